"""bench/bench_peers.py end to end, small: one run of each scenario under torchrun and EasyScale; the table has a
row per system with every column, each with numbers, and EasyScale's final states after a kill -9 and after a
resize equal its event-free run's bit for bit. (The peers that need a lighthouse or a Ray cluster run in the
benchmark only: the test suite's time goes to the project's own checks.)"""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
