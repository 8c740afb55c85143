"""The seeds' policies against their papers' baselines in the simulator; markdown tables for BENCHMARKS.md.

Pollux's workloads on 16 nodes x 4 T4, 60 s rounds. EDL: Tiresias and Elastic-Tiresias with 30 s of
stop-and-restart per reallocation and with our measured in-place scale-event pause (0.07 s). Saxena et al.:
the batch-adaptive dynamic program against the same program at the user's batch (30 s per reallocation),
average JCT and jobs completed within horizons after the first submission (the workloads submit for ~8 h).
EasyScale: YARN-CS (one start per round), EasyScale-homo and -heter on its 32 V100 + 16 P100 + 16 T4, with a
20 s first start and free rescaling, on EasyScale-format workloads drawn from the Philly trace (seeds 0-2).

  python bench/bench_seeds.py                  # the 8 workloads, about 2 min on 2 cores
  python bench/bench_seeds.py --workloads 6 --easyscale-seeds 0
"""
import argparse
import multiprocessing

import numpy as np

from easyscale_ext.sched.models.application import Applications
from easyscale_ext.sched.models.cluster import Cluster
from easyscale_ext.sched.models.traces import data_dir
from easyscale_ext.sched.models.workload import easyscale_workload, load_workload
from easyscale_ext.sched.policies import RUNNABLE
from easyscale_ext.sched.simulator import SimConfig, simulate

STOP_FREE_S = 0.07  # BENCHMARKS.md, "Scale-event pause": 0.06-0.07 s per in-place scale event
RUNS = [("tiresias", 30.0), ("tiresias", STOP_FREE_S), ("edl", 30.0), ("edl", STOP_FREE_S),
        ("saxena-fixed", 30.0), ("saxena", 30.0)]
HORIZONS_H = (4, 8)
EASYSCALE_CLUSTER = "4x8:v100,2x8:p100,4x4:t4"
EASYSCALE_RUNS = ("yarn-cs", "easyscale-homo", "easyscale-heter")
EASYSCALE_LOAD = dict(jobs=80, hours=8.0)


def run(task):
    policy, restart, workload, data = task
    specs = load_workload(data / "pollux" / "workloads" / f"{workload}.csv")
    result = simulate(specs, RUNNABLE[policy](0), Cluster.parse("16x4:t4"), Applications(data),
                      SimConfig(restart_s=restart, start_s=restart))
    start = min(j["arrival"] for j in result.jobs)
    done = {h: sum(j["completion"] - start <= h * 3600 for j in result.jobs) for h in HORIZONS_H}
    return (policy, restart, workload), {"avg_jct": float(np.mean([j["jct"] for j in result.jobs])),
                                         "restarts": float(np.mean([j["restarts"] for j in result.jobs])),
                                         **{f"done_{h}h": d for h, d in done.items()}}


def run_easyscale(task):
    policy, seed, specs, data = task
    result = simulate(specs, RUNNABLE[policy](0), Cluster.parse(EASYSCALE_CLUSTER), Applications(data),
                      SimConfig(start_s=20.0, restart_s=0.0))
    jct = [j["jct"] for j in result.jobs]
    end = max(j["completion"] for j in result.jobs) - min(j["arrival"] for j in result.jobs)
    return (policy, seed), {"avg_jct": float(np.mean(jct)), "p99_jct": float(np.percentile(jct, 99)),
                            "makespan": float(end)}


def easyscale_table(rows, seeds):
    print(f"\n| policy | avg JCT s, mean of seeds {', '.join(map(str, seeds))} | p99 JCT s | makespan s | "
          + " | ".join(f"avg JCT s, seed {s}" for s in seeds) + " |")
    print("|---|" + "---:|" * (3 + len(seeds)))
    for policy in EASYSCALE_RUNS:
        mean = {k: np.mean([rows[policy, s][k] for s in seeds]) for k in ("avg_jct", "p99_jct", "makespan")}
        print(f"| {policy} | {mean['avg_jct']:.0f} | {mean['p99_jct']:.0f} | {mean['makespan']:.0f} | "
              + " | ".join(f"{rows[policy, s]['avg_jct']:.0f}" for s in seeds) + " |")


def columns(rows, workloads):
    """workload-6 alone (if run) and the mean over all the workloads run."""
    cols = [("workload-6", ["workload-6"])] if "workload-6" in workloads else []
    return cols + [(f"mean of {len(workloads)}", workloads)] if len(workloads) > 1 else cols


def edl_table(rows, workloads):
    cols = columns(rows, workloads)
    print("\n| policy | reallocation | " + " | ".join(f"avg JCT (s), {c}" for c, _ in cols)
          + " | restarts/job, " + cols[-1][0] + " |")
    print("|---|---|" + "---:|" * (len(cols) + 1))
    for policy, restart in RUNS[:4]:
        jct = [np.mean([rows[policy, restart, w]["avg_jct"] for w in ws]) for _, ws in cols]
        restarts = np.mean([rows[policy, restart, w]["restarts"] for w in cols[-1][1]])
        name = "Tiresias" if policy == "tiresias" else "E-Tiresias (EDL)"
        print(f"| {name} | {restart:g} s | " + " | ".join(f"{v:.0f}" for v in jct) + f" | {restarts:.2f} |")


def saxena_table(rows, workloads):
    cols = columns(rows, workloads)
    done = [f"done_{h}h" for h in HORIZONS_H]
    print("\n| policy | " + " | ".join(f"avg JCT (s), {c} | " + " | ".join(
        f"jobs done in {h} h, {c}" for h in HORIZONS_H) for c, _ in cols) + " |")
    print("|---|" + "---:|" * (len(cols) * (1 + len(HORIZONS_H))))
    for policy in ("saxena-fixed", "saxena"):
        cells = []
        for _, ws in cols:
            cells += [f"{np.mean([rows[policy, 30.0, w]['avg_jct'] for w in ws]):.0f}"]
            cells += [f"{np.mean([rows[policy, 30.0, w][d] for w in ws]):.1f}" for d in done]
        name = "fixed batch (baseline)" if policy == "saxena-fixed" else "Saxena (batch in range)"
        print(f"| {name} | " + " | ".join(cells) + " |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=None)
    parser.add_argument("--workloads", type=int, nargs="+", default=list(range(1, 9)))
    parser.add_argument("--easyscale-seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    data = data_dir(args.data)
    workloads = [f"workload-{w}" for w in args.workloads]
    tasks = [(p, r, w, data) for w in workloads for p, r in RUNS]
    tasks.sort(key=lambda t: t[0] != "saxena")  # the slowest first keeps both cores busy
    trace = load_workload(data / "pollux" / "traces" / "philly.csv")
    apps, cluster = Applications(data), Cluster.parse(EASYSCALE_CLUSTER)
    generated = {s: easyscale_workload(trace, apps, cluster, seed=s, **EASYSCALE_LOAD) for s in args.easyscale_seeds}
    with multiprocessing.get_context("fork").Pool(2) as pool:
        rows = dict(pool.imap_unordered(run, tasks))
        easyscale_rows = dict(pool.imap_unordered(run_easyscale, [(p, s, generated[s], data) for s in generated
                                                                  for p in EASYSCALE_RUNS]))
    edl_table(rows, workloads)
    saxena_table(rows, workloads)
    easyscale_table(easyscale_rows, args.easyscale_seeds)


if __name__ == "__main__":
    main()
