"""The API reference builds from the docstrings with no warning (as `make docs` does), and names every public name."""
import os
import subprocess
import sys

import pytest

import easyscale_ext

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.slow


def test_the_api_reference_builds_without_warnings_and_names_every_public_name(tmp_path):
    out = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                          os.path.join(ROOT, "docs", "api"), str(tmp_path)], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    pages = "".join(open(os.path.join(tmp_path, f)).read() for f in os.listdir(tmp_path) if f.endswith(".html"))
    for name in easyscale_ext.__all__:
        if not name.startswith("__"):
            assert f'id="easyscale_ext.{name}"' in pages, f"easyscale_ext.{name} is not in the API reference"
    for name in ("easyscale_ext.lightning.EasyScaleStrategy", "easyscale_ext.hf.EasyScaleTrainer",
                 "easyscale_ext.sched.policies.base.Policy", "easyscale_ext.sched.simulator.simulate"):
        assert f'id="{name}"' in pages, f"{name} is not in the API reference"
    for command in ("easyscale run", "easyscale scale", "easyscale submit", "easyscale cluster start"):
        assert f"usage: {command}" in pages, f"`{command} --help` is not in the API reference"
