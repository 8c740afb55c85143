"""The job store's traffic as an elastic job's members grow: the requests each process makes of the store per step
and per heartbeat period, the bytes it sends, the launcher's own requests, and the store host's CPU.

What runs: tests/support/train_job.py's conv net under easyscale_ext.elastic.launcher (`easyscale run`), N = 64
virtual workers on P processes, D0, gloo, 0.25 s added to every step, the default liveness (a heartbeat every
second). Every process runs the job
through this script (`--traced`), which counts each request its job store client makes (JobStore's calls into the
torch store, by thread: the training loop's and the heartbeat's); bytes are measured at the store's end of every
connection (`ss -ti`). The window runs between rank 0's steps 8 and 8 + --window. The host's CPU is that of the
launcher's threads (its watch over the processes, the store's server) over the same window. Not counted: torch's own rendezvous through
the store as a group forms (once a generation, not a step).

    .venv/bin/python bench/bench_store.py                 # P = 2, 4, 8, 16, 32
    .venv/bin/python bench/bench_store.py --procs 4,32 --json store.json
"""
import argparse
import atexit
import json
import os
import re
import runpy
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
JOB = os.path.join(ROOT, "tests", "support", "train_job.py")
FIRST = 8  # rank 0's step at the first sample: the first generation's meetings and replication are behind it
STEP_S = 0.25  # added to every step: the window spans several heartbeat periods at every P
HEARTBEAT = "easyscale-heartbeat"  # membership.py's thread


class Counted:
    """A torch store whose every request is logged as (time, the thread's name, the request)."""

    def __init__(self, store, log: list):
        self.store, self.log = store, log

    def __getattr__(self, name):
        request = getattr(self.store, name)

        def call(*args, **kwargs):
            self.log.append((time.time(), threading.current_thread().name, name))
            return request(*args, **kwargs)
        return call


def count_requests(log: list) -> None:
    """Every JobStore made from here on logs its requests into `log`."""
    import torch.distributed as dist
    from easyscale_ext.elastic import protocol

    made = protocol.JobStore.__init__
    protocol.JobStore.__init__ = lambda self, store: made(self, Counted(store, log))
    # torch's process group needs the store itself: its rendezvous goes uncounted
    protocol.JobStore.group_store = lambda self, generation: dist.PrefixStore(f"gen{generation}", self.store.store)


def traced(path: str, argv: list) -> None:
    """Run the job script `argv` here, its store requests written to `path` at exit."""
    log = []
    count_requests(log)
    atexit.register(lambda: json.dump(log, open(path, "w")))
    sys.argv = argv
    runpy.run_path(argv[0], run_name="__main__")


def received_bytes(port: int) -> dict:
    """Per client port: the bytes the store has received on that connection."""
    text = subprocess.run(["ss", "-tinH", "state", "established", f"( sport = :{port} )"], capture_output=True,
                          text=True, check=True).stdout
    return {int(peer): int(dict(re.findall(r"(\w+):(\d+)", info)).get("bytes_received", 0))
            for peer, info in re.findall(r"\S+:\d+\s+\S+:(\d+)\s*\n\s+(.*)", text)}


def rank0_step(path: str) -> tuple:
    """(rank 0's newest step, when it ended) from the job's step log."""
    step, at = -1, 0.0
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                worker, s, t = line.split()[:3]
                if worker == "w0" and int(s) > step:
                    step, at = int(s), float(t)
    return step, at


