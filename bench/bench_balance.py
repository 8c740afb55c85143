"""Heterogeneous processes on one machine: throughput of the even split, the balanced split and the
ideal.

Three processes of tests/support/train_job.py's conv net, N virtual workers, pinned so that process 0 has a core
to itself and processes 1 and 2 share another (speeds about 1 : 1/2 : 1/2). Runs, interleaved:
  even      the even split, no balancer
  balanced  ElasticMember(balance=...): rebalances in place once the speeds are measured
Throughput is virtual-worker micro-batches per second over the steps after --settle. The ideal is what
a perfectly divisible job would reach: compute N / sum(speeds) per step (speed = 1 / seconds per worker,
as the processes measured it at the balanced run's last step) plus the step's non-compute part (the
balanced step time minus its slowest process's compute). Medians over --repeats.
Then the reaction to a change of speeds: in a balanced run, once it has rebalanced, processes 0 and 1 swap
cores (process 0 now shares one, process 1 has one to itself); reported: the steps from the swap to the
split that follows it.

    .venv/bin/python bench/bench_balance.py [--n 12] [--batch 256] [--repeats 3]
"""
import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(ROOT, "tests", "support", "train_job.py")
sys.path.insert(0, ROOT)


def pin(pid: int, core: int) -> None:
    for task in os.listdir(f"/proc/{pid}/task"):  # every thread of the process
        os.sched_setaffinity(int(task), {core})


def run(n: int, steps: int, batch: int, balance: bool, cpus, swap: bool = False) -> dict:
    """One run; with `swap`, processes 0 and 1 trade cores once the first rebalance has happened."""
    from easyscale_ext.elastic.launcher import ElasticLauncher

    with tempfile.TemporaryDirectory() as tmp:
        log, events = os.path.join(tmp, "times"), os.path.join(tmp, "events")
        argv = [sys.executable, JOB, "--mode", "easyscale", "--elastic", "1", "--virtual-workers", str(n),
                "--batch", str(batch), "--steps", str(steps), "--epochs", "1", "--balance", str(int(balance)),
                "--log-times", log, "--log-events", events, "--out", os.path.join(tmp, "h")]
        launcher = ElasticLauncher(argv, 3, env=dict(os.environ, OMP_NUM_THREADS="1"), log_dir=tmp, cpus=cpus)
        result = {}
        job = threading.Thread(target=lambda: result.setdefault("code", launcher.run()))
        job.start()
        swapped_at = None
        while swap and job.is_alive() and swapped_at is None:
            time.sleep(0.01)
            if os.path.exists(events) and os.path.getsize(events) > 0:
                pin(launcher.children["w0"].pid, cpus[1])
                pin(launcher.children["w1"].pid, cpus[0])
                swapped_at = max(int(line.split()[1]) for line in open(log))
        job.join()
        if result.get("code") != 0:
            raise SystemExit(f"job failed ({result.get('code')}); logs in {tmp}")
        rows = defaultdict(dict)
        for line in open(log):
            worker, step, t, workers, seconds = line.split()
            rows[int(step)][worker] = (float(t), int(workers), float(seconds))
        seen = sorted({tuple(map(int, line.split())) for line in open(events)}) if os.path.exists(events) else []
    return {"rows": rows, "rebalanced_at": seen[0][0] if seen else None, "sizes": list(seen[0][3:]) if seen else [],
            "swapped_at": swapped_at, "after_swap": seen[1] if len(seen) > 1 else None}


def throughput(rows, n, first, last) -> float:
    t0, t1 = (max(t for t, _, _ in rows[s].values()) for s in (first, last))
    return (last - first) * n / (t1 - t0)


def ideal_throughput(rows, n, first, last) -> float:
    step = n / throughput(rows, n, first, last)  # seconds per step
    procs = rows[last].values()
    other = step - max(k * seconds for _, k, seconds in procs)
    return n / (n / sum(1 / seconds for _, _, seconds in procs) + other)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=12)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=256, help="samples per micro-batch")
    ap.add_argument("--settle", type=int, default=15, help="steps left out at the start (measuring, rebalancing)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("needs two cores")
    cpus = [cores[0], cores[1], cores[1]]
    results = defaultdict(list)
    for _ in range(args.repeats):
        for name, balance in (("even", False), ("balanced", True)):
            r = run(args.n, args.steps, args.batch, balance, cpus)
            results[name].append(throughput(r["rows"], args.n, args.settle, args.steps))
            if balance:
                results["ideal"].append(ideal_throughput(r["rows"], args.n, args.settle, args.steps))
                results["rebalanced_at"].append(r["rebalanced_at"])
                results["sizes"].append(r["sizes"])
    even, balanced, ideal = (statistics.median(results[k]) for k in ("even", "balanced", "ideal"))
    print(f"N={args.n}, batch {args.batch}, 3 processes on cores {cpus}, steps {args.settle}-{args.steps}, "
          f"medians of {args.repeats}")
    print(f"throughput (micro-batches/s): even {even:.1f}, balanced {balanced:.1f}, ideal {ideal:.1f}")
    print(f"balanced / ideal {balanced / ideal:.2f}, balanced / even {balanced / even:.2f}")
    print(f"rebalanced at steps {results['rebalanced_at']} to sizes {results['sizes']}")
    reactions = []
    for _ in range(args.repeats):
        r = run(args.n, args.steps, args.batch, True, cpus, swap=True)
        after = r["after_swap"]
        reactions.append(after[0] - r["swapped_at"] if after else None)
        print(f"swap after step {r['swapped_at']}: next split {list(after[3:]) if after else None} at step "
              f"{after[0] if after else None}")
    done = [x for x in reactions if x is not None]
    median = f", median {statistics.median(done)}" if done else ""
    print(f"steps from the swap to the new split: {reactions}{median}")


if __name__ == "__main__":
    main()
