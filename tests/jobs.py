"""Runs tests/train_job.py as real processes on localhost and returns rank 0's state hash."""
import os
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_job.py")


def run_job(mode: str, procs: int = 1, env_per_rank: Optional[List[Dict[str, str]]] = None, timeout: int = 240,
            **options) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "hash")
        args = [sys.executable, JOB, "--mode", mode, "--procs", str(procs), "--out", out,
                "--init", "file://" + os.path.join(tmp, "rendezvous")]
        for key, value in options.items():
            args += ["--" + key.replace("_", "-"), str(value)]
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
