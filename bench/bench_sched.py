"""Fidelity and speed of the scheduling simulator (easyscale_ext.sched); figures for BENCHMARKS.md.

Fidelity: the Pollux artifact's setting (16 nodes x 4 T4, 60 s rounds, 30 s per reallocation), average JCT of
Pollux, Optimus+Oracle and Tiresias on the 8 workloads of pollux/workloads/, against the published numbers.
Speed: wall time of one 160-job workload per policy, and of the Philly trace (FIFO, Tiresias) by job count.

  python bench/bench_sched.py                      # everything (about 15 min on 2 cores)
  python bench/bench_sched.py --seeds 0 --workloads 6 --philly 10000
"""
import argparse
import json
import multiprocessing
import time

import numpy as np

from easyscale_ext.sched.models.application import Applications
from easyscale_ext.sched.models.cluster import Cluster
from easyscale_ext.sched.models.traces import data_dir
from easyscale_ext.sched.models.workload import load_workload
from easyscale_ext.sched.policies import POLICIES
from easyscale_ext.sched.simulator import simulate

PUBLISHED = {  # average JCT (s), Pollux artifact (DATA.md)
    "workload-6": {"pollux": 2446, "optimus": 5302, "tiresias": 3470},
    "mean": {"pollux": 2751, "optimus": 5682, "tiresias": 4038},
}
FIDELITY = ("pollux", "tiresias", "optimus")
PHILLY_CLUSTER = "64x8"  # 512 GPUs: the trace's mean demand is ~374 GPUs


def run(task):
    kind, policy, target, seed, data = task
    cluster = Cluster.parse("16x4:t4" if kind == "fidelity" else PHILLY_CLUSTER)
    if kind == "fidelity":
        specs = load_workload(data / "pollux" / "workloads" / f"{target}.csv")
    else:
        specs = load_workload(data / "pollux" / "traces" / "philly.csv", limit=target)
    begin = time.perf_counter()
    result = simulate(specs, POLICIES[policy](seed), cluster, Applications(data))
    wall = time.perf_counter() - begin
    jct = np.array([j["jct"] for j in result.jobs])
    return {"kind": kind, "policy": policy, "target": target, "seed": seed, "avg_jct": float(jct.mean()),
            "restarts": float(np.mean([j["restarts"] for j in result.jobs])), "rounds": len(result.timeline["time"]),
            "wall_s": wall}


def fidelity_table(rows, workloads):
    def jct(policy, w):
        return [r["avg_jct"] for r in rows if r["kind"] == "fidelity" and r["policy"] == policy and r["target"] == w]

    print("\nAverage JCT (s), 16x4 T4; Pollux: mean [min, max] over seeds")
    print(f"{'workload':12s}" + "".join(f"{p:>28s}" for p in FIDELITY) + "   order P<T<O")
    means = {p: [] for p in FIDELITY}
    for w in workloads:
        cells, avg = [], {}
        for p in FIDELITY:
            v = jct(p, w)
            avg[p] = float(np.mean(v))
            means[p].append(avg[p])
            ref = PUBLISHED.get(w, {}).get(p)
            text = f"{avg[p]:.0f}" + (f" [{min(v):.0f},{max(v):.0f}]" if len(v) > 1 else "")
            cells.append(text + (f" ({avg[p] / ref - 1:+.1%} vs {ref})" if ref else ""))
        ok = avg["pollux"] < avg["tiresias"] < avg["optimus"]
        print(f"{w:12s}" + "".join(f"{c:>28s}" for c in cells) + f"   {'yes' if ok else 'NO'}")
    if len(workloads) == 8:
        ref = PUBLISHED["mean"]
        print(f"{'mean of 8':12s}" + "".join(
            f"{f'{np.mean(means[p]):.0f} ({np.mean(means[p]) / ref[p] - 1:+.1%} vs {ref[p]})':>28s}" for p in FIDELITY))


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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=None)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="Pollux search seeds")
    parser.add_argument("--workloads", type=int, nargs="+", default=list(range(1, 9)))
    parser.add_argument("--philly", type=int, nargs="*", default=[10000, 20000, 41000, 82247],
                        help="Philly-trace job counts to time (none: skip)")
    parser.add_argument("--json", default=None, help="write the raw rows here")
    args = parser.parse_args()
    data = data_dir(args.data)
    workloads = [f"workload-{w}" for w in args.workloads]
    tasks = [("fidelity", p, w, s, data) for w in workloads for p in FIDELITY
             for s in (args.seeds if p == "pollux" else [0])]
    tasks += [("philly", p, n, 0, data) for n in args.philly for p in ("fifo", "tiresias")]
    tasks.sort(key=lambda t: (t[0] == "fidelity", t[1] != "pollux"))  # longest first keeps both cores busy
    with multiprocessing.get_context("fork").Pool(2) as pool:
        rows = list(pool.imap_unordered(run, tasks))
    fidelity_table(rows, workloads)
    speed_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)


if __name__ == "__main__":
    main()
