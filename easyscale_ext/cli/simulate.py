"""`easyscale simulate`: run policies on a workload; print a table, write JSON and plots.

  easyscale simulate --workload FILE [--policy NAME,NAME,...|all] [--cluster SPEC] [--map APP=PROFILED]
                     [--seed S] [--out DIR] [--calibration auto|none|sia|sia-restarts|easyscale]
                     [--in-place policy|on|off]
                     [--freezing job|on|off] [--applications SEED]

Several policies run one process each, two at a time. Also `easyscale workload`, which draws a workload from the
Philly trace (`--sample SEED`: as Pollux's and Sia's samplers do). Like the simulator (easyscale_ext.sched), no
torch. Every input is checked before anything runs: a mistake is one line saying what to do (UsageError, exit
status 2), and nothing is written.
"""
import json
import multiprocessing
import time
import warnings
from dataclasses import replace
from pathlib import Path

from tqdm import tqdm

from ..sched.metrics import isolated_runtimes, summarize
from ..sched.models import sampler, workload
from ..sched.models.application import DERIVED_FROM_T4, EPOCHS, GPU_TYPES, STAND_INS, Applications
from ..sched.models.cluster import DEFAULT, EASYSCALE, SHAPES, Cluster
from ..sched.models.reallocation import INTER_NODE_GBPS, INTRA_NODE_GBPS
from ..sched.models.traces import data_dir
from ..sched.policies import POLICIES, RENAMED, RUNNABLE, made
from ..sched.simulator import EASYSCALE as EASYSCALE_MODEL
from ..sched.simulator import SIA, SIA_RESTARTS, SimConfig, job_maker, simulate, validate
from .errors import UsageError

CALIBRATIONS = {"none": SimConfig(), "sia": SIA, "sia-restarts": SIA_RESTARTS, "easyscale": EASYSCALE_MODEL}
COLUMNS = ["avg_jct", "p50_jct", "p99_jct", "makespan", "gpu_util", "restarts_per_job", "ftf_mean", "ftf_max"]


