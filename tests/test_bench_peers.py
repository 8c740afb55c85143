"""bench/bench_peers.py end to end, small: one run of each scenario under torchrun and EasyScale; the table has a
row per system with every column, each with numbers, and EasyScale's final states after a kill -9 and after a
resize equal its event-free run's bit for bit. (The peers that need a lighthouse or a Ray cluster run in the
benchmark only: the test suite's time goes to the project's own checks.) Without processes: EasyScale's step log
logs each step once through a lost process, whichever step the recovery continues from."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import bench_peers  # noqa: E402
from peers_job import SHARDS, DeferredStepLog  # noqa: E402


@pytest.mark.slow
@pytest.mark.multiprocess
def test_bench_peers_table(tmp_path):
    systems = ["torchrun", "easyscale"]
    run = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "bench_peers.py"), "--runs", "1", "--epochs",
                          "12", "--models", "cnn", "--systems", ",".join(systems), "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr
    table = [line for line in run.stdout.splitlines() if line.startswith("|")]
    header = [c.strip() for c in table[0].strip("|").split("|")]
    rows = {cells[0]: dict(zip(header, cells)) for cells in
            ([c.strip() for c in line.strip("|").split("|")] for line in table[2:])}
    assert sorted(rows) == sorted(systems), run.stdout
    assert all(len(row) == len(header) for row in rows.values()), run.stdout
    for system in systems:
        assert not rows[system]["step ms"].startswith("not run"), run.stdout
        assert os.path.exists(tmp_path / f"loss_{system}_cnn.png")
    easyscale = rows["easyscale"]
    assert easyscale["kill -9: bits equal"] == "yes" and easyscale["resize: bits equal"] == "yes", run.stdout
    assert easyscale["kill -9: redone steps / lost samples"] == "0 / 0", run.stdout
    assert rows["torchrun"]["resize 4->2: s (pause s)"].startswith("no"), run.stdout


def test_easyscale_logs_each_step_once_through_a_lost_process(tmp_path):
    log = DeferredStepLog(str(tmp_path))

    def run(number, procs, gen):
        log.starting(number)
        log.finished(step=number, procs=procs, shards=list(range(SHARDS)), gen=gen, loss=1.0)

    for number in (1, 2):
        run(number, 4, 0)
    log.starting(3)  # a process lost in step 3's exchange: this one never finishes it, a survivor whose state the
    run(4, 3, 1)     # recovery takes did
    run(5, 3, 1)     # finished here, then lost at the boundary after it: the recovery goes back to step 4's state
    run(5, 3, 2)
    run(6, 3, 2)
    log.write(**log.done)
    (tmp_path / "sha256").write_text("")
    found = bench_peers.read(str(tmp_path))
    assert bench_peers.redone_lost(found, 6) == (0, 0)
    assert [(r["step"], r["gen"], r["loss"]) for r in found["lead"]] == \
        [(1, 0, 1.0), (2, 0, 1.0), (3, 0, None), (4, 1, 1.0), (5, 2, 1.0), (6, 2, 1.0)]
