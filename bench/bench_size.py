"""One result for a job of N virtual workers on any number of processes, at a real job's width.

What runs: tests/support/train_job.py's conv net (D0, gloo, one intra-op thread a process), N virtual workers of 4
samples each, on P processes forked from rank 0 after its imports (as `easyscale run` forks them), 2 steps; and the
single-process reference of the same N (a plain loop over the N workers' micro-batches). Elastic rows run 6 steps
under easyscale_ext.elastic.launcher (`easyscale run`): `--schedules` scale in place at steps 2 and 4 (N:A>B>C: A
processes, then B, then C), `--kills` SIGKILL one process of A in the middle of step 3 (after its first backward) and
the others go on in place. Every run's SHA-256 over parameters, buffers and optimizer state must be the reference's
for the same steps. The seconds are each run's, start to end, on this machine's cores shared by all processes: they
say what a run costs here, not a speed.

    .venv/bin/python bench/bench_size.py                          # N = 64 on 1-32, N = 1,024 on 1, 8, 32, elastic at 32
    .venv/bin/python bench/bench_size.py --sizes 64:1,8,16 --schedules "" --kills ""
"""
import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
JOB = os.path.join(ROOT, "tests", "support", "train_job.py")
ENV = dict(os.environ, OMP_NUM_THREADS="1")
ELASTIC_STEPS = 6


def fixed(mode: str, n: int, procs: int, steps: int, timeout: float) -> tuple:
    """(hash, seconds) of one run on a fixed number of processes."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "hash")
        argv = [sys.executable, JOB, "--mode", mode, "--virtual-workers", str(n), "--procs", str(procs),
                "--steps", str(steps), "--epochs", "1", "--out", out, "--init", "file://" + os.path.join(tmp, "rdzv"),
                "--rank", "0", "--fork", "1"]
        start = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=ENV)
        seconds = time.perf_counter() - start
        if done.returncode:
            raise RuntimeError(f"{mode} N={n} P={procs} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
        with open(out) as f:
            return f.read().strip(), seconds


def elastic(n: int, procs: int, options: list, timeout: float) -> tuple:
    """(hash, seconds) of one run under the launcher, ELASTIC_STEPS steps, with train_job's `options`."""
    from easyscale_ext.elastic.launcher import ElasticLauncher

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "hash")
        argv = [sys.executable, JOB, "--mode", "easyscale", "--virtual-workers", str(n), "--steps", str(ELASTIC_STEPS),
                "--epochs", "1", "--elastic", "1", "--out", out, *options]
        start = time.perf_counter()
        code = ElasticLauncher(argv, procs, env=ENV, log_dir=tmp).run(timeout_s=timeout)
        seconds = time.perf_counter() - start
        if code:
            logs = "".join(open(os.path.join(tmp, name)).read()[-1500:] for name in sorted(os.listdir(tmp))
                           if name.endswith(".log"))
            raise RuntimeError(f"N={n} from P={procs} with {options} failed ({code}):\n{logs}")
        with open(out) as f:
            return f.read().strip(), seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64:1,2,4,8,16,32;1024:1,8,32",
                    help="N:P,P,...;N:P,... (each P must divide N)")
    ap.add_argument("--schedules", default="64:32>16>32;1024:32>16>32", help="N:A>B>C;...: in place at steps 2 and 4")
    ap.add_argument("--kills", default="64:32;1024:32", help="N:P;...: one of P processes killed mid-step")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds a run may take")
    args = ap.parse_args()
    print("| N | P | SHA-256 (first 12) | the reference's | seconds |\n|---:|---|---|---|---:|", flush=True)
    references, failed = {}, False

    def row(n, steps, label, digest, seconds):
        nonlocal failed
        if (n, steps) not in references:
            references[n, steps] = expected, took = fixed("reference", n, 1, steps, args.timeout)
            print(f"| {n} | reference, {steps} steps | {expected[:12]} | | {took:.1f} |", flush=True)
        same = digest == references[n, steps][0]
        failed |= not same
        print(f"| {n} | {label} | {digest[:12]} | {'yes' if same else 'NO'} | {seconds:.1f} |", flush=True)

    for spec in filter(None, args.sizes.split(";")):
        n, procs = spec.split(":")
        for p in map(int, procs.split(",")):
            row(int(n), 2, str(p), *fixed("easyscale", int(n), p, 2, args.timeout))
    for spec in filter(None, args.schedules.split(";")):
        n, sizes = spec.split(":")
        first, *then = sizes.split(">")
        schedule = ",".join(f"{2 * (i + 1)}:{p}" for i, p in enumerate(then))
        row(int(n), ELASTIC_STEPS, f"{sizes.replace('>', ' -> ')} in place",
            *elastic(int(n), int(first), ["--schedule", schedule], args.timeout))
    for spec in filter(None, args.kills.split(";")):
        n, p = spec.split(":")
        row(int(n), ELASTIC_STEPS, f"{p}, one killed mid-step",
            *elastic(int(n), int(p), ["--kill9-at", f"w{int(p) // 2}:3:mid"], args.timeout))
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"\nlargest resident set of one process: {peak:.0f} MB")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
