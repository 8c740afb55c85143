"""Starting a job's processes: forked from an interpreter that has torch loaded, where that is the same as starting
a fresh one (`easyscale run`'s processes, and cluster mode's on each node).

Importing torch costs a process seconds of CPU (4 s on a 2.45 GHz EPYC), more than a small job's training, and a
joining process's start is what a scale-up waits for. So `easyscale run` starts `python script.py ...` through
Python's fork server (multiprocessing's "forkserver": a single-threaded interpreter, started once per launching
process, that has imported torch and easyscale_ext and forks a child per request) and runs the script as
`__main__` with its argv, environment, search path and output file. What an interpreter reads only as it starts
or loads a library (PYTHON*, OpenMP's OMP_*, MKL's settings) is then the fork server's: a process whose
environment differs from the server's in anything but the variables the launcher sets per process (read once the
script runs) is started fresh, with `subprocess`, as is a command other than `python script.py`, and every process
where the environment says EASYSCALE_FORK_SERVER=0. Imports no torch (the fork server does).
"""
import atexit
import json
import multiprocessing
import os
import runpy
import select
import signal
import subprocess
import sys
import threading
from multiprocessing import forkserver
from typing import Dict, Optional, Sequence

FORK_SERVER_ENV = "EASYSCALE_FORK_SERVER"  # "0": every process a fresh interpreter
# torch, torch.distributed, the extension and the elastic runtime; and torch._dynamo, which every torch.optim
# optimizer imports as it is first built (1 s of CPU in each process otherwise, a small job's whole training).
PRELOAD = ["easyscale_ext.elastic", "torch._dynamo"]
_server = {}  # the fork server this process started: "env" it runs under, "path" a script's sys.path there


class Forked:
    """A process from the fork server, as the launcher uses a `subprocess.Popen`."""

    def __init__(self, process):
        self._process = process
        self.pid = process.pid

    @property
    def returncode(self) -> Optional[int]:
        return self._process.exitcode  # negative: the signal that ended it, as Popen's

    def poll(self) -> Optional[int]:
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
        return self._process.exitcode

    def kill(self) -> None:
        if self.poll() is None:  # as Popen: never signal a pid that may have been reused
            self._process.kill()


def start(argv: Sequence[str], env: Dict[str, str], per_process: Sequence[str], log_path: Optional[str] = None,
          cpu: Optional[int] = None, die_with: Optional[int] = None, append: bool = False):
    """Process `argv` with `env`, its output to `log_path` (None: this process's), on core `cpu` (None: any): a
    `Forked` one where the fork server can start it as a fresh interpreter would, else a `subprocess.Popen`.
    `per_process`: the variables that may differ from the server's environment. `die_with` (forked only): the pid
    of a process whose end kills this one, in a session of its own, with whatever it started. `append`: to the end of
    `log_path` (else it is emptied first)."""
    argv = list(argv)
    if forkable(argv, env, per_process):
        if log_path:
            open(log_path, "a" if append else "w").close()  # there once started, as with Popen; the child appends
        process = multiprocessing.get_context("forkserver").Process(
            target=_run_script, args=(argv, env, _server["path"], log_path, cpu, die_with))
        process.start()
        return Forked(process)
    out = open(log_path, "a" if append else "w") if log_path else None
    try:
        child = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    finally:
        if out is not None:
            out.close()  # the child holds its own descriptor
    if cpu is not None:  # pinned while the interpreter starts, before it starts any thread
        os.sched_setaffinity(child.pid, {cpu})
    return child


def fork_server_on(env: Dict[str, str]) -> bool:
    """What EASYSCALE_FORK_SERVER in `env` says; a ValueError naming the choices for any other value."""
    setting = env.get(FORK_SERVER_ENV, "1")
    if setting not in ("0", "1"):
        raise ValueError(f"{FORK_SERVER_ENV}={setting!r}: set 1 (fork processes from a server with torch loaded, "
                         "the default) or 0 (start each as a fresh interpreter)")
    return setting == "1"


def forkable(argv: Sequence[str], env: Dict[str, str], per_process: Sequence[str]) -> bool:
    """Whether `start` forks `argv` under `env` (the first call starts the fork server, under `env`)."""
    script = len(argv) >= 2 and argv[0] == sys.executable and argv[1].endswith(".py")
    if not fork_server_on(env) or not script or "PYTHONSAFEPATH" in env:  # (no script folder first in sys.path)
        return False
    if not _server:
        _start_server({k: v for k, v in env.items() if k not in per_process})
    server, ours = _server["env"], set(per_process)
    return all(env.get(k) == server.get(k) for k in env.keys() | server.keys() if k not in ours)


def _start_server(env) -> None:
    """The fork server, under `env`; and the search path a script started fresh under `env` would have, but for
    its own folder (which each child puts first)."""
    path = subprocess.run([sys.executable, "-c", "import json, sys; print(json.dumps(sys.path[1:]))"], env=env,
                          check=True, capture_output=True, text=True).stdout
    # "__main__": the server runs the launching program's main module once (as multiprocessing's children do,
    # under `if __name__ == "__main__":`), so that no child runs it again before its script.
    multiprocessing.get_context("forkserver").set_forkserver_preload(["__main__", *PRELOAD])
    saved = {k: os.environ.get(k) for k in os.environ.keys() | env.keys() if os.environ.get(k) != env.get(k)}
    _set_environment({k: env.get(k) for k in saved})  # the server inherits this process's environment
    try:
        forkserver.ensure_running()
    finally:
        _set_environment(saved)
    _server.update(env=dict(env), path=json.loads(path))


def _die_with(pid: int) -> None:
    """SIGKILL this session once process `pid` has ended (what PR_SET_PDEATHSIG does for a parent), from a thread
    that waits on the process's pidfd."""
    try:
        ended = os.pidfd_open(pid)
    except ProcessLookupError:
        os.killpg(0, signal.SIGKILL)

    def watch():
        select.select([ended], [], [])
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, daemon=True, name="easyscale-die-with").start()


def _set_environment(values) -> None:
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _run_script(argv, env, path, log_path, cpu, die_with) -> None:
    """In the forked child: what `python script.py args...` sets up, then the script as `__main__`."""
    if die_with is not None:
        os.setsid()
        _die_with(die_with)
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    os.environ.clear()
    os.environ.update(env)
    if log_path:
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    sys.argv = argv[1:]
    sys.path[:] = [os.path.dirname(os.path.abspath(argv[1])), *path]
    try:
        runpy.run_path(argv[1], run_name="__main__")
    finally:
        atexit._run_exitfuncs()  # a multiprocessing child ends in os._exit, which runs none
