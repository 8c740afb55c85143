"""Surviving a lost process: replication of the virtual workers' contexts, and the survivors' decision.

At every synced step, after backward and before that step's exchange can complete anywhere, each process
writes its virtual workers' contexts to the job store (ddp.on_step_contexts): whenever a process holds a
step's result, the store holds every worker's context for it (the model and optimizer state every survivor
holds already). When a collective fails, each survivor says which step it holds; once every member has
said so or is lost, the first to see it decides for all (compare_set): the survivors, the newest step any of
them holds, and its holder.

Whether an error is a lost process is decided from its type and from the job store (a member lost, or one
already recovering), never from its text: a training bug whose message mentions gloo is a training bug.
"""
import logging
import time
import traceback
from typing import Dict, List, Optional, Tuple

import torch.distributed as dist

from .membership import MemberLost, Membership

log = logging.getLogger(__name__)

# Replications each process keeps per virtual worker, written in turn: recovery needs a worker's newest
# or the one before (a process is at most one replication ahead of any survivor).
CONTEXT_SLOTS = 3


class TrainingError(RuntimeError):
    """A process of the job failed in its own code (not a lost peer): the job stops."""


class Replicas:
    """This process's replicated contexts in the job store."""

    def __init__(self, membership: Membership):
        self.membership = membership
        self.store = membership.store
        self._written = 0

    def write(self, contexts: Dict[int, bytes], step: int) -> None:
        """Contexts at the end of `step` into the store, tagged with the step and the order they were written
        in (generation, then this process's count: a worker has one owner in a generation). Slots go in turn,
        not by step: steps under no_sync() replicate nothing."""
        if self.store.is_lost(self.membership.id):  # stopped or cut off, then left out: a stale write could
            # take the slot of a newer replica of these workers, written by the processes that now run them
            raise MemberLost(f"{self.membership.id} was taken for lost and the job went on without it")
        slot = self._written % CONTEXT_SLOTS
        tag = f"{step} {self.membership.generation} {self._written}\n".encode()
        self._written += 1
        self.store.replicate(slot, tag, contexts)

    def context(self, v: int, step: int) -> Tuple[Optional[bytes], List[int]]:
        """Virtual worker v's newest replicated context for `step` (None if the store holds none), and the
        steps the store holds for it."""
        found = []
        for slot in range(CONTEXT_SLOTS):
            replica = self.store.replica(slot, v)
            if replica is not None:
                tag, ctx = replica.split(b"\n", 1)
                found.append((tuple(int(x) for x in tag.split()), ctx))
        held = [(order, ctx) for (s, *order), ctx in found if s == step]
        newest = max(held, key=lambda h: h[0])[1] if held else None
        return newest, sorted(s for (s, *_), _ in found)


def lost_peer(error: BaseException, membership: Membership, wait_s: float) -> bool:
    """Whether `error` comes from a lost process rather than the training code: a failed collective
    (DistError), a member lost outside one (MemberLost), or a RuntimeError raised while the store shows a
    member of this generation lost or another one recovering (waiting up to `wait_s` for that evidence:
    a peer that dies closes its connections before its launcher or heartbeat can tell)."""
    if isinstance(error, (dist.DistError, MemberLost)):
        return True
    if not isinstance(error, RuntimeError) or isinstance(error, TrainingError):
        return False
    m, deadline = membership, time.monotonic() + wait_s
    others = [x for x in m.members if x != m.id]
    while others:
        if any(m.store.said_holds(m.generation, x) or m.lost(x) for x in others):
            return True
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return False


def report_training_error(error: BaseException, membership: Membership) -> None:
    """Tell the job that this process failed in its own code, so the others stop instead of going on
    without it."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    try:
        membership.store.report_failure(membership.id, text)
    except Exception:  # the store is gone: nobody is left to tell
        pass


def decide_survivors(membership: Membership, replicas: Replicas, world_size: int, timeout_s: float) -> dict:
    """Wait until every member of the current generation has said which step it holds or is lost; the
    first process to see that decides for all (compare_set)."""
    m, store, generation = membership, membership.store, membership.generation
    deadline = time.monotonic() + timeout_s
    while (decision := store.recovery(generation)) is None:
        failed = [(x, text) for x in m.members if (text := store.failure(x)) is not None]
        if failed:
            return {"failed": failed[0][0], "error": f"process {failed[0][0]} failed in the training code, not by a "
                    f"lost connection; the job stops. Its error:\n{failed[0][1]}"}
        held = [x for x in m.members if store.said_holds(generation, x)]
        lost = [x for x in m.members if x not in held and m.lost(x)]
        if len(held) + len(lost) == len(m.members):
            store.propose_recovery(generation, _survivors(m, replicas, held, lost, world_size))
            continue
        if time.monotonic() > deadline:
            return {"error": f"no recovery decision within {timeout_s} s: the members that neither failed "
                             "nor lost their heartbeat are still in the step"}
        time.sleep(0.02)
    return decision


def _survivors(m: Membership, replicas: Replicas, held: List[str], lost: List[str], world_size: int) -> dict:
    generation = m.generation
    holds = {x: m.store.holds(generation, x) for x in held}
    held = [x for x in held if holds[x] is not None]  # a joiner that had not taken the job's state yet
    if not held:
        return {"error": "every process holding the job's state was lost: restart it from its last checkpoint"}
    step = max(h[0] for h in holds.values() if h is not None)
    source = next(x for x in held if holds[x][0] == step)  # it holds the model and optimizer state
    for v in range(world_size):
        context, steps = replicas.context(v, step)
        if context is None:
            return {"error": f"virtual worker {v}'s context for step {step} is not in the job store (it holds "
                             f"steps {steps or 'none'}): the job cannot continue in place; restart it from its "
                             "last checkpoint"}
    latest = m.store.current_generation(since=generation)  # a scale event may have published one
    for x in lost:
        m.store.mark_lost(x, str(generation))
    return {"members": held, "lost": lost, "source": source, "position": holds[source],
            "generation": latest + 1}
