"""The elastic training loop, written once: `ElasticMember.run(train_step, ...)` does around the user's
step everything an elastic job needs (as torchrun's agent and Horovod's `hvd.elastic.run` do for theirs):
joining, resuming from a checkpoint and inside an epoch, the step count, which steps synchronise under
gradient accumulation, the optimizer and LR scheduler steps, step boundaries (scale events, departures,
rebalancing), periodic checkpoints, and recovery from a lost process, in place."""
import contextlib
import os
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .client import CHECKPOINT_ENV
from .state import Position


@dataclass
class Step:
    batches: Any   # every local virtual worker's micro-batch: iterate `ddp.workers(step.batches)`
    number: int    # steps done once this one is (1 for the first)
    epoch: int
    sync: bool     # False inside gradient accumulation (under ddp.no_sync(): no optimizer step follows)


def run(member, train_step: Callable[[Step], None], ddp, optimizer, loader, epochs: int, scheduler=None,
        checkpointer=None, checkpoint_every: int = 0, accumulate: int = 1, position: Optional[Position] = None,
        step_optimizer: bool = True) -> Optional[Position]:
    """Train `epochs` epochs of `loader` (a `ddp.data_loader`) with `train_step(step)`, which runs forward and
    backward for `step.batches`; on every synced step the loop then calls `optimizer.step()`,
    `optimizer.zero_grad()` and `scheduler.step()` (pass `step_optimizer=False` to do them in train_step,
    on `step.sync` steps only). Every `accumulate` steps synchronise (the others run under `no_sync()`).

    The job starts from `position`, else from `checkpointer`'s newest checkpoint (if given; a joiner takes
    the job's state instead), and saves one every `checkpoint_every` steps and when every process leaves.
    Without a checkpointer, one in the folder `$EASYSCALE_CHECKPOINT_DIR` names, if set (cluster mode sets it for
    every job, so a suspended job resumes where it stopped).
    Returns the final position, or None on a process that left the job (preempted, scaled in): it then
    holds no process group. An error of the training code ends the job on every process; a lost process
    does not.
    """
    if accumulate < 1 or checkpoint_every < 0:
        raise ValueError(f"need accumulate >= 1 and checkpoint_every >= 0, got {accumulate} and {checkpoint_every}")
    if checkpointer is None and os.environ.get(CHECKPOINT_ENV):
        from .checkpoint import Checkpointer
        checkpointer = Checkpointer(os.environ[CHECKPOINT_ENV], ddp, optimizer, scheduler)
    if position is None and checkpointer is not None and not member.joining:
        position = checkpointer.resume()
    member.total_steps = epochs * len(loader)
    position = member.start(ddp, optimizer, scheduler, position)
    loader.reassign(ddp.local_ranks)  # a joiner's share, or a checkpoint's uneven split

    def train_from(position: Position) -> Optional[Position]:
        step = position.step
        for epoch in range(position.epoch, epochs):
            loader.set_epoch(epoch, position.step_in_epoch if epoch == position.epoch else 0)
            for batches in loader:
                sync = (step + 1) % accumulate == 0
                with contextlib.nullcontext() if sync else ddp.no_sync():
                    train_step(Step(batches, step + 1, epoch, sync))
                if sync and step_optimizer:
                    optimizer.step()
                    optimizer.zero_grad()
                    if scheduler is not None:
                        scheduler.step()
                step += 1
                here = Position(step, epoch, loader.next_step)
                if checkpointer is not None and checkpoint_every and step % checkpoint_every == 0:
                    checkpointer.save(here)
                if not member.step_boundary(ddp, optimizer, scheduler, here, checkpointer=checkpointer):
                    return None
                loader.reassign(ddp.local_ranks)
        return Position(step, epochs, 0)

    while True:
        try:
            return train_from(position)
        except Exception as error:  # a lost process: the survivors go on in place; anything else is raised
            position = member.recover(error, ddp, optimizer, scheduler, loader)
