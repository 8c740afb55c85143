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
"""
import json
import os
import signal
import sys
import threading
import time
import uuid
from dataclasses import astuple, dataclass, field
from datetime import timedelta
from typing import Callable, List, Optional, Tuple, Union

import torch
import torch.distributed as dist

from .balance import Balancer, ranges_of
from .checkpoint import Position
from .ddp import even_ranges

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
    store.set(f"release_at/{int(store.add('release_seq', 1))}", worker)


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
                 timeout_s: float = 300.0, balance: Union[bool, Balancer, None] = None):
        """`balance`: True or a Balancer rebalances virtual workers by measured speed (rank 0's
        Balancer decides); None reads $EASYSCALE_BALANCE (`easyscale run --balance` sets it)."""
        address = address or os.environ.get(STORE_ENV)
        if not address:
            raise ValueError(f"no job store: pass address='host:port' or set {STORE_ENV}")
        self.store = connect(address, timeout_s)
        self.id = worker_id or os.environ.get(ID_ENV) or uuid.uuid4().hex[:12]
        self.backend = backend
        self.timeout = timedelta(seconds=timeout_s)
        self.joining = os.environ.get(JOIN_ENV) == "1"
        self.generation = -1
        self.members: List[str] = []
        self.hooks: List[Callable[[ScaleEvent], None]] = []
        self._published = False  # the job state joiners are checked against
        self._releases_seen = 0  # rank 0: departures requested so far that it has read
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
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group(self.backend, store=dist.PrefixStore(f"gen{generation}", self.store),
                                rank=self.members.index(self.id), world_size=len(self.members), timeout=self.timeout)

    @property
    def rank(self) -> int:
        return self.members.index(self.id)

    def _on_sigterm(self, signum, frame) -> None:
        """Leave at the next step boundary, in place. A second SIGTERM terminates at once (the job then
        needs its last checkpoint)."""
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        print(f"easyscale: {self.id} got SIGTERM: leaving at the next step boundary", file=sys.stderr, flush=True)
        _release(self.store, self.id)

    def _departures(self) -> List[str]:
        """Members that asked to leave since rank 0 last looked (requests for former members are dropped)."""
        count = int(self.store.add("release_seq", 0))
        asked = [self.store.get(f"release_at/{i}").decode() for i in range(self._releases_seen + 1, count + 1)]
        self._releases_seen = count
        return [m for m in self.members if m in asked]

    def on_scale(self, hook: Callable[[ScaleEvent], None]) -> None:
        """Call hook(event) on every process after each scale event it survives or joins."""
        self.hooks.append(hook)

    # -- joining ----------------------------------------------------------------------
    def join(self, ddp, optimizer, scheduler) -> Position:
        """For a joining process, once prepared: wait for admission, then adopt the job's state.

        Takes what step_boundary() takes (scheduler None if the job has none); a joiner whose
        optimizer or scheduler is not the members' kind fails here, before it is admitted.
        """
        if not self.joining:
            raise RuntimeError("join() is for processes started to join a running job")
        self.store.wait(["job_state"])  # published by rank 0 at its first step boundary
        theirs, mine = json.loads(self.store.get("job_state")), _job_state(ddp, optimizer, scheduler)
        differences = [f"{k}: {theirs[k]} in the job, {mine[k]} here" for k in theirs if theirs[k] != mine[k]]
        if differences:
            raise ValueError("this joining process does not hold the running job's state ("
                             + "; ".join(differences) + "): build the same model, optimizer and LR scheduler "
                             "as the members and pass them all: member.join(ddp, optimizer, scheduler)")
        self.store.set(f"ready/{self.id}", "1")
        self.store.add("ready_count", 1)
        self.store.set(f"ready_at/{int(self.store.add('ready_seq', 1))}", self.id)
        self.store.wait([f"admit/{self.id}"])
        generation = int(self.store.get(f"admit/{self.id}"))
        self._enter(generation)
        self.joining = False
        return self._adopt(ddp, optimizer, scheduler, joined=True)

    def _ready_joiners(self) -> List[str]:
        count = int(self.store.add("ready_seq", 0))
        out = []
        for i in range(1, count + 1):
            who = self.store.get(f"ready_at/{i}").decode()
            if not self.store.check([f"admit/{who}"]):
                out.append(who)
        return out

    # -- the step boundary --------------------------------------------------------------
    def step_boundary(self, ddp, optimizer, scheduler, position: Position, block: bool = False,
                      checkpointer=None) -> bool:
        """Call after every optimizer step, on every member. Returns False if this process left the job.

        A scale-out waits for its joiners to be prepared; meanwhile training goes
        on, unless `block` (for schedules that must take effect at this step).
        If every process asked to leave (SIGTERM), the job stops here: it saves
        `position` through `checkpointer` (a Checkpointer) first, if given.
        """
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
            dist.destroy_process_group()
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
        dist.destroy_process_group()

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
               old: Optional[List[str]] = None) -> Position:
        generation = self.generation
        step, epoch, step_in_epoch = json.loads(self.store.get(f"gen/{generation}/position"))
        # Rank 0 is a survivor: its model, buffers and optimizer state are the job's.
        ddp.process_group = dist.group.WORLD
        ddp.broadcast_state(src=0)
        states = [(optimizer.state_dict(), scheduler.state_dict() if scheduler else None, ddp.freezer_state())
                  if self.rank == 0 else None]
        dist.broadcast_object_list(states, src=0)  # pickles for us
        if self.rank != 0:
            opt_state, sched_state, freezer_state = states[0]
            optimizer.load_state_dict(opt_state)
            if scheduler is not None:
                scheduler.load_state_dict(sched_state)
            ddp.load_freezer_state(freezer_state)
        lo, hi = json.loads(self.store.get(f"gen/{generation}/ranges"))[self.rank]
        ddp.reconfigure(dist.group.WORLD, {v: self.store.get(f"gen/{generation}/ctx/{v}") for v in range(lo, hi)},
                        virtual_ranks=(lo, hi))
        dist.barrier()
        if self.rank == 0:  # everyone has adopted: the store need not keep the contexts
            for v in range(ddp.world_size):
                self.store.delete_key(f"gen/{generation}/ctx/{v}")
        position = Position(step, epoch, step_in_epoch)
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
