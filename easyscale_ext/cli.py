"""The `easyscale` command. Until the demo lands, `easyscale smoke` checks the build."""
import argparse
import sys


def smoke() -> int:
    import torch

    import easyscale_ext as es

    xs = [torch.randn(1000, dtype=torch.float32) for _ in range(5)]
    total = es.canonical_sum(xs)
    print(f"easyscale_ext {es.__version__}: cuda_built={es.cuda_built()} torch={torch.__version__} "
          f"canonical_sum of 5 x 1000 -> {total.sum().item():.6f}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="easyscale", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("smoke", help="check that the extension loads and its kernels run")
    args = parser.parse_args(argv)
    if args.command == "smoke":
        return smoke()
    return 2


if __name__ == "__main__":
    sys.exit(main())
