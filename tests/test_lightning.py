"""EasyScaleStrategy (easyscale_ext/lightning.py), as the README gives it: its Lightning example ends with one
SHA-256 on 1, 2 and 4 processes and after a restart from its checkpoint on another number of processes; each
setting it cannot honour fails at once, naming the setting."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "train_lightning.py")
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def run(script, *args, cwd):
    return subprocess.run([sys.executable, script, *args], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env=ENV)


def state(out) -> str:
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("state ")]
    assert len(lines) == 1, out.stdout
    return lines[0]


def test_the_same_bits_on_1_2_and_4_processes_and_after_a_restart_on_another(tmp_path):
    full = {d: state(run(EXAMPLE, "--devices", str(d), cwd=tmp_path)) for d in (1, 2, 4)}
    assert full[1] == full[2] == full[4]
    first = state(run(EXAMPLE, "--devices", "2", "--epochs", "1", "--ckpt-dir", "ck", cwd=tmp_path))
    assert first != full[1]  # an epoch short: what the restart must make up
    assert state(run(EXAMPLE, "--devices", "4", "--resume", "ck/last.ckpt", cwd=tmp_path)) == full[1]


def test_the_readme_shows_the_example_as_it_runs():
    with open(os.path.join(ROOT, "README.md")) as f, open(EXAMPLE) as g:
        assert g.read() in f.read()


@pytest.mark.parametrize("mode, says", [
    ("accumulate", "Trainer(accumulate_grad_batches=2) cannot be honoured by EasyScaleStrategy"),
    ("manual", "EasyScaleStrategy runs automatic optimization only"),
    ("syncbn", "Trainer(sync_batchnorm=True) is not supported by EasyScaleStrategy"),
    ("sampler", "the training DataLoader's WeightedRandomSampler cannot be kept"),
    ("hook", "EasyScaleStrategy does not take DDP communication hooks"),
])
def test_a_setting_it_cannot_honour_is_named(tmp_path, mode, says):
    out = run(os.path.join(ROOT, "tests", "support", "lightning_misuse.py"), mode, cwd=tmp_path)
    assert out.returncode != 0 and says in out.stderr, out.stderr[-3000:]


def test_more_processes_than_virtual_workers_are_refused(tmp_path):
    out = run(EXAMPLE, "--devices", "2", "--virtual-workers", "1", cwd=tmp_path)
    assert out.returncode != 0
    assert "EasyScaleStrategy(virtual_world_size=1) runs on at most 1 process; Trainer(devices=2, num_nodes=1) " \
           "starts 2" in out.stderr, out.stderr[-3000:]
