"""Runs tests/train_job.py as real processes on localhost and returns rank 0's state hash."""
import functools
import os
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional

import pytest

from easyscale_ext.runtime import determinism

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_job.py")


def _flags(options) -> List[str]:
    out = []
    for key, value in options.items():
        out += ["--" + ("virtual-workers" if key == "n" else key.replace("_", "-")), str(value)]
    return out


def run_job(mode: str, procs: int = 1, env_per_rank: Optional[List[Dict[str, str]]] = None, timeout: int = 240,
            **options) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "hash")
        args = [sys.executable, JOB, "--mode", mode, "--procs", str(procs), "--out", out,
                "--init", "file://" + os.path.join(tmp, "rendezvous")]
        args += _flags(options)
        children = []
        for rank in range(procs):
            env = dict(os.environ, OMP_NUM_THREADS="1")
            env.update((env_per_rank or [{}] * procs)[rank])
            children.append(subprocess.Popen(args + ["--rank", str(rank)], env=env, stdout=subprocess.PIPE,
                                             stderr=subprocess.STDOUT, text=True))
        logs = []
        for child in children:
            try:
                logs.append(child.communicate(timeout=timeout)[0])
            except subprocess.TimeoutExpired:
                for c in children:
                    c.kill()
                raise
        failed = [(i, c.returncode) for i, c in enumerate(children) if c.returncode != 0]
        if failed:
            raise RuntimeError(f"{mode} job failed {failed}:\n" + "\n".join(logs))
        with open(out) as f:
            return f.read()


def run_elastic(procs: int, schedule: str, timeout: int = 300, cpus=None, env_per_process=None, stops=False,
                **options) -> str:
    """An in-place scaling run under easyscale_ext.launcher; returns the final rank 0's hash ("" if `stops`:
    every process leaves before the end)."""
    from easyscale_ext.elastic.launcher import ElasticLauncher

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "hash")
        args = [sys.executable, JOB, "--mode", "easyscale", "--elastic", "1", "--schedule", schedule, "--out", out]
        args += _flags(options)
        launcher = ElasticLauncher(args, procs, env=dict(os.environ, OMP_NUM_THREADS="1"), log_dir=tmp, cpus=cpus,
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
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, OMP_NUM_THREADS="1"))
        if done.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(f"torchrun job failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        with open(out) as f:
            return f.read(), done.stderr


@functools.lru_cache(maxsize=None)
def reference(model="cnn", n=4, level="D0", isa=None, accumulate=1):
    """The single-process reference; `isa` caps its kernels at that level (an older machine)."""
    env = dict(determinism.environment(level), **(determinism.isa_caps(isa) if isa else {}))
    return run_job("reference", n=n, model=model, level=level, accumulate=accumulate, env_per_rank=[env])


D1 = determinism.environment("D1")
# The emulated older machine: one instruction-set level below the one kernels run at here.
NATIVE = determinism.native_isa()
OLDER = determinism.isa_below(NATIVE)
needs_older = pytest.mark.skipif(OLDER is None, reason=f"no instruction-set level below this CPU's ({NATIVE}) "
                                                       "to emulate an older machine with")
