"""The command line: argument errors exit non-zero with a message and no traceback."""
import subprocess
import sys

import pytest


def easyscale(*args):
    return subprocess.run([sys.executable, "-m", "easyscale_ext.cli", *args], capture_output=True, text=True,
                          timeout=120)


def test_smoke_runs():
    out = easyscale("smoke")
    assert out.returncode == 0 and "cuda_built=" in out.stdout


@pytest.mark.parametrize("args,message", [
    (["launch", "--procs", "0", "--", "x.py"], "must be a positive integer"),
    (["launch", "--procs", "2"], "give the training script"),
    (["scale", "--store", "127.0.0.1:1", "--procs", "-3"], "must be a positive integer"),
    (["scale", "--procs", "2"], "--store"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_arguments_fail_clearly(args, message):
    out = easyscale(*args)
    assert out.returncode != 0
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def test_every_command_has_help():
    for command in ([], ["smoke"], ["launch"], ["scale"]):
        out = easyscale(*command, "--help")
        assert out.returncode == 0 and "usage: easyscale" in out.stdout
