"""Every state in cluster mode and the only moves between them: a job's (the job table's), one incarnation's (its
supervisor's), and each of its processes'. Whatever the timing of rounds, verbs, faults and restarts, each reads
as a path through its graph; any other move raises IllegalMove and changes nothing.

A job, in the job table (JobTable.move):

    queued ─> running ─> suspending ─> suspended ─> running ─> ...
                 │                        ↑
                 ├────────────────────────┘  (its processes or its supervisor lost: it resumes from a checkpoint)
                 └─> finished | failed | cancelled   (from suspending too; cancelled from every live state)

An incarnation (a supervisor's run of the job, Run), and how its end moves the job (AFTER):

    placing ─> running ─> suspending ─> finished | failed | suspended | orphaned
       │          └─────────────────────────┘
       └─> orphaned   (suspended before any process started)

A process of the job (ProcessState): starting or joining, then training, then leaving, then gone (any of them may
end: gone).
"""
from enum import StrEnum


class IllegalMove(ValueError):
    pass


def move(moves: dict, current, to, what: str):
    """`to`, if `moves` allows it from `current`; else IllegalMove naming `what` moved."""
    if to not in moves.get(current, ()):
        raise IllegalMove(f"{what} cannot move to {to}: it is {current}")
    return to


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


def sources(to: JobState) -> tuple:
    """The states a job may move to `to` from."""
    return tuple(s for s, targets in MOVES.items() if to in targets)


class Run(StrEnum):
    PLACING = "placing"  # no slot given yet: no process started
    RUNNING = "running"  # its processes started; it grows, shrinks and moves in place
    SUSPENDING = "suspending"  # every process leaves at its next step boundary, the job saving a checkpoint there
    FINISHED = "finished"  # a member ended unasked with 0: it trained to its end
    FAILED = "failed"  # a process exited with an error (its code, the first error line)
    SUSPENDED = "suspended"  # every process left at a step boundary, the job saved there: it resumes from that step
    ORPHANED = "orphaned"  # its processes went with their nodes or were killed from outside: it resumes from its
    # newest checkpoint


RUN_MOVES = {
    Run.PLACING: {Run.RUNNING, Run.ORPHANED},
    Run.RUNNING: {Run.SUSPENDING, Run.FINISHED, Run.FAILED, Run.SUSPENDED, Run.ORPHANED},
    Run.SUSPENDING: {Run.FINISHED, Run.FAILED, Run.SUSPENDED, Run.ORPHANED},
}
AFTER = {Run.FINISHED: JobState.FINISHED, Run.FAILED: JobState.FAILED, Run.SUSPENDED: JobState.SUSPENDED,
         Run.ORPHANED: JobState.SUSPENDED}  # an incarnation's end -> its job's state


class ProcessState(StrEnum):
    STARTING = "starting"  # one of the job's first processes: a member once the first group forms
    JOINING = "joining"  # started to join the running job: prepares, then waits to be admitted
    TRAINING = "training"  # a member of the job's current group
    LEAVING = "leaving"  # released (it leaves at its next step boundary), or withdrawn before it was admitted
    GONE = "gone"  # exited


PROCESS_MOVES = {
    ProcessState.STARTING: {ProcessState.TRAINING, ProcessState.GONE},
    ProcessState.JOINING: {ProcessState.TRAINING, ProcessState.LEAVING, ProcessState.GONE},
    ProcessState.TRAINING: {ProcessState.LEAVING, ProcessState.GONE},
    ProcessState.LEAVING: {ProcessState.GONE},
}
