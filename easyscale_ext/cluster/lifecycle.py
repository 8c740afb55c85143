"""What a job's life can be: its states and the only moves between them. The cluster's job table refuses any
other move (JobTable.move), so whatever the timing of rounds, verbs, faults and restarts, a job's history reads as a
path through this graph:

    queued ─> running ─> suspending ─> suspended ─> running ─> ...
                 │                        ↑
                 ├────────────────────────┘  (its processes or its supervisor lost: it resumes from a checkpoint)
                 └─> finished | failed | cancelled   (from suspending too; cancelled from every live state)
"""
from enum import StrEnum


class JobState(StrEnum):
    QUEUED = "queued"  # submitted, never run: waits for slots
    RUNNING = "running"  # holds slots (its processes may still be starting or joining)
    SUSPENDING = "suspending"  # asked to leave its slots: saves a checkpoint at its next step boundary, then leaves
    SUSPENDED = "suspended"  # holds nothing: waits for slots to resume from its newest checkpoint
    FINISHED = "finished"  # trained to its end
    FAILED = "failed"  # its script exited with an error, or it could not be started
    CANCELLED = "cancelled"  # by `easyscale cancel`


MOVES = {
    JobState.QUEUED: {JobState.RUNNING, JobState.CANCELLED},
    JobState.RUNNING: {JobState.SUSPENDING, JobState.SUSPENDED, JobState.FINISHED, JobState.FAILED,
                       JobState.CANCELLED},
    JobState.SUSPENDING: {JobState.SUSPENDED, JobState.FINISHED, JobState.FAILED, JobState.CANCELLED},
    JobState.SUSPENDED: {JobState.RUNNING, JobState.CANCELLED},
}
WAITING = (JobState.QUEUED, JobState.SUSPENDED)  # a policy may give it slots
HOLDING = (JobState.RUNNING, JobState.SUSPENDING)  # it has a supervisor and, unless lost, processes on slots
LIVE = WAITING + HOLDING
ENDED = tuple(s for s in JobState if s not in LIVE)


class IllegalMove(ValueError):
    pass


def sources(to: JobState) -> tuple:
    """The states a job may move to `to` from."""
    return tuple(s for s, targets in MOVES.items() if to in targets)
