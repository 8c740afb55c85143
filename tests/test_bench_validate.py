"""bench/bench_validate.py's bookkeeping, without simulating: the decision and verdict draws never share a seed, and
the tables and goals are printed from the kept figures alone (a file holding every figure runs no simulation)."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import bench_validate  # noqa: E402


def test_splits_never_share_a_draw():
    draws = {split: {bench_validate.seed_of(split, cell, k) for cell in range(len(bench_validate.CELLS))
                     for k in range(100)} for split in bench_validate.SPLITS}
    assert all(len(seeds) == 100 * len(bench_validate.CELLS) for seeds in draws.values())
    assert len(set().union(*draws.values())) == sum(map(len, draws.values()))
    assert {split: bench_validate.role_of(split) for split in draws} == {
        "decide": "decide", "verdict": "verdict", "decide-2": "decide", "verdict-2": "verdict"}


def test_the_kept_file_says_which_draws_and_role_and_is_not_read_for_another_split(tmp_path):
    path = tmp_path / "decide2.json"
    seed = bench_validate.seed_of("decide-2", 3, 1)
    bench_validate.save(path, "decide-2", {bench_validate.key_of(seed, "sia"): {"avg": 1.0}})
    kept = json.loads(path.read_text())
    assert (kept["split"], kept["role"], kept["seeds"]) == ("decide-2", "decide", [seed])
    assert bench_validate.load(path, "decide-2") == kept["figures"]
    with pytest.raises(SystemExit, match="holds the 'decide-2' draws, not 'verdict-2'"):
        bench_validate.load(path, "verdict-2")


def test_tables_and_goals_from_kept_figures(tmp_path):
    # elastic-goodput at 0.8 of Sia's average and 0.9 of sia-inplace's, its p99 and makespan Sia's; an ablation 5 %
    # worse
    scale = {"sia": 1.0, "sia-inplace": 0.8 / 0.9, "elastic-goodput": 0.8, "elastic-goodput-no-remaining": 0.84}
    figures = {bench_validate.key_of(bench_validate.seed_of("verdict", cell, 0), policy):
               {"avg": 1000.0 * s, "p99": 5000.0, "makespan": 9000.0, "cpu": 0.0}
               for cell in range(len(bench_validate.CELLS)) for policy, s in scale.items()}
    path = tmp_path / "verdict.json"
    bench_validate.save(path, "verdict", figures)
    run = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "bench_validate.py"), "--split", "verdict",
                          "--draws", "1", "--json", str(path), "--procs", "1", "--policies", ",".join(scale)],
                         capture_output=True, text=True, timeout=300, cwd=os.path.join(ROOT, "bench"))
    assert run.returncode == 0, run.stderr
    assert " s CPU" not in run.stdout  # nothing simulated: no progress line
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:2]): line for line in run.stdout.splitlines()
            if line.startswith("| ")}
    assert "| 15 | 0.800 [0.800, 0.800] | 0.900 [0.900, 0.900] | 100% | 1.000 [1.000, 1.000] |" in rows["all", ""]
    assert "1.050" in rows["no-remaining", "1.050"]
    assert "MISSED" not in run.stdout and run.stdout.count("- met:") == 3 + len(bench_validate.SHAPES)
