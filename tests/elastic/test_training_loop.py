"""The elastic training loop as users write it: `ElasticMember.run` (the README's example, run as written), and a
training-code error, which must end the job."""
import os
import re
import subprocess
import sys

import pytest

from support.jobs import run_elastic

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "train_elastic.py")
CLI = [sys.executable, "-m", "easyscale_ext.cli"]

pytestmark = pytest.mark.multiprocess


def test_the_readme_shows_the_elastic_example_as_it_is():
    readme = open(os.path.join(ROOT, "README.md")).read()
    assert "```python\n" + open(EXAMPLE).read() + "```" in readme


def run_example(procs: int, scale_to: int = 0, folder: str = "") -> str:
    """`easyscale run --procs P -- examples/train_elastic.py`, asked at once to scale to `scale_to`
    processes; returns the digest it prints."""
    job = subprocess.Popen(CLI + ["run", "--procs", str(procs), "--", EXAMPLE] + ([folder] if folder else []),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        first = job.stdout.readline()
        address = re.search(r"job store at (\S+);", first).group(1)
        if scale_to:
            asked = subprocess.run(CLI + ["scale", "--store", address, "--procs", str(scale_to)],
                                   capture_output=True, text=True, timeout=60)
            assert asked.returncode == 0, asked.stderr
        out, _ = job.communicate(timeout=240)
    finally:
        job.kill()
        job.wait()
    assert job.returncode == 0, first + out
    digests = re.findall(r"^step 48: sha256 ([0-9a-f]{64})$", out, re.M)  # 3 epochs of 16 steps
    assert len(digests) == 1, out
    return digests[0]


def test_the_elastic_example_ends_with_the_same_bits_on_any_schedule(tmp_path):
    fixed = run_example(1)
    assert run_example(2, scale_to=3, folder=str(tmp_path)) == fixed
    assert sorted(os.listdir(tmp_path)) == [f"step-00000000{s}.ckpt" for s in (20, 30, 40)]  # every 10, 3 kept


def test_a_training_error_that_mentions_gloo_ends_the_job_and_is_reported():
    # Taken for a lost peer by its message before: the job went on without the process and exited 0.
    with pytest.raises(RuntimeError) as failed:
        run_elastic(2, "", n=4, raise_at="w1:3")
    log = str(failed.value)
    assert "elastic job failed (1" in log
    assert log.count("RuntimeError: gloo-style config value invalid: a bug in the training code") >= 2  # both
    assert "TrainingError: process w1 failed in the training code" in log
    assert "continuing on" not in log
