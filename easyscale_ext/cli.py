"""The `easyscale` command.

  easyscale smoke                                  check that the extension loads and its kernels run
  easyscale launch --procs P -- SCRIPT [ARGS]      run SCRIPT as an elastic job on P local processes
  easyscale scale --store HOST:PORT --procs P      ask a running elastic job to run on P processes
"""
import argparse
import sys


def smoke(args) -> int:
    import torch

    import easyscale_ext as es

    xs = [torch.randn(1000, dtype=torch.float32) for _ in range(5)]
    total = es.canonical_sum(xs)
    print(f"easyscale_ext {es.__version__}: cuda_built={es.cuda_built()} torch={torch.__version__} "
          f"canonical_sum of 5 x 1000 -> {total.sum().item():.6f}")
    return 0


def launch(args) -> int:
    from .launcher import ElasticLauncher

    script = args.script[1:] if args.script[:1] == ["--"] else args.script
    if not script:
        raise SystemExit("easyscale launch: give the training script after --, e.g. "
                         "easyscale launch --procs 2 -- train.py --epochs 3")
    launcher = ElasticLauncher([sys.executable] + script, args.procs, host=args.host, port=args.port)
    print(f"easyscale: job store at {launcher.address}; scale with "
          f"`easyscale scale --store {launcher.address} --procs N`", flush=True)
    return launcher.run()


def scale(args) -> int:
    from .elastic import request_scale

    try:
        request_scale(args.store, args.procs)
    except (RuntimeError, ValueError) as e:
        raise SystemExit(f"easyscale scale: cannot reach the job store at {args.store}: {e}")
    print(f"easyscale: asked the job at {args.store} to run on {args.procs} processes")
    return 0


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="easyscale", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("smoke", help="check that the extension loads and its kernels run")
    p.set_defaults(run=smoke)
    p = sub.add_parser("launch", help="run a training script as an elastic job on local processes")
    p.add_argument("--procs", type=positive, required=True, help="processes to start with")
    p.add_argument("--host", default="127.0.0.1", help="address the job store binds to (default: loopback)")
    p.add_argument("--port", type=int, default=0, help="job store port (default: any free port)")
    p.add_argument("script", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS]")
    p.set_defaults(run=launch)
    p = sub.add_parser("scale", help="ask a running elastic job to change its number of processes")
    p.add_argument("--store", required=True, help="HOST:PORT printed by `easyscale launch`")
    p.add_argument("--procs", type=positive, required=True, help="processes to run on")
    p.set_defaults(run=scale)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
