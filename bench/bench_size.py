"""One result for a job of N virtual workers on any number of processes, at a real job's width.

What runs: tests/support/train_job.py's conv net (D0, gloo, one intra-op thread a process), N virtual workers of 4
samples each, 2 steps of an epoch, on P processes forked from rank 0 after its imports (as `easyscale run` forks
them); and the single-process reference of the same N (a plain loop over the N workers' micro-batches). Every run's
SHA-256 over parameters, buffers and optimizer state must be the reference's. The seconds are each run's, start to
end, on this machine's cores shared by all P processes: they say what a run costs here, not a speed.

    .venv/bin/python bench/bench_size.py                          # N = 64 on 1-32, N = 1,024 on 1, 8, 32
    .venv/bin/python bench/bench_size.py --sizes 64:1,8,16
"""
import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(ROOT, "tests", "support", "train_job.py")


def run(mode: str, n: int, procs: int, timeout: float) -> tuple:
    """(hash, seconds) of one run."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "hash")
        argv = [sys.executable, JOB, "--mode", mode, "--virtual-workers", str(n), "--procs", str(procs),
                "--steps", "2", "--epochs", "1", "--out", out, "--init", "file://" + os.path.join(tmp, "rdzv"),
                "--rank", "0", "--fork", "1"]
        start = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, OMP_NUM_THREADS="1"))
        seconds = time.perf_counter() - start
        if done.returncode:
            raise RuntimeError(f"{mode} N={n} P={procs} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
        with open(out) as f:
            return f.read().strip(), seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64:1,2,4,8,16,32;1024:1,8,32",
                    help="N:P,P,...;N:P,... (each P must divide N)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds a run may take")
    args = ap.parse_args()
    print("| N | P | SHA-256 (first 12) | the reference's | seconds |\n|---:|---:|---|---|---:|", flush=True)
    failed = False
    for spec in args.sizes.split(";"):
        n, procs = spec.split(":")
        n = int(n)
        expected, seconds = run("reference", n, 1, args.timeout)
        print(f"| {n} | reference | {expected[:12]} | | {seconds:.1f} |", flush=True)
        for p in map(int, procs.split(",")):
            digest, seconds = run("easyscale", n, p, args.timeout)
            failed |= digest != expected
            print(f"| {n} | {p} | {digest[:12]} | {'yes' if digest == expected else 'NO'} | {seconds:.1f} |",
                  flush=True)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"\nlargest resident set of one process: {peak:.0f} MB")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
