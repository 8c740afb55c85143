"""The simulator and its command line load no torch (easyscale_ext/sched/__init__.py says what sched may import).

Each check runs in a fresh interpreter: this test process has torch loaded already (tests/conftest.py).
"""
import importlib.util
import subprocess
import sys

import pytest

MODULES = ["easyscale_ext.sched", "easyscale_ext.sched.simulator", "easyscale_ext.sched.policies",
           "easyscale_ext.sched.models.job", "easyscale_ext.cli.simulate"]


def run(*argv):
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120)


def torch_imports(importtime_log: str) -> list:
    """The modules of torch that `python -X importtime` logged as imported."""
    names = [line.rsplit("|", 1)[-1].strip() for line in importtime_log.splitlines() if line.startswith("import time:")]
    return [n for n in names if n == "torch" or n.startswith("torch.")]


def test_importing_the_simulator_loads_no_torch():
    code = f"import sys\nimport {', '.join(MODULES)}\nassert 'torch' not in sys.modules, 'torch was imported'"
    proc = run("-c", code)
    assert proc.returncode == 0, proc.stderr


def test_simulate_help_loads_no_torch():
    code = ("import argparse\nfrom easyscale_ext.cli.simulate import add_parser\n"
            "parser = argparse.ArgumentParser(prog='easyscale')\n"
            "add_parser(parser.add_subparsers(dest='command', required=True))\n"
            "parser.parse_args(['simulate', '--help'])")
    proc = run("-X", "importtime", "-c", code)
    assert proc.returncode == 0, proc.stderr
    assert "--workload" in proc.stdout and "--policy" in proc.stdout
    assert torch_imports(proc.stderr) == []


@pytest.mark.skipif(importlib.util.find_spec("easyscale_ext.cli.__main__") is None,
                    reason="python -m easyscale_ext.cli is not available")
def test_easyscale_simulate_help_loads_no_torch():
    proc = run("-X", "importtime", "-m", "easyscale_ext.cli", "simulate", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "--workload" in proc.stdout and "--policy" in proc.stdout
    assert torch_imports(proc.stderr) == []
