"""Stop-free in-place scaling (as in EDL): membership changes at a step
boundary while surviving processes keep running.

A job's processes share a torch.distributed TCPStore (hosted by the launcher,
bound to loopback unless told otherwise). Generation g has an ordered member
list and its own process group, created on a PrefixStore of the job store.

- A joining process prepares first (model, optimizer and data built), then
  registers as ready and waits to be admitted.
- Scale requests set the job's target process count (`request_scale`, or
  `easyscale scale`). A named departure (SIGTERM to a process, `request_release`
  or `easyscale scale --release WORKER`) asks that process to leave. At every
  step boundary rank 0 looks at departures, the target and the ready joiners,
  and broadcasts whether the membership changes.
- On a change every member exports its virtual workers' contexts to the store,
  rank 0 publishes the new members and the data position, the old group is
  destroyed, leavers return, and survivors and joiners form the new group:
  rank 0 (a survivor) broadcasts model, buffers and optimizer state, and every
  process adopts the contexts of the virtual workers it now owns.
- A process that dies (kill -9, a crash) is replaced in place. Every process
  beats a heartbeat into the store, and replicates its virtual workers'
  contexts there at every synced step, after backward and before that step's
  exchange can complete anywhere (ddp.on_step_contexts): whenever a process
  holds a step's result, the store holds every worker's context for it. When
  a collective fails, the training loop calls `recover`: the survivors say
  which step they hold, a member whose heartbeat stops for `liveness_s` is
  lost, and the survivors form a new generation that continues from the
  newest step any of them holds (its holder broadcasts the model and
  optimizer state), adopting the lost process's virtual workers from the
  store. The lost steps are redone; the result is bitwise the fixed run's.
  A member that stops without closing its connections (a lost machine, a
  stopped process) fails no collective before its timeout: the heartbeat
  thread, which also watches the others' beats, cuts the group's connections.
"""
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
import uuid
from dataclasses import astuple, dataclass, field
from datetime import timedelta
from typing import Callable, Dict, List, Optional, Tuple, Union

import torch
import torch.distributed as dist

from .balance import Balancer, ranges_of
from .checkpoint import Position
from .ddp import even_ranges

# Replications each process keeps per virtual worker, written in turn: recovery needs a worker's newest
# or the one before (a process is at most one replication ahead of any survivor).
_CONTEXT_SLOTS = 3

STORE_ENV = "EASYSCALE_STORE"       # host:port of the job store
ID_ENV = "EASYSCALE_WORKER_ID"
JOIN_ENV = "EASYSCALE_JOIN"         # "1" for a process that joins a running job
BALANCE_ENV = "EASYSCALE_BALANCE"   # "1": rebalance virtual workers by measured speed


def connect(address: str, timeout_s: float = 300.0) -> dist.TCPStore:
    host, port = address.rsplit(":", 1)
    return dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout_s))


def request_scale(address: str, procs: int) -> None:
    """Ask a running job to run on `procs` processes (scale-out needs joiners started by the launcher)."""
    if procs < 1:
        raise ValueError(f"procs must be >= 1, got {procs}")
    connect(address, 30).set("target", str(procs))


def current_members(store) -> List[str]:
    """The members of the job's latest generation, in rank order."""
    g = 0
    while store.check([f"gen/{g + 1}/members"]):
        g += 1
    return json.loads(store.get(f"gen/{g}/members"))


def request_release(address: str, worker: str) -> None:
    """Ask the job's process `worker` to leave at the next step boundary, in place: its virtual workers move to
    the others (what SIGTERM to that process does)."""
    store = connect(address, 30)
    members = current_members(store)
    if worker not in members:
        raise ValueError(f"the job has no process {worker!r}; its processes are {', '.join(members)}")
    if len(members) == 1:
        raise ValueError(f"{worker} is the job's last process: to stop the job, send it SIGTERM (it leaves "
                         "at the next step boundary after saving a checkpoint, if it has a Checkpointer)")
    _release(store, worker)


def _release(store, worker: str) -> None:
    store.append("releases", worker + "\n")  # one atomic write: a death mid-request leaves no gap


def request_split(address: str, sizes: List[int]) -> None:
    """Ask a running job to give its processes, in rank order, these numbers of virtual workers (at the
    next step boundary, in place; e.g. from a scheduler that knows the devices' speeds)."""
    if not sizes or min(sizes) < 1:
        raise ValueError(f"every process needs at least one virtual worker, got {sizes}")
    connect(address, 30).set("split", json.dumps([int(k) for k in sizes]))


