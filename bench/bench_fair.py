"""Every policy under one job model: per workload family a table of avg JCT, p99 JCT and makespan, and
the ablation of elastic-goodput. Markdown for BENCHMARKS.md; one simulation at a time.

Job model, the same for every policy: a restart-based job pays its restart (Pollux's workloads and EasyScale's:
a flat 30 s, EasyScale's 20 s first start; Sia's workloads: Sia's per-application 15-250 s); a job of a policy
that runs in place pays the measured pause plus the bytes that move (models/reallocation.py); freezing off.

  python bench/bench_fair.py --tables                       # the three families (~13 min on one core)
  python bench/bench_fair.py --ablation --workloads 1 2 3 4 # ablation: Sia's and Pollux's 1-4, EasyScale's
  python bench/bench_fair.py --tables --families sia --workloads 1
  python bench/bench_fair.py --spread --families easyscale  # elastic-goodput / sia under arrivals moved by up to 30 s
"""
import argparse
import json
import time
from dataclasses import replace
from functools import lru_cache

import numpy as np

from easyscale_ext.sched.bound import job_lower_bounds
from easyscale_ext.sched.models.application import STAND_INS, Applications
from easyscale_ext.sched.models.cluster import Cluster
from easyscale_ext.sched.models.traces import data_dir
from easyscale_ext.sched.models.workload import load_workload, unique_names, with_stand_ins
from easyscale_ext.sched.policies import RUNNABLE
from easyscale_ext.sched.simulator import SIA_RESTARTS, SimConfig, simulate

FAMILIES = {  # workload path, cluster, job model (flags of easyscale simulate), policies
    "sia": ("sia/workloads/philly/workload-{}.csv", "6x4:t4,2x8:a100,3x8:2080ti", SIA_RESTARTS,
            "--calibration sia-restarts", ["fifo", "tiresias", "pollux", "easyscale-homo", "easyscale-heter", "sia",
                                           "elastic-goodput"]),
    "pollux": ("pollux/workloads/workload-{}.csv", "16x4:t4", SimConfig(), "",
               ["fifo", "tiresias", "optimus", "edl", "saxena", "icefrog", "pollux", "easyscale-homo", "sia",
                "elastic-goodput"]),
    "easyscale": ("easyscale/workloads/test.csv", "4x8:v100,2x8:p100,4x4:t4", SimConfig(start_s=20.0, restart_s=30.0),
                  "--start 20 --restart 30", ["yarn-cs", "tiresias", "pollux", "easyscale-homo",
                                              "easyscale-heter", "sia", "elastic-goodput"]),
}
# Published average JCTs, seconds: the Pollux artifact's results-jobload/<policy>-1.0/summary.json per workload;
# EasyScale's paper for its test.csv (heter / homo / YARN-CS). Sia's paper gives means only (calibrated testbed).
PUBLISHED = {
    ("pollux", "pollux"): [2089, 3323, 2188, 2721, 2674, 2446, 3616, 2952],
    ("pollux", "tiresias"): [2474, 5145, 3876, 3280, 3501, 3470, 5480, 5080],
    ("pollux", "optimus"): [4087, 6914, 3944, 5968, 5656, 5302, 7291, 6294],
    ("easyscale", "easyscale-heter"): [677], ("easyscale", "easyscale-homo"): [1071],
    ("easyscale", "yarn-cs"): [8905],
}
LIMIT = "lower limit"
SIA_PAPER = {"sia": "0.6 / 9.5 / 14.2 (mean, calibrated)", "pollux": "1.0 / 14.9 / 24.5 (mean, calibrated)"}
# The ablation: (row, policy, in-place switch, what it assumes)
ABLATION = [
    ("Sia", "sia", "policy", "Sia's program; jobs restart on every change"),
    ("Sia + in place", "sia", "on", "Sia's program unchanged; jobs move in place (pause + bytes)"),
    ("Sia + in place, discounted", "sia-inplace", "policy", "as above, and the program discounts a change by 1 s"),
    ("Sia + mixed types", "elastic-goodput-pairs-only", "policy",
     "Sia's program with two-type configurations; restarts"),
    ("elastic-goodput", "elastic-goodput", "policy",
     "two-type pairs + cheap-move growth + sqrt-utility objective + remaining-work weight; jobs in place"),
    ("elastic-goodput without mixed types", "elastic-goodput-no-mixed", "policy", "one type per job"),
    ("elastic-goodput without cheap-move growth", "elastic-goodput-no-fast-growth", "policy",
     "Sia's 2x growth limit and 30 s discount"),
    ("elastic-goodput with Sia's objective", "elastic-goodput-sia-objective", "policy",
     "Sia's cost value^-0.5 instead of the utility"),
    ("elastic-goodput without the remaining-work weight", "elastic-goodput-no-remaining", "policy",
     "values not weighted by remaining work"),
    ("elastic-goodput, restart-based", "elastic-goodput", "off",
     "elastic-goodput's program, but jobs restart on every change"),
]


