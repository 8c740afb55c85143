"""Every policy side by side, one table per workload family, on that family's own cluster; markdown for
BENCHMARKS.md.

  pollux     Pollux's workloads on 16 x 4 T4, 60 s rounds, 30 s per stop-and-restart
  pollux-2x  the same at twice the load (workloads-2.0/)
  sia        Sia's Philly workloads on its 6 x 4 T4 + 2 x 8 A100 + 3 x 8 RTX 2080Ti
  easyscale  EasyScale-format workloads drawn from the Philly trace (seeds) on its 32 V100 + 16 P100 + 16 T4,
             20 s first start, 30 s per restart
Jobs of policies that scale in place (EasyScale's, elastic-goodput) pay an in-place move's cost instead (the measured
pause plus the bytes that move, models/reallocation.py). The tables under one job model (Sia's restart seconds on
its workloads, the ablation) come from bench/bench_fair.py.

  python bench/bench_policies.py                       # 3 workloads per family, ~8 min on 2 cores
  python bench/bench_policies.py --families sia --workloads 1
"""
import argparse
import multiprocessing
import time

import numpy as np

from easyscale_ext.sched.models.application import Applications
from easyscale_ext.sched.models.cluster import Cluster
from easyscale_ext.sched.models.traces import data_dir
from easyscale_ext.sched.models.workload import easyscale_workload, load_workload
from easyscale_ext.sched.policies import RUNNABLE
from easyscale_ext.sched.simulator import SimConfig, simulate

ELASTIC = ["pollux", "sia", "easyscale-homo", "easyscale-heter", "elastic-goodput"]
FAMILIES = {  # cluster, simulator settings, policies
    "pollux": ("16x4:t4", SimConfig(), ["fifo", "tiresias", "optimus", "edl", "saxena", "icefrog"] + ELASTIC),
    "pollux-2x": ("16x4:t4", SimConfig(), ["fifo", "tiresias", "optimus", "edl", "saxena", "icefrog"] + ELASTIC),
    "sia": ("6x4:t4,2x8:a100,3x8:2080ti", SimConfig(), ["fifo", "tiresias"] + ELASTIC),
    "easyscale": ("4x8:v100,2x8:p100,4x4:t4", SimConfig(start_s=20.0, restart_s=30.0),
                  ["yarn-cs", "tiresias"] + ELASTIC),
}


def workload(family, index, data, apps):
    if family == "pollux":
        return load_workload(data / "pollux" / "workloads" / f"workload-{index}.csv")
    if family == "pollux-2x":
        return load_workload(data / "pollux" / "workloads-2.0" / f"workload-{index}.csv")
    if family == "sia":
        return load_workload(data / "sia" / "workloads" / "philly" / f"workload-{index}.csv")
    trace = load_workload(data / "pollux" / "traces" / "philly.csv")
    return easyscale_workload(trace, apps, Cluster.parse(FAMILIES[family][0]), jobs=80, hours=8.0, seed=index)


def run(task):
    family, index, policy, specs, data = task
    spec, config, _ = FAMILIES[family]
    begin = time.perf_counter()
    result = simulate(specs, RUNNABLE[policy](0), Cluster.parse(spec), Applications(data), config)
    jct = np.array([j["jct"] for j in result.jobs])
    end = max(j["completion"] for j in result.jobs) - min(j["arrival"] for j in result.jobs)
    used = sum(j["gpu_seconds"] for j in result.jobs) / (Cluster.parse(spec).total_gpus * end)
    return (family, index, policy), {"avg": jct.mean(), "p99": np.percentile(jct, 99), "makespan": end,
                                     "util": used, "wall": time.perf_counter() - begin}


def table(family, indices, rows):
    policies = FAMILIES[family][2]
    label = "seed" if family == "easyscale" else "workload"
    print(f"\n{family} ({FAMILIES[family][0]}), mean over {label}s {', '.join(map(str, indices))}:\n")
    print("| policy | avg JCT h | p99 JCT h | makespan h | GPU util | " + " | ".join(
        f"avg JCT h, {label} {i}" for i in indices) + " | wall s per run |")
    print("|---|" + "---:|" * (5 + len(indices)))
    best = min(np.mean([rows[family, i, p]["avg"] for i in indices]) for p in policies if p != "elastic-goodput")
    for p in policies:
        r = [rows[family, i, p] for i in indices]
        mean = {k: np.mean([x[k] for x in r]) for k in ("avg", "p99", "makespan", "util", "wall")}
        mark = f" ({mean['avg'] / best:.2f} of the best other)" if p == "elastic-goodput" else ""
        print(f"| {p} | {mean['avg'] / 3600:.3f}{mark} | {mean['p99'] / 3600:.2f} | {mean['makespan'] / 3600:.1f} | "
              f"{mean['util']:.2f} | " + " | ".join(f"{x['avg'] / 3600:.3f}" for x in r) + f" | {mean['wall']:.0f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=None)
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--workloads", type=int, nargs="+", default=[1, 2, 3],
                        help="workload numbers (Pollux, Sia) and seeds (EasyScale, from 1 on too)")
    args = parser.parse_args()
    data = data_dir(args.data)
    apps = Applications(data)
    tasks = [(f, i, p, workload(f, i, data, apps), data) for f in args.families for i in args.workloads
             for p in FAMILIES[f][2]]
    tasks.sort(key=lambda t: t[2] != "pollux")  # the slowest first keeps both cores busy
    with multiprocessing.get_context("fork").Pool(2) as pool:
        rows = dict(pool.imap_unordered(run, tasks))
    for family in args.families:
        table(family, args.workloads, rows)


if __name__ == "__main__":
    main()
