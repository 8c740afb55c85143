"""What happens in a round, for the simulator and the cluster alike.

`run(backend, policy)` is the one scheduling loop, and the only place allocations change. Each round the backend
says what time it is (having let time pass: jobs arrived, progressed, ended) and gives its `View`: the jobs that may
hold GPUs, the cluster as the policy sees it, what each job holds, and the cuts events forced on jobs since the last
round (their slots went with a node, or were reserved). The round first makes the cuts decisions, then holds the
policy's `optimize` to each job's limits (sched/limits.py), and turns the difference into typed decisions (start,
resume, grow, shrink, move, suspend) that the backend carries out; then it accounts for the round. The simulator's
backend (simulator.py) advances a clock and the job models; the cluster's (cluster/backend.py) waits for real time,
reads what its jobs measured and carries decisions out on Ray. Nothing else differs between them.

Decisions name nodes by the backend's keys (the simulator's node indices, the cluster's Ray node ids), so a cut can
name a node that has left the policy's view; the policy sees node indices of `View.cluster`, mapped through
`View.keys`.
"""
from collections import Counter
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Callable, Dict, List, Optional, Protocol

from .limits import hold


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
    old: tuple  # the GPUs it held (node keys, one per GPU)
    new: tuple  # the GPUs it holds from now on
    why: str = ""  # what made it: "by POLICY" ("preempted by POLICY" for a suspension), or the event behind a cut

    @property
    def gained(self) -> Counter:
        return Counter(self.new) - Counter(self.old)


@dataclass(frozen=True)
class Cut:
    """An event's decision, made before the policy's: `job` keeps only the GPUs `keep` (node keys; none: it is
    suspended), because the others are gone (`why`)."""
    job: str
    keep: tuple
    why: str


@dataclass
class View:
    jobs: list  # the job models the policy sees, in arrival order
    cluster: object  # the GPUs the policy may allocate (models.cluster.Cluster)
    held: Dict[str, tuple]  # job -> the node keys of the GPUs it holds (jobs the policy sees only)
    keys: tuple  # the key of each of `cluster`'s nodes, in its order
    cuts: List[Cut] = field(default_factory=list)  # forced by events since the last round


def decisions(held: Dict[str, tuple], decided: Dict[str, tuple], has_run: Callable[[str], bool],
              why: Callable[[str, Change], str] = lambda job, change: "") -> List[Decision]:
    """The changes from `held` to `decided` (job -> GPUs; no empty ones), in a fixed order, so that runs
    reproduce: the jobs decided, in the policy's order, then those it stopped. `has_run(job)`: whether the job has
    held GPUs before; `why(job, change)`: what made the change."""
    out = []
    for job in [*decided, *(j for j in held if j not in decided)]:
        old, new = held.get(job, ()), decided.get(job, ())
        if new != old:
            change = _change(old, new, has_run(job))
            out.append(Decision(job, change, old, new, why(job, change)))
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
        """Around one round's view, decisions and actuation."""

    def view(self, now: float) -> Optional[View]:
        """What the round decides on; None when there is nothing to decide."""

    def has_run(self, job: str) -> bool:
        """Whether the job has held GPUs before."""

    def carry_out(self, now: float, changes: List[Decision]) -> None:
        """Make the changes, in their order."""

    def account(self, now: float, held: Dict[str, tuple]) -> None:
        """Record the round: `held` is what each job the policy saw holds after it."""


def run(backend: Backend, policy, preempt: bool = True) -> None:
    """Rounds of `policy` until the backend has no job left. Without `preempt`, no decision of the policy stops a
    running job (cuts still may: their GPUs are gone)."""
    while (now := backend.next_round()) is not None:
        with backend.deciding():
            view = backend.view(now)
            if view is not None:
                backend.account(now, decide(backend, policy, now, view, preempt))


def decide(backend: Backend, policy, now: float, view: View, preempt: bool = True) -> Dict[str, tuple]:
    """One round's decisions on `view`, carried out: the cuts first, then the policy's. Returns what each job holds
    after them."""
    held = dict(view.held)
    if view.cuts:
        reasons = {cut.job: cut.why for cut in view.cuts}
        after = {job: nodes for job, nodes in {**held, **{c.job: c.keep for c in view.cuts}}.items() if nodes}
        backend.carry_out(now, decisions(held, after, backend.has_run, lambda job, change: reasons[job]))
        held = after
    index = {key: i for i, key in enumerate(view.keys)}
    allocations = {job: tuple(index[key] for key in nodes) for job, nodes in held.items()}
    decided = hold(policy, now, view.jobs, view.cluster, allocations, preempt)
    after = {job: tuple(view.keys[i] for i in alloc) for job, alloc in decided.items()}
    backend.carry_out(now, decisions(held, after, backend.has_run, lambda job, change: (
        f"preempted by {policy.name}" if change == Change.SUSPEND else f"by {policy.name}")))
    return after
