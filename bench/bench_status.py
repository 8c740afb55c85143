"""`easyscale status` on a cluster whose job table holds many ended jobs, against the same command on an empty
table, in the same run: the time a user waits, start of the command to its exit (the interpreter's start and
Ray's connection included). Markdown for BENCHMARKS.md.

    python bench/bench_status.py                     # 10,000 ended jobs, 5 runs of each command
    python bench/bench_status.py --jobs 1000 --runs 3
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time


def populate(home: str, ended: int) -> None:
    """A job table in `home`'s state folder, as `cluster start` finds it, with `ended` finished jobs."""
    from easyscale_ext.cluster.jobtable import JobTable

    state = os.path.join(home, "state")
    os.makedirs(state, exist_ok=True)
    table = JobTable(os.path.join(state, "jobs.sqlite"))
    with table.db:
        table.db.executemany("INSERT INTO jobs (id, name, state, submitted, finished, argv, env, nodes, "
                             "virtual_workers, min_procs, max_procs, exit_code) VALUES (?, 'old', 'finished', ?, ?, "
                             "'[\"train.py\"]', '{}', '[]', 4, 1, 4, 0)",
                             [(f"old-{i:06d}", float(i), float(i) + 60) for i in range(ended)])


def timed(home: str, runs: int, *args) -> float:
    """The median seconds of `easyscale ARGS` over `runs` runs."""
    env = dict(os.environ, EASYSCALE_HOME=home)
    seconds = []
    for _ in range(runs):
        start = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "easyscale_ext.cli", *args], env=env, capture_output=True,
                             text=True, timeout=300)
        seconds.append(time.perf_counter() - start)
        if out.returncode:
            raise RuntimeError(f"easyscale {' '.join(args)} failed: {out.stderr}")
    return statistics.median(seconds)


def measure(ended: int, runs: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="es-status-") as home:
        populate(home, ended)
        env = dict(os.environ, EASYSCALE_HOME=home)
        started = subprocess.run([sys.executable, "-m", "easyscale_ext.cli", "cluster", "start", "--slots", "1"],
                                 env=env, capture_output=True, text=True, timeout=300)
        if started.returncode:
            raise RuntimeError(started.stderr)
        try:
            return {"status": timed(home, runs, "status"), "status --all": timed(home, runs, "status", "--all")}
        finally:
            subprocess.run([sys.executable, "-m", "easyscale_ext.cli", "cluster", "stop"], env=env,
                           capture_output=True, timeout=300)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=10000, help="ended jobs in the table (default 10,000)")
    parser.add_argument("--runs", type=int, default=5, help="runs of each command (median; default 5)")
    args = parser.parse_args()
    empty, full = measure(0, args.runs), measure(args.jobs, args.runs)
    print(f"| command | empty table (s) | {args.jobs:,} ended jobs (s) | ratio |")
    print("|---|---:|---:|---:|")
    for command in empty:
        print(f"| `easyscale {command}` | {empty[command]:.2f} | {full[command]:.2f} | "
              f"{full[command] / empty[command]:.2f} |")


if __name__ == "__main__":
    main()
