"""`easyscale simulate`: run policies on a workload; print a table, write JSON and plots.

  easyscale simulate --workload FILE --policy NAME|all [--cluster SPEC] [--seed S] [--out DIR]

`--policy all` runs every policy, one process per policy, two at a time.
"""
import json
import multiprocessing
import time
from pathlib import Path

from tqdm import tqdm

from . import workload
from .application import Applications
from .cluster import DEFAULT, Cluster
from .data import data_dir
from .easyscale import EasyScalePolicy
from .edl import EdlPolicy
from .fifo import FifoPolicy
from .icefrog import IceFrogPolicy
from .metrics import isolated_runtimes, summarize
from .optimus import OptimusPolicy
from .ours import OursPolicy
from .pollux import PolluxPolicy
from .saxena import SaxenaPolicy
from .sia import SiaPolicy
from .simulator import SimConfig, simulate
from .tiresias import TiresiasPolicy
from .workload import load_workload

POLICIES = {
    "fifo": lambda seed: FifoPolicy(),
    "fifo-serial": lambda seed: FifoPolicy(serial=True),
    "tiresias": lambda seed: TiresiasPolicy(),
    "optimus": lambda seed: OptimusPolicy(),
    "pollux": lambda seed: PolluxPolicy(seed=seed),
    "edl": lambda seed: EdlPolicy(),
    "easyscale-heter": lambda seed: EasyScalePolicy(heterogeneous=True),
    "easyscale-homo": lambda seed: EasyScalePolicy(heterogeneous=False),
    "saxena": lambda seed: SaxenaPolicy(),
    "saxena-fixed": lambda seed: SaxenaPolicy(adaptive_batch=False),
    "sia": lambda seed: SiaPolicy(),
    "ours": lambda seed: OursPolicy(),
    "icefrog": lambda seed: IceFrogPolicy(),
    "icefrog-nofreeze": lambda seed: IceFrogPolicy(freeze=False),
}
EASYSCALE_CLUSTER = "4x8:v100,2x8:p100,4x4:t4"  # EasyScale's simulated 32 V100 + 16 P100 + 16 T4
COLUMNS = ["avg_jct", "p50_jct", "p99_jct", "makespan", "gpu_util", "restarts_per_job", "ftf_mean", "ftf_max"]


def add_parser(subparsers):
    p = subparsers.add_parser("simulate", help="trace-driven cluster-scheduling simulation",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", required=True, help="a Pollux workload CSV or the Philly trace")
    p.add_argument("--policy", default="all", choices=sorted(POLICIES) + ["all"],
                   help="one policy, or all that can run the workload on the cluster (one process each, two at a time)")
    p.add_argument("--cluster", default=DEFAULT, help=f"COUNTxGPUS[:TYPE],... (default {DEFAULT})")
    p.add_argument("--seed", type=int, default=0, help="seed of the randomised policies (Pollux's search)")
    p.add_argument("--out", default=None, help="directory for the JSON results and the plots")
    p.add_argument("--data", default=None, help="trace directory (default $EASYSCALE_SCHED_DATA, else "
                                                "../shared/data beside the checkout)")
    p.add_argument("--round", type=float, default=60.0, help="seconds between scheduling rounds")
    p.add_argument("--restart", type=float, default=30.0, help="seconds without progress after a reallocation")
    p.add_argument("--start", type=float, default=None, help="seconds before a job's first progress "
                                                             "(default: --restart)")
    p.add_argument("--limit", type=int, default=None, help="simulate only the first N jobs to arrive")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=main)  # easyscale_ext.cli dispatches on args.run
    w = subparsers.add_parser("workload", help="write an EasyScale-format workload drawn from the Philly trace",
                              description=workload.easyscale_workload.__doc__.split("\n\n")[0])
    w.add_argument("--out", required=True, help="the CSV file to write")
    w.add_argument("--jobs", type=int, default=80, help="jobs to draw (default 80)")
    w.add_argument("--hours", type=float, default=4.0, help="arrivals spread over this many hours (default 4)")
    w.add_argument("--cluster", default=EASYSCALE_CLUSTER, help=f"COUNTxGPUS:TYPE,... (default {EASYSCALE_CLUSTER})")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--data", default=None, help="trace directory (as for simulate)")
    w.set_defaults(run=make_workload)
    return p


