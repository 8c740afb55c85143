"""Fault injection at the points of a rendezvous that a test cannot reach from the training script: a process
whose $EASYSCALE_FAULT names a point SIGKILLs itself when it gets there, as a crash or a lost machine would
(tests/elastic, bench/bench_chaos.py). Unset, each point is one dictionary lookup."""
import os
import signal

FAULT_ENV = "EASYSCALE_FAULT"
POINTS = (
    "starting",     # a first member, before the job's first group forms
    "registering",  # a joiner, prepared and checked, before it says it is ready
    "admitted",     # a joiner told its generation, before that generation's group forms
    "admitting",    # a member, once rank 0 has written the next generation and admitted its joiners
    "adopting",     # any process of a new generation, as it takes the job's state (the state broadcast)
)


def reach(point: str) -> None:
    if os.environ.get(FAULT_ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)
