"""The README's examples run as they are under torchrun: the EasyScaleDDP conversion prints the
same states on 1 and 2 processes, and with N = 2 the states the DDP script prints on 2."""
import os
import subprocess
import sys

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