def add_parser(subparsers):
    p = subparsers.add_parser("simulate", help="trace-driven cluster-scheduling simulation",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", required=True,
                   help="a Pollux, Sia or EasyScale workload CSV, or the Philly trace: a path, or one inside the "
                        "data folder (e.g. pollux/workloads/workload-6.csv, easyscale/workloads/test.csv)")
    p.add_argument("--policy", default="all", metavar="NAME,...|all",
                   help=f"the policies to run, comma-separated, of {', '.join(POLICIES)}; or all of those that can "
                        "run the workload on the cluster (default). One process each, two at a time. The ablations "
                        "of BENCHMARKS.md's tables run too (sched.policies.EXPERIMENTS)")
    p.add_argument("--cluster", default=None, help=f"COUNTxGPUS[:TYPE],... with TYPE one of {', '.join(GPU_TYPES)} "
                                                   f"or a shape's name, {', '.join(SHAPES)} (default {DEFAULT}; "
                                                   f"{EASYSCALE}, EasyScale's, for an EasyScale-format workload)")
    p.add_argument("--map", action="append", default=[], metavar="APP=PROFILED,...",
                   help="run APP's jobs as the profiled application PROFILED (repeatable); by default "
                        + ", ".join(f"{a}={b}" for a, b in STAND_INS.items()))
    p.add_argument("--seed", type=int, default=0, help="seed of the randomised policies (Pollux's search)")
    p.add_argument("--out", default=None, help="directory for the JSON results and the plots")
    p.add_argument("--data", default=None, help="trace directory (default $EASYSCALE_SCHED_DATA, else the "
                                                "package's copy)")
    p.add_argument("--round", type=float, default=None, help="seconds between scheduling rounds (default 60)")
    p.add_argument("--restart", type=float, default=None,
                   help="seconds without progress after a reallocation (default 30; 0 with --calibration easyscale)")
    p.add_argument("--start", type=float, default=None, help="seconds before a job's first progress "
                                                             "(default: --restart; 20 with --calibration easyscale)")
    p.add_argument("--limit", type=int, default=None, help="simulate only the first N jobs to arrive")
    p.add_argument("--applications", type=int, default=None, metavar="SEED",
                   help="give the Philly trace's jobs profiled applications, drawn by their GPU-hours with this "
                        "seed (epochs fitted to their durations), so that every policy can run it")
    p.add_argument("--calibration", choices=["auto", *CALIBRATIONS], default="auto",
                   help="auto (default): sia for a Pollux-format workload on a cluster of several GPU types (only "
                        "Sia's artifact simulates one: Sia's setting), else none, the project's job model; "
                        "easyscale: the EasyScale artifact's job model, for its EasyScale-format workloads "
                        "(models/easyscale.py: jobs of epochs x 1 %% of their data set in samples, compute time "
                        "only, a 20 s first start, free rescaling; a repeated job name keeps its last row); "
                        "sia-restarts: the Sia artifact's per-application restart seconds (15-250 s) over --restart "
                        "and --start, for restart-based jobs; "
                        "sia: its whole job model (also jobs 1.2-1.8x slower than profiled, its calibration to its "
                        "testbed, and per-GPU batches bounded by each GPU type's own profile), and Pollux and Sia "
                        "as it runs them (sched.policies.SIA_ARTIFACT: Pollux at p = 0.5, Sia's restart factor by "
                        "application)")
    p.add_argument("--in-place", choices=["policy", "on", "off"], default="policy",
                   help="whether jobs rescale in place (measured pause plus the bytes that move) or restart: as "
                        "the policy's jobs do (default), or on/off for every policy (the ablation 'Sia + in place')")
    p.add_argument("--freezing", choices=["job", "on", "off"], default="job",
                   help="layer freezing: where a job opts in (its workload's freeze column; default), for every "
                        "job whose model family has a published timeline (on), or for none (off)")
    p.add_argument("--intra-node-gbps", type=float, default=None,
                   help=f"GB/s between GPUs of a node, for in-place moves (default {INTRA_NODE_GBPS})")
    p.add_argument("--inter-node-gbps", type=float, default=None,
                   help=f"GB/s between nodes, for in-place moves (default {INTER_NODE_GBPS})")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=main)  # easyscale_ext.cli dispatches on args.run
    w = subparsers.add_parser(
        "workload", help="write a workload drawn from the Philly trace",
        description="Write a workload drawn from the Philly trace: with --sample, Pollux's format as Pollux's and "
                    "Sia's samplers draw theirs (sched.models.sampler); otherwise EasyScale's format, jobs that keep "
                    "their trace job's GPUs and duration (sched.models.workload.easyscale_workload).")
    w.add_argument("--out", required=True, help="the CSV file to write")
    w.add_argument("--cluster", default=EASYSCALE,
                   help=f"COUNTxGPUS:TYPE,... or one of {', '.join(SHAPES)} (default {EASYSCALE}); with --sample, its "
                        "most plentiful GPU type is the one jobs are sized for")
    w.add_argument("--seed", type=int, default=0, help="without --sample: the draw (default 0)")
    w.add_argument("--sample", type=int, default=None, metavar="SEED",
                   help="draw with the samplers' rules and this seed")
    w.add_argument("--load", type=float, default=1.0,
                   help=f"with --sample: jobs relative to the samplers' {sampler.JOBS} in {sampler.WINDOW[1]:g} hours "
                        "(default 1; Pollux's artifact has 0.5-2)")
    w.add_argument("--rules", choices=list(sampler.RULES), default="sia",
                   help="with --sample: Sia's rules (default; no ncf, up to 14 GPUs, sized for the cluster's GPUs) "
                        "or Pollux's (T4s, up to 48 GPUs)")
    w.add_argument("--jobs", type=int, default=80, help="without --sample: jobs to draw (default 80)")
    w.add_argument("--hours", type=float, default=4.0,
                   help="without --sample: arrivals spread over this many hours (default 4)")
    w.add_argument("--data", default=None, help="trace directory (as for simulate)")
    w.set_defaults(run=make_workload)
    return p


def make_workload(args) -> int:
    data, cluster = find_data(args.data), parse_cluster(args.cluster)
    trace_csv = data / "pollux" / "traces" / "philly.csv"
    if args.sample is not None:
        if args.sample < 0:
            raise UsageError(f"--sample {args.sample}: a seed is a whole number of at least 0")
        try:
            specs = sampler.sample_workload(trace_csv, Applications(data), cluster, args.sample, args.load,
                                            args.rules)
        except ValueError as e:
            raise UsageError(f"--load: {e}")
        workload.write_pollux_workload(specs, args.out)
    else:
        specs = workload.easyscale_workload(workload.load_workload(trace_csv), Applications(data), cluster,
                                            args.jobs, args.hours, args.seed)
        workload.write_easyscale_workload(specs, args.out)
    print(f"wrote {len(specs)} jobs to {args.out}")
    return 0


def find_data(path):
    try:
        return data_dir(path)
    except FileNotFoundError as e:
        raise UsageError(str(e))


