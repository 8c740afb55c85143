"""bench/bench_chaos.py's short version, as CI runs it: 3 jobs on a 3-node cluster, 8 random faults (a fixed
seed); every job must end with its fixed-size run's bits, none lost or run twice at once (its exit status)."""
import os

import pytest

from support.jobs import run_script

pytestmark = pytest.mark.multiprocess
BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench",
                     "bench_chaos.py")


def test_random_faults_lose_no_job_and_change_no_bit(tmp_path):
    # 30 steps: the jobs last about 60 s, the 8 faults (every 5 s or so) strike within about 47. At 20 steps the
    # last fault came as the jobs ended and found nothing left to strike (a CI run, 2026-11-26).
    out = run_script([BENCH, "--faults", "8", "--jobs", "3", "--steps", "30", "--gap", "5", "--seed", "1",
                      "--no-baseline"], tmp_path, timeout=900)
    assert out.returncode == 0 and "jobs lost: 0 []  bits changed: 0 []  run twice at once: 0 []" in out.stdout, \
        out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stdout.count(" s  ") >= 8  # every fault struck
