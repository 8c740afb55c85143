"""Where one policy loses to another, job by job: both simulated on bench_validate.py's draws of a cell (a shape and a
load), and each job's JCT difference split into its wait (arrival to first start) and its run (first start to end),
summed over jobs grouped by length (the job's lower limit on its JCT alone on the cluster, sched.bound) and by the
GPUs it asked for, with the GPU-hours each group was given, the GPUs it held on average while it ran, and its changes
in place: grown, shrunk, moved (the same number elsewhere); a resume after a suspension counts apart; and the
GPU-hours each length group was given on each GPU type (from each round's decisions). A group's share
of the loss says which jobs pay, its wait or run how: a wait is the policy's order (whom it starts first), a run its
sizes and moves.

    python bench/bench_diagnose.py --split verdict --shape easyscale --load 1 --draws 4
    python bench/bench_diagnose.py --split verdict --shape easyscale --load 1 --policies elastic-goodput,sia-inplace

Each simulation runs in a worker process, --procs at a time; Sia's workloads' job model, as bench_validate.py.
"""
import argparse
import multiprocessing
from collections import Counter, defaultdict

import numpy as np

from bench_validate import CELLS, seed_of
from easyscale_ext.sched.bound import job_lower_bounds
from easyscale_ext.sched.models.application import Applications
from easyscale_ext.sched.models.cluster import SHAPES, Cluster
from easyscale_ext.sched.models.sampler import sample_workload
from easyscale_ext.sched.models.traces import data_dir
from easyscale_ext.sched.policies import RUNNABLE
from easyscale_ext.sched.policies.sia import config_of
from easyscale_ext.sched.simulator import SIA_RESTARTS, simulate

_apps = None


def specs_of(data, shape, load, seed):
    global _apps
    _apps = _apps or Applications(data)
    cluster = Cluster.parse(SHAPES[shape])
    return cluster, sample_workload(data / "pollux" / "traces" / "philly.csv", _apps, cluster, seed, load)


def simulate_one(task) -> tuple:
    """(seed, policy, {job: (arrival, first start, completion, GPUs asked, GPU-seconds, changes, GPU-seconds by
    type)}), changes a Counter of grow, shrink, move and resume."""
    data, shape, load, seed, name = task
    cluster, specs = specs_of(data, shape, load, seed)
    policy = RUNNABLE[name](0)
    decided = []  # (time, {job: ((GPU type, GPUs), ...)}) of each round: a simulated run's segments say no type
    optimize = policy.optimize

    def recorded(now, jobs, cluster, allocations):
        out = optimize(now, jobs, cluster, allocations)
        decided.append((now, {job: config_of(alloc, cluster) for job, alloc in out.items() if alloc}))
        return out

    policy.optimize = recorded
    result = simulate(specs, policy, cluster, _apps, SIA_RESTARTS)
    held = defaultdict(list)  # job -> its segments (start, end, GPUs), in time order
    for job, start, end, gpus in sorted(result.segments, key=lambda s: s[1]):
        held[job].append((start, end, gpus))
    changes = {job: Counter(change_of(a, b) for a, b in zip(spans, spans[1:])) for job, spans in held.items()}
    completion = {j["name"]: j["completion"] for j in result.jobs}
    on_type = defaultdict(Counter)  # job -> GPU type -> GPU-seconds, as decided from each round to the next
    for (begin, configs), (until, _) in zip(decided, decided[1:] + [(max(completion.values()), {})]):
        for job, config in configs.items():
            for gpu_type, gpus in config:
                on_type[job][gpu_type] += gpus * max(min(until, completion[job]) - begin, 0.0)
    return seed, name, {j["name"]: (j["arrival"], j["start"], j["completion"], j["gpus_asked"],
                                    j["gpu_seconds"], changes.get(j["name"], Counter()), on_type[j["name"]])
                        for j in result.jobs}


def change_of(before, after) -> str:
    """What happened between two of a job's segments (start, end, GPUs)."""
    if after[0] > before[1]:
        return "resume"
    return "grow" if after[2] > before[2] else "shrink" if after[2] < before[2] else "move"


def lower_limits(task) -> tuple:
    data, shape, load, seed = task
    cluster, specs = specs_of(data, shape, load, seed)
    return seed, dict(zip((s.name for s in specs), job_lower_bounds(specs, cluster, _apps, SIA_RESTARTS)))


LENGTHS = ((600, "under 10 min"), (3600, "10 min to 1 h"), (3 * 3600, "1 to 3 h"), (float("inf"), "over 3 h"))


def length_of(limit: float) -> str:
    """The length group of a job whose JCT alone on the cluster is at least `limit` seconds."""
    return next(f"{i}: {name}" for i, (below, name) in enumerate(LENGTHS, 1) if limit < below)


