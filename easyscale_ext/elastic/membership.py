"""Membership and rendezvous: who is in the job, generation by generation, and who is alive.

Generation g has an ordered member list in the job store and its own process group, formed on a
PrefixStore("gen{g}"). Every process beats a counter into the store on a thread and connection of its own;
a member whose counter has not moved for liveness_s (as seen by its watchers, the two members after it in rank
order: no clocks are compared across machines) is marked lost. The same thread, on every member, cuts the current
group once one of its members is marked (gloo: its connections shut down; NCCL: its communicators aborted): a
member that stops without closing its connections (a lost machine, a stopped process) would otherwise fail no
collective before the group's timeout.
"""
import atexit
import functools
import logging
import os
import socket
import threading
import time
from datetime import timedelta
from typing import Callable, Dict, List, Optional, Tuple

import torch.distributed as dist

from .client import connect

log = logging.getLogger(__name__)
WATCHED = 2  # members whose beats each member watches: a stopped one has this many watchers, whatever the group's size


class MemberLost(RuntimeError):
    """A process of the job was lost while the others waited for it outside a collective."""


class Membership:
    """This process's place in the job: its id, the current generation and its members, and the group."""

    def __init__(self, address: str, worker_id: str, backend: str, timeout_s: float, liveness_s: float):
        self.store = connect(address, timeout_s)
        self.id = worker_id
        self.backend = backend
        self.timeout = timedelta(seconds=timeout_s)
        self.liveness_s = liveness_s
        self.liveness = Liveness(self.store, liveness_s)
        self.generation = -1
        self.members: List[str] = []
        # (generation, members, what cuts the group) while a group is up: what the heartbeat thread watches
        self._watch: Optional[Tuple[int, List[str], Callable[[], None]]] = None
        # Connected before any group forms, so that its socket is never taken for one of the group's.
        beat_store = connect(address, timeout_s)
        self._closing = threading.Event()
        self._beating = threading.Thread(target=self._heartbeat, args=(beat_store,), daemon=True,
                                         name="easyscale-heartbeat")
        self._beating.start()
        atexit.register(self._stop_heartbeat)  # a script that never calls close() must not abort at its exit

    @property
    def rank(self) -> int:
        return self.members.index(self.id)

    def lost(self, who: str) -> bool:
        """Whether `who` is known lost: its launcher saw it exit, or its heartbeat lapsed."""
        return self.store.is_lost(who) or self.liveness.stale(who)

    def enter(self, generation: int) -> None:
        """Form generation `generation`'s process group with its members (leaving the current one)."""
        self.generation = generation
        self.members = self.store.members(generation)
        if self.id not in self.members:
            raise RuntimeError(f"worker {self.id} is not a member of generation {generation}: {self.members}")
        self.leave_group()
        self._await_members(generation)
        if self.backend == "nccl":
            # A collective that fails, times out or is aborted then raises in wait(), into recover(), instead of
            # NCCL's watchdog ending the process. Read as the group forms; a setting of the user's stands.
            os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")
        before = _sockets()
        dist.init_process_group(self.backend, store=self.store.group_store(generation),
                                rank=self.rank, world_size=len(self.members), timeout=self.timeout)
        self._watch = (generation, list(self.members), self._cutter(before))

    def _cutter(self, before: Dict[int, int]) -> Callable[[], None]:
        """What fails the collectives of the group just formed at once: gloo's connections to the other members
        (the sockets opened since `before`) shut down, NCCL's communicators aborted (their kernels end, and
        the blocking wait raises)."""
        if self.backend == "nccl":
            return dist.group.WORLD.abort
        sockets = {fd: inode for fd, inode in _sockets().items() if before.get(fd) != inode} \
            if self.backend == "gloo" else {}
        return functools.partial(_shut_down, sockets)

    def cut(self) -> None:
        """Fail the current group's collectives now (what the heartbeat does when a member's beat lapses)."""
        watch = self._watch
        if watch is not None:
            watch[2]()

    def enter_first(self) -> None:
        """Form the job's first group. A first member lost before it formed (say, its node went as the job started)
        is left out: nobody has trained yet, so the others form the next generation without it and lose nothing
        but its slot, which a joiner fills in place. The first to see the loss writes that generation."""
        generation = 0
        while True:
            try:
                return self.enter(generation)
            except MemberLost:
                survivors = [m for m in self.members if not self.lost(m)]
                self.store.propose_members(generation + 1, survivors)
                generation += 1

    def close(self) -> None:
        """Stop the heartbeat and leave the group."""
        self._stop_heartbeat()
        atexit.unregister(self._stop_heartbeat)
        self.leave_group()

    def _stop_heartbeat(self) -> None:
        """A thread inside the store's client when the interpreter exits aborts the process ("terminate called
        without an active exception"): a job that finished would be reported failed."""
        self._closing.set()
        self._beating.join(timeout=2 * self.liveness_s)

    def leave_group(self) -> None:
        self._watch = None
        if dist.is_initialized():
            dist.destroy_process_group()

    def _await_members(self, generation: int) -> None:
        """Wait until every member of `generation` is there to form its group; a member lost before
        (e.g. a joiner killed after it was admitted) raises MemberLost instead of stalling the rest."""
        self.store.arrive(generation, self.id)
        looked, losses = time.monotonic(), self.store.losses()
        while not self.store.arrived(generation, self.members):
            # Who is missing, and whether lost, every liveness_s / 5 (liveness needs no more) or at a new loss
            marked = self.store.losses()
            if time.monotonic() - looked > self.liveness_s / 5 or marked != losses:
                looked, losses = time.monotonic(), marked
                lost = [m for m in self.members if not self.store.arrived(generation, [m]) and self.lost(m)]
                if lost:
                    raise MemberLost(f"{', '.join(lost)} lost before generation {generation} formed")
            time.sleep(0.01)

    def _heartbeat(self, store) -> None:
        """Beat this process's counter every liveness_s / 5 on a connection of its own, and watch the beats of the
        WATCHED members after this one in rank order: one that stopped without closing its connections fails no
        collective before the group's timeout, so its watchers mark it lost. Every member reads the count of
        losses each period; once a member of its group is marked, it cuts the group here, which fails the
        collective this process waits in, if any, at once (then recover()). A period costs WATCHED + 2 requests
        however large the group; a new group or a new loss costs one look at every member's mark."""
        liveness, cut, seen = Liveness(store, self.liveness_s), None, None  # seen: (generation, losses) looked at
        try:
            while not self._closing.is_set():
                store.beat(self.id)
                watch = self._watch
                if watch is not None and watch[0] != cut:
                    generation, members, cutter = watch
                    lapsed = [m for m in watched(members, self.id) if liveness.stale(m)]
                    for m in lapsed:
                        store.mark_lost(m, "no heartbeat")
                    losses = store.losses()
                    if lapsed or seen != (generation, losses):
                        seen = (generation, losses)
                        lost = lapsed or [m for m in members if m != self.id and store.is_lost(m)]
                        if lost:
                            cut = generation
                            log.warning("%s: %s lost (%s): cutting generation %d's group", self.id, ", ".join(lost),
                                        "no heartbeat for %s s" % self.liveness_s if lapsed else "marked", cut)
                            cutter()
                self._closing.wait(self.liveness_s / 5)
        except Exception:  # the store is gone: the job is over
            return


