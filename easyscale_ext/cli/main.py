"""The `easyscale` command.

  easyscale demo [--n N --schedule S ...]        elastic training on digits, replayed on fixed P, verdict
  easyscale run --procs P -- SCRIPT [ARGS]       run SCRIPT as an elastic job on P local processes
  easyscale scale --store HOST:PORT --procs P    ask a running elastic job to run on P processes
                  (or --split K0,K1,..., or --release WORKER)
  easyscale bench [--quick]                      the benchmarks recorded in BENCHMARKS.md
  easyscale smoke                                check that the extension loads and its kernels run
  easyscale simulate --workload FILE --policy P  trace-driven cluster-scheduling simulation
  easyscale workload --out FILE [--sample SEED]  a workload drawn from the Philly trace
"""
import argparse
import logging
import sys

from .errors import UsageError


def smoke(args) -> int:
    import torch

    import easyscale_ext as es

    xs = [torch.randn(1000, dtype=torch.float32) for _ in range(5)]
    total = es.canonical_sum(xs)
    print(f"easyscale_ext {es.__version__}: cuda_built={es.cuda_built()} torch={torch.__version__} "
          f"canonical_sum of 5 x 1000 -> {total.sum().item():.6f}")
    return 0


def run(args) -> int:
    import os

    from ..elastic.client import save_secret
    from ..elastic.launcher import ElasticLauncher
    from .. import determinism

    script = args.script[1:] if args.script[:1] == ["--"] else args.script
    if not script:
        raise UsageError("give the training script after --, e.g. "
                         "easyscale run --procs 2 -- train.py --epochs 3")
    try:
        env = dict(os.environ, **determinism.environment(args.level, args.isa))
    except ValueError as e:
        raise UsageError(str(e))
    if args.balance:
        env["EASYSCALE_BALANCE"] = "1"
    try:
        launcher = ElasticLauncher([sys.executable] + script, args.procs, host=args.host, port=args.port, env=env,
                                   cpus=args.cpus)
    except ValueError as e:
        raise UsageError(str(e))
    secret = save_secret(launcher.address, launcher.secret)  # for this user's `easyscale scale` only
    print(f"easyscale: job store at {launcher.address}; scale with "
          f"`easyscale scale --store {launcher.address} --procs N`", flush=True)
    try:
        return launcher.run()
    finally:
        os.remove(secret)


def scale(args) -> int:
    import os

    # Before torch loads: its store client would log a failed connection again, as a C++ stack.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
    from ..elastic.client import (NotTheJobsSecret, StoreUnreachable, request_release, request_scale,
                                  request_split)

    try:
        if args.split:
            request_split(args.store, args.split, args.connect_timeout)
        elif args.release:
            request_release(args.store, args.release, args.connect_timeout)
        else:
            request_scale(args.store, args.procs, args.connect_timeout)
    except (ValueError, StoreUnreachable, NotTheJobsSecret) as e:
        raise UsageError(str(e))
    asked = (f"split its virtual workers {args.split}" if args.split else f"let {args.release} leave"
             if args.release else f"run on {args.procs} processes")
    print(f"easyscale: asked the job at {args.store} to {asked}")
    return 0


def demo(args) -> int:
    import os

    from .. import determinism
    from . import demo as demo_module

    if args.balance and (args.n < 3 or len(os.sched_getaffinity(0)) < 2):
        raise UsageError("--balance needs N >= 3 (3 processes) and two CPU cores")
    try:
        if not args.balance:  # --balance runs its own 3 processes
            demo_module.parse_schedule(args.schedule, args.n)
        determinism.job_isa(args.level, args.isa)
    except ValueError as e:
        raise UsageError(str(e))
    if args.fixed_procs > args.n:
        raise UsageError(f"--fixed-procs {args.fixed_procs} exceeds N={args.n}: every process "
                         "needs a virtual worker")
    try:
        os.makedirs(args.out, exist_ok=True)
        probe = os.path.join(args.out, ".write-test")
        open(probe, "w").close()
        os.unlink(probe)
    except OSError as e:
        raise UsageError(f"cannot write to output folder {args.out}: {e.strerror}; "
                         "pass --out with a writable folder")
    return demo_module.demo(args)


def bench(args) -> int:
    import os
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    scripts = {os.path.join(root, "bench", name): quick for name, quick in QUICK_BENCH.items()}
    if not all(os.path.exists(s) for s in scripts):
        raise UsageError("the bench/ folder is not next to the package; run it from a "
                         "source checkout (pip install -e .)")
    for script, quick in scripts.items():
        extra = quick if args.quick else []
        print(f"$ {os.path.relpath(script, root)} {' '.join(extra)}", flush=True)
        code = subprocess.call([sys.executable, script, *extra])
        if code:
            return code
    return 0


# Every benchmark recorded in BENCHMARKS.md, with the arguments of its quick run.
QUICK_BENCH = {
    "bench_core.py": ["--quick"],
    "bench_ddp.py": ["--quick"],
    "bench_elastic.py": ["--repeats", "1"],
    "bench_freeze.py": ["--repeats", "1"],
    "bench_balance.py": ["--repeats", "1"],
    "bench_sched.py": ["--seeds", "0", "--workloads", "6", "--philly", "10000"],
}


