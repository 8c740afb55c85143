"""python -m easyscale_ext.sched ... = easyscale simulate ..."""
import argparse
import sys

from .cli import add_parser, main

parser = argparse.ArgumentParser(prog="python -m easyscale_ext.sched")
add_parser(parser.add_subparsers(dest="command", required=True))
sys.exit(main(parser.parse_args(["simulate"] + sys.argv[1:])))
