"""bench/bench_chaos.py's short version, as CI runs it: 3 jobs on a 3-node cluster under Sia (which preempts and
moves jobs), 8 random faults (a fixed seed); every job must end with its fixed-size run's bits, none lost or run
twice at once (its exit status)."""
import os
import re

import pytest

from support.jobs import run_script

pytestmark = pytest.mark.multiprocess
BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench",
                     "bench_chaos.py")


def test_random_faults_lose_no_job_and_change_no_bit(tmp_path):
    # The jobs last 45-60 s; the 8 faults, every 3 s or so, strike within about 30 (28.5 s here, 2026-11-27). At a
    # 5 s gap the first waited 12 s for a running job and the last found every job ended (CI, 47 s makespan).
    out = run_script([BENCH, "--policy", "sia", "--faults", "8", "--jobs", "3", "--steps", "30", "--gap", "3",
                      "--seed", "1", "--no-baseline"], tmp_path, timeout=900)
    assert out.returncode == 0 and "jobs lost: 0 []  bits changed: 0 []  run twice at once: 0 []" in out.stdout, \
        out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stdout.count(" s  ") >= 8  # every fault struck
    # the watcher saw the jobs' processes (forked ones too: their /proc shows the fork server's command)
    assert int(re.search(r"processes seen at once: up to (\d+)", out.stdout).group(1)) >= 2, out.stdout[-3000:]
