"""The cluster scheduler's CPU while its jobs run and nothing happens: K jobs (default 1, 4 and 16) each hold one
slot with a process that sleeps, and the scheduler's process (and the jobs' supervisors, for comparison) is
measured over a window (default 60 s) once every job runs. A scheduler that learns of changes from events costs
the same whatever K is; one that looks at every job every second costs more with each job.

The real scheduler actor on a real local Ray cluster (loopback) with 16 slots on one node, fifo, rounds of
--round seconds (default 60, `easyscale cluster start`'s); CPU from the kernel's counts (psutil), each K in a
cluster of its own.

    python bench/bench_idle.py                              # 1, 4 and 16 jobs, 60 s each
    python bench/bench_idle.py --jobs 1,16 --window 30 --json idle.json
"""
import argparse
import json
import os
import sys
import tempfile
import time

SLOTS = 16
SLEEPER = "import time\ntime.sleep(1e9)\n"


def cpu_seconds(processes) -> float:
    total = 0.0
    for p in processes:
        try:
            times = p.cpu_times()
            total += times.user + times.system
        except Exception:  # ended meanwhile
            pass
    return total


def actors(psutil, title: str) -> list:
    """This cluster's worker processes of the actor class `title` (Ray names them ray::TITLE): the local cluster's
    nodes are this process's children, their workers theirs."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if " ".join(p.cmdline()).startswith(f"ray::{title}"):
                found.append(p)
        except psutil.NoSuchProcess:
            pass
    return found


def measure(jobs: int, window: float, round_s: float, work: str) -> dict:
    """Scheduler and supervisors' CPU over `window` seconds with `jobs` sleeping jobs running."""
    import psutil

    from easyscale_ext.cluster.local import LocalCluster

    local = LocalCluster(nodes=1, slots=SLOTS)
    import ray

    from easyscale_ext.cluster.scheduler import launch

    state = os.path.join(work, f"state{jobs}")
    script = os.path.join(work, "sleeper.py")
    with open(script, "w") as f:
        f.write(SLEEPER)
    try:
        scheduler = launch(state, "fifo", round_s)
        ids = [ray.get(scheduler.submit.remote([script], 1, 1, 1, f"idle{i}", {"OMP_NUM_THREADS": "1"}))
               for i in range(jobs)]
        deadline = time.monotonic() + 60 + 20 * jobs
        while True:  # every job running, its process started
            shown = ray.get(scheduler.status.remote())
            if sum(j["state"] == "running" and bool((j["live"] or {}).get("holding")) for j in shown) == jobs:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"not every job started: {[(j['id'], j['state']) for j in shown]}")
            time.sleep(1.0)
        time.sleep(5.0)  # the last supervisor's start is over
        watched = {"scheduler": actors(psutil, "Scheduler"), "supervisors": actors(psutil, "JobSupervisor")}
        if len(watched["scheduler"]) != 1 or len(watched["supervisors"]) != jobs:
            raise RuntimeError(f"found {len(watched['scheduler'])} schedulers and {len(watched['supervisors'])} "
                               f"supervisors for {jobs} jobs")
        before = {k: cpu_seconds(v) for k, v in watched.items()}
        start = time.monotonic()
        time.sleep(window)
        seconds = time.monotonic() - start
        used = {k: cpu_seconds(v) - before[k] for k, v in watched.items()}
        for job in ids:
            ray.get(scheduler.cancel.remote(job))
    finally:
        local.shutdown()
    return {"jobs": jobs, "window_s": seconds, "scheduler_cpu_pct": 100 * used["scheduler"] / seconds,
            "supervisors_cpu_pct": 100 * used["supervisors"] / seconds}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", default="1,4,16", help="numbers of running jobs, comma-separated (at most 16)")
    parser.add_argument("--window", type=float, default=60.0, help="seconds measured")
    parser.add_argument("--round", type=float, default=60.0, help="the scheduler's round, seconds")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    counts = [int(k) for k in args.jobs.split(",")]
    if not all(1 <= k <= SLOTS for k in counts):
        parser.error(f"--jobs: each between 1 and {SLOTS}")
    work = tempfile.mkdtemp(prefix="bench_idle_")
    results = []
    for k in counts:
        results.append(measure(k, args.window, args.round, work))
        r = results[-1]
        print(f"  {k} jobs: scheduler {r['scheduler_cpu_pct']:.2f} % of a core, supervisors "
              f"{r['supervisors_cpu_pct']:.2f} %", flush=True)
    print("\n| running jobs | scheduler (% of a core) | supervisors, all (% of a core) |\n|---:|---:|---:|")
    for r in results:
        print(f"| {r['jobs']} | {r['scheduler_cpu_pct']:.2f} | {r['supervisors_cpu_pct']:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"round_s": args.round, "results": results, "python": sys.version.split()[0]}, f, indent=1)


if __name__ == "__main__":
    main()
