"""Elastic-goodput on workloads it was never developed on: draws by Pollux's and Sia's samplers' rules
(sched.models.sampler, Sia's rules) on five cluster shapes of 64 GPUs at three loads, split once into decision
draws, on which each design choice is judged, and verdict draws, on which the policy is reported. No two splits
share a draw: a draw's seed is its split's base plus 1,000 x its cell (shape, load) plus its index. A verdict split
that has judged a policy has been looked at: a later change decides on a fresh decision split and is judged on a fresh
verdict split (`decide-2`, `verdict-2`); `verdict-2` has judged elastic-goodput too (BENCHMARKS.md), so a change
after it needs splits of its own. The --json file says which split and role its figures are of, and their seeds.

Job model: Sia's workloads' (Sia's per-application restarts; runs in place where the policy does), as bench_fair.py.

  python bench/bench_validate.py --split decide --json decide.json    # the choices, on the decision draws
  python bench/bench_validate.py --split verdict --json verdict.json  # the verdict, on draws used for nothing else
  python bench/bench_validate.py --split decide-2 --json decide2.json # a second round's choices, on fresh draws
  python bench/bench_validate.py --split verdict-2 --json verdict2.json --policies elastic-goodput,sia,sia-inplace

Each simulation runs in a worker process, --procs at a time. --json keeps every figure as it comes (a rerun with
the same file simulates only what it lacks), and the tables are printed from it at the end.
"""
import argparse
import json
import multiprocessing
import os
import time
from pathlib import Path

import numpy as np

from bench_fair import summary
from easyscale_ext.sched.models.application import Applications
from easyscale_ext.sched.models.cluster import SHAPES, Cluster
from easyscale_ext.sched.models.sampler import sample_workload
from easyscale_ext.sched.models.traces import data_dir
from easyscale_ext.sched.policies import RUNNABLE
from easyscale_ext.sched.policies.elastic_goodput import ElasticGoodputPolicy
from easyscale_ext.sched.simulator import SIA_RESTARTS, simulate

SPLITS = {"decide": 0, "verdict": 1_000_000, "decide-2": 2_000_000, "verdict-2": 3_000_000}  # name -> seed base
LOADS = (0.5, 1.0, 2.0)
JUDGED = "elastic-goodput"
BASELINES = ("sia", "sia-inplace")
# No `-no-mixed`: a sampled job does not say it may mix GPU types, so elastic-goodput keeps it on one type anyway.
ABLATIONS = ("elastic-goodput-no-fast-growth", "elastic-goodput-sia-objective", "elastic-goodput-no-remaining")
CELLS = [(shape, load) for shape in SHAPES for load in LOADS]
# Settings of elastic-goodput not (yet) its own, judged here on the decision draws: an age bound on Smith's weight,
# remaining work in seconds of the job's fastest GPU type, the weight on growth only (not on a job's GPU type).
CANDIDATES = {f"{JUDGED}-age-{hours}h": (lambda hours=hours: ElasticGoodputPolicy(age_s=hours * 3600.0))
              for hours in (2, 6)}
CANDIDATES[f"{JUDGED}-typed-work"] = lambda: ElasticGoodputPolicy(typed_work=True)
CANDIDATES[f"{JUDGED}-growth-weight"] = lambda: ElasticGoodputPolicy(weigh_types=False)


def seed_of(split, cell, k) -> int:
    return SPLITS[split] + 1000 * cell + k


_apps = None


def simulate_one(task) -> tuple:
    """(key, figures) of one policy on one draw: avg and p99 JCT, makespan (seconds) and CPU seconds."""
    global _apps
    key, data, shape, load, seed, policy = task
    _apps = _apps or Applications(data)
    begin = time.process_time()
    cluster = Cluster.parse(shape)
    specs = sample_workload(data / "pollux" / "traces" / "philly.csv", _apps, cluster, seed, load)
    make = CANDIDATES.get(policy) or (lambda: RUNNABLE[policy](0))
    result = simulate(specs, make(), cluster, _apps, SIA_RESTARTS)
    figures = summary({j["name"]: (j["arrival"], j["jct"]) for j in result.jobs})
    return key, dict(figures, cpu=time.process_time() - begin)