def specs_of(family, index, data):
    path = data / FAMILIES[family][0].format(index)
    specs, _ = with_stand_ins(load_workload(path), STAND_INS)
    return unique_names(specs)[0]


def moved(specs, draw, jitter):
    """`specs` with each arrival moved by up to `jitter` seconds, drawn with seed `draw` (0: as in the trace)."""
    if not draw:
        return specs
    rng = np.random.default_rng(draw)
    return sorted((replace(s, arrival=max(0.0, s.arrival + rng.uniform(-jitter, jitter))) for s in specs),
                  key=lambda s: s.arrival)


def run(family, index, policy, data, draw=0, jitter=0.0, **config):
    _, cluster, base, _, _ = FAMILIES[family]
    begin = time.process_time()
    result = simulate(moved(specs_of(family, index, data), draw, jitter), RUNNABLE[policy](0), Cluster.parse(cluster),
                      Applications(data), replace(base, **config))
    figures = summary({j["name"]: (j["arrival"], j["jct"]) for j in result.jobs})
    limits = lower_limits(family, index, data)
    figures["least"] = min(j["jct"] / limits[j["name"]] for j in result.jobs)  # >= 1: no job beats its limit
    return dict(figures, cpu=time.process_time() - begin)


def summary(jobs) -> dict:
    """avg JCT, p99 JCT and makespan of {name: (arrival, JCT)}."""
    arrival, jct = (np.array(column) for column in zip(*jobs.values()))
    return {"avg": float(jct.mean()), "p99": float(np.percentile(jct, 99)),
            "makespan": float(np.max(arrival + jct) - np.min(arrival))}


@lru_cache(maxsize=None)
def lower_limits(family, index, data) -> dict:
    """Each job's lower limit on its JCT under any policy (sched.bound): name -> seconds."""
    _, cluster, base, _, _ = FAMILIES[family]
    specs = specs_of(family, index, data)
    return dict(zip((s.name for s in specs), job_lower_bounds(specs, Cluster.parse(cluster), Applications(data), base)))


def limit_row(family, index, data) -> dict:
    """The limit's avg, p99 and makespan: each a lower limit on that figure, as every JCT is at least its job's."""
    limits = lower_limits(family, index, data)
    return dict(summary({s.name: (s.arrival, limits[s.name]) for s in specs_of(family, index, data)}), cpu=0.0)


def mean(rows, key):
    return float(np.mean([r[key] for r in rows]))


def tables(args, data, out):
    for family in args.families:
        indices = [0] if family == "easyscale" else args.workloads
        rows = {p: [run(family, i, p, data) for i in indices] for p in FAMILIES[family][4]}
        limit = [limit_row(family, i, data) for i in indices]
        out[family] = dict(rows, **{LIMIT: limit})
        label = "" if family == "easyscale" else f", mean over workloads {', '.join(map(str, indices))}"
        print(f"\n{family} ({FAMILIES[family][1]}){label}; hours\n")
        print("| policy | avg JCT | p99 JCT | makespan | published avg JCT | " +
              ("" if family == "easyscale" else " | ".join(f"avg w{i}" for i in indices) + " | ") + "CPU s | "
              "avg / limit |")
        print("|---|" + "---:|" * (4 + (0 if family == "easyscale" else len(indices)) + 2))
        for p, r in [*rows.items(), (LIMIT, limit)]:
            pub = PUBLISHED.get((family, p))
            pub = (f"{np.mean([pub[i - 1] if family != 'easyscale' else pub[0] for i in indices]) / 3600:.3f}"
                   if pub else SIA_PAPER.get(p, "") if family == "sia" else "")
            per = "" if family == "easyscale" else " | ".join(f"{x['avg'] / 3600:.3f}" for x in r) + " | "
            print(f"| {p} | {mean(r, 'avg') / 3600:.3f} | {mean(r, 'p99') / 3600:.2f} | "
                  f"{mean(r, 'makespan') / 3600:.2f} | {pub} | {per}{mean(r, 'cpu'):.0f} | "
                  f"{mean(r, 'avg') / mean(limit, 'avg'):.2f} |")
        least = min(x["least"] for r in rows.values() for x in r)
        print(f"\n{LIMIT}: each job alone, in every epoch on its fastest one-type allocation and batch, moving for "
              f"free (sched.bound); the least JCT / limit of any job in any row: {least:.4f}"
              + ("" if least >= 1 - 1e-9 else " (BELOW 1: the limit does not hold)"))
        if "sia" in rows and "elastic-goodput" in rows:
            print("\nours / sia per workload (avg, p99, makespan): " + "; ".join(
                f"{i}: {o['avg'] / s['avg']:.3f}, {o['p99'] / s['p99']:.3f}, {o['makespan'] / s['makespan']:.3f}"
                for i, o, s in zip(indices, rows["elastic-goodput"], rows["sia"])), flush=True)


