"""The command line: argument errors exit non-zero with a message and no traceback."""
import json
import os
import socket
import subprocess
import sys
from datetime import timedelta

import pytest


def easyscale(*args):
    return subprocess.run([sys.executable, "-m", "easyscale_ext.cli", *args], capture_output=True, text=True,
                          timeout=120)


def test_smoke_runs():
    out = easyscale("smoke")
    assert out.returncode == 0 and "cuda_built=" in out.stdout


@pytest.mark.parametrize("args,message", [
    (["run", "--procs", "0", "--", "x.py"], "must be a positive integer"),
    (["run", "--procs", "2"], "give the training script"),
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
    for command in ([], ["demo"], ["run"], ["scale"], ["bench"], ["smoke"], ["simulate"]):
        out = easyscale(*command, "--help")
        assert out.returncode == 0 and "usage: easyscale" in out.stdout


@pytest.mark.parametrize("args,message", [
    (["demo", "--n", "0"], "must be a positive integer"),
    (["demo", "--n", "4", "--schedule", "1,5"], "must be between 1 and N=4"),
    (["demo", "--fixed-procs", "8"], "exceeds N=4"),
    (["demo", "--level", "D7"], "unknown determinism level"),
    (["demo", "--out", "/proc/easyscale-demo"], "cannot write to output folder"),
    (["run", "--procs", "1", "--level", "fast", "--", "x.py"], "unknown determinism level"),
    (["run", "--procs", "1", "--level", "D2", "--isa", "AVX9", "--", "x.py"], "unknown instruction-set floor"),
    (["run", "--procs", "1", "--level", "D1", "--isa", "AVX", "--", "x.py"], "applies to determinism D2 only"),
    (["demo", "--isa", "SSE4.1"], "applies to determinism D2 only"),
    (["demo", "--balance", "--n", "2"], "needs N >= 3"),
    (["run", "--procs", "2", "--cpus", "0,4096", "--", "x.py"], "cores [4096] are not available here"),
    (["scale", "--store", "127.0.0.1:1", "--split", "3,0"], "expected positive worker counts"),
    (["scale", "--store", "127.0.0.1:1", "--split", "3,1", "--procs", "2"], "not allowed with argument"),
])
def test_demo_and_run_argument_errors(args, message):
    out = easyscale(*args)
    assert out.returncode != 0
    assert message in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.slow
@pytest.mark.multiprocess
def test_short_demo_is_bitwise_identical_and_plots(tmp_path):
    out = subprocess.run([sys.executable, "-m", "easyscale_ext.cli", "demo", "--epochs", "2", "--schedule", "1,2|2",
                          "--freeze", "0.3", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "verdict: bitwise identical" in out.stdout
    assert "froze layer" in out.stdout and "unfrozen: P=2" in out.stdout
    png = (tmp_path / "demo.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


@pytest.mark.slow
@pytest.mark.multiprocess
def test_demo_on_mixed_speed_processes_reports_the_splits_and_the_bits(tmp_path):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores to give processes different speeds")
    out = subprocess.run([sys.executable, "-m", "easyscale_ext.cli", "demo", "--balance", "--n", "6", "--epochs", "2",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "elastic: P=3 (2,2,2): steps 1-" in out.stdout  # later splits depend on the measured speeds
    assert "verdict: bitwise identical" in out.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("args,message", [
    (["--store", "localhost", "--procs", "2"], "expected the job store's address as HOST:PORT"),
    (["--store", "127.0.0.1:x", "--procs", "2"], "expected the job store's address as HOST:PORT"),
    (["--store", f"127.0.0.1:{free_port()}", "--procs", "2", "--connect-timeout", "3600"],
     "no job store answers at 127.0.0.1:"),  # refused: said at once, not after the hour (TCPStore retries)
])
def test_scale_without_a_reachable_job_fails_in_one_line_at_once(args, message):
    out = easyscale("scale", *args)  # one that waited for its connect timeout would pass easyscale()'s own
    assert out.returncode == 2 and message in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) <= 3  # argparse: usage + line


@pytest.fixture
def job_store():
    """A job store as a running job of 3 processes and 12 virtual workers leaves it."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30))
    store.set("gen/0/members", json.dumps(["w0", "w1", "w2"]))
    store.set("job_state", json.dumps({"virtual_world_size": 12}))
    yield store, f"127.0.0.1:{store.port}"


@pytest.mark.parametrize("args,message", [
    (["--split", "1,1"], "a split needs 3 sizes >= 1 summing to 12, got 1,1"),
    (["--split", "6,3,2"], "a split needs 3 sizes >= 1 summing to 12, got 6,3,2"),
    (["--procs", "13"], "the job has 12 virtual workers"),
    (["--release", "w7"], "the job has no process 'w7'; its processes are w0, w1, w2"),
])
def test_a_request_the_job_cannot_take_is_refused_and_nothing_is_sent(job_store, args, message):
    store, address = job_store
    out = easyscale("scale", "--store", address, *args)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr
    assert not any(store.check([key]) for key in ("split", "target", "releases"))


def test_a_request_the_job_can_take_is_sent(job_store):
    store, address = job_store
    out = easyscale("scale", "--store", address, "--split", "6,3,3")
    assert out.returncode == 0, out.stderr
    assert json.loads(store.get("split")) == [6, 3, 3]


def test_workload_draws_a_workload_that_simulate_runs(tmp_path):
    out = easyscale("workload", "--out", str(tmp_path / "w.csv"), "--jobs", "6", "--hours", "0.5", "--seed", "3")
    assert out.returncode == 0 and "wrote 6 jobs" in out.stdout, out.stderr
    lines = (tmp_path / "w.csv").read_text().splitlines()
    assert lines[0].startswith("name,time,application,max_parallelism") and len(lines) == 7
    again = easyscale("workload", "--out", str(tmp_path / "again.csv"), "--jobs", "6", "--hours", "0.5", "--seed", "3")
    assert again.returncode == 0 and (tmp_path / "again.csv").read_text() == "\n".join(lines) + "\n"  # seeded
    run = easyscale("simulate", "--workload", str(tmp_path / "w.csv"), "--policy", "fifo", "--out", str(tmp_path))
    assert run.returncode == 0 and "fifo" in run.stdout, run.stderr
