"""The examples run as they are under torchrun: the README's EasyScaleDDP conversion prints the same states on 1 and
2 processes, and with N = 2 the states the DDP script prints on 2; EasyScaleDDP's docstring example one hash."""
import os
import subprocess
import sys

import pytest
from support.examples import docstring_example

pytestmark = pytest.mark.multiprocess  # every test starts processes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def torchrun(script, procs, *args):
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(procs),
                          "--standalone", os.path.join(ROOT, "examples", script), *args],
                         capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert out.returncode == 0, out.stdout + out.stderr
    return [line for line in out.stdout.splitlines() if line.startswith("epoch")]


def test_conversion_pair_equal_at_n2():
    ddp = torchrun("train_ddp.py", 2)
    assert len(ddp) == 2
    assert torchrun("train_easyscale.py", 1, "2") == ddp


def test_easyscale_example_same_states_on_1_and_2_processes():
    one = torchrun("train_easyscale.py", 1)
    assert len(one) == 2
    assert torchrun("train_easyscale.py", 2) == one


def test_easyscale_ddp_docstring_example_prints_one_hash_on_1_and_2_processes(tmp_path):
    import easyscale_ext as es

    script = tmp_path / "train.py"
    script.write_text(docstring_example(es.EasyScaleDDP))
    hashes = []
    for procs in (1, 2):
        out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(procs),
                              "--standalone", str(script)], capture_output=True, text=True, timeout=300,
                             env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert out.returncode == 0, out.stdout + out.stderr
        hashes.append(out.stdout.split())
    assert len(hashes[0]) == 1 and len(hashes[0][0]) == 64
    assert hashes[1] == hashes[0]