def parse_cluster(spec) -> Cluster:
    try:
        cluster = Cluster.parse(spec)
    except ValueError as e:
        raise UsageError(f"--cluster: {e}")
    unknown = sorted(set(cluster.types) - set(GPU_TYPES))
    if unknown:
        raise UsageError(f"--cluster {spec}: no step-time profile for GPU type {', '.join(unknown)}; use one of "
                         f"{', '.join(GPU_TYPES)}")
    return cluster


def policy_names(text) -> list:
    names = list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    for old in [n for n in names if n in RENAMED]:
        warnings.warn(f"--policy {old} is now called {RENAMED[old]}: use that name", FutureWarning, stacklevel=2)
    names = list(dict.fromkeys(RENAMED.get(n, n) for n in names))
    unknown = [n for n in names if n not in RUNNABLE and n != "all"]
    if unknown or not names or "all" in names and len(names) > 1:
        raise UsageError(f"--policy {text}: expected all, or comma-separated names of {', '.join(POLICIES)}"
                         + (f" (unknown: {', '.join(unknown)})" if unknown else ""))
    return names


def stand_ins(maps) -> dict:
    """STAND_INS with the --map APP=PROFILED,... options over it."""
    mapping = dict(STAND_INS)
    for item in (i for text in maps for i in text.split(",") if i.strip()):
        app, equals, profiled = (x.strip() for x in item.partition("="))
        if not (app and equals and profiled in EPOCHS):
            raise UsageError(f"--map {item}: expected APP=PROFILED with PROFILED one of {', '.join(EPOCHS)}")
        mapping[app] = profiled
    return mapping


def load(args, data, mapping) -> tuple:
    """The workload's jobs (a path, else one inside the data folder) with `mapping`'s stand-ins and a name each,
    the names it numbered (or, with EasyScale's calibration, kept once), and the stand-ins used."""
    for path in (Path(args.workload), data / args.workload):
        try:
            specs = workload.load_workload(path, args.limit)
            break
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as e:
            raise UsageError(f"--workload: {e}")
    else:
        raise UsageError(f"no workload file {args.workload}: pass --workload with a path, or one inside the data "
                         f"folder {data} (e.g. pollux/workloads/workload-6.csv)")
    if args.applications is not None:
        if any(s.app is not None for s in specs):
            raise UsageError(f"--applications: {args.workload} names its jobs' applications already; it draws them "
                             "for the Philly trace's, which have none")
        specs = workload.with_applications(specs, Applications(data), seed=args.applications)
    try:
        specs, used = workload.with_stand_ins(specs, mapping)
    except ValueError as e:
        raise UsageError(f"{e}: run each as a profiled one with --map APP=PROFILED")
    if args.calibration == "easyscale":  # its simulator keys jobs by name
        return (*workload.last_per_name(specs), used)
    return (*workload.unique_names(specs), used)


def run_one(name, specs, cluster, args, position=0):
    """Simulate one policy; returns (result, summary, wall seconds)."""
    apps = Applications(data_dir(args.data))
    config = sim_config(args)
    bar = tqdm(total=len(specs), desc=f"{name:16s}", unit="job", position=position, leave=True,
               disable=args.no_progress)
    begin = time.perf_counter()
    result = simulate(specs, made(name, args.calibration)(args.seed), cluster, apps, config, progress=bar)
    wall = time.perf_counter() - begin
    bar.close()
    isolated = isolated_runtimes(specs, apps, cluster, job_maker(config))
    return result, summarize(result, cluster.total_gpus, isolated), wall


def sim_config(args) -> SimConfig:
    """The calibration's settings, with those the command line gives over them."""
    given = {"round_s": args.round, "restart_s": args.restart, "intra_node_gbps": args.intra_node_gbps,
             "inter_node_gbps": args.inter_node_gbps,
             "start_s": args.restart if args.start is None else args.start}
    return replace(CALIBRATIONS[args.calibration], in_place=args.in_place, freezing=args.freezing,
                   **{k: v for k, v in given.items() if v is not None})


def _run_indexed(item):
    index, name, specs, cluster, args = item
    return run_one(name, specs, cluster, args, position=index)


