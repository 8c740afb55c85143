"""Cluster mode against its simulation: the same trace, cluster and policies, run for real on a local two-node
Ray cluster and in `easyscale_ext.sched.simulate`; markdown for BENCHMARKS.md.

Each job is a real EasyScaleDDP process group (bench/cluster_job.py) of 4 virtual workers whose steps are padded
to its application's profiled step time on the slots it holds: this machine has no GPUs, so each step's device
time is emulated (t4 profiles). Jobs arrive every --gap seconds. The simulation gets the run's own measured
costs: a job's first start (allocation to its first step), the in-place pause of a scale event, the joiners'
preparation of a growth (allocation to admission: the job trains as before meanwhile), a job's exit
(last step to its processes' exit: it holds its slots until then), and each job's length (its steps as a share of
the application's epoch, the simulator's slowdown); and it starts a round at each arrival, as the scheduler does
on a submission. Both drivers run the policy made non-preemptive (a running job keeps a slot: cluster mode
changes jobs only in place).

    python bench/bench_cluster.py --steps 12            # fifo and easyscale-homo, 8 jobs, 3 runs: 13 min here
    python bench/bench_cluster.py --policies fifo --jobs 4 --runs 1
"""
import argparse
from dataclasses import replace
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
APPS = ("imagenet", "yolov3", "deepspeech2", "bert")
VIRTUAL_WORKERS, NODES, SLOTS = 4, 2, 4


def run_for_real(policy, trace, steps, round_s, work):
    """Submit `trace` ((seconds after start, app) pairs) to a fresh scheduler; returns what the run measured."""
    import ray

    from easyscale_ext.cluster.scheduler import launch

    scheduler = launch(os.path.join(work, policy, "state"), policy, round_s)
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    begin, ids = time.time(), []
    pending = list(enumerate(trace))
    while True:
        while pending and time.time() - begin >= pending[0][1][0]:
            i, (_, app) = pending.pop(0)
            log = os.path.join(work, policy, f"steps{i}.log")
            ids.append(ray.get(scheduler.submit.remote([os.path.join(HERE, "cluster_job.py"), app, str(steps), log],
                                                       VIRTUAL_WORKERS, 1, VIRTUAL_WORKERS, f"job{i}", env, app)))
        jobs = ray.get(scheduler.status.remote())
        if not pending and all(j["state"] not in ("queued", "running") for j in jobs):
            break
        time.sleep(0.5)
    failed = [j["id"] for j in jobs if j["state"] != "finished"]
    if failed:
        raise RuntimeError(f"{policy}: jobs {failed} did not finish; logs in {work}/{policy}/state/logs")
    result = ray.get(scheduler.report.remote())
    rounds = ray.get(scheduler.round_seconds.remote())
    digests = set()
    for job in jobs:
        with open(os.path.join(job["log_dir"], "w0.log")) as f:
            digests.update(line.split()[-1] for line in f if "sha256" in line)
    ray.kill(scheduler)
    pauses, starts, exits, joins = [], [], [], []
    t0 = min(j["submitted"] for j in jobs)
    records = {r["name"]: r for r in result.jobs}
    for i, job in enumerate(jobs):
        with open(os.path.join(work, policy, f"steps{i}.log")) as f:
            rows = [tuple(map(float, line.split())) for line in f]
        first = min(s for (name, s, _, _) in result.segments if name == job["id"]) + t0
        starts.append(rows[0][2] - first)
        exits.append(records[job["id"]]["completion"] + t0 - rows[-1][3])
        usual = statistics.median(b[2] - a[3] for a, b in zip(rows, rows[1:]) if a[1] == b[1])
        pauses += [b[2] - a[3] - usual for a, b in zip(rows, rows[1:]) if a[1] != b[1]]
        held = sorted((s, n) for (name, s, _, n) in result.segments if name == job["id"])
        for (_, before), (at, after) in zip(held, held[1:]):  # a growth: from the allocation to the joiners' admission
            grown = next((k for k, r in enumerate(rows) if r[1] == after and r[2] >= at + t0), None)
            if after > before and grown:
                joins.append(rows[grown - 1][3] - (at + t0))
    return result, rounds, digests, pauses, starts, exits, joins


def simulate_run(policy, result, steps, round_s, start_s, pause_s, exit_s, join_s):
    from easyscale_ext.sched.metrics import summarize
    from easyscale_ext.sched.models.application import Applications
    from easyscale_ext.sched.models.cluster import Cluster
    from easyscale_ext.sched.models.traces import data_dir
    from easyscale_ext.sched import live
    from easyscale_ext.sched.policies import POLICIES
    from easyscale_ext.sched.policies.limits import Limits
    from easyscale_ext.sched.simulator import SimConfig, simulate

    apps = Applications(data_dir())
    # each job as the scheduler modelled it (sched.live), now known to last one (shortened) epoch
    specs = [replace(live.job_model(j["name"], j["arrival"], VIRTUAL_WORKERS, VIRTUAL_WORKERS, apps[j["app"]]).spec,
                     epochs=1) for j in result.jobs]
    cluster = Cluster.parse(f"{NODES}x{SLOTS}:t4")
    wrapped = Limits(POLICIES[policy](0))
    wrapped.limits = {s.name: (1, VIRTUAL_WORKERS) for s in specs}
    config = SimConfig(round_s=round_s, start_s=start_s, restart_s=start_s, in_place_s=pause_s, exit_s=exit_s,
                       join_s=join_s, rounds_at_arrivals=True,
                       slowdown={a: steps / apps[a].noise.progress_at(1) for a in APPS})
    simulated = simulate(sorted(specs, key=lambda s: (s.arrival, s.name)), wrapped, cluster, apps, config)
    return summarize(simulated, cluster.total_gpus)


