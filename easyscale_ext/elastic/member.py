"""ElasticMember: this process's part in a stop-free elastic job (as in EDL), in place on every event.

The public face of the elastic layer; its parts live beside it: membership.py (generations, rendezvous,
heartbeats), scaling.py (rank 0's decisions at a step boundary), recovery.py (replication and the
survivors' decision), signals.py (SIGTERM), state.py (what moves with the job), loop.py (`run`, the loop
that does all of this around the user's step).

- A joining process prepares first (model, optimizer and data built), then registers as ready and waits to
  be admitted (`start`).
- The members meet at a step boundary about every MEET_S seconds (every boundary with `block`, the first of a
  generation, the Balancer's): rank 0 looks at departures (SIGTERM, `request_release`), the target process count
  (`request_scale`), ready joiners and the split (`request_split`, the Balancer), and broadcasts whether the
  membership changes and at which step they meet next (meeting every step cost 15 % of a 33 ms step with 4
  processes on 2 CPU cores).
  On a change every member exports its virtual workers' contexts to the store, the old group is destroyed,
  leavers return, and survivors and joiners form the next generation: rank 0 (a
  survivor) broadcasts model, buffers and optimizer state, and every process adopts the contexts of the
  virtual workers it now owns.
- A process that dies is replaced in place (`recover`): the survivors continue from the newest step any of
  them holds, adopting the lost process's workers from their replicated contexts. The result is bitwise the
  fixed run's.
"""
import logging
import os
import time
import traceback
import uuid
from dataclasses import astuple, dataclass, field
from typing import Callable, List, Optional, Tuple, Union

import torch
import torch.distributed as dist

from ..placement import even_ranges, ranges_of
from . import client, faults, recovery, signals, state
from .balance import Balancer
from .membership import Membership
from .scaling import ScalingDecisions
from .state import Position

