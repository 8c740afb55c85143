"""SIGTERM, the preemption signal: the first asks this process to leave at the next step boundary, in place
(its virtual workers move to the others); a second terminates at once (the job then needs its checkpoint)."""
import logging
import os
import signal
import threading
from typing import Callable

log = logging.getLogger(__name__)


def on_sigterm(leave: Callable[[], None]) -> None:
    """Call leave() on this process's first SIGTERM (from the main thread only, as Python requires)."""
    if threading.current_thread() is not threading.main_thread():
        return
    pid = os.getpid()

    def handler(signum, frame) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the second one terminates
        if os.getpid() != pid:  # a forked child (a DataLoader worker, a pool's): ends as by default
            os.kill(os.getpid(), signal.SIGTERM)
            return
        leave()

    signal.signal(signal.SIGTERM, handler)
