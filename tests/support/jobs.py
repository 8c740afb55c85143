"""Runs tests/support/train_job.py as real processes on localhost and returns rank 0's state hash."""
import contextlib
import functools
import os
import signal
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional

import pytest

from easyscale_ext import determinism, spawn

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_job.py")
# Seconds a job may take to start processes and reach its first steps under Ray: slot actors start and its
# processes import torch, on two cores the other test worker keeps busy (over 100 s on the slower machines).
START_S = 240


# The environment the tests' jobs run under: this process's as its tests were collected, with one intra-op thread.
# Fixed, not read at each start: what changes os.environ later (pytest's PYTEST_CURRENT_TEST for each test, a module
# that sets a thread count as it is imported, a local Ray's variables) would make a later job's environment differ
# from the fork server's, and easyscale_ext.spawn would start its processes fresh (4 s of CPU each).
JOB_ENV = dict({k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}, OMP_NUM_THREADS="1")


def job_env() -> Dict[str, str]:
    """JOB_ENV, a copy; the first call starts this process's fork server under it, so that the jobs of every test
    in one pytest worker fork from one server."""
    spawn.forkable([sys.executable, JOB], JOB_ENV, ())
    return dict(JOB_ENV)


def _wait(child, timeout: float) -> None:
    try:
        child.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass  # killed in run_job's clean-up; its log says where it was


def _flags(options) -> List[str]:
    out = []
    for key, value in options.items():
        out += ["--" + ("virtual-workers" if key == "n" else key.replace("_", "-")), str(value)]
    return out


def descendants(pid: int) -> List[int]:
    """Every process below `pid` (from /proc), including those in sessions of their own (torchrun's workers)."""
    children: Dict[int, List[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(proc: subprocess.Popen) -> None:
    """Kill `proc` and everything it started, whatever happened to the test (call in a finally). One that
    has exited is left alone: its pid may be another process's by now."""
    if proc.poll() is not None:
        return
    for pid in descendants(proc.pid) + [proc.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:  # gone already
            pass
    proc.wait()


def run_job(mode: str, procs: int = 1, env_per_rank: Optional[List[Dict[str, str]]] = None, timeout: int = 240,
            **options) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "hash")
        args = [sys.executable, JOB, "--mode", mode, "--procs", str(procs), "--out", out,
                "--init", "file://" + os.path.join(tmp, "rendezvous")]
        args += _flags(options)
        env_per_rank = env_per_rank or [{}] * procs
        # Ranks of one environment fork from one process after its imports (4 s of CPU each saved); ranks that
        # emulate different machines start as processes of their own, each reading its environment at start-up
        # (and so does a job whose environment differs from the fork server's: spawn starts it fresh).
        starts = [["--rank", "0", "--fork", "1"]] if all(e == env_per_rank[0] for e in env_per_rank) else \
            [["--rank", str(rank)] for rank in range(procs)]
        base, children = job_env(), []
        try:
            for rank, flags in enumerate(starts):
                argv, env, log = args + flags, dict(base, **env_per_rank[rank]), os.path.join(tmp, f"log.{rank}")
                if spawn.forkable(argv, env, ()):  # leads a process group of its own, with the ranks it forks
                    children.append(spawn.start(argv, env, (), log_path=log, die_with=os.getpid()))
                    continue
                with open(log, "w") as output:
                    children.append(subprocess.Popen(argv, env=env, stdout=output, stderr=subprocess.STDOUT,
                                                     start_new_session=True))
            for child in children:
                _wait(child, timeout)
        finally:
            for child in children:
                kill_tree(child)
                # Forked ranks left behind by a rank 0 that failed first are no longer its descendants, but stay in
                # its process group (which keeps its id while one of them lives).
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)
        logs = [open(os.path.join(tmp, f"log.{rank}")).read() for rank in range(len(starts))]
        failed = [(i, c.returncode) for i, c in enumerate(children) if c.returncode != 0]
        if failed:
            raise RuntimeError(f"{mode} job failed {failed}:\n" + "\n".join(logs))
        with open(out) as f:
            return f.read()


def buffer_hashes(mode: str, procs: int, **options) -> List[str]:
    """Each process's own buffers after a run_job run, by rank."""
    with tempfile.TemporaryDirectory() as tmp:
        run_job(mode, procs, buffers_out=os.path.join(tmp, "buffers"), **options)
        return [open(os.path.join(tmp, f"buffers.{rank}")).read() for rank in range(procs)]


def run_elastic(procs: int, schedule: str, timeout: int = 300, cpus=None, env_per_process=None, stops=False,
                **options) -> str:
    """An in-place scaling run under easyscale_ext.launcher; returns the final rank 0's hash ("" if `stops`:
    every process leaves before the end)."""
    from easyscale_ext.elastic.launcher import ElasticLauncher

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "hash")
        args = [sys.executable, JOB, "--mode", "easyscale", "--elastic", "1", "--schedule", schedule, "--out", out]
        args += _flags(options)
        launcher = ElasticLauncher(args, procs, env=job_env(), log_dir=tmp, cpus=cpus,
                                   env_per_process=env_per_process)
        code = launcher.run(timeout_s=timeout)
        logs = "".join(open(os.path.join(tmp, f)).read() for f in sorted(os.listdir(tmp)) if f.endswith(".log"))
        if stops and code == 0 and not os.path.exists(out):
            return ""
        if code != 0 or not os.path.exists(out):
            final = "a final state was written" if os.path.exists(out) else "no final state"
            raise RuntimeError(f"elastic job failed ({code}, {final}):\n{logs}")
        with open(out) as f:
            return f.read()