KINDS = ("grow", "shrink", "move", "resume")


def table(title, rows, total) -> None:
    print(f"\n{title}\n")
    print("| group | jobs | JCT lost (h) | share of the loss | of it waiting (h) | of it running (h) | "
          "GPU-hours: A / B | GPUs held running: A / B | A's grow, shrink, move, resume | B's |")
    print("|---|" + "---:|" * 9)
    for name, r in rows:
        kinds = lambda p: ", ".join(str(r[p][k]) for k in KINDS)  # noqa: E731
        print(f"| {name} | {r['jobs']} | {r['lost'] / 3600:.2f} | {r['lost'] / total:.0%} | {r['wait'] / 3600:.2f} | "
              f"{r['run'] / 3600:.2f} | {r['gpu'][0] / 3600:.0f} / {r['gpu'][1] / 3600:.0f} | "
              f"{r['gpu'][0] / r['ran'][0]:.1f} / {r['gpu'][1] / r['ran'][1]:.1f} | {kinds(0)} | {kinds(1)} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", default="verdict", help="bench_validate.py's split whose draws are diagnosed")
    parser.add_argument("--shape", choices=list(SHAPES), required=True)
    parser.add_argument("--load", type=float, required=True)
    parser.add_argument("--draws", type=int, default=4, help="the cell's first draws")
    parser.add_argument("--policies", default="elastic-goodput,sia-inplace", help="A,B: where A loses to B")
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--data", default=None)
    args = parser.parse_args()
    a, b = args.policies.split(",")
    cell = CELLS.index((args.shape, args.load))
    data = data_dir(args.data)
    seeds = [seed_of(args.split, cell, k) for k in range(args.draws)]
    with multiprocessing.get_context("spawn").Pool(args.procs) as pool:
        runs = pool.map(simulate_one, [(data, args.shape, args.load, s, p) for s in seeds for p in (a, b)])
        limits = dict(pool.map(lower_limits, [(data, args.shape, args.load, s) for s in seeds]))
    jobs = defaultdict(dict)  # (seed, job) -> policy -> its figures
    for seed, policy, records in runs:
        for name, figures in records.items():
            jobs[seed, name][policy] = figures
    print(f"{a} (A) against {b} (B) on {args.shape} at load {args.load:g}, {args.split} draws {seeds}")
    print("\n| draw | jobs | avg JCT A (h) | avg JCT B (h) | A / B |\n|---:|---:|---:|---:|---:|")
    for seed in seeds:
        mine = [f for (s, _), f in jobs.items() if s == seed]
        jct = {p: np.mean([f[p][2] - f[p][0] for f in mine]) for p in (a, b)}
        print(f"| {seed} | {len(mine)} | {jct[a] / 3600:.3f} | {jct[b] / 3600:.3f} | {jct[a] / jct[b]:.3f} |")
    def row():
        return {"jobs": 0, "lost": 0.0, "wait": 0.0, "run": 0.0, "gpu": [0.0, 0.0], "ran": [0.0, 0.0],
                0: Counter(), 1: Counter(), "types": [Counter(), Counter()]}

    by_length, by_size = defaultdict(row), defaultdict(row)
    for job, f in jobs.items():
        arrival = f[a][0]
        for r in (by_length[length_of(limits[job[0]][job[1]])], by_size[f"{f[a][3]} GPUs asked"]):
            r["jobs"] += 1
            r["lost"] += f[a][2] - f[b][2]
            r["wait"] += (f[a][1] - arrival) - (f[b][1] - arrival)
            r["run"] += (f[a][2] - f[a][1]) - (f[b][2] - f[b][1])
            for i, p in enumerate((a, b)):
                r["gpu"][i] += f[p][4]
                r["ran"][i] += f[p][2] - f[p][1]
                r[i].update(f[p][5])
                r["types"][i].update(f[p][6])
    total = sum(r["lost"] for r in by_length.values())
    print(f"\nJCT A - B summed over every job: {total / 3600:.2f} h (positive: A loses)")
    table("by length (alone on the cluster, at best)", sorted(by_length.items()), total)
    table("by GPUs asked", sorted(by_size.items(), key=lambda kv: int(kv[0].split()[0])), total)
    types = list(dict.fromkeys(Cluster.parse(SHAPES[args.shape]).types))
    print("\nGPU-hours on each type, A / B, by length (as decided round by round)\n")
    print("| group | " + " | ".join(types) + " |\n|---|" + "---:|" * len(types))
    for name, r in sorted(by_length.items()):
        print(f"| {name} | " + " | ".join(f"{r['types'][0][t] / 3600:.0f} / {r['types'][1][t] / 3600:.0f}"
                                         for t in types) + " |")


if __name__ == "__main__":
    main()