def measure(procs: int, window: int, timeout: float) -> dict:
    from easyscale_ext.elastic.launcher import ElasticLauncher

    host_log = []
    count_requests(host_log)
    with tempfile.TemporaryDirectory() as tmp:
        steps_log = os.path.join(tmp, "times")
        argv = [sys.executable, os.path.abspath(__file__), "--traced", os.path.join(tmp, "requests"), JOB,
                "--mode", "easyscale", "--virtual-workers", "64", "--steps", str(FIRST + window + 4), "--epochs", "1",
                "--elastic", "1", "--step-sleep", str(STEP_S), "--log-times", steps_log, "--out", os.path.join(tmp, "hash")]
        launcher = ElasticLauncher(argv, procs, env=dict(os.environ, OMP_NUM_THREADS="1"))
        port = launcher.server.port
        result = {}
        running = threading.Thread(target=lambda: result.setdefault("rc", launcher.run(timeout_s=timeout)),
                                   name="launcher")
        running.start()
        samples = []
        for target in (FIRST, FIRST + window):
            while rank0_step(steps_log)[0] < target:
                if not running.is_alive():
                    raise RuntimeError(f"P={procs}: the job ended before step {target}")
                time.sleep(0.01)
            samples.append((*rank0_step(steps_log), host_cpu_seconds(), received_bytes(port)))
        clients = client_pids(port)
        running.join()
        if result.get("rc") != 0:
            raise RuntimeError(f"P={procs}: the job failed ({result.get('rc')})")
        logs = {pid: json.load(open(os.path.join(tmp, name)))
                for name in os.listdir(tmp) if (pid := name.partition("requests.")[2])}
    (s0, t0, cpu0, b0), (s1, t1, cpu1, b1) = samples
    seconds, steps = t1 - t0, s1 - s0

    def requests(log, thread=None, other_than=None):
        return sum(t0 <= t < t1 and (thread is None or name == thread) and name != other_than
                   for t, name, _ in log)

    sent = defaultdict(int)
    for peer, after in b1.items():
        sent[str(clients.get(peer))] += after - b0.get(peer, 0)
    return {"procs": procs, "seconds": seconds, "steps": steps,
            "per_step": {pid: requests(log, other_than=HEARTBEAT) / steps for pid, log in logs.items()},
            "heartbeat_per_s": {pid: requests(log, thread=HEARTBEAT) / seconds for pid, log in logs.items()},
            "bytes_per_step": {pid: sent[pid] / steps for pid in logs},
            "launcher_per_s": requests(host_log, thread="launcher") / seconds,
            "host_cpu": (cpu1 - cpu0) / seconds}


def host_cpu_seconds() -> float:
    """CPU seconds of this process's threads but the main one (which samples): the launcher's and the store's."""
    ticks = 0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) != os.getpid():
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def client_pids(port: int) -> dict:
    """Client port -> the pid holding it."""
    text = subprocess.run(["ss", "-tnpH", "state", "established", f"( dport = :{port} )"], capture_output=True,
                          text=True, check=True).stdout
    return {int(local): int(pid) for local, pid in
            re.findall(r"\S+:(\d+)\s+\S+:\d+\s+users:\(\(\"[^\"]*\",pid=(\d+)", text)}


def main() -> None:
    if sys.argv[1:2] == ["--traced"]:
        return traced(f"{sys.argv[2]}.{os.getpid()}", sys.argv[3:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", default="2,4,8,16,32")
    ap.add_argument("--window", type=int, default=24, help="rank 0's steps between the samples")
    ap.add_argument("--timeout", type=float, default=1200)
    ap.add_argument("--json")
    args = ap.parse_args()
    print("| P | requests a step: a process (max) | heartbeat requests a second: a process (max) | KB a step: a process "
          "| the launcher's requests a second | host CPU |\n|---:|---:|---:|---:|---:|---:|", flush=True)
    rows = []
    for procs in map(int, args.procs.split(",")):
        r = measure(procs, args.window, args.timeout)
        rows.append(r)
        step, beat = list(r["per_step"].values()), list(r["heartbeat_per_s"].values())
        print(f"| {procs} | {statistics.median(step):.1f} ({max(step):.1f}) | "
              f"{statistics.median(beat):.1f} ({max(beat):.1f}) | "
              f"{statistics.median(r['bytes_per_step'].values()) / 1e3:.1f} | {r['launcher_per_s']:.0f} | "
              f"{r['host_cpu'] * 100:.0f} % |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
