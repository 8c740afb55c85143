"""A bench script's ranks as processes of their own: one file:// rendezvous, what each prints last read as JSON."""
import json
import os
import subprocess
import sys
import tempfile
from typing import Callable, List, Optional


def run_ranks(script: str, procs: int, spec: Callable[[int, str], list],
              launch: Optional[Callable[[int, list], list]] = None, env: Optional[dict] = None) -> List[dict]:
    """Run `script --child JSON(spec(rank, init))` for every rank (one intra-op thread each); their results, in rank
    order. `launch(rank, argv)`: the command that runs a rank's argv (on an emulated host, say); `env`: variables
    every rank gets besides this process's."""
    with tempfile.TemporaryDirectory() as tmp:
        init = "file://" + os.path.join(tmp, "rdzv")
        argv = [[sys.executable, script, "--child", json.dumps(spec(r, init))] for r in range(procs)]
        children = [subprocess.Popen(launch(r, argv[r]) if launch else argv[r], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True,
                                     env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))) for r in range(procs)]
        results = []
        for child in children:
            out, err = child.communicate()
            if child.returncode:
                raise RuntimeError(err[-3000:])
            results.append(json.loads(out.strip().splitlines()[-1]))
        return results