def make_workload(args) -> int:
    try:
        data = data_dir(args.data)
    except FileNotFoundError as e:
        raise SystemExit(f"easyscale workload: {e}")
    trace = workload.load_workload(data / "pollux" / "traces" / "philly.csv")
    specs = workload.easyscale_workload(trace, Applications(data), Cluster.parse(args.cluster), args.jobs,
                                        args.hours, args.seed)
    workload.write_easyscale_workload(specs, args.out)
    print(f"wrote {len(specs)} jobs to {args.out}")
    return 0


def run_one(name, args, position=0):
    """Simulate one policy; returns (result, summary, wall seconds)."""
    data = data_dir(args.data)
    apps, cluster = Applications(data), Cluster.parse(args.cluster)
    specs = load_workload(args.workload, args.limit)
    config = SimConfig(round_s=args.round, restart_s=args.restart,
                       start_s=args.restart if args.start is None else args.start)
    bar = tqdm(total=len(specs), desc=f"{name:16s}", unit="job", position=position, leave=True,
               disable=args.no_progress)
    begin = time.perf_counter()
    result = simulate(specs, POLICIES[name](args.seed), cluster, apps, config, progress=bar)
    wall = time.perf_counter() - begin
    bar.close()
    return result, summarize(result, cluster.total_gpus, isolated_runtimes(specs, apps, cluster)), wall


def _run_indexed(item):
    index, name, args = item
    return run_one(name, args, position=index)


def main(args) -> int:
    try:
        data_dir(args.data)
    except FileNotFoundError as e:
        raise SystemExit(f"easyscale simulate: {e}")
    names = [args.policy]
    if args.policy == "all":
        trace = any(s.app is None for s in load_workload(args.workload, args.limit))
        mixed = not Cluster.parse(args.cluster).homogeneous
        names = [n for n in sorted(POLICIES) if not (trace and POLICIES[n](args.seed).profiled)
                 and not (mixed and POLICIES[n](args.seed).one_gpu_type)]
    items = [(i, n, args) for i, n in enumerate(names)]
    if len(names) > 1:
        with multiprocessing.get_context("fork").Pool(min(2, len(names))) as pool:
            runs = pool.map(_run_indexed, items, chunksize=1)
    else:
        runs = [_run_indexed(items[0])]
    print_table(names, runs)
    if args.out:
        write_outputs(Path(args.out), Path(args.workload).stem, args, runs)
    return 0


def print_table(names, runs):
    print(f"{'policy':16s} " + " ".join(f"{c:>16s}" for c in COLUMNS) + f" {'wall s':>8s}")
    for name, (_, summary, wall) in zip(names, runs):
        cells = " ".join(f"{summary[c]:16.3f}" if c in summary else f"{'-':>16s}" for c in COLUMNS)
        print(f"{name:16s} {cells} {wall:8.1f}")


def write_outputs(out, stem, args, runs):
    from . import plots  # matplotlib only when plotting

    out.mkdir(parents=True, exist_ok=True)
    results = [r for r, _, _ in runs]
    for result, summary, _ in runs:
        record = {"workload": str(args.workload), "seed": args.seed, "summary": summary, **result.to_json()}
        (out / f"{stem}-{result.policy}.json").write_text(json.dumps(record, indent=1))
        plots.gantt(result, out / f"{stem}-{result.policy}-gantt.png")
    total = Cluster.parse(args.cluster).total_gpus
    plots.jct_cdf(results, out / f"{stem}-jct-cdf.png")
    plots.gpus_over_time(results, total, out / f"{stem}-gpus.png")
    print(f"wrote {len(runs)} JSON results and plots to {out}/")
