"""Heterogeneous processes (EasyScale's intra-job scheduling): more virtual workers on faster ones.

Each process times its virtual workers' forward and backward (EasyScaleDDP keeps the per-worker
seconds of its recent steps); at step boundaries the processes share their medians, and a Balancer
on rank 0 proposes the split that minimises the predicted step time. The model's bits do not depend
on the split, so the switch, through the in-place path, changes only the speed.
"""
import heapq
from dataclasses import dataclass
from typing import List, Optional, Sequence


def optimal_split(n: int, speeds: Sequence[float]) -> List[int]:
    """Contiguous range sizes k_i >= 1 summing to n that minimise max_i k_i / speeds_i.

    Process i finishes its j-th worker at j / s_i. Every split holds each process's first worker
    plus n - P further "finish times" taken from each process in order, so its step time is at least
    the largest of: the slowest first worker, and the (n - P)-th smallest finish time over all j >= 2.
    Handing out workers one at a time to the process that would finish its next one soonest attains
    exactly that bound, hence is optimal (ties go to the lower rank, so the split is reproducible).
    The exchange adds the same time to every split and does not change the choice.
    """
    procs = len(speeds)
    if not 1 <= procs <= n:
        raise ValueError(f"need 1 <= processes <= n, got {procs} processes for n={n}")
    if any(s <= 0 for s in speeds):
        raise ValueError(f"speeds must be positive, got {list(speeds)}")
    sizes = [1] * procs
    heap = [(2 / s, i) for i, s in enumerate(speeds)]
    heapq.heapify(heap)
    for _ in range(n - procs):
        _, i = heapq.heappop(heap)
        sizes[i] += 1
        heapq.heappush(heap, ((sizes[i] + 1) / speeds[i], i))
    return sizes


def step_time(sizes: Sequence[int], speeds: Sequence[float]) -> float:
    """Predicted compute time of a step: the slowest process's."""
    return max(k / s for k, s in zip(sizes, speeds))


def waste(sizes: Sequence[int], speeds: Sequence[float]) -> float:
    """EasyScale's waste: device time idle per step while the slowest process finishes."""
    t = step_time(sizes, speeds)
    return sum(t - k / s for k, s in zip(sizes, speeds))


def ranges_of(sizes: Sequence[int]) -> List[List[int]]:
    out, at = [], 0
    for k in sizes:
        out.append([at, at + k])
        at += k
    return out


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
        self.log: List[Rebalance] = []

    def propose(self, step: int, sizes: Sequence[int], seconds_per_worker: Sequence[float]) -> Optional[List[int]]:
        speeds = [1.0 / s for s in seconds_per_worker]
        best = optimal_split(sum(sizes), speeds)
        before, after = step_time(sizes, speeds), step_time(best, speeds)
        self.streak = self.streak + 1 if after < (1 - self.threshold) * before else 0
        if self.streak < self.patience:
            return None
        self.streak = 0
        self.log.append(Rebalance(step, list(sizes), best, before, after, waste(sizes, speeds), waste(best, speeds)))
        return best
