"""A job's state, assembled in one place for every path that moves it: a checkpoint, a joiner's (or a
recovering survivor's) adoption from a member, and the kinds a joiner is checked against.

The model's parameters and buffers travel through EasyScaleDDP (broadcast or state_dict), each virtual
worker's context through the context store's bytes; what is here is the rest: optimizer, LR scheduler,
freezer, and where training resumes.
"""
from dataclasses import dataclass
from typing import Optional


@dataclass
class Position:
    """Where training resumes: the global step count and the position in the data."""
    step: int = 0
    epoch: int = 0
    step_in_epoch: int = 0


def training_state(ddp, optimizer, scheduler) -> dict:
    """The state beside the model that every process holds alike."""
    return {"optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "freezer": ddp.freezer_state()}


def load_training_state(state: dict, ddp, optimizer, scheduler) -> None:
    """Take `training_state`'s output; a ValueError says what does not fit this job."""
    optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None:
        if state["scheduler"] is None:
            raise ValueError("it holds no LR scheduler state but this job has a scheduler")
        scheduler.load_state_dict(state["scheduler"])
    ddp.load_freezer_state(state["freezer"])


def job_kind(ddp, optimizer, scheduler) -> dict:
    """What a joining process must hold alike to take the job's state (checked before it is admitted)."""
    return {"virtual_world_size": ddp.world_size, "optimizer": type(optimizer).__name__,
            "parameter groups": [len(g["params"]) for g in optimizer.param_groups],
            "LR scheduler": type(scheduler).__name__ if scheduler is not None else None,
            "freezer": type(ddp.freezer).__name__ if ddp.freezer is not None else None}


def kind_differences(theirs: dict, mine: dict) -> Optional[str]:
    """None if a joiner's kinds match the job's, else what differs."""
    differences = [f"{k}: {theirs[k]} in the job, {mine[k]} here" for k in theirs if theirs[k] != mine.get(k)]
    return "; ".join(differences) or None