def level(text: str) -> str:
    from ..determinism import parse

    try:
        return parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e))


def isa(text: str) -> str:
    from ..determinism import parse_isa

    try:
        return parse_isa(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e))


def cpu_list(text: str) -> list:
    import os

    try:
        cpus = [int(c) for c in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected core numbers like 0,1,1, got {text!r}")
    allowed = os.sched_getaffinity(0)
    if not set(cpus) <= allowed:
        raise argparse.ArgumentTypeError(f"cores {sorted(set(cpus) - allowed)} are not available here "
                                         f"(available: {sorted(allowed)})")
    return cpus


def sizes_list(text: str) -> list:
    try:
        sizes = [int(k) for k in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected positive worker counts like 6,3,3, got {text!r}")
    return sizes


ISA_HELP = "D2's instruction-set floor for every process: AVX2 (default), AVX or SSE4.1"


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def parser() -> argparse.ArgumentParser:
    """The `easyscale` command's parser, every subcommand's included (the API docs print their help)."""
    parser = argparse.ArgumentParser(prog="easyscale", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more messages (-vv: debug)")
    parser.add_argument("-q", "--quiet", action="count", default=0, help="fewer messages (warnings off)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="elastic training on digits, replayed on a fixed P: the bitwise verdict")
    p.add_argument("--n", type=positive, default=4, help="virtual workers (default 4)")
    p.add_argument("--schedule", default="1,2,4|3,2",
                   help="process counts over the run; ',' = in-place scale event, '|' = checkpoint and restart "
                        "(default 1,2,4|3,2)")
    p.add_argument("--fixed-procs", type=positive, default=2, help="processes of the replay run (default 2)")
    p.add_argument("--epochs", type=positive, default=4, help="epochs (default 4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--level", default="D1", type=level, help="determinism level D0, D1 or D2 (default D1)")
    p.add_argument("--isa", type=isa, help=ISA_HELP)
    p.add_argument("--out", default="easyscale-demo", help="output folder (default ./easyscale-demo)")
    p.add_argument("--balance", action="store_true",
                   help="instead of --schedule: 3 processes, one alone on a core and two sharing another, "
                        "rebalanced in place by measured speed (use N >= 6, e.g. --n 12)")
    p.add_argument("--freeze", type=float, default=0.0, metavar="THRESHOLD",
                   help="freeze converged layers (AutoFreeze's gradient-norm change below THRESHOLD, e.g. 0.1) "
                        "and compare with the same fixed job unfrozen")
    p.set_defaults(run=demo)
    p = sub.add_parser("run", help="run a training script as an elastic job on local processes")
    p.add_argument("--procs", type=positive, required=True, help="processes to start with")
    p.add_argument("--level", default="D0", type=level,
                   help="determinism level: sets the environment it needs (default D0)")
    p.add_argument("--isa", type=isa, help=ISA_HELP)
    p.add_argument("--balance", action="store_true",
                   help="give faster processes more virtual workers, rebalanced online by measured speed")
    p.add_argument("--cpus", type=cpu_list, default=None, metavar="C0,C1,...",
                   help="pin the i-th process to core Ci (cycling); a core listed twice is shared")
    p.add_argument("--host", default="127.0.0.1", help="address the job store binds to (default: loopback)")
    p.add_argument("--port", type=int, default=0, help="job store port (default: any free port)")
    p.add_argument("script", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS]")
    p.set_defaults(run=run)
    p = sub.add_parser("scale", help="ask a running elastic job to change its processes or their split")
    p.add_argument("--store", required=True, help="HOST:PORT printed by `easyscale run`")
    p.add_argument("--connect-timeout", type=float, default=5.0, metavar="SECONDS",
                   help="how long to wait for the job store to answer (default 5)")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--procs", type=positive, help="processes to run on")
    what.add_argument("--split", type=sizes_list, metavar="K0,K1,...",
                      help="virtual workers of each process, in rank order (summing to N)")
    what.add_argument("--release", metavar="WORKER",
                      help="let this process (e.g. w1, as in the launcher's logs) leave, in place, as SIGTERM does")
    p.set_defaults(run=scale)
    p = sub.add_parser("bench", help="run the benchmarks recorded in BENCHMARKS.md")
    p.add_argument("--quick", action="store_true", help="fewer repeats, smaller cases")
    p.set_defaults(run=bench)
    p = sub.add_parser("smoke", help="check that the extension loads and its kernels run")
    p.set_defaults(run=smoke)
    from . import cluster, simulate

    simulate.add_parser(sub)
    cluster.add_parsers(sub)
    return parser


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(format="easyscale: %(message)s",
                        level=logging.WARNING + 10 * (args.quiet - args.verbose))
    try:
        return args.run(args)
    except UsageError as e:
        print(f"easyscale {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
