"""SIGTERM, the preemption signal: the first asks this process to leave at the next step boundary, in place
(its virtual workers move to the others); a second terminates at once (the job then needs its checkpoint)."""
import logging
import os
import signal
import threading
from typing import Callable

log = logging.getLogger(__name__)


def _default_in_forked_child() -> None:
    # A DataLoader worker or a pool's process ends on SIGTERM, as by default. Done at the fork, not in the
    # handler: a Python-level handler runs only between bytecodes, so a signal that lands just before a
    # blocking call (a 30 s sleep, a queue read) would wait for that call to return.
    if getattr(signal.getsignal(signal.SIGTERM), "__module__", None) == __name__:  # on_sigterm's
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


os.register_at_fork(after_in_child=_default_in_forked_child)


def on_sigterm(leave: Callable[[], None]) -> None:
    """Call leave() on this process's first SIGTERM (from the main thread only, as Python requires)."""
    if threading.current_thread() is not threading.main_thread():
        return
    pid = os.getpid()

    def handler(signum, frame) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the second one terminates
        if os.getpid() != pid:  # a child forked past os.fork (by C code): never leaves in its parent's name
            os.kill(os.getpid(), signal.SIGTERM)
            return
        leave()

    signal.signal(signal.SIGTERM, handler)
