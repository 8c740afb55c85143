"""What a run's allocations were: one account, kept the same way for a simulated run and a cluster's.

Each change of the GPUs a job holds enters `held(t, job, gpus)`, in time order, and the ledger keeps who held how
many GPUs from when to when (segments: the Gantt chart, GPU-seconds), each job's first start, and its starts (a
start after holding none: its first, then each resume from a checkpoint; a change in place is none). The simulator
enters its round's decisions as it carries them out and each job's completion; cluster mode's rounds write each
change to the job table as they carry it out (`JobTable.allocations`, which outlives a scheduler's restart), and its
report enters them in the same order.
"""
from collections import Counter
from typing import Dict, List, Tuple


class Ledger:
    def __init__(self):
        self.segments: List[Tuple[str, float, float, int]] = []  # (job, start, end, GPUs), in the order they closed
        self.first_start: Dict[str, float] = {}
        self.starts = Counter()  # job -> starts
        self.attained = Counter()  # job -> GPU-seconds held
        self.holding = 0  # GPUs held now, by every job
        self._opened: Dict[str, Tuple[float, int]] = {}  # job -> (since, GPUs) while it holds some

    def held(self, t: float, job: str, gpus: int) -> None:
        """From `t` on, `job` holds `gpus` GPUs (0: none; it ended, or waits)."""
        if job in self._opened:
            since, before = self._opened.pop(job)
            if t > since:
                self.segments.append((job, since, t, before))
                self.attained[job] += (t - since) * before
            self.holding -= before
        elif gpus:
            self.starts[job] += 1
        if gpus:
            self._opened[job] = (t, gpus)
            self.first_start.setdefault(job, t)
            self.holding += gpus
