"""The README's examples run as they are under torchrun, and the EasyScaleDDP
conversion prints the same losses on 1 and 2 processes."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def torchrun(script, procs):
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(procs),
                          "--standalone", os.path.join(ROOT, "examples", script)],
                         capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert out.returncode == 0, out.stdout + out.stderr
    return [line for line in out.stdout.splitlines() if line.startswith("epoch")]


def test_ddp_example_runs():
    assert len(torchrun("train_ddp.py", 2)) == 2


def test_easyscale_example_same_losses_on_1_and_2_processes():
    one = torchrun("train_easyscale.py", 1)
    assert len(one) == 2
    assert torchrun("train_easyscale.py", 2) == one
