"""Fidelity and speed of the scheduling simulator (easyscale_ext.sched); figures for BENCHMARKS.md.

Fidelity: the Pollux artifact's setting (16 nodes x 4 T4, 60 s rounds, 30 s per reallocation), average JCT of
Pollux, Optimus+Oracle and Tiresias on the 8 workloads of pollux/workloads/ (or workloads-2.0/), against the
artifact's own results per workload.
Speed: wall time of one 160-job workload per policy, and of the Philly trace (FIFO, Tiresias) by job count.
Timing (--timing): CPU seconds of every policy on every shipped workload, one run at a time (one core): Pollux's 8
workloads and their 2x versions on 16 x 4 T4, Sia's 8 on its cluster, EasyScale's test.csv on its cluster.
Sia's setting (--sia): Sia and Pollux on Sia's 8 Philly workloads and cluster, uncalibrated, under the Sia
artifact's job model (simulator.SIA) and under that with 30 s restarts, both with Pollux and Sia as that artifact
runs them (policies.SIA_ARTIFACT), against the means in Sia's SOSP'23 paper (as its artifact ships them).

  python bench/bench_sched.py                      # everything (about 15 min on 2 cores)
  python bench/bench_sched.py --seeds 0 --workloads 6 --philly 10000
  python bench/bench_sched.py --load 2.0 --seeds 0 --philly     # twice the load (workloads-2.0/), no trace
  taskset -c 1 python bench/bench_sched.py --timing   # about 30 min
  taskset -c 1 python bench/bench_sched.py --timing --policies pollux   # Pollux's search against its 60 s goal
  python bench/bench_sched.py --sia --seeds 0          # about 8 min
  python bench/bench_sched.py --workloads 2 --seeds 0 --philly --search elitist [--size 64x24]  # the fast search
  python bench/bench_sched.py --seeds 0 --philly --pollux-nodes needed   # Pollux searching only the nodes it needs
"""
import argparse
import functools
import json
import multiprocessing
import time
from dataclasses import replace

import numpy as np

from easyscale_ext.sched.models.application import STAND_INS, Applications
from easyscale_ext.sched.models.cluster import EASYSCALE, Cluster
from easyscale_ext.sched.models.traces import data_dir
from easyscale_ext.sched.models.workload import load_workload, unique_names, with_stand_ins
from easyscale_ext.sched.policies import RUNNABLE, made
from easyscale_ext.sched.policies.pollux import NODES, SEARCHES, PolluxPolicy
from easyscale_ext.sched.simulator import SIA, SimConfig, simulate, validate

PUBLISHED = {  # average JCT (s) on workloads 1..8, the Pollux artifact's simulator/results-jobload/<policy>-<load>
    "workloads": {"pollux": (2089, 3323, 2188, 2721, 2674, 2446, 3616, 2952),
                  "tiresias": (2474, 5145, 3876, 3280, 3501, 3470, 5480, 5080),
                  "optimus": (4087, 6914, 3944, 5968, 5656, 5302, 7291, 6294)},
    "workloads-2.0": {"pollux": (6186, 4191, 5132, 5262, 6591, 5105, 3836, 6010),
                      "tiresias": (10138, 8656, 10728, 9665, 12098, 10255, 8371, 10406),
                      "optimus": (10807, 8515, 8363, 10313, 11830, 9767, 6998, 11175)},
}
FIDELITY = ("pollux", "tiresias", "optimus")
SIA_PAPER = {"sia": (0.6, 9.5, 14.2), "pollux": (1.0, 14.9, 24.5)}  # hours: average JCT, p99 JCT, makespan
# Job models on Sia's setting: uncalibrated, the Sia artifact's (simulator.SIA), and that with Pollux's 30 s restarts
SIA_MODELS = {"none": SimConfig(), "sia": SIA, "sia-30s": replace(SIA, restart_by_app={})}
PHILLY_CLUSTER = "64x8"  # 512 GPUs: the trace's mean demand is ~374 GPUs
SHIPPED = {  # workload family: (files in the data folder, cluster)
    "pollux": ([f"pollux/workloads/workload-{w}.csv" for w in range(1, 9)], "16x4:t4"),
    "pollux-2x": ([f"pollux/workloads-2.0/workload-{w}.csv" for w in range(1, 9)], "16x4:t4"),
    "sia": ([f"sia/workloads/philly/workload-{w}.csv" for w in range(1, 9)], "6x4:t4,2x8:a100,3x8:2080ti"),
    "easyscale": (["easyscale/workloads/test.csv"], EASYSCALE),
}


