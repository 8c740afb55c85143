"""bench/bench_growth.py end to end, small: the grid of rounds against jobs and GPUs, and the whole Philly trace
stopped at a CPU budget, each with its table, JSON and plot."""
import json
import os
import subprocess
import sys

import pytest

from easyscale_ext.sched.policies import POLICIES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.slow


def bench_growth(*args):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "bench_growth.py"), *map(str, args)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_grid_times_each_policys_rounds(tmp_path):
    out = bench_growth("--jobs", 10, 100, "--gpus", 64, "--rounds", 2, "--policies", "fifo,saxena",
                       "--json", tmp_path / "grid.json", "--plot", tmp_path / "grid.png")
    points = json.loads((tmp_path / "grid.json").read_text())
    assert {(p["policy"], p["jobs"]) for p in points} == {(n, j) for n in ("fifo", "saxena") for j in (10, 100)}
    assert all(p["seconds"] > 0 for p in points), points
    assert "| saxena (T4 only) |" in out and (tmp_path / "grid.png").stat().st_size > 0


def test_the_whole_trace_stops_at_its_budget_and_plots_cpu_and_memory_against_days(tmp_path):
    out = bench_growth("--philly", "fifo,saxena", "--budget", 2, "--json", tmp_path / "philly.json",
                       "--plot", tmp_path / "philly.png")
    results = json.loads((tmp_path / "philly.json").read_text())
    assert [r["policy"] for r in results] == ["fifo", "saxena (T4 only)"]
    for r in results:  # stopped partway, with how far it got, and the whole trace's CPU extrapolated beyond that
        assert not r["finished"] and r["rounds"] > 0 and r["days"] > 0, r
        assert r["whole"].startswith(">= ") and float(r["whole"][3:]) >= round(r["cpu"]), r
        days, cpu = zip(*r["curve"])
        assert list(days) == sorted(days) and list(cpu) == sorted(cpu) and days[-1] == round(r["days"], 3)
        # each in a process of its own: its peak resident memory, and what it holds each day, are its own
        assert r["peak_rss"] >= max(rss for _, rss in r["rss"]) > 0 and [d for d, _ in r["rss"]][0] == 0, r
        assert f"| {r['policy']} | {r['rounds']} |" in out
    assert (tmp_path / "philly.png").stat().st_size > 0


def test_the_first_days_run_to_the_end_and_report_their_jcts(tmp_path):
    out = bench_growth("--philly", "fifo", "--days", 2, "--budget", 60, "--json", tmp_path / "days.json")
    result, = json.loads((tmp_path / "days.json").read_text())
    assert result["finished"] and result["jobs"] == 1, result  # the trace's one job of its first two days
    assert 0 < result["avg_jct"] == result["p99_jct"] <= result["makespan"], result
    assert f"| fifo | 1 | {result['avg_jct']:.2f} |" in out
    none = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "bench_growth.py"), "--philly", "fifo",
                           "--days", "0"], capture_output=True, text=True, timeout=600)
    assert none.returncode != 0 and "--days 0: no job arrives that early" in none.stderr, none.stderr


def test_all_runs_every_policy_and_an_unknown_one_is_named(tmp_path):
    # but YARN-CS, one job at a time: Philly's jobs back to back are 34 years of rounds
    bench_growth("--philly", "all", "--budget", 0.3, "--json", tmp_path / "all.json")
    results = json.loads((tmp_path / "all.json").read_text())
    assert [r["policy"].removesuffix(" (T4 only)") for r in results] == [n for n in POLICIES if n != "yarn-cs"]
    wrong = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "bench_growth.py"), "--philly", "fifo,lifo"],
                           capture_output=True, text=True, timeout=600)
    assert wrong.returncode != 0 and "unknown --philly lifo: choose from all, fifo" in wrong.stderr, wrong.stderr