def run_torchrun(procs: int, port: int, timeout: int = 300, **options):
    """A torchrun job (c10d rendezvous, restarts on failure); returns rank 0's hash."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "hash")
        args = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:1", "--nproc-per-node", str(procs),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--max-restarts", "3",
                "--monitor-interval", "0.2", JOB, "--mode", "easyscale", "--torchrun", "1", "--out", out]
        args += _flags(options)
        agent = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=dict(os.environ, OMP_NUM_THREADS="1"))
        try:
            stdout, stderr = agent.communicate(timeout=timeout)
        finally:
            kill_tree(agent)  # the agent's workers run in sessions of their own
        if agent.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(f"torchrun job failed ({agent.returncode}):\n{stdout}\n{stderr}")
        with open(out) as f:
            return f.read(), stderr


@functools.lru_cache(maxsize=None)
def reference(model="cnn", n=4, level="D0", isa=None, accumulate=1, amp="none", steps=3, epochs=2):
    """The single-process reference (train_job.py's defaults: 3 steps an epoch, 2 epochs); `isa` caps its kernels
    at that level (an older machine). Computed once per test process: the tests of one module share it."""
    env = dict(determinism.environment(level), **(determinism.isa_caps(isa) if isa else {}))
    return run_job("reference", n=n, model=model, level=level, accumulate=accumulate, amp=amp, steps=steps,
                   epochs=epochs, env_per_rank=[env])


D1 = determinism.environment("D1")
# The emulated older machine: one instruction-set level below the one kernels run at here.
NATIVE = determinism.native_isa()
OLDER = determinism.isa_below(NATIVE)
needs_older = pytest.mark.skipif(OLDER is None, reason=f"no instruction-set level below this CPU's ({NATIVE}) "
                                                       "to emulate an older machine with")


def run_script(argv: List[str], cwd, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run `python ARGV` (one intra-op thread) to its end; whatever it started (Lightning's or torchrun's worker
    processes) is killed afterwards. Past `timeout` it is killed too, and returns what it printed until then (the
    caller's assertion shows where it hung)."""
    proc = subprocess.Popen([sys.executable, *argv], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        out, err = proc.communicate(timeout=60)
        err += f"\n[killed: still running after {timeout} s]"
    finally:
        kill_tree(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def printed_state(out: subprocess.CompletedProcess) -> str:
    """The one `state SHA-256` line an example prints, failing with its output if it did not end well."""
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("state ")]
    assert len(lines) == 1, out.stdout
    return lines[0]


def in_readme(path: str) -> bool:
    """Whether the README shows the file at `path` verbatim."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "README.md")) as f, open(path) as g:
        return g.read() in f.read()


def logged_steps(times) -> list:
    """(worker, step, time, its virtual workers) of every step train_job.py logged to `times` (--log-times, a
    pathlib path; none before it exists)."""
    out = []
    for line in times.read_text().splitlines() if times.exists() else []:
        worker, step, at, local = line.split()[:4]
        out.append((worker, int(step), float(at), int(local)))
    return out