def run(task, search=None):
    """One simulation; `search` (search, population, generations, nodes) is Pollux's search instead of its
    default."""
    kind, policy, target, seed, data, folder = task
    config = SimConfig()
    if kind == "fidelity":
        cluster, specs = Cluster.parse("16x4:t4"), load_workload(data / "pollux" / folder / f"{target}.csv")
    elif kind == "sia":  # folder: the job model, one of SIA_MODELS
        paths, spec = SHIPPED["sia"]
        cluster, specs = Cluster.parse(spec), load_workload(data / paths[target - 1])
        config = SIA_MODELS[folder]
    else:
        cluster = Cluster.parse(PHILLY_CLUSTER)
        specs = load_workload(data / "pollux" / "traces" / "philly.csv", limit=target)
    begin = time.perf_counter()
    calibration = "sia" if kind == "sia" and folder != "none" else "none"  # under its job model, its Pollux and Sia
    chosen = made(policy, calibration)(seed)
    if search and policy == "pollux":  # the search asked for, at the setting's p
        chosen = PolluxPolicy(seed, p=chosen.p, search=search[0], population=search[1], generations=search[2],
                              nodes=search[3])
    result = simulate(specs, chosen, cluster, Applications(data), config)
    wall = time.perf_counter() - begin
    jct = np.array([j["jct"] for j in result.jobs])
    end = max(j["completion"] for j in result.jobs) - min(j["arrival"] for j in result.jobs)
    return {"kind": kind, "policy": policy, "target": target, "seed": seed, "model": folder,
            "avg_jct": float(jct.mean()), "p99_jct": float(np.percentile(jct, 99)), "jcts": jct.tolist(),
            "makespan": end,
            "restarts": float(np.mean([j["restarts"] for j in result.jobs])), "rounds": len(result.timeline["time"]),
            "wall_s": wall}


# Sia's artifact's figures over a set of workloads (utils/print_run_stats.py): the average and the p99 over every
# job of every workload pooled (the p99 the sorted JCTs' entry at int(0.99 n)), the makespans averaged
def pooled_mean(rows):
    return float(np.mean([t for r in rows for t in r["jcts"]]))


def pooled_p99(rows):
    jcts = sorted(t for r in rows for t in r["jcts"])
    return jcts[int(0.99 * len(jcts))]


def mean_makespan(rows):
    return float(np.mean([r["makespan"] for r in rows]))