def spread(args, data, out):
    """Elastic-goodput's avg JCT over Sia's per workload, in draws whose arrivals are moved by up to --jitter seconds: a
    figure of one trace can turn on near-ties, so one simulation is one draw of a spread."""
    for family in args.families:
        indices = [0] if family == "easyscale" else args.workloads
        print(f"\n{family}: elastic-goodput / sia, avg JCT, arrivals moved by up to {args.jitter:g} s (draw 0: as "
              "in the trace)\n")
        print("| workload | " + " | ".join(f"draw {d}" for d in range(args.draws)) + " | median |")
        print("|---|" + "---:|" * (args.draws + 1))
        for i in indices:
            ratios = [run(family, i, "elastic-goodput", data, d, args.jitter)["avg"] /
                      run(family, i, "sia", data, d, args.jitter)["avg"] for d in range(args.draws)]
            out.setdefault("spread", {}).setdefault(family, {})[i] = ratios
            print(f"| {i} | " + " | ".join(f"{r:.3f}" for r in ratios) + f" | {np.median(ratios):.3f} |", flush=True)


def ablation(args, data, out):
    families = [f for f in args.families if f != "easyscale"]
    cases = [(f, i) for f in families for i in args.workloads] + (
        [("easyscale", 0)] if "easyscale" in args.families else [])
    rows = {}
    for label, policy, in_place, _ in ABLATION:
        for freezing in ("off", "on"):
            rows[label, freezing] = [run(f, i, policy, data, in_place=in_place, freezing=freezing) for f, i in cases]
            print(f"  {label}, freezing {freezing}: " + " ".join(f"{x['avg'] / 3600:.3f}" for x in rows[label, freezing]),
                  flush=True)
    out["ablation"] = {"cases": cases, "rows": {f"{k[0]} | freezing {k[1]}": v for k, v in rows.items()}}
    groups = {f: [k for k, (g, _) in enumerate(cases) if g == f] for f in dict.fromkeys(g for g, _ in cases)}
    print("\nablation; per family the mean over its workloads of avg JCT / p99 JCT / makespan, hours, and the avg "
          "JCT relative to Sia's (restart-based, freezing off)\n")
    print("| row | assumes | freezing | " + " | ".join(
        f"{f} ({', '.join(str(cases[k][1]) for k in ks)})" for f, ks in groups.items()) + " |")
    print("|---|---|---|" + "---|" * len(groups))
    base = rows["Sia", "off"]
    for label, _, _, assumes in ABLATION:
        for freezing in ("off", "on"):
            r = rows[label, freezing]
            cells = []
            for f, ks in groups.items():
                sub, ref = [r[k] for k in ks], [base[k] for k in ks]
                cells.append(f"{mean(sub, 'avg') / 3600:.3f} / {mean(sub, 'p99') / 3600:.2f} / "
                             f"{mean(sub, 'makespan') / 3600:.2f} ({mean(sub, 'avg') / mean(ref, 'avg'):.2f})")
            print(f"| {label} | {assumes} | {freezing} | " + " | ".join(cells) + " |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=None)
    parser.add_argument("--tables", action="store_true")
    parser.add_argument("--ablation", action="store_true")
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--workloads", type=int, nargs="+", default=list(range(1, 9)))
    parser.add_argument("--spread", action="store_true",
                        help="elastic-goodput / sia per workload over draws of shifted arrivals")
    parser.add_argument("--draws", type=int, default=6, help="with --spread: draws, the first as in the trace")
    parser.add_argument("--jitter", type=float, default=30.0, help="with --spread: seconds an arrival moves, at most")
    parser.add_argument("--json", default=None, help="write the raw figures here")
    args = parser.parse_args()
    data, out = data_dir(args.data), {}
    if args.tables:
        tables(args, data, out)
    if args.spread:
        spread(args, data, out)
    if args.ablation:
        ablation(args, data, out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