def key_of(seed, policy) -> str:
    return f"{seed}/{policy}"


def role_of(split: str) -> str:
    """What a split's draws are for: "decide" (choices are made on them) or "verdict" (a policy is judged on them)."""
    return split.split("-")[0]


def load(path: Path, split: str) -> dict:
    """The figures kept in `path` for `split` (none if there is no file); a file of another split is refused."""
    if not path.exists():
        return {}
    kept = json.loads(path.read_text())
    if "split" not in kept:
        raise SystemExit(f"{path} does not say which draws its figures are of (an older file): give a new --json")
    if kept["split"] != split:
        raise SystemExit(f"{path} holds the {kept['split']!r} draws, not {split!r}: give another --json")
    return kept["figures"]


def save(path, split, figures) -> None:
    """Write `figures` to `path` atomically (a crash mid-write leaves the last complete file), with the split, its
    role and the seeds they are of."""
    seeds = sorted({int(key.split("/")[0]) for key in figures})
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps({"split": split, "role": role_of(split), "seeds": seeds, "figures": figures},
                              indent=0, sort_keys=True))
    os.replace(tmp, path)


def ratios(figures, split, cell, draws, num, den, metric="avg") -> np.ndarray:
    """num's `metric` over den's on each draw of `cell` that has both."""
    keys = [(key_of(s, num), key_of(s, den)) for s in (seed_of(split, cell, k) for k in range(draws))]
    return np.array([figures[a][metric] / figures[b][metric] for a, b in keys if a in figures and b in figures])


RATIOS = (("sia",), ("sia-inplace",), ("sia-inplace", "p99"), ("sia-inplace", "makespan"))  # EG over: (whom, metric)


def goals(pooled) -> None:
    """Each goal of the validation met or missed: elastic-goodput's average JCT below sia-inplace's (Sia given the
    runtime's in-place scaling) on 90 % of draws and at every shape's median draw, its p99 no worse and its makespan
    within 2 % at the median draw."""
    if not len(pooled["all", ""][0]):
        return
    _, inplace, p99, makespan = pooled["all", ""]
    lines = [(f"below sia-inplace on >= 90 % of draws: {np.mean(inplace < 1):.0%}", np.mean(inplace < 1) >= 0.9),
             (f"p99 / sia-inplace's <= 1 at the median: {np.median(p99):.3f}", np.median(p99) <= 1),
             (f"makespan / sia-inplace's <= 1.02 at the median: {np.median(makespan):.3f}",
              np.median(makespan) <= 1.02)]
    lines += [(f"below sia-inplace at the median on {shape}: {np.median(v[1]):.3f}", np.median(v[1]) < 1)
              for (shape, load), v in pooled.items() if load == "all" and shape != "all" and len(v[1])]
    print()
    for text, met in lines:
        print(f"- {'met' if met else 'MISSED'}: {text}")


def spread(values) -> str:
    """median [10th, 90th percentile]."""
    if not len(values):
        return "-"
    p10, p50, p90 = np.percentile(values, [10, 50, 90])
    return f"{p50:.3f} [{p10:.3f}, {p90:.3f}]"