@dataclass
class ScaleEvent:
    step: int
    old_procs: int
    new_procs: int
    generation: int
    ranges: List[Tuple[int, int]] = field(default_factory=list)  # virtual ranks of each process after it
    seconds: float = 0.0  # from the decision to the new group being ready
    joined: List[str] = field(default_factory=list)
    left: List[str] = field(default_factory=list)


class ElasticMember:
    """This process's membership in an elastic job."""

    def __init__(self, address: Optional[str] = None, worker_id: Optional[str] = None, backend: str = "gloo",
                 timeout_s: float = 300.0, balance: Union[bool, Balancer, None] = None, liveness_s: float = 5.0):
        """`balance`: True or a Balancer rebalances virtual workers by measured speed (rank 0's
        Balancer decides); None reads $EASYSCALE_BALANCE (`easyscale run --balance` sets it).
        `liveness_s`: a process whose heartbeat stops this long is lost (see recover)."""
        address = address or os.environ.get(STORE_ENV)
        if not address:
            raise ValueError(f"no job store: pass address='host:port' or set {STORE_ENV}")
        if liveness_s <= 0:
            raise ValueError(f"liveness_s must be > 0, got {liveness_s}")
        self.store = connect(address, timeout_s)
        self.id = worker_id or os.environ.get(ID_ENV) or uuid.uuid4().hex[:12]
        self.liveness_s = liveness_s
        self._liveness = _Liveness(self.store, liveness_s)
        # (generation, members, the group's sockets) while a group is up: what the heartbeat thread watches
        self._watch: Optional[Tuple[int, List[str], Dict[int, int]]] = None
        # Connected before any group forms, so that its socket is never taken for one of the group's.
        beat_store = connect(address, timeout_s)
        threading.Thread(target=self._heartbeat, args=(beat_store,), daemon=True, name="easyscale-heartbeat").start()
        self._boundary: Optional[Tuple[Position, int]] = None  # the last step boundary and ddp.synced_steps then
        self._replicated: Optional[Position] = None  # where the store's newest copy of this process's contexts is
        self._replications = 0
        self.backend = backend
        self.timeout = timedelta(seconds=timeout_s)
        self.joining = os.environ.get(JOIN_ENV) == "1"
        self.generation = -1
        self.members: List[str] = []
        self.hooks: List[Callable[[ScaleEvent], None]] = []
        self._published = False  # the job state joiners are checked against
        self._releases_seen = 0  # rank 0: departures requested so far that it has read
        self._terminated = False
        self._pid = os.getpid()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)
        if balance is None:
            balance = os.environ.get(BALANCE_ENV) == "1"
        self.balancer = Balancer() if balance is True else (balance or None)
        if not self.joining:
            self._enter(0)

    # -- membership -----------------------------------------------------------------
    def _enter(self, generation: int) -> None:
        self.generation = generation
        self.members = json.loads(self.store.get(f"gen/{generation}/members"))
        if self.id not in self.members:
            raise RuntimeError(f"worker {self.id} is not a member of generation {generation}: {self.members}")
        self._leave_group()
        self._await_members(generation)
        before = _sockets()
        dist.init_process_group(self.backend, store=dist.PrefixStore(f"gen{generation}", self.store),
                                rank=self.members.index(self.id), world_size=len(self.members), timeout=self.timeout)
        # gloo's connections to the other members. NCCL's are its own and nothing cuts them: a lost process
        # ends its collective at the group's timeout, where NCCL's watchdog tears the process down (by default)
        # rather than raising into recover(); restart the job from its checkpoint.
        sockets = {fd: inode for fd, inode in _sockets().items() if before.get(fd) != inode} \
            if self.backend == "gloo" else {}
        self._watch = (generation, list(self.members), sockets)

    def _leave_group(self) -> None:
        self._watch = None
        if dist.is_initialized():
            dist.destroy_process_group()

    def _heartbeat(self, store) -> None:
        """Beat this process's counter every liveness_s / 5 on a connection of its own, and watch the
        members' beats: one that stopped without closing its connections (a lost machine, a stopped
        process) fails no collective before the group's timeout, so its lapse cuts the group's connections
        here, which fails the collective this process waits in, if any, at once (then recover())."""
        liveness, cut = _Liveness(store, self.liveness_s), None
        try:
            while True:
                store.add(f"beat/{self.id}", 1)
                watch = self._watch
                lapsed = [m for m in watch[1] if m != self.id and liveness.stale(m)] if watch else []
                if lapsed and watch[0] != cut:
                    cut = watch[0]
                    for m in lapsed:  # recover() need not wait out another liveness_s to see it
                        store.set(f"lost/{m}", "no heartbeat")
                    _shut_down(watch[2])
                time.sleep(self.liveness_s / 5)
        except Exception:  # the store is gone: the job is over
            return

    def _await_members(self, generation: int) -> None:
        """Wait until every member of `generation` is there to form its group; a member lost before
        (e.g. a joiner killed after it was admitted) raises MemberLost instead of stalling the rest."""
        self.store.set(f"gen/{generation}/arrived/{self.id}", "1")
        while True:
            missing = [m for m in self.members if not self.store.check([f"gen/{generation}/arrived/{m}"])]
            if not missing:
                return
            lost = [m for m in missing if self.store.check([f"lost/{m}"]) or self._liveness.stale(m)]
            if lost:
                raise MemberLost(f"{', '.join(lost)} lost before generation {generation} formed")
            time.sleep(0.01)

    @property
    def rank(self) -> int:
        return self.members.index(self.id)

    def _on_sigterm(self, signum, frame) -> None:
        """Leave at the next step boundary, in place. A second SIGTERM terminates at once (the job then
        needs its last checkpoint)."""
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if os.getpid() != self._pid:  # a forked child (a DataLoader worker, a pool's): ends as by default
            os.kill(os.getpid(), signal.SIGTERM)
            return
        print(f"easyscale: {self.id} got SIGTERM: leaving at the next step boundary", file=sys.stderr, flush=True)
        self._terminated = True  # a joiner not admitted yet withdraws (join)
        _release(self.store, self.id)

    def _departures(self) -> List[str]:
        """Members that asked to leave since rank 0 last looked (requests for former members are dropped)."""
        if not self.store.check(["releases"]):
            return []
        asked = self.store.get("releases").decode().split()
        new, self._releases_seen = asked[self._releases_seen:], len(asked)
        return [m for m in self.members if m in new]

    def on_scale(self, hook: Callable[[ScaleEvent], None]) -> None:
        """Call hook(event) on every process after each scale event it survives or joins."""
        self.hooks.append(hook)

    # -- joining ----------------------------------------------------------------------
    def start(self, ddp, optimizer, scheduler, position: Optional[Position] = None) -> Position:
        """Call once before training, on every process: a joiner joins (see join); a first process starts
        at `position` (default step 0; e.g. a checkpoint's). Returns the position to train from; from
        then on the process's virtual workers' contexts are replicated for recover()."""
        if self.joining:
            return self.join(ddp, optimizer, scheduler)
        position = position or Position()
        self._boundary = (position, ddp.synced_steps)
        ddp.on_step_contexts = self._replicate
        self._replicate(ddp.export_contexts(), position.step)  # what a loss during the first step goes back to
        self._replicated = position
        return position

    def join(self, ddp, optimizer, scheduler) -> Position:
        """For a joining process, once prepared: wait for admission, then adopt the job's state.

        Takes what step_boundary() takes (scheduler None if the job has none); a joiner whose
        optimizer or scheduler is not the members' kind fails here, before it is admitted.
        """
        if not self.joining:
            raise RuntimeError("join() is for processes started to join a running job")
        self._wait_for("job_state")  # published by rank 0 at its first step boundary
        theirs, mine = json.loads(self.store.get("job_state")), _job_state(ddp, optimizer, scheduler)
        differences = [f"{k}: {theirs[k]} in the job, {mine[k]} here" for k in theirs if theirs[k] != mine[k]]
        if differences:
            raise ValueError("this joining process does not hold the running job's state ("
                             + "; ".join(differences) + "): build the same model, optimizer and LR scheduler "
                             "as the members and pass them all: member.join(ddp, optimizer, scheduler)")
        self.store.set(f"ready/{self.id}", "1")
        while True:
            self.store.append("ready", self.id + "\n")  # one atomic write: a death mid-registration leaves no gap
            self._wait_for(f"admit/{self.id}")
            generation = int(self.store.get(f"admit/{self.id}"))
            try:
                self._enter(generation)
                break
            except MemberLost:  # a member died as this generation formed: wait for the next admission
                self.store.set(f"gen/{generation}/holds/{self.id}", json.dumps(None))  # no state: not a survivor
                self.store.delete_key(f"admit/{self.id}")
        self.joining = False
        position = self._adopt(ddp, optimizer, scheduler, joined=True)
        self._boundary = (position, ddp.synced_steps)
        ddp.on_step_contexts = self._replicate
        return position

    def _wait_for(self, key: str) -> None:
        """Wait for `key` in the job store; a SIGTERM meanwhile withdraws this joiner (it exits)."""
        while not self.store.check([key]):
            if self._terminated:
                self.store.set(f"lost/{self.id}", "withdrew")
                print(f"easyscale: {self.id} withdrew before it joined the job", file=sys.stderr, flush=True)
                raise SystemExit(0)
            time.sleep(0.05)

    def _ready_joiners(self) -> List[str]:
        if not self.store.check(["ready"]):
            return []
        return [who for who in dict.fromkeys(self.store.get("ready").decode().split())
                if not any(self.store.check([f"{k}/{who}"]) for k in ("admit", "lost"))
                and not self._liveness.stale(who)]

    # -- the step boundary --------------------------------------------------------------
    def step_boundary(self, ddp, optimizer, scheduler, position: Position, block: bool = False,
                      checkpointer=None) -> bool:
        """Call after every optimizer step, on every member. Returns False if this process left the job.

        A scale-out waits for its joiners to be prepared; meanwhile training goes
        on, unless `block` (for schedules that must take effect at this step).
        If every process asked to leave (SIGTERM), the job stops here: it saves
        `position` through `checkpointer` (a Checkpointer) first, if given.
        """
        if ddp.synced_steps > self._boundary[1]:  # the synced step since the last boundary replicated this state
            self._replicated = position
        self._boundary = (position, ddp.synced_steps)
        ddp.on_step_contexts = self._replicate
        proposal = self._rebalance(ddp, position.step)
        decision = [None]
        if self.rank == 0:
            if not self._published:
                self.store.set("job_state", json.dumps(_job_state(ddp, optimizer, scheduler)))
                self._published = True
            leaving = self._departures()
            if leaving:  # named departures first; a scale request waits for the next boundary
                decision[0] = [m for m in self.members if m not in leaving]
                self.store.set("target", str(max(len(decision[0]), 1)))
            else:
                decision[0] = self._decide(ddp.world_size)
            while block and decision[0] is None and self._pending():
                time.sleep(0.01)
                decision[0] = self._decide(ddp.world_size)
            if decision[0] is None and proposal is not None:
                decision[0] = self.members  # the same processes, another split
        dist.broadcast_object_list(decision, src=0)
        members = decision[0]
        if members is None:
            return True
        if not members:
            self._stop(position, checkpointer)
            return False
        start = time.perf_counter()
        old = self.members
        generation = self.generation + 1
        for v, ctx in ddp.export_contexts().items():
            self.store.set(f"gen/{generation}/ctx/{v}", ctx)
        if self.rank == 0:
            self.store.set(f"gen/{generation}/position",
                           json.dumps(astuple(position)))
            self.store.set(f"gen/{generation}/members", json.dumps(members))
            # A membership change splits evenly (a joiner's speed is unknown); a rebalance as proposed.
            ranges = ranges_of(proposal) if members == self.members else even_ranges(ddp.world_size, len(members))
            self.store.set(f"gen/{generation}/ranges", json.dumps(ranges))
            for who in members:
                if who not in old:
                    self.store.set(f"admit/{who}", str(generation))
        dist.barrier()
        if self.id not in members:
            self._leave_group()
            return False
        self._enter(generation)
        self._adopt(ddp, optimizer, scheduler, joined=False, start=start, old=old)
        return True

    def _stop(self, position: Position, checkpointer) -> None:
        """Every process leaves: the job ends here, saved if it can be."""
        if checkpointer is not None:
            checkpointer.save(position)
        elif self.rank == 0:
            print(f"easyscale: every process of the job left at step {position.step} and no checkpointer was "
                  "passed to step_boundary(): the state after this step is not saved", file=sys.stderr, flush=True)
        self._leave_group()

    def _rebalance(self, ddp, step: int) -> Optional[List[int]]:
        """New range sizes for rank 0 to decide on (None elsewhere, or to keep the split): a split
        requested through the store, else, every balancer interval, the Balancer's proposal from each
        process's measured seconds per virtual worker."""
        proposal = None
        if self.balancer is not None and step % self.balancer.interval == 0:
            seconds = [None] * len(self.members)
            dist.all_gather_object(seconds, ddp.seconds_per_worker())
            if self.rank == 0 and None not in seconds:
                proposal = self.balancer.propose(step, [hi - lo for lo, hi in ddp.ranges], seconds)
        if self.rank == 0 and self.store.check(["split"]):
            requested = json.loads(self.store.get("split"))
            self.store.delete_key("split")
            if len(requested) == len(self.members) and min(requested) >= 1 and sum(requested) == ddp.world_size:
                return requested
            print(f"easyscale: ignoring the split {requested}: it needs {len(self.members)} sizes >= 1 summing "
                  f"to {ddp.world_size}", file=sys.stderr, flush=True)
        return proposal

    def _pending(self) -> bool:
        return self.store.check(["target"]) and int(self.store.get("target")) != len(self.members)

    def _decide(self, world_size: int) -> Optional[List[str]]:
        if not self.store.check(["target"]):
            return None
        target = int(self.store.get("target"))
        if target > world_size:  # every process needs a virtual worker
            print(f"easyscale: {target} processes requested but the job has {world_size} virtual workers; "
                  f"scaling to {world_size}", file=sys.stderr, flush=True)
            target = world_size
            self.store.set("target", str(target))
        if target == len(self.members):
            return None
        if target < len(self.members):
            return self.members[:target]
        ready = self._ready_joiners()
        if len(ready) < target - len(self.members):
            return None  # keep training until enough joiners are prepared
        return self.members + ready[:target - len(self.members)]

    def _adopt(self, ddp, optimizer, scheduler, joined: bool, start: Optional[float] = None,
               old: Optional[List[str]] = None, src: int = 0,
               context_of: Optional[Callable[[int], bytes]] = None) -> Position:
        """Take the job's state from process `src` (a survivor: rank 0 after a scale event) and this
        process's virtual workers' contexts (from the scale event's export unless `context_of`)."""
        generation = self.generation
        step, epoch, step_in_epoch = json.loads(self.store.get(f"gen/{generation}/position"))
        ddp.process_group = dist.group.WORLD
        ddp.broadcast_state(src=src)
        states = [(optimizer.state_dict(), scheduler.state_dict() if scheduler else None, ddp.freezer_state())
                  if self.rank == src else None]
        dist.broadcast_object_list(states, src=src)  # pickles for us
        if self.rank != src:
            opt_state, sched_state, freezer_state = states[0]
            optimizer.load_state_dict(opt_state)
            if scheduler is not None:
                scheduler.load_state_dict(sched_state)
            ddp.load_freezer_state(freezer_state)
        lo, hi = json.loads(self.store.get(f"gen/{generation}/ranges"))[self.rank]
        exported = context_of is None
        context_of = context_of or (lambda v: self.store.get(f"gen/{generation}/ctx/{v}"))
        contexts = {v: context_of(v) for v in range(lo, hi)}
        ddp.reconfigure(dist.group.WORLD, contexts, virtual_ranks=(lo, hi))
        # What a loss in the next steps goes back to, in this process's own slots: its next replication must
        # not overwrite the state it continues from (a job coming from one process has none).
        self._replicate(contexts, step)
        if not exported:  # a survivor's buffers may hold a forward of the abandoned step: virtual rank 0's
            ddp.broadcast_buffers_from_rank0()
        dist.barrier()
        if exported and self.rank == 0:  # everyone has adopted: the store need not keep the contexts
            for v in range(ddp.world_size):
                self.store.delete_key(f"gen/{generation}/ctx/{v}")
        position = self._replicated = Position(step, epoch, step_in_epoch)
        if self.hooks:
            if old is None:  # a joiner learns the previous members from the store
                old = json.loads(self.store.get(f"gen/{generation - 1}/members"))
            event = ScaleEvent(step=step, old_procs=len(old), new_procs=len(self.members), generation=generation,
                               ranges=[tuple(r) for r in ddp.ranges],
                               seconds=time.perf_counter() - start if start is not None else 0.0,
                               joined=[m for m in self.members if m not in old],
                               left=[m for m in old if m not in self.members])
            for hook in self.hooks:
                hook(event)
        return position


    # -- surviving a lost process ----------------------------------------------------------
    def _replicate(self, contexts, step: Optional[int] = None) -> None:
        """ddp.on_step_contexts: this step's contexts into the store, tagged with the step they end and the
        order they were written in (generation, then this process's count: a worker has one owner in a
        generation). Slots go in turn, not by step: steps under no_sync() replicate nothing. A job on one
        process has no survivor to recover: it replicates from its first scale event on (_adopt)."""
        if len(self.members) == 1 and step is None:
            return
        step = self._boundary[0].step + 1 if step is None else step
        slot, tag = self._replications % _CONTEXT_SLOTS, f"{step} {self.generation} {self._replications}\n".encode()
        self._replications += 1
        self.store.multi_set([f"live/{slot}/ctx/{v}" for v in contexts], [tag + ctx for ctx in contexts.values()])

    def _live_context(self, v: int, step: int) -> Tuple[Optional[bytes], List[int]]:
        """Virtual worker v's newest replicated context for `step` (None if the store holds none), and the
        steps the store holds for it."""
        found = []
        for slot in range(_CONTEXT_SLOTS):
            key = f"live/{slot}/ctx/{v}"
            if self.store.check([key]):
                tag, ctx = self.store.get(key).split(b"\n", 1)
                found.append((tuple(int(x) for x in tag.split()), ctx))
        held = [(order, ctx) for (s, *order), ctx in found if s == step]
        newest = max(held, key=lambda h: h[0])[1] if held else None
        return newest, sorted(s for (s, *_), _ in found)

    def recover(self, error: BaseException, ddp, optimizer, scheduler, loader) -> Position:
        """Call with the error of a failed collective (raised in a step or at a step boundary), on every
        process the error reaches. If processes of the job died, the survivors continue without them, in
        place: returns the position to continue the training loop from (`loader` is set to it; the steps
        after it are redone). Re-raises `error` where it is no lost process, or where the job cannot go on
        in place (then restart from the last checkpoint)."""
        if not _communication_error(error):
            raise error
        if self._boundary is None:
            raise RuntimeError("a collective failed before this process's first step boundary, and "
                               "member.start(ddp, optimizer, scheduler, position) was not called before training: "
                               "nothing is replicated yet; restart the job from its last checkpoint") from error
        start = time.perf_counter()
        ddp.abandon_step()
        # Closing this process's connections fails the collectives other survivors may still wait in: the
        # group goes once nothing holds it, and the failed collective's frames do.
        traceback.clear_frames(error.__traceback__)
        self._leave_group()
        position, synced_then = self._boundary
        if ddp.synced_steps > synced_then:  # this step's gradients were handed over: the optimizer has stepped
            position = Position(position.step + 1, loader.epoch, loader.next_step)
        else:  # the last replicated state: steps since under no_sync() (their kept gradients) are redone
            position = self._replicated
        old, generation = self.members, self.generation
        self.store.set(f"gen/{generation}/holds/{self.id}", json.dumps(astuple(position)))
        decision = self._decide_survivors(generation, ddp.world_size, error)
        if "error" in decision:
            raise RuntimeError(decision["error"]) from error
        if self.id not in decision["members"]:
            raise RuntimeError(f"{self.id} was taken for lost (no heartbeat for {self.liveness_s} s) and the "
                               "job went on without it") from error
        members, new = decision["members"], decision["generation"]
        step = decision["position"][0]
        self.store.set(f"gen/{new}/position", json.dumps(decision["position"]))
        self.store.set(f"gen/{new}/ranges", json.dumps(even_ranges(ddp.world_size, len(members))))
        self.store.set(f"gen/{new}/members", json.dumps(members))
        print(f"easyscale: {self.id}: lost {', '.join(decision['lost']) or 'no process'}; continuing on "
              f"{len(members)} processes from step {step}", file=sys.stderr, flush=True)
        self._enter(new)
        position = self._adopt(ddp, optimizer, scheduler, joined=False, start=start, old=old,
                               src=members.index(decision["source"]),
                               context_of=lambda v: self._live_context(v, step)[0])
        self._boundary = (position, ddp.synced_steps)
        loader.reassign(ddp.local_ranks)
        loader.set_epoch(position.epoch, position.step_in_epoch)
        return position

    def _decide_survivors(self, generation: int, world_size: int, error: BaseException) -> dict:
        """Wait until every member of `generation` has said which step it holds or has lost its heartbeat;
        the first process to see that decides for all (compare_set)."""
        key = f"gen/{generation}/recovery"
        deadline = time.monotonic() + self.timeout.total_seconds()
        while not self.store.check([key]):
            held = [m for m in self.members if self.store.check([f"gen/{generation}/holds/{m}"])]
            lost = [m for m in self.members
                    if m not in held and (self.store.check([f"lost/{m}"]) or self._liveness.stale(m))]
            if len(held) + len(lost) == len(self.members):
                self.store.compare_set(key, "", json.dumps(self._survivors(generation, held, lost, world_size)))
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"no recovery decision within {self.timeout}: the members that neither "
                                   "failed nor lost their heartbeat are still in the step") from error
            time.sleep(0.02)
        return json.loads(self.store.get(key))

    def _survivors(self, generation: int, held: List[str], lost: List[str], world_size: int) -> dict:
        holds = {m: json.loads(self.store.get(f"gen/{generation}/holds/{m}")) for m in held}
        held = [m for m in held if holds[m] is not None]  # a joiner that had not taken the job's state yet
        if not held:
            return {"error": "every process holding the job's state was lost: restart it from its last checkpoint"}
        step = max(h[0] for h in holds.values())
        source = next(m for m in held if holds[m][0] == step)  # it holds the model and optimizer state
        for v in range(world_size):
            context, steps = self._live_context(v, step)
            if context is None:
                return {"error": f"virtual worker {v}'s context for step {step} is not in the job store (it holds "
                                 f"steps {steps or 'none'}): the job cannot continue in place; restart it from its "
                                 "last checkpoint"}
        latest = generation
        while self.store.check([f"gen/{latest + 1}/members"]):  # a scale event may have published one
            latest += 1
        for m in lost:
            self.store.set(f"lost/{m}", str(generation))
        return {"members": held, "lost": lost, "source": source, "position": holds[source],
                "generation": latest + 1}


