"""Pause of one scale event as a surviving worker sees it.

pause = end of the last step before the event -> end of the first step after it, on a process that lives through
the event (rank 0). In-place (stop-free) scaling under easyscale_ext.elastic.launcher against checkpoint-and-restart
through torchrun (stop at a step with a checkpoint, start again on the new process count and resume), A -> B and
B -> A, same model (tests/support/train_job.py's conv net) on the same machine. The in-place job starts on A
processes, asks for B at step 2 and for A again at --back-at; a scale-out's joiners are forked from the launcher's
fork server (the default) and prepared while the others train (stop-free), and the seconds from the request to the
boundary that admits them are reported, also with joiners started as fresh interpreters (EASYSCALE_FORK_SERVER=0).
Medians over --repeats runs.

    .venv/bin/python bench/bench_elastic.py [--repeats 3] [--json PATH]                 # 1 <-> 2, N = 4
    .venv/bin/python bench/bench_elastic.py --procs 32,16 --virtual-workers 64 --batch 4 --epochs 5 --fresh-epochs 12
                                           --back-at 20
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
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def read_times(path):
    times = defaultdict(dict)
    with open(path) as f:
        for line in f:
            worker, step, t = line.split()[:3]
            times[worker][int(step)] = float(t)
    return times


def work(args, epochs=None):
    return ["--mode", "easyscale", "--virtual-workers", str(args.virtual_workers), "--batch", str(args.batch),
            "--steps", str(args.steps), "--epochs", str(epochs or args.epochs)]


def in_place(tmp, args, fork_server="1", epochs=None):
    """{"A -> B": pause, "B -> A": pause, "step": a normal step, "joined_after_*": the scale-out's admission}."""
    from easyscale_ext.elastic.launcher import ElasticLauncher

    a, b = args.procs
    times_log, events_log = os.path.join(tmp, "times"), os.path.join(tmp, "events")
    argv = [sys.executable, JOB, *work(args, epochs), "--elastic", "1", "--block", "0",
            "--schedule", f"2:{b},{args.back_at}:{a}", "--log-times", times_log, "--log-events", events_log,
            "--out", os.path.join(tmp, "hash")]
    if ElasticLauncher(argv, a, env=dict(ENV, EASYSCALE_FORK_SERVER=fork_server)).run(timeout_s=1800) != 0:
        raise RuntimeError("in-place job failed")
    survivor = read_times(times_log)["w0"]
    with open(events_log) as f:  # every process that saw an event wrote it: "step old new sizes..."
        events = sorted({tuple(map(int, line.split()[:3])) for line in f})
    if len(events) != 2:
        raise RuntimeError(f"expected 2 scale events, saw {events}: raise --epochs")
    steps = sorted(survivor)
    r = {"step": statistics.median(survivor[s] - survivor[s - 1] for s in steps[1:])}
    for step, old, new in events:
        r[f"{old} -> {new}"] = survivor[step + 1] - survivor[step]
        if new > old:  # a scale-out: asked for at step 2 (A < B) or at --back-at
            asked = 2 if a < b else args.back_at
            r["joined_after_steps"], r["joined_after_s"] = step - asked, survivor[step] - survivor[asked]
    return r


def torchrun(tmp, procs, args, extra, port):
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:1", "--nproc-per-node", str(procs),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", JOB, *work(args), "--torchrun", "1",
            "--ckpt-dir", os.path.join(tmp, "ckpt"), "--ckpt-every", "1000", "--resume", "1",
            "--log-times", os.path.join(tmp, "times"), "--out", os.path.join(tmp, "hash"), *extra]
    subprocess.run(argv, check=True, capture_output=True, env=ENV)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def restart(tmp, before, after, args, stop=10):
    # The first run checkpoints at `stop` and ends; the second resumes from it.
    torchrun(tmp, before, args, ["--stop-after", str(stop), "--ckpt-every", str(stop)], free_port())
    torchrun(tmp, after, args, ["--stop-after", str(stop + 5)], free_port())
    t = read_times(os.path.join(tmp, "times"))["0"]
    return t[stop + 1] - t[stop]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", default="1,2", help="A,B: the processes before and after the first event")
    ap.add_argument("--virtual-workers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32, help="samples a virtual worker a step")
    ap.add_argument("--steps", type=int, default=25, help="steps an epoch")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--fresh-epochs", type=int, help="epochs of the run whose joiners start as fresh interpreters "
                    "(default --epochs): its joiners must be admitted before the end")
    ap.add_argument("--back-at", type=int, default=400, help="the in-place run asks for A processes again here "
                    "(after the first event's joiners trained some steps: a fresh interpreter takes seconds)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    args.procs = tuple(map(int, args.procs.split(",")))
    a, b = args.procs
    events = (f"{a} -> {b}", f"{b} -> {a}")
    runs = defaultdict(list)
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            r = in_place(tmp, args)
        for key, value in r.items():
            runs[key if key.startswith("joined") else "in_place " + key].append(value)
        with tempfile.TemporaryDirectory() as tmp:
            fresh = in_place(tmp, args, fork_server="0", epochs=args.fresh_epochs)
            runs["joined_after_s_fresh"].append(fresh["joined_after_s"])
        for before, after in ((a, b), (b, a)):
            with tempfile.TemporaryDirectory() as tmp:
                runs[f"restart {before} -> {after}"].append(restart(tmp, before, after, args))
    med = {k: statistics.median(v) for k, v in runs.items()}
    print(f"N = {args.virtual_workers}, median of {args.repeats} runs; a normal step takes "
          f"{med['in_place step'] * 1e3:.1f} ms on the survivor; joiners were admitted "
          f"{med['joined_after_steps']:.0f} steps after the request (prepared meanwhile), {med['joined_after_s']:.2f} s "
          f"after it ({med['joined_after_s_fresh']:.2f} s as fresh interpreters)\n")
    print("| event | in-place pause ms | torchrun restart pause ms | restart / in-place |")
    print("|---|---|---|---|")
    for event in events:
        inplace, restarted = med["in_place " + event], med["restart " + event]
        kind = "scale-out" if int(event.split()[-1]) > int(event.split()[0]) else "scale-in"
        print(f"| {kind} {event} | {inplace * 1e3:.1f} | {restarted * 1e3:.1f} | {restarted / inplace:.1f}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)


if __name__ == "__main__":
    main()