def tables(figures, split, draws, policies) -> None:
    print(f"\n{split} draws ({draws} per cell); ratios of avg JCT unless named: median [10th, 90th percentile]\n")
    print("| shape | load | draws | EG / sia | EG / sia-inplace | EG below sia-inplace | p99: EG / sia-inplace | "
          "makespan: EG / sia-inplace |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    rows = {}  # (shape, load) -> the four ratios' arrays over the cell's draws
    for cell, (shape, load) in enumerate(CELLS):
        rows[shape, load] = [ratios(figures, split, cell, draws, JUDGED, *pair) for pair in RATIOS]
    groups = [((s, f"{l:g}"), [rows[s, l]]) for s, l in CELLS]
    groups += [((s, "all"), [rows[s, l] for l in LOADS]) for s in SHAPES] + [(("all", ""), list(rows.values()))]
    pooled = {}
    for (shape, load), members in groups:
        sia, inplace, p99, makespan = (np.concatenate([m[i] for m in members]) for i in range(len(RATIOS)))
        below = f"{np.mean(inplace < 1):.0%}" if len(inplace) else "-"
        print(f"| {shape} | {load} | {len(inplace)} | {spread(sia)} | {spread(inplace)} | {below} | {spread(p99)} | "
              f"{spread(makespan)} |")
        pooled[shape, load] = sia, inplace, p99, makespan
    goals(pooled)
    ablations = [p for p in policies if p not in (JUDGED, *BASELINES)]
    if not ablations:
        return
    print(f"\neach choice taken out (or setting added): its avg JCT over {JUDGED}'s per shape over its loads (above 1: "
          "the choice pays), over every draw, the share of draws where it pays, and its p99 over elastic-goodput's\n")
    print("| variant | " + " | ".join(SHAPES) + " | all | pays on | p99 / EG |")
    print("|---|" + "---:|" * (len(SHAPES) + 3))
    for policy in ablations:
        per_shape, every, p99 = [], [], []
        for shape in SHAPES:
            cells = [cell for cell, (s, _) in enumerate(CELLS) if s == shape]
            values = [r for cell in cells for r in ratios(figures, split, cell, draws, policy, JUDGED)]
            p99 += [r for cell in cells for r in ratios(figures, split, cell, draws, policy, JUDGED, "p99")]
            per_shape.append(f"{np.median(values):.3f}" if values else "-")
            every += values
        pays = f"{np.mean(np.array(every) > 1):.0%}" if every else "-"
        print(f"| {policy.removeprefix(JUDGED + '-')} | " + " | ".join(per_shape) +
              f" | {spread(every)} | {pays} | {spread(p99)} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", choices=list(SPLITS), required=True)
    parser.add_argument("--draws", type=int, default=4, help=f"draws per cell of {len(CELLS)} (default 4)")
    parser.add_argument("--policies", default=",".join((JUDGED, *BASELINES, *ABLATIONS)),
                        help="comma-separated, of sched.policies.RUNNABLE and CANDIDATES (default: elastic-goodput, "
                             "the baselines and the ablations)")
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--json", required=True, help="figures kept here, read back on a rerun")
    parser.add_argument("--data", default=None)
    args = parser.parse_args()
    data, policies = data_dir(args.data), args.policies.split(",")
    unknown = [p for p in policies if p not in RUNNABLE and p not in CANDIDATES]
    if unknown:
        parser.error(f"unknown policies {', '.join(unknown)}")
    path = Path(args.json)
    figures = load(path, args.split)
    tasks = [(key_of(seed, p), data, shape, load, seed, p)
             for k in range(args.draws) for cell, (shape, load) in enumerate(CELLS)
             for seed in [seed_of(args.split, cell, k)] for p in policies if key_of(seed, p) not in figures]
    begin = time.time()
    with multiprocessing.get_context("spawn").Pool(args.procs) as pool:
        for done, (key, result) in enumerate(pool.imap_unordered(simulate_one, tasks), 1):
            figures[key] = result
            save(path, args.split, figures)
            print(f"  {done}/{len(tasks)} {key} avg {result['avg'] / 3600:.3f} h, {result['cpu']:.0f} s CPU, "
                  f"{time.time() - begin:.0f} s", flush=True)
    tables(figures, args.split, args.draws, policies)


if __name__ == "__main__":
    main()
