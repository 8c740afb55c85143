"""Closed on one machine: while a job runs under `easyscale run` or on a cluster `easyscale cluster start` started,
every socket its processes listen on (Ray's, the job's store, gloo's) is on loopback."""
import json
import os
import subprocess
import sys
import time

import pytest

from support.jobs import JOB, START_S, descendants, kill_tree
from support.sockets import listening_of, on_loopback

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SLOW_JOB = [JOB, "--mode", "easyscale", "--elastic", "1", "--virtual-workers", "2", "--steps", "40", "--step-sleep",
            "0.5"]


def sessions(ids):
    """The live processes of the sessions `ids`, and every process below them."""
    roots = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[3]) in ids:
                    roots.append(int(entry))
        except (OSError, ValueError):
            pass
    return set(roots).union(*(descendants(r) for r in roots))


def listeners_once_training(pids_of, times, kinds):
    """The listening sockets of the job's processes (`pids_of()`) once it has trained a step (its --log-times file
    `times` has a line), seen until every kind of process in `kinds` (command names) listens."""
    deadline = time.monotonic() + START_S
    while True:
        found = listening_of(pids_of())
        if times.exists() and times.read_text().strip() and kinds <= {command for _, command, _, _ in found}:
            return found
        assert time.monotonic() < deadline, found
        time.sleep(0.5)


def test_easyscale_run_listens_on_loopback_only(tmp_path):
    run = subprocess.Popen([sys.executable, "-m", "easyscale_ext.cli", "run", "--procs", "2", "--", *SLOW_JOB,
                            "--out", str(tmp_path / "hash"), "--log-times", str(tmp_path / "times")], cwd=ROOT,
                           env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        found = listeners_once_training(lambda: {run.pid, *descendants(run.pid)}, tmp_path / "times", {"python"})
        off = [entry for entry in found if not on_loopback(entry[2])]
        assert not off, f"listening off loopback: {off}"
    finally:
        kill_tree(run)


def test_a_local_cluster_and_its_jobs_listen_on_loopback_only(tmp_path):
    env = dict(os.environ, EASYSCALE_HOME=str(tmp_path / "home"), OMP_NUM_THREADS="1")
    easyscale = lambda *args: subprocess.run([sys.executable, "-m", "easyscale_ext.cli", *args], cwd=ROOT,  # noqa
                                             env=env, capture_output=True, text=True, timeout=180)
    try:
        assert easyscale("cluster", "start", "--slots", "1:t4,1:a100", "--round", "2").returncode == 0
        saved = json.loads((tmp_path / "home" / "cluster.json").read_text())
        assert easyscale("submit", "--virtual-workers", "2", "--level", "D2", "--", *SLOW_JOB, "--out",
                         str(tmp_path / "hash"), "--log-times", str(tmp_path / "times")).returncode == 0
        found = listeners_once_training(lambda: sessions(set(saved["ray_sessions"])), tmp_path / "times",
                                        {"gcs_server", "raylet", "ray::Scheduler", "ray::JobSupervi", "python"})
        off = [entry for entry in found if not on_loopback(entry[2])]
        assert not off, f"listening off loopback: {off}"
    finally:
        easyscale("cluster", "stop")
