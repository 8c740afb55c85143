"""One process of a job on one slot: a Ray actor that runs the training script as a child process, so that
the script runs unchanged (as under `easyscale run`) and its death is the child's, never the actor's. The
child dies with the actor (a node lost, the actor killed): no training process outlives its slot."""
import os
import signal
import subprocess
import sys
from typing import Dict, List, Optional

import ray

# Run before the script, in its process: the kernel sends it SIGKILL when the actor's process ends (Linux's
# PR_SET_PDEATHSIG, kept across exec). Not a preexec_fn: Python code between fork and exec can deadlock in
# a process with threads, as Ray's workers are.
DIE_WITH_PARENT = ("import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGKILL); "
                   "os.execvp(sys.argv[1], sys.argv[1:])")


@ray.remote(num_cpus=0)
class SlotWorker:
    def __init__(self, argv: List[str], env: Dict[str, str], log_path: str):
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.child = subprocess.Popen([sys.executable, "-c", DIE_WITH_PARENT, *argv], env=dict(os.environ, **env),
                                          stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def poll(self) -> Optional[int]:
        """The child's exit code, None while it runs."""
        return self.child.poll()

    def terminate(self) -> None:
        """SIGTERM: the process leaves the job at its next step boundary, in place (a preemption)."""
        if self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)

    def kill(self) -> Optional[int]:
        """Kill the child and whatever it started (DataLoader workers); returns its exit code."""
        if self.child.poll() is None:
            try:
                os.killpg(self.child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return self.child.wait()

    def log(self, offset: int = 0, limit: int = 1 << 20) -> bytes:
        """Bytes of the child's output from `offset` (logs travel through Ray: no shared file system needed)."""
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            return f.read(limit)