log = logging.getLogger(__name__)
# Members meet at a step boundary about this often: a scale request waits up to this much longer, and a meeting (a
# broadcast, rank 0's store reads: 1-5 ms with 4 processes on 2 CPU cores) costs about 1 % of the steps between.
MEET_S = 0.25


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
    """This process's membership in an elastic job: it joins the job's process group through the job's store
    (`easyscale run` and `easyscale submit` start the store and set $EASYSCALE_STORE), and `run(train_step, ddp,
    optimizer, loader, epochs, ...)` is the whole training loop, which scales in and out in place at step
    boundaries (`easyscale scale`, a scheduler, SIGTERM to leave), recovers in place from a lost process and
    checkpoints. Build it before the model: it forms the process group. examples/train_elastic.py is a complete
    job."""

    def __init__(self, address: Optional[str] = None, worker_id: Optional[str] = None, backend: str = "gloo",
                 timeout_s: float = 300.0, balance: Union[bool, Balancer, None] = None, liveness_s: float = 5.0):
        """`balance`: True or a Balancer rebalances virtual workers by measured speed (rank 0's
        Balancer decides); None reads $EASYSCALE_BALANCE (`easyscale run --balance` sets it).
        `liveness_s`: a process whose heartbeat stops this long is lost (see recover)."""
        address = address or os.environ.get(client.STORE_ENV)
        if not address:
            raise ValueError(f"no job store: pass address='host:port' or set {client.STORE_ENV} "
                             "(`easyscale run` and `easyscale submit` set it)")
        if liveness_s <= 0:
            raise ValueError(f"liveness_s must be > 0, got {liveness_s}")
        worker_id = worker_id or os.environ.get(client.ID_ENV) or uuid.uuid4().hex[:12]
        self.membership = Membership(address, worker_id, backend, timeout_s, liveness_s)
        self.store, self.id, self.liveness_s = self.membership.store, worker_id, liveness_s
        if balance is None:
            balance = os.environ.get(client.BALANCE_ENV) == "1"
        self.balancer = Balancer() if balance is True else (balance or None)
        self.scaling = ScalingDecisions(self.membership, self.balancer)
        self.replicas = recovery.Replicas(self.membership)
        self.joining = os.environ.get(client.JOIN_ENV) == "1"
        self.hooks: List[Callable[[ScaleEvent], None]] = []
        self._boundary: Optional[Tuple[Position, int]] = None  # the last step boundary and ddp.synced_steps then
        self._replicated: Optional[Position] = None  # where the store's newest copy of this process's contexts is
        self._published = False  # the job state joiners are checked against
        self._next_meeting: Optional[int] = None  # the step whose boundary the members meet at next (None: the next)
        self._last_meeting: Optional[Tuple[float, int]] = None  # rank 0: (time, step) of the last meeting
        self.total_steps: Optional[int] = None  # the run's length, where known (run() sets it): for a scheduler
        self._terminated = False
        signals.on_sigterm(self._leave_on_sigterm)
        if not self.joining:
            faults.reach("starting")
            self.membership.enter_first()

    @property
    def generation(self) -> int:
        return self.membership.generation

    @property
    def members(self) -> List[str]:
        return self.membership.members

    @property
    def rank(self) -> int:
        return self.membership.rank

    def on_scale(self, hook: Callable[[ScaleEvent], None]) -> None:
        """Call hook(event) on every process after each scale event it survives or joins."""
        self.hooks.append(hook)

    def run(self, train_step, ddp, optimizer, loader, epochs: int, scheduler=None, **options):
        """The whole elastic training loop around `train_step(step)`: see loop.run."""
        from .loop import run
        return run(self, train_step, ddp, optimizer, loader, epochs, scheduler, **options)

    def close(self) -> None:
        """End this process's part: stop its heartbeat, destroy its process group if it still has one (call
        at the end)."""
        self.membership.close()

    def _leave_on_sigterm(self) -> None:
        log.warning("%s got SIGTERM: leaving at the next step boundary", self.id)
        self._terminated = True  # a joiner not admitted yet withdraws (_wait_for)
        self.store.release(self.id)

    # -- before training -----------------------------------------------------------------
    def start(self, ddp, optimizer, scheduler, position: Optional[Position] = None) -> Position:
        """Call once before training, on every process: a joiner waits to be admitted and takes the job's
        state (its optimizer and scheduler must be the members' kinds, else it fails before admission); a
        first process starts at `position` (default step 0; e.g. a checkpoint's). Returns the position to
        train from; from then on the process's virtual workers' contexts are replicated for recover()."""
        if self.joining:
            return self._join(ddp, optimizer, scheduler)
        position = position or Position()
        self._boundary = (position, ddp.synced_steps)
        ddp.on_step_contexts = self._replicate
        self._replicate(ddp.export_contexts(), position.step)  # what a loss during the first step goes back to
        self._replicated = position
        return position

    def _join(self, ddp, optimizer, scheduler) -> Position:
        self._withdraw_if_asked()  # SIGTERM while it prepared: never registers
        self._wait_for(lambda: self.store.job_state() is not None)  # rank 0's, at its first step boundary
        differences = state.kind_differences(self.store.job_state(), state.job_kind(ddp, optimizer, scheduler))
        if differences:
            raise ValueError(f"this joining process does not hold the running job's state ({differences}): build "
                             "the same model, optimizer and LR scheduler as the members and pass them all: "
                             "member.start(ddp, optimizer, scheduler)")
        faults.reach("registering")
        self.store.register_ready(self.id)
        while True:
            self.store.announce_ready(self.id)
            self._wait_for(lambda: self.store.admitted(self.id))
            generation = self.store.admission(self.id)
            faults.reach("admitted")
            try:
                self.membership.enter(generation)
                position = self._adopt(ddp, optimizer, scheduler)
                break
            except Exception as error:  # a member died as this generation formed or gave it the job's state: the
                if not recovery.lost_peer(error, self.membership, wait_s=2 * self.liveness_s):  # others go on
                    raise  # without this process, which holds no state; it waits for the next admission
                self.membership.leave_group()
                self.store.set_holds(generation, self.id, None)  # no state: not a survivor
                self.store.unadmit(self.id)
                log.warning("%s: a member was lost as generation %d formed; waiting to be admitted again", self.id,
                            generation)
        self.joining = False
        self._boundary = (position, ddp.synced_steps)
        ddp.on_step_contexts = self._replicate
        return position

    def _wait_for(self, done: Callable[[], bool]) -> None:
        """Wait until `done()` (what the job store says); a SIGTERM meanwhile withdraws this joiner (it exits)."""
        while not done():
            self._withdraw_if_asked()
            time.sleep(0.05)

    def _withdraw_if_asked(self) -> None:
        if self._terminated:
            self.store.mark_lost(self.id, "withdrew")
            log.warning("%s withdrew before it joined the job", self.id)
            raise SystemExit(0)

    # -- the step boundary --------------------------------------------------------------
    def step_boundary(self, ddp, optimizer, scheduler, position: Position, block: bool = False,
                      checkpointer=None) -> bool:
        """Call after every optimizer step, on every member. Returns False if this process left the job
        (it then has no process group).

        The members meet at the boundaries rank 0 sets (about every MEET_S seconds); a request is acted on at the
        next meeting. A scale-out waits for its joiners to be prepared; meanwhile training goes on, unless `block`
        (for schedules that must take effect at this step: every boundary is then a meeting). If every process
        asked to leave (SIGTERM), the job stops here: it saves `position` through `checkpointer` (a Checkpointer)
        first, if given.
        """
        if self._boundary is None:  # the recipe from before start() existed: this boundary starts it
            self.start(ddp, optimizer, scheduler, position)
        if ddp.synced_steps > self._boundary[1]:  # the synced step since the last boundary replicated this state
            self._replicated = position
        self._boundary = (position, ddp.synced_steps)
        ddp.on_step_contexts = self._replicate
        if not block and self._next_meeting is not None and position.step < self._next_meeting:
            return True  # every member skips the same boundaries: they agreed on the next meeting at the last one
        proposal = self.scaling.proposed_split(ddp, position.step)
        decision = [None]
        steps_to_next = 1
        if self.rank == 0:
            if not self._published:
                self.store.publish_job_state(state.job_kind(ddp, optimizer, scheduler))
                self._published = True
            # What a scheduler reads: how far the job is, on how many processes (one small write a step).
            self.store.set_progress({"step": position.step, "epoch": position.epoch, "total": self.total_steps,
                                     "procs": len(self.members), "time": time.time()})
            decision[0] = self.scaling.next_members(ddp.world_size, block)
            if decision[0] is None and proposal is not None:
                decision[0] = self.members  # the same processes, another split
            steps_to_next = self._steps_to_next_meeting(position.step)
        # One small collective a meeting says whether anything changes and when the members meet next; the members
        # travel only when they change.
        plan = torch.tensor([decision[0] is not None, steps_to_next],
                            device=ddp.device if dist.get_backend() == "nccl" else "cpu")
        dist.broadcast(plan, src=0)
        self._next_meeting = position.step + int(plan[1])
        if not plan[0]:
            return True
        dist.broadcast_object_list(decision, src=0)
        members = decision[0]
        if not members:
            self._stop(position, checkpointer)
            return False
        start = time.perf_counter()
        old = self.members
        generation = self.generation + 1
        for v, ctx in ddp.export_contexts().items():
            self.store.set_context(generation, v, ctx)
        if self.rank == 0:
            self.store.set_position(generation, astuple(position))
            self.store.set_members(generation, members)
            # A membership change splits evenly (a joiner's speed is unknown); a rebalance as proposed.
            ranges = ranges_of(proposal) if members == self.members else even_ranges(ddp.world_size, len(members))
            self.store.set_ranges(generation, ranges)
            for who in members:
                if who not in old:
                    self.store.admit(who, generation)
        faults.reach("admitting")
        dist.barrier()
        if self.id not in members:
            self.membership.leave_group()
            return False
        self.membership.enter(generation)
        self._adopt(ddp, optimizer, scheduler, start=start, old=old)
        return True

    def _steps_to_next_meeting(self, step: int) -> int:
        """Rank 0: boundaries until the next meeting, about MEET_S of steps at the pace since the last one; the
        balancer's steps are meetings (it proposes there)."""
        now, last = time.perf_counter(), self._last_meeting
        self._last_meeting = now, step
        if last is None or step <= last[1]:
            return 1
        steps = max(1, round(MEET_S * (step - last[1]) / max(now - last[0], 1e-9)))
        if self.balancer is not None:
            steps = min(steps, self.balancer.interval - step % self.balancer.interval)
        return steps

    def _stop(self, position: Position, checkpointer) -> None:
        """Every process leaves: the job ends here, saved if it can be."""
        if self.rank == 0:  # stopped, not finished: what a supervisor needs to queue the job again
            self.store.set_stopped(position.step)
        if checkpointer is not None:
            checkpointer.save(position)
        elif self.rank == 0:
            log.warning("every process of the job left at step %d and no checkpointer was passed to "
                        "step_boundary(): the state after this step is not saved", position.step)
        self.membership.leave_group()

    def _adopt(self, ddp, optimizer, scheduler, start: Optional[float] = None, old: Optional[List[str]] = None,
               src: int = 0, context_of: Optional[Callable[[int], bytes]] = None) -> Position:
        """Take the job's state from process `src` (a survivor: rank 0 after a scale event) and this
        process's virtual workers' contexts (from the scale event's export unless `context_of`)."""
        generation = self.generation
        self._next_meeting = self._last_meeting = None  # a new generation meets at its first boundary
        step, epoch, step_in_epoch = self.store.position(generation)
        ddp.process_group = dist.group.WORLD
        faults.reach("adopting")
        ddp.broadcast_state(src=src)
        states = [state.training_state(ddp, optimizer, scheduler) if self.rank == src else None]
        dist.broadcast_object_list(states, src=src)  # pickles for us
        if self.rank != src:
            state.load_training_state(states[0], ddp, optimizer, scheduler)
        lo, hi = self.store.ranges(generation)[self.rank]
        exported = context_of is None
        context_of = context_of or (lambda v: self.store.context(generation, v))
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
                self.store.drop_context(generation, v)
        position = self._replicated = Position(step, epoch, step_in_epoch)
        if self.hooks:
            if old is None:  # a joiner learns the previous members from the store
                old = self.store.members(generation - 1)
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
        """ddp.on_step_contexts: this step's contexts into the store. A job on one process has no survivor
        to recover: it replicates from its first scale event on (_adopt)."""
        if len(self.members) == 1 and step is None:
            return
        self.replicas.write(contexts, self._boundary[0].step + 1 if step is None else step)

    def recover(self, error: BaseException, ddp, optimizer, scheduler, loader) -> Position:
        """Call with the error of a failed collective (raised in a step or at a step boundary), on every
        process the error reaches. If processes of the job died, the survivors continue without them, in
        place: returns the position to continue the training loop from (`loader` is set to it; the steps
        after it are redone). An error of the training code itself is re-raised, and the job's other
        processes stop too (a TrainingError) instead of going on without this one; so is an error where
        the job cannot go on in place (then restart from the last checkpoint)."""
        if not recovery.lost_peer(error, self.membership, wait_s=2 * self.liveness_s):
            recovery.report_training_error(error, self.membership)
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
        self.membership.leave_group()
        position, synced_then = self._boundary
        if ddp.synced_steps > synced_then:  # this step's gradients were handed over: the optimizer has stepped
            position = Position(position.step + 1, loader.epoch, loader.next_step)
        else:  # the last replicated state: steps since under no_sync() (their kept gradients) are redone
            position = self._replicated
        old, generation = self.members, self.generation
        self.store.set_holds(generation, self.id, astuple(position))
        decision = recovery.decide_survivors(self.membership, self.replicas, ddp.world_size,
                                             self.membership.timeout.total_seconds())
        if "error" in decision:
            kind = recovery.TrainingError if "failed" in decision else RuntimeError
            raise kind(decision["error"]) from error
        if self.id not in decision["members"]:
            raise RuntimeError(f"{self.id} was taken for lost (no heartbeat for {self.liveness_s} s) and the "
                               "job went on without it") from error
        members, new = decision["members"], decision["generation"]
        step = decision["position"][0]
        self.store.set_position(new, decision["position"])
        self.store.set_ranges(new, even_ranges(ddp.world_size, len(members)))
        self.store.set_members(new, members)
        log.warning("%s: lost %s; continuing on %d processes from step %d", self.id,
                    ", ".join(decision["lost"]) or "no process", len(members), step)
        self.membership.enter(new)
        position = self._adopt(ddp, optimizer, scheduler, start=start, old=old,
                               src=members.index(decision["source"]),
                               context_of=lambda v: self.replicas.context(v, step)[0])
        self._boundary = (position, ddp.synced_steps)
        loader.reassign(ddp.local_ranks)
        loader.set_epoch(position.epoch, position.step_in_epoch)
        return position
