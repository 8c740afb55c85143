"""Pause of one scale event as a surviving worker sees it.

pause = end of the last step before the event -> end of the first step after
it, on a process that lives through the event. In-place (stop-free) scaling
under easyscale_ext.elastic.launcher against checkpoint-and-restart through torchrun
(stop at a step with a checkpoint, start again on the new process count and
resume), scale-out 1 -> 2 and scale-in 2 -> 1, same model (tests/support/train_job.py's
conv net, N = 4) on the same machine. Medians over --repeats runs. Also the seconds from the scale-out request to
the joiner's first step, its process forked from the launcher's fork server (the default) and started as a fresh
interpreter (EASYSCALE_FORK_SERVER=0).

    .venv/bin/python bench/bench_elastic.py [--repeats 3] [--json PATH]
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(ROOT, "tests", "support", "train_job.py")
WORK = ["--mode", "easyscale", "--virtual-workers", "4", "--batch", "32", "--steps", "25", "--epochs", "20"]
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def read_times(path):
    times = defaultdict(dict)
    with open(path) as f:
        for line in f:
            worker, step, t = line.split()[:3]
            times[worker][int(step)] = float(t)
    return times


def in_place(tmp, fork_server="1"):
    from easyscale_ext.elastic.launcher import ElasticLauncher

    log = os.path.join(tmp, "times")
    scale_in_at = 400  # the joiner, started at step 2, trains some steps before the scale-in (a fresh one takes 4-6 s)
    argv = [sys.executable, JOB, *WORK, "--elastic", "1", "--block", "0", "--schedule", f"2:2,{scale_in_at}:1",
            "--log-times", log, "--out", os.path.join(tmp, "hash")]
    if ElasticLauncher(argv, 1, env=dict(ENV, EASYSCALE_FORK_SERVER=fork_server)).run(timeout_s=600) != 0:
        raise RuntimeError("in-place job failed")
    times = read_times(log)
    survivor, joiner = times["w0"], times["w1"]
    first, last = min(joiner), max(joiner)
    steps = sorted(survivor)
    typical = statistics.median(survivor[s] - survivor[s - 1] for s in steps[1:])
    return {"out": survivor[first] - survivor[first - 1], "in": survivor[last + 1] - survivor[last],
            "step": typical, "joined_after_steps": first - 2, "joined_after_s": survivor[first - 1] - survivor[2]}


def torchrun(tmp, procs, extra, port):
    args = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:1", "--nproc-per-node", str(procs),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", JOB, *WORK, "--torchrun", "1",
            "--ckpt-dir", os.path.join(tmp, "ckpt"), "--ckpt-every", "1000", "--resume", "1",
            "--log-times", os.path.join(tmp, "times"), "--out", os.path.join(tmp, "hash"), *extra]
    subprocess.run(args, check=True, capture_output=True, env=ENV)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def restart(tmp, before, after, stop):
    # The first run checkpoints at `stop` and ends; the second resumes from it.
    torchrun(tmp, before, ["--stop-after", str(stop), "--ckpt-every", str(stop)], free_port())
    torchrun(tmp, after, ["--stop-after", str(stop + 5)], free_port())
    t = read_times(os.path.join(tmp, "times"))["0"]
    return t[stop + 1] - t[stop]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    runs = defaultdict(list)
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            r = in_place(tmp)
        for key in ("out", "in", "step"):
            runs["in_place_" + key].append(r[key])
        runs["joined_after_steps"].append(r["joined_after_steps"])
        runs["joined_after_s"].append(r["joined_after_s"])
        with tempfile.TemporaryDirectory() as tmp:
            runs["joined_after_s_fresh"].append(in_place(tmp, fork_server="0")["joined_after_s"])
        with tempfile.TemporaryDirectory() as tmp:
            runs["restart_out"].append(restart(tmp, 1, 2, 10))
        with tempfile.TemporaryDirectory() as tmp:
            runs["restart_in"].append(restart(tmp, 2, 1, 10))
    med = {k: statistics.median(v) for k, v in runs.items()}
    print(f"median of {args.repeats} runs; a normal step takes {med['in_place_step'] * 1e3:.1f} ms on the survivor; "
          f"joiners were admitted {med['joined_after_steps']:.0f} steps after the request (prepared meanwhile), "
          f"{med['joined_after_s']:.2f} s after it ({med['joined_after_s_fresh']:.2f} s as a fresh interpreter)\n")
    print("| event | in-place pause ms | torchrun restart pause ms | restart / in-place |")
    print("|---|---|---|---|")
    for event, label in (("out", "scale-out 1 -> 2"), ("in", "scale-in 2 -> 1")):
        a, b = med["in_place_" + event], med["restart_" + event]
        print(f"| {label} | {a * 1e3:.1f} | {b * 1e3:.1f} | {b / a:.1f}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)


if __name__ == "__main__":
    main()
