"""Cluster mode from the command line, as the README gives it: start, submit, status, logs, cancel, stop."""
import json
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("ray", reason="cluster mode needs Ray (pip install 'easyscale_ext[cluster]')")
pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "train_elastic.py")


@pytest.fixture
def easyscale(tmp_path):
    env = dict(os.environ, EASYSCALE_HOME=str(tmp_path / "home"), OMP_NUM_THREADS="1")

    def run(*args, timeout=180):
        return subprocess.run([sys.executable, "-m", "easyscale_ext.cli", *args], capture_output=True, text=True,
                              env=env, timeout=timeout)
    yield run
    run("cluster", "stop")


def test_jobs_submitted_to_a_local_cluster_run_to_their_fixed_bits(easyscale, tmp_path):
    for args in (["status"], ["submit", "--virtual-workers", "2", EXAMPLE], ["cancel", "x"]):
        out = easyscale(*args)
        assert out.returncode == 2 and "no cluster is running: start one with `easyscale cluster start`" in out.stderr
    out = easyscale("cluster", "start", "--policy", "nope")
    assert out.returncode == 2 and "unknown policy 'nope': choose one of fifo" in out.stderr, out.stderr
    out = easyscale("cluster", "start", "--slots", "3", "--round", "0.5")
    assert out.returncode == 0 and "scheduler running" in out.stdout, out.stderr
    saved = json.loads((tmp_path / "home" / "cluster.json").read_text())
    assert oct((tmp_path / "home" / "ray_auth_token").stat().st_mode & 0o777) == "0o600"
    from easyscale_ext.cluster.local import loopback_env
    stranger = subprocess.run([sys.executable, "-c", f"import ray; ray.init(address={saved['address']!r})"],
                              capture_output=True, text=True, timeout=120,
                              env=dict({k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")},
                                       **loopback_env()))
    assert stranger.returncode != 0 and "InvalidAuthToken" in stranger.stderr, stranger.stderr[-2000:]  # no token
    jobs = []
    for procs in (2, 1):
        out = easyscale("submit", "--virtual-workers", "4", "--max-procs", str(procs), EXAMPLE)
        assert out.returncode == 0, out.stderr
        jobs.append(out.stdout.strip())
    digests = []
    for job in jobs:
        out = easyscale("logs", "-f", job)
        assert out.returncode == 0, out.stderr
        digests += re.findall(r"^step 48: sha256 ([0-9a-f]{64})$", out.stdout, re.M)
    assert len(digests) == 2 and digests[0] == digests[1]
    table = easyscale("status").stdout
    assert all(re.search(rf"^{job}\s+finished", table, re.M) for job in jobs), table
    out = easyscale("cluster", "reserve", "2")
    assert out.returncode == 0 and "reserved 2 slots on 2x " in out.stdout, out.stderr
    assert re.search(r"^\S+\s+3\s+2\s+0$", easyscale("status").stdout, re.M)  # node, slots, reserved, held
    out = easyscale("cluster", "reserve", "2")
    assert out.returncode == 2 and "only 1 of 2 slots can be reserved in the cluster" in out.stderr, out.stderr
    assert "2 reserved slots given back" in easyscale("cluster", "unreserve").stdout
    out = easyscale("cluster", "report", "--out", str(tmp_path / "report"))
    assert out.returncode == 0, out.stderr
    record = json.loads((tmp_path / "report" / "cluster-fifo.json").read_text())
    assert sorted(j["name"] for j in record["jobs"]) == sorted(jobs) and record["summary"]["avg_jct"] > 0
    assert {p.name for p in (tmp_path / "report").glob("*.png")} == {
        f"cluster-fifo-{kind}.png" for kind in ("gantt", "jct-cdf", "gpus", "summary")}
    for args, message in ((["submit", "--virtual-workers", "2", "no/such.py"], "no training script at"),
                          (["submit", "--virtual-workers", "8", "--min-procs", "5", EXAMPLE],
                           "needs at least 5 slots and the cluster has 3"),
                          (["status", "nope"], "no job 'nope'"), (["cancel", "nope"], "no job 'nope'")):
        out = easyscale(*args)
        assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert easyscale("cluster", "stop").returncode == 0