def idle_slot():
    """RSS (MB) and CPU (% of a core over 10 s) of a slot's actor process whose job process only sleeps."""
    import psutil
    import ray

    from easyscale_ext.cluster.worker import SlotWorker

    with tempfile.TemporaryDirectory() as tmp:
        worker = SlotWorker.remote(["sleep", "60"], {}, os.path.join(tmp, "idle.log"))
        actor = psutil.Process(ray.get(worker.__ray_call__.remote(lambda self: os.getpid())))
        before = sum(actor.cpu_times()[:2])
        time.sleep(10)
        cpu = (sum(actor.cpu_times()[:2]) - before) / 10 * 100
        rss = actor.memory_info().rss / 2 ** 20
        ray.kill(worker)
    return rss, cpu


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policies", default="fifo,easyscale-homo")
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--gap", type=float, default=5.0, help="seconds between arrivals")
    ap.add_argument("--round", type=float, default=5.0, help="seconds per scheduling round")
    ap.add_argument("--runs", type=int, default=3, help="runs of each policy; the table gives medians")
    args = ap.parse_args()
    from easyscale_ext.cluster.local import LocalCluster
    from easyscale_ext.sched.metrics import summarize

    cluster = LocalCluster(nodes=NODES, slots=SLOTS)
    trace = [(i * args.gap, APPS[i % len(APPS)]) for i in range(args.jobs)]
    print(f"# {args.jobs} jobs ({', '.join(APPS)} in turn, {VIRTUAL_WORKERS} virtual workers, {args.steps} steps), "
          f"one every {args.gap:g} s, on {NODES} nodes x {SLOTS} slots, rounds of {args.round:g} s. No GPU here: "
          "every step is padded to its application's t4 profile for the slots it holds.\n")
    policies = args.policies.split(",")
    runs, digests = {p: [] for p in policies}, set()  # policy -> a row per run
    try:
        with tempfile.TemporaryDirectory() as work:
            for run in range(args.runs):
                for policy in policies:
                    here = os.path.join(work, str(run))
                    result, rounds, hashes, pauses, starts, exits, joins = run_for_real(policy, trace, args.steps,
                                                                                        args.round, here)
                    digests |= hashes
                    real = summarize(result, NODES * SLOTS)
                    pause = statistics.median(pauses) if pauses else 0.0
                    start, exit_s = statistics.median(starts), statistics.median(exits)
                    join = statistics.median(joins) if joins else 0.0
                    sim = simulate_run(policy, result, args.steps, args.round, start, max(pause, 0.0), exit_s,
                                       max(join, 0.0))
                    runs[policy].append((real["avg_jct"], sim["avg_jct"], sim["avg_jct"] / real["avg_jct"],
                                         real["makespan"], sim["makespan"], statistics.median(rounds), max(rounds),
                                         len(pauses), pause, start, exit_s, join))
                    print(f"run {run + 1}, {policy}: sim / real {runs[policy][-1][2]:.2f}", file=sys.stderr,
                          flush=True)
            rss, cpu = idle_slot()
    finally:
        cluster.shutdown()
    print(f"Median of {args.runs} runs (sim / real of each run in brackets).\n")
    print("| policy | avg JCT real (s) | avg JCT simulated (s) | sim / real | makespan real | makespan sim "
          "| round median / max (s) | scale events | pause median (s) | first start median (s) | exit median (s) "
          "| join median (s) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = {p: [statistics.median(column) for column in zip(*r)] for p, r in runs.items()}
    for p, (real, sim, ratio, mreal, msim, rmed, rmax, events, pause, start, exit_s, join) in rows.items():
        each = ", ".join(f"{r[2]:.2f}" for r in runs[p])
        print(f"| {p} | {real:.1f} | {sim:.1f} | {ratio:.2f} [{each}] | {mreal:.1f} | {msim:.1f} | {rmed:.3f} / "
              f"{max(r[6] for r in runs[p]):.3f} | {events:g} | {pause:.2f} | {start:.1f} | {exit_s:.1f} "
              f"| {join:.1f} |")
    order_real = sorted(rows, key=lambda p: rows[p][0])
    order_sim = sorted(rows, key=lambda p: rows[p][1])
    print(f"\nordering by avg JCT: real {order_real}, simulated {order_sim} "
          f"({'same' if order_real == order_sim else 'DIFFERENT'})")
    print(f"final states: {len(digests)} distinct SHA-256 over every job of every policy and run "
          "(1 = bitwise identical)")
    print(f"idle slot: its actor's process holds {rss:.0f} MB RSS and uses {cpu:.2f} % of a core")

if __name__ == "__main__":
    main()