def watched(members: List[str], me: str) -> List[str]:
    """The members whose heartbeats `me` watches: the WATCHED after it, around the rank order (each member has as
    many watchers)."""
    i = members.index(me)
    return [members[(i + k) % len(members)] for k in range(1, min(WATCHED, len(members) - 1) + 1)]


class Liveness:
    """Whose heartbeat has not moved for liveness_s, as seen from here (no clocks compared across
    machines). A process that has not started beating is still starting, not lost."""

    def __init__(self, store, liveness_s: float):
        self.store, self.liveness_s = store, liveness_s
        self.seen: Dict[str, Tuple[int, float]] = {}  # process -> (its last beat count, when first seen here)

    def stale(self, who: str) -> bool:
        beat, now = self.store.beat(who, 0), time.monotonic()
        if beat == 0:
            return False
        seen = self.seen.get(who)
        if seen is None or seen[0] != beat:
            self.seen[who] = (beat, now)
            return False
        return now - seen[1] > self.liveness_s


def _sockets() -> Dict[int, int]:
    """This process's open sockets, fd -> inode (Linux's /proc; empty elsewhere: no group is then cut)."""
    out = {}
    for fd in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else []:
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if link.startswith("socket:["):
            out[int(fd)] = int(link[len("socket:["):-1])
    return out


def _shut_down(sockets: Dict[int, int]) -> None:
    """Shut down the connected ones of these sockets (a group's: gloo's pairs; not its listener, whose
    failure aborts the process), unless their descriptors were closed and reused since."""
    for fd, inode in sockets.items():
        try:
            with socket.socket(fileno=os.dup(fd)) as s:  # the duplicate keeps the socket while we look
                if os.fstat(s.fileno()).st_ino == inode and s.family in (socket.AF_INET, socket.AF_INET6) \
                        and not s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                    s.shutdown(socket.SHUT_RDWR)
        except OSError:  # closed, or not connected
            continue