def sia_table(rows, workloads):
    """Average JCT (h) per workload and model; the means of avg / p99 / makespan against Sia's paper."""
    models = tuple(SIA_MODELS)
    print(f"\nSia's setting ({SHIPPED['sia'][1]}), hours; model none = uncalibrated, sia = simulator.SIA, "
          "sia-30s = simulator.SIA with 30 s restarts\n")
    print("| workload | " + " | ".join(f"{p}, {m}" for p in SIA_PAPER for m in models) + " |")
    print("|---|" + "---:|" * (len(SIA_PAPER) * len(models)))
    pick = lambda p, m, w: [r for r in rows if r["policy"] == p and r["model"] == m and r["target"] == w]  # noqa
    for w in workloads:
        print(f"| {w} | " + " | ".join(f"{np.mean([r['avg_jct'] for r in pick(p, m, w)]) / 3600:.3f}"
                                       for p in SIA_PAPER for m in models) + " |")
    cells, means = [], {}
    for p in SIA_PAPER:
        for m in models:
            runs = [[r for w in workloads for r in pick(p, m, w) if r["seed"] == s]
                    for s in sorted({r["seed"] for w in workloads for r in pick(p, m, w)})]
            got = [np.mean([f(run) for run in runs]) / 3600 for f in (pooled_mean, pooled_p99, mean_makespan)]
            means[p, m] = got[0]
            cells.append(" / ".join(f"{g:.2f} ({g / d - 1:+.0%})" for g, d in zip(got, SIA_PAPER[p])))
    print("| mean avg / p99 / makespan (vs paper) | " + " | ".join(cells) + " |")
    paper = SIA_PAPER["sia"][0] / SIA_PAPER["pollux"][0]
    print(f"\nSia/Pollux, average JCT (paper {paper:.2f}): " + ", ".join(
        f"{m} {means['sia', m] / means['pollux', m]:.3f} ({means['sia', m] / means['pollux', m] / paper - 1:+.1%})"
        for m in models))


def fidelity_table(rows, workloads, folder):
    def jct(policy, w):
        return [r["avg_jct"] for r in rows if r["kind"] == "fidelity" and r["policy"] == policy and r["target"] == w]

    published = PUBLISHED[folder]
    print(f"\nAverage JCT (s), pollux/{folder}/, 16x4 T4; Pollux: mean [min, max] over seeds")
    print(f"{'workload':12s}" + "".join(f"{p:>28s}" for p in FIDELITY) + "   order P<T<O")
    means = {p: [] for p in FIDELITY}
    for w in workloads:
        cells, avg = [], {}
        for p in FIDELITY:
            v = jct(p, w)
            avg[p] = float(np.mean(v))
            means[p].append(avg[p])
            ref = published[p][int(w.split("-")[1]) - 1]
            text = f"{avg[p]:.0f}" + (f" [{min(v):.0f},{max(v):.0f}]" if len(v) > 1 else "")
            cells.append(text + (f" ({avg[p] / ref - 1:+.1%} vs {ref})" if ref else ""))
        ok = avg["pollux"] < avg["tiresias"] < avg["optimus"]
        print(f"{w:12s}" + "".join(f"{c:>28s}" for c in cells) + f"   {'yes' if ok else 'NO'}")
    if len(workloads) == 8:
        ref = {p: np.mean(published[p]) for p in FIDELITY}
        print(f"{'mean of 8':12s}" + "".join(
            f"{f'{np.mean(means[p]):.0f} ({np.mean(means[p]) / ref[p] - 1:+.1%} vs {ref[p]:.0f})':>28s}"
            for p in FIDELITY))


def speed_table(rows):
    print("\nWall time (s) per 160-job workload (16x4 T4): " + ", ".join(
        f"{p} {np.mean([r['wall_s'] for r in rows if r['kind'] == 'fidelity' and r['policy'] == p]):.1f}"
        for p in FIDELITY))
    philly = [r for r in rows if r["kind"] == "philly"]
    if philly:
        gpus = Cluster.parse(PHILLY_CLUSTER).total_gpus
        print(f"\nPhilly trace on {PHILLY_CLUSTER} ({gpus} GPUs): jobs, rounds, wall s")
        for r in sorted(philly, key=lambda r: (r["policy"], r["target"])):
            print(f"  {r['policy']:9s} {r['target']:6d} jobs  {r['rounds']:7d} rounds  {r['wall_s']:7.1f} s  "
                  f"avg JCT {r['avg_jct']:.0f} s")


