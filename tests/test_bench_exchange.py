"""bench/bench_exchange.py end to end, small: what a process sends a step under one and two levels, counted on real
gloo processes, equals the closed forms its model of the exchange at 1,024 GPUs is built on; and the model's figure."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.slow


def test_the_counts_are_the_closed_forms_and_two_levels_send_a_node_size_share_off_the_node(tmp_path):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "bench_exchange.py"), "--procs", "4",
                          "--node-size", "2", "--json", tmp_path / "exchange.json", "--plot", tmp_path / "model.png"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    counts = json.loads((tmp_path / "exchange.json").read_text())["counts"]
    assert {(c["n"], c["levels"]) for c in counts} == {(4, 1), (4, 2), (16, 1), (16, 2)}
    off = {}
    for c in counts:
        for rank in c["ranks"]:  # one local root a process (N = 4 and 16 split evenly): every process sends as much
            assert (rank["levels"], rank["bytes"], rank["off_node"]) == (c["levels"], *c["closed_form"]), c
        off[c["n"], c["levels"]] = c["closed_form"][1]
    assert off[4, 2] * 2 == off[4, 1] > 0 and off[16, 2] * 2 == off[16, 1]  # nodes of 2: half one level's
    assert (tmp_path / "model.png").stat().st_size > 0 and "| 1,024 |" in out.stdout