def main(args) -> int:
    data, names, mapping = find_data(args.data), policy_names(args.policy), stand_ins(args.map)
    if args.cluster:
        parse_cluster(args.cluster)  # before reading the workload: a mistake here says nothing else
    specs, renamed, used = load(args, data, mapping)
    easyscale = specs[0].virtual_workers is not None
    cluster = parse_cluster(args.cluster or (EASYSCALE if easyscale else DEFAULT))
    chosen = args.calibration
    args.calibration = calibration_for(specs, cluster) if chosen == "auto" else chosen
    runnable = choose(names, specs, cluster, args.seed, args.calibration, sim_config(args).job_model,
                      Applications(data))
    describe(cluster, easyscale and not args.cluster, used, renamed, args.calibration)
    if chosen == "auto" and args.calibration == "sia":
        print("job model and settings: Sia's artifact's (--calibration sia), the default for a Pollux-format "
              "workload on several GPU types; --calibration none for the project's")
    items = [(i, n, specs, cluster, args) for i, n in enumerate(runnable)]
    if len(items) > 1:
        with multiprocessing.get_context("fork").Pool(2) as pool:
            runs = pool.map(_run_indexed, items, chunksize=1)
    else:
        runs = [_run_indexed(items[0])]
    print_table(runnable, runs)
    if args.out:
        tag = "+".join(names)  # `all`, or the policies named
        write_outputs(Path(args.out), Path(args.workload).stem, tag, cluster, args, used, runnable, runs)
    return 0


def calibration_for(specs, cluster) -> str:
    """The default calibration: Sia's setting for Pollux-format jobs on several GPU types, else the project's."""
    pollux_format = all(s.app is not None and s.virtual_workers is None for s in specs)
    return "sia" if pollux_format and len(set(cluster.types)) > 1 else "none"


def choose(names, specs, cluster, seed, calibration, job_model, apps) -> list:
    """The policies `names` (or all that can run the workload on the cluster); a UsageError if one named cannot.
    Each is checked as `calibration` makes it: the very policy run_one runs."""
    chosen = list(POLICIES) if names == ["all"] else names
    refused = {}
    for name in chosen:
        try:
            validate(specs, made(name, calibration)(seed), cluster, job_model, apps)
        except ValueError as e:
            refused[name] = str(e)
    if refused and (names != ["all"] or len(refused) == len(chosen)):
        raise UsageError(next(iter(refused.values())))
    return [n for n in chosen if n not in refused]


def describe(cluster, easyscale_default, used, renamed, calibration):
    """Say what the run is made of beyond what was asked: the cluster always, stand-ins and new names if any."""
    room = cluster.room(cluster.gpus)
    print(f"cluster {cluster.spec}: " + " + ".join(f"{n} {t}" for t, n in room.items())
          + (" (EasyScale's, the default for its workloads)" if easyscale_default else "")
          + "".join(f"; {t} steps are t4's scaled by EasyScale's measured {t}/t4 ratios" for t in room
                    if t in DERIVED_FROM_T4))
    if used:
        print("applications without a profile run as: " + ", ".join(f"{a} -> {b}" for a, b in used.items())
              + " (--map APP=PROFILED to change)")
    if renamed and calibration == "easyscale":
        print(f"repeated job names, the last row of each kept (as EasyScale's simulator does): {', '.join(renamed)}")
    elif renamed:
        print(f"repeated job names numbered: {', '.join(renamed)}")


def print_table(names, runs):
    print(f"{'policy':16s} " + " ".join(f"{c:>16s}" for c in COLUMNS) + f" {'wall s':>8s}")
    for name, (_, summary, wall) in zip(names, runs):
        cells = " ".join(f"{summary[c]:16.3f}" if c in summary else f"{'-':>16s}" for c in COLUMNS)
        print(f"{name:16s} {cells} {wall:8.1f}")


def write_outputs(out, stem, tag, cluster, args, used, names, runs):
    """Per policy `<workload>-<policy>.json` and `-gantt.png`; comparing the run's policies (`tag`: all, or their
    names joined by +), `<workload>-<tag>-jct-cdf.png`, `-gpus.png` and `-summary.png`."""
    from ..sched import plots  # matplotlib only when plotting

    out.mkdir(parents=True, exist_ok=True)
    where = f"{stem} on {cluster.spec}"
    for name, (result, summary, _) in zip(names, runs):
        record = {"workload": str(args.workload), "seed": args.seed, "stand_ins": used, "summary": summary,
                  **result.to_json()}
        (out / f"{stem}-{name}.json").write_text(json.dumps(record, indent=1))
        plots.gantt(result, where, out / f"{stem}-{name}-gantt.png")
    results = [r for r, _, _ in runs]
    plots.jct_cdf(results, where, out / f"{stem}-{tag}-jct-cdf.png")
    plots.gpus_over_time(results, cluster.total_gpus, where, out / f"{stem}-{tag}-gpus.png")
    plots.summary(names, [s for _, s, _ in runs], where, out / f"{stem}-{tag}-summary.png")
    print(f"wrote {len(runs)} JSON results and plots to {out}/ ({stem}-<policy>.json, {stem}-{tag}-*.png)")
