"""Heterogeneous processes (EasyScale's intra-job scheduling): more virtual workers on faster ones.

Each process times its virtual workers' forward and backward (EasyScaleDDP keeps the per-worker
seconds of its recent steps); at step boundaries the processes share their medians, and a Balancer
on rank 0 proposes the split that minimises the predicted step time. The model's bits do not depend
on the split, so the switch, through the in-place path, changes only the speed.
"""
from dataclasses import dataclass
from typing import List, Optional, Sequence

from ..placement import optimal_split, step_time, waste


@dataclass
class Rebalance:
    step: int
    old: List[int]
    new: List[int]
    step_time_before: float  # predicted, seconds of compute per step
    step_time_after: float
    waste_before: float
    waste_after: float


class Balancer:
    """Rank 0's rebalancing policy: every `interval` steps, compare the current split with the optimal
    one for the measured speeds; switch when the predicted step time drops by more than `threshold`
    (relative) on `patience` consecutive evaluations, so that noise does not make the split flap."""

    def __init__(self, interval: int = 10, threshold: float = 0.1, patience: int = 2):
        if interval < 1 or patience < 1 or not 0 <= threshold < 1:
            raise ValueError("need interval >= 1, patience >= 1 and 0 <= threshold < 1")
        self.interval, self.threshold, self.patience = interval, threshold, patience
        self.streak = 0
        self.evaluations = 0  # proposals considered, acted on or not
        self.log: List[Rebalance] = []

    def propose(self, step: int, sizes: Sequence[int], seconds_per_worker: Sequence[float]) -> Optional[List[int]]:
        self.evaluations += 1
        speeds = [1.0 / s for s in seconds_per_worker]
        best = optimal_split(sum(sizes), speeds)
        before, after = step_time(sizes, speeds), step_time(best, speeds)
        self.streak = self.streak + 1 if after < (1 - self.threshold) * before else 0
        if self.streak < self.patience:
            return None
        self.streak = 0
        self.log.append(Rebalance(step, list(sizes), best, before, after, waste(sizes, speeds), waste(best, speeds)))
        return best