class MemberLost(RuntimeError):
    """A process of the job was lost while the others waited for it outside a collective."""


def _communication_error(error: BaseException) -> bool:
    """Whether `error` is a collective's failure (a peer gone), not the training code's."""
    if isinstance(error, (dist.DistError, MemberLost)):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and any(
        s in text for s in ("Connection closed by peer", "Connection reset by peer", "gloo", "Broken pipe"))


class _Liveness:
    """Whose heartbeat has not moved for liveness_s, as seen from here (no clocks compared across
    machines). A process that has not started beating is still starting, not lost."""

    def __init__(self, store, liveness_s: float):
        self.store, self.liveness_s = store, liveness_s
        self.seen: Dict[str, Tuple[int, float]] = {}  # process -> (its last beat count, when first seen here)

    def stale(self, who: str) -> bool:
        beat, now = int(self.store.add(f"beat/{who}", 0)), time.monotonic()
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


def _job_state(ddp, optimizer, scheduler) -> dict:
    """The kinds of state step_boundary() carries to joiners, which a joiner must hold alike."""
    return {"virtual_world_size": ddp.world_size, "optimizer": type(optimizer).__name__,
            "parameter groups": [len(g["params"]) for g in optimizer.param_groups],
            "LR scheduler": type(scheduler).__name__ if scheduler is not None else None,
            "freezer": type(ddp.freezer).__name__ if ddp.freezer is not None else None}


def init_process_group(backend: str = "gloo", timeout_s: float = 300.0) -> None:
    """torch.distributed.init_process_group for a script under torchrun, robust to restarts.

    Each restart attempt rendezvouses under its own store prefix, so ranks of a
    new attempt never read the addresses a killed attempt left behind.
    """
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size=world,
                          is_master=(rank == 0 and not agent), timeout=timedelta(seconds=timeout_s))
    dist.init_process_group(backend, store=dist.PrefixStore(f"easyscale/attempt{attempt}", store), rank=rank,
                            world_size=world, timeout=timedelta(seconds=timeout_s))