def timing(data, policies):
    """CPU seconds of each of `policies` on every shipped workload it can run, one after the other; a table of
    the most and the mean per workload family."""
    seconds = {}
    for family, (paths, spec) in SHIPPED.items():
        cluster = Cluster.parse(spec)
        for path in paths:
            specs = unique_names(with_stand_ins(load_workload(data / path), STAND_INS)[0])[0]
            for name in policies:
                make = RUNNABLE[name]
                try:
                    validate(specs, make(0), cluster)
                except ValueError:
                    continue
                begin = time.process_time()
                simulate(specs, make(0), cluster, Applications(data))
                seconds.setdefault((name, family), []).append(time.process_time() - begin)
                print(f"{name} {path} {seconds[name, family][-1]:.1f} s", flush=True)
    print("\nCPU seconds per run, most [mean] over each family's workloads (one core)\n")
    print("| policy | " + " | ".join(f"{f} ({len(SHIPPED[f][0])}, {SHIPPED[f][1]})" for f in SHIPPED) + " |")
    print("|---|" + "---:|" * len(SHIPPED))
    for name in policies:
        print(f"| {name} | " + " | ".join(f"{max(v):.1f} [{np.mean(v):.1f}]" if (v := seconds.get((name, f))) else "-"
                                          for f in SHIPPED) + " |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=None)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="Pollux search seeds")
    parser.add_argument("--workloads", type=int, nargs="+", default=list(range(1, 9)))
    parser.add_argument("--load", choices=["1.0", "2.0"], default="1.0",
                        help="the artifact's workloads (1.0) or those at twice the load (2.0, workloads-2.0/)")
    parser.add_argument("--philly", type=int, nargs="*", default=[10000, 20000, 41000, 82247],
                        help="Philly-trace job counts to time (none: skip)")
    parser.add_argument("--json", default=None, help="write the raw rows here")
    parser.add_argument("--timing", action="store_true", help="only time every policy on every shipped workload")
    parser.add_argument("--policies", default=",".join(RUNNABLE), help="with --timing: the policies to time")
    parser.add_argument("--sia", action="store_true", help="only Sia and Pollux on Sia's setting, against its paper")
    parser.add_argument("--search", default="nsga2", choices=SEARCHES,
                        help="Pollux's search: the artifact's NSGA-II (default) or the elitist one")
    parser.add_argument("--size", metavar="POPxGEN", help="Pollux's search size, e.g. 64x24 (default: the search's "
                        f"own: {', '.join(f'{k} {p}x{g}' for k, (p, g) in SEARCHES.items())})")
    parser.add_argument("--pollux-nodes", default="all", choices=NODES,
                        help="the nodes Pollux's search sees each round (PolluxPolicy(nodes=...))")
    args = parser.parse_args()
    data = data_dir(args.data)
    search = (args.search, *((int(x) for x in args.size.split("x")) if args.size else (None, None)),
              args.pollux_nodes)
    job = functools.partial(run, search=search)
    if args.timing:
        policies = args.policies.split(",")
        unknown = sorted(set(policies) - set(RUNNABLE))
        if unknown:
            parser.error(f"unknown policies {unknown}: choose among {', '.join(RUNNABLE)}")
        return timing(data, policies)
    if args.sia:
        tasks = [("sia", p, w, s, data, m) for w in args.workloads for p in SIA_PAPER for m in SIA_MODELS
                 for s in (args.seeds if p == "pollux" else [0])]
        with multiprocessing.get_context("fork").Pool(2) as pool:
            return sia_table(list(pool.imap_unordered(job, tasks)), args.workloads)
    workloads = [f"workload-{w}" for w in args.workloads]
    folder = "workloads" if args.load == "1.0" else "workloads-2.0"
    tasks = [("fidelity", p, w, s, data, folder) for w in workloads for p in FIDELITY
             for s in (args.seeds if p == "pollux" else [0])]
    tasks += [("philly", p, n, 0, data, None) for n in args.philly for p in ("fifo", "tiresias")]
    tasks.sort(key=lambda t: (t[0] == "fidelity", t[1] != "pollux"))  # longest first keeps both cores busy
    with multiprocessing.get_context("fork").Pool(2) as pool:
        rows = list(pool.imap_unordered(job, tasks))
    fidelity_table(rows, workloads, folder)
    speed_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)


if __name__ == "__main__":
    main()
