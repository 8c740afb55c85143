"""The release as a user gets it: the sdist builds and holds every C++/CUDA source, a fresh virtual environment
(torch from the package index, as a user's pip would fetch it) builds the C++ extension from it, and the installed
package runs a real job from outside the source tree."""
import glob
import os
import subprocess
import sys
import tarfile

import pytest

from support.examples import docstring_example

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


def run(cmd, cwd=None, env=None):
    # One compile at a time: the other pytest worker keeps the second core.
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=1800, cwd=cwd,
                         env=dict(os.environ, MAX_JOBS="1", OMP_NUM_THREADS="1", **(env or {})))
    assert out.returncode == 0, f"{cmd}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


def test_the_sdist_installs_into_a_fresh_environment_and_runs_a_job_outside_the_source_tree(tmp_path):
    import easyscale_ext as es
    import torch

    run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", tmp_path / "dist", ROOT])
    sdist, = glob.glob(str(tmp_path / "dist" / f"easyscale_ext-{es.__version__}.tar.gz"))
    # Every source a build may compile ships (the CUDA ones included: `make build` compiles those from the same
    # files, so the environment below builds the CPU kernels only, and the sdist's CUDA build is this check).
    sources = {"CMakeLists.txt", "setup.py"} | {
        os.path.relpath(os.path.join(folder, name), ROOT)
        for folder, _, names in os.walk(os.path.join(ROOT, "csrc")) for name in names}
    with tarfile.open(sdist) as archive:
        shipped = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert sources <= shipped, sorted(sources - shipped)
    assert "LICENSE" in shipped
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", venv])
    python = venv / "bin" / "python"
    # The extension compiles against the torch it runs with: that torch first, then the sdist without isolation.
    run([python, "-m", "pip", "install", "-q", f"torch=={torch.__version__.split('+')[0]}", "numpy", "ninja",
         "pybind11", "setuptools", "wheel"])
    run([python, "-m", "pip", "install", "-q", "--no-build-isolation", sdist], env={"EASYSCALE_CUDA": "0"})
    elsewhere = tmp_path / "elsewhere"  # nothing of the source tree on sys.path
    elsewhere.mkdir()
    smoke = run([venv / "bin" / "easyscale", "smoke"], cwd=elsewhere)
    assert f"easyscale_ext {es.__version__}" in smoke, smoke
    installed = run([python, "-c", "import easyscale_ext, os; print(os.path.dirname(easyscale_ext.__file__))"],
                    cwd=elsewhere).strip()
    assert installed.startswith(str(venv)), installed
    # The licence goes with the installed package: its SPDX expression in the metadata, its text in the dist-info.
    licence = run([python, "-c", "import importlib.metadata as m; d = m.distribution('easyscale_ext'); "
                   "print(d.metadata['License-Expression'], *(f for f in d.files if f.name == 'LICENSE'))"],
                  cwd=elsewhere).split()
    assert licence == ["BSD-3-Clause", f"easyscale_ext-{es.__version__}.dist-info/licenses/LICENSE"], licence
    (elsewhere / "train.py").write_text(docstring_example(es.EasyScaleDDP))
    hashes = [run([python, "-m", "torch.distributed.run", "--nproc-per-node", procs, "--standalone", "train.py"],
                  cwd=elsewhere).split() for procs in (1, 2)]
    assert len(hashes[0]) == 1 and hashes[1] == hashes[0], hashes
