"""bench/bench_ddp.py --wide across emulated hosts, small: each host's processes on a network namespace of their own,
links held to a rate, EasyScaleDDP at one and two levels against torch DDP in one run, one row per node size."""
import json
import os
import subprocess
import sys

import pytest

from support.hosts import unavailable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.multiprocess


def test_wide_on_emulated_hosts_gives_a_row_per_node_size_against_the_same_ddp_runs(tmp_path):
    why = unavailable()
    if why:
        pytest.skip(why)
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "bench_ddp.py"), "--wide", "--models",
                          "transformer", "--procs", "4", "--hosts", "2", "--link-mbit", "1000", "--node-size", "0,2",
                          "--repeats", "1", "--steps", "1", "--json", tmp_path / "wide.json"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    rows = json.loads((tmp_path / "wide.json").read_text())
    assert [(r["node_size"], r["hosts"], r["link_mbit"]) for r in rows] == [(0, 2, 1000), (2, 2, 1000)]
    assert rows[0]["runs"]["ddp"] == rows[1]["runs"]["ddp"]  # one set of torch DDP runs, beside both
    assert all(r["medians"][side]["step"] > 0 for r in rows for side in ("easyscale", "ddp"))
    assert "2 emulated hosts, links of 1000 Mb/s" in out.stdout
