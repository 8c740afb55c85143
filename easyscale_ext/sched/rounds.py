"""What happens in a round, for the simulator and the cluster alike.

`run(backend, policy)` is the one scheduling loop. Each round the backend says what time it is (having let time
pass: jobs arrived, progressed, ended), and what the policy sees (the jobs that may hold GPUs, the cluster, their
allocations); the policy's `optimize` returns new allocations; those become typed decisions (start, resume, grow,
shrink, move, suspend) that the backend carries out; then it accounts for the round. The simulator's backend
(simulator.py) advances a clock and the job models; the cluster's (cluster/scheduler.py) waits for real time, reads
what its jobs measured and carries decisions out on Ray. Nothing else differs between them.
"""
from collections import Counter
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import StrEnum
from typing import Callable, Dict, List, Optional, Protocol


class Change(StrEnum):
    START = "start"  # a job given GPUs for the first time
    RESUME = "resume"  # a job that held none since it was suspended given GPUs: it restarts from its checkpoint
    GROW = "grow"  # in place: it keeps its GPUs and gains more
    SHRINK = "shrink"  # in place: it leaves some of its GPUs
    MOVE = "move"  # in place: it gains some and leaves others (or its ranks change GPUs)
    SUSPEND = "suspend"  # a running job given none: it leaves them, saving a checkpoint, and waits


@dataclass(frozen=True)
class Decision:
    job: str
    change: Change
    old: tuple  # the GPUs it held (node indices, one per GPU)
    new: tuple  # the GPUs it holds from now on

    @property
    def gained(self) -> Counter:
        return Counter(self.new) - Counter(self.old)


def decisions(allocations: Dict[str, tuple], decided: Dict[str, tuple],
              has_run: Callable[[str], bool]) -> List[Decision]:
    """The changes from `allocations` to `decided` (job -> GPUs; no empty ones), in a fixed order, so that runs
    reproduce: the jobs decided, in the policy's order, then those it stopped. `has_run(job)`: whether the job has
    held GPUs before."""
    out = []
    for job in [*decided, *(j for j in allocations if j not in decided)]:
        old, new = allocations.get(job, ()), decided.get(job, ())
        if new != old:
            out.append(Decision(job, _change(old, new, has_run(job)), old, new))
    return out


def _change(old, new, ran: bool) -> Change:
    if not new:
        return Change.SUSPEND
    if not old:
        return Change.RESUME if ran else Change.START
    gained, lost = Counter(new) - Counter(old), Counter(old) - Counter(new)
    return Change.GROW if gained and not lost else Change.SHRINK if lost and not gained else Change.MOVE


class Backend(Protocol):
    def next_round(self) -> Optional[float]:
        """Let time pass until the next round is due; its time on the policy's clock, or None when no job is left."""

    def deciding(self) -> AbstractContextManager:
        """Around one round's view, decision and actuation."""

    def view(self, now: float) -> Optional[tuple]:
        """(jobs, cluster, allocations) that the policy sees now; None when there is nothing to decide."""

    def has_run(self, job: str) -> bool:
        """Whether the job has held GPUs before."""

    def carry_out(self, now: float, cluster, decided: Dict[str, tuple], changes: List[Decision]) -> None:
        """Make `decided` the allocations, by `changes`."""

    def account(self, now: float, decided: Dict[str, tuple]) -> None:
        """Record the round."""


def run(backend: Backend, policy) -> None:
    """Rounds of `policy` until the backend has no job left."""
    while (now := backend.next_round()) is not None:
        with backend.deciding():
            seen = backend.view(now)
            if seen is None:
                continue
            jobs, cluster, allocations = seen
            decided = {job: alloc for job, alloc in policy.optimize(now, jobs, cluster, allocations).items() if alloc}
            backend.carry_out(now, cluster, decided, decisions(allocations, decided, backend.has_run))
            backend.account(now, decided)
