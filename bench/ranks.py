"""A bench script's ranks as processes of their own: one file:// rendezvous, what each prints last read as JSON."""
import json
import os
import subprocess
import sys
import tempfile
from typing import Callable, List


def run_ranks(script: str, procs: int, spec: Callable[[int, str], list]) -> List[dict]:
    """Run `script --child JSON(spec(rank, init))` for every rank (one intra-op thread each); their results, in rank
    order."""
    with tempfile.TemporaryDirectory() as tmp:
        init = "file://" + os.path.join(tmp, "rdzv")
        children = [subprocess.Popen([sys.executable, script, "--child", json.dumps(spec(r, init))],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=dict(os.environ, OMP_NUM_THREADS="1")) for r in range(procs)]
        results = []
        for child in children:
            out, err = child.communicate()
            if child.returncode:
                raise RuntimeError(err[-3000:])
            results.append(json.loads(out.strip().splitlines()[-1]))
        return results
