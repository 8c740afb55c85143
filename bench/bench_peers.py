"""One job under the peers users would pick instead, side by side: torch DDP under torchrun's elastic agent,
torchft, Ray Train's elastic TorchTrainer and EasyScaleDDP under `easyscale run`.

The job is bench/peers_job.py's for every system (the same model, data, optimizer, global batch of 4 x 16 and
steps; 4 processes on CPU, gloo, one thread each, all on loopback), each started as its documentation says:
  torchrun   torchrun --nnodes 1:1 --nproc-per-node 4 --max-restarts 3 --rdzv-backend c10d, rank 0
             checkpoints every 10 steps, a restart resumes from it;
  torchft    torchft_lighthouse --min_replicas 1 --quorum_tick_ms 100 --join_timeout_ms 10000 (its README's) and
             one replica group per process, each under its own torchrun --max-restarts 3 (torchft's README);
  ray        TorchTrainer, ScalingConfig(num_workers=(2, 4)), FailureConfig(max_failures=3), a checkpoint every
             10 steps through ray.train.report, RAY_TRAIN_V2_ENABLED=1, on two local nodes of 2 worker slots;
  easyscale  easyscale run --procs 4, ElasticMember.run, 4 virtual workers, a checkpoint every 10 steps.
Scenarios, each from the same seed, --runs times (medians):
  steady     the event-free run: median step time, and its ratio to torch DDP's in the same invocation;
  kill -9    one of the 4 processes (shard 2's) killed mid-epoch, 5 steps after a checkpoint: seconds from the
             kill to the job's next completed step in a new configuration, and to its next step on 4
             processes again; steps completed twice (redone: the step the kill interrupted is not counted) and
             samples of the job never trained on (lost: a shard's micro-batch missing from a committed step);
  resize     4 -> 2 and then 2 -> 4 on request where the system has one (easyscale scale; torchft: stopping
             two replica groups and starting them again; Ray: a node of 2 slots removed, then added back);
             seconds from the request to the first step on the new size, and the longest pause between two
             steps meanwhile;
  bits       the final SHA-256 over parameters, buffers and optimizer state (easyscale_ext.runtime.digest)
             against the same system's event-free run of the same repetition.
Prints one markdown table (a row per system and model) and writes DIR/loss_SYSTEM_MODEL.png: the loss of shard
0's micro-batch per step in the first repetition's event-free, kill -9 and resize runs.

    .venv/bin/python bench/bench_peers.py [--runs 3] [--epochs 40] [--models cnn,transformer]
                                          [--systems torchrun,torchft,ray,easyscale] [--out DIR]
"""
import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from support.jobs import kill_tree  # noqa: E402

from easyscale_ext.elastic import request_scale  # noqa: E402

sys.path.insert(0, HERE)
from peers_job import BATCH, SHARDS, STEPS_PER_EPOCH, steps_done, event  # noqa: E402

JOB = os.path.join(HERE, "peers_job.py")
BIN = os.path.dirname(sys.executable)
ENV = dict(os.environ, OMP_NUM_THREADS="1")
SYSTEMS = ("torchrun", "torchft", "ray", "easyscale")
# Ray's elastic policy looks for new resources every elastic_resize_monitor_interval_s (default 60 s): at the default
# a grown cluster is noticed after this job has ended, so its 2 -> 4 is measured with 10 s (the table says so).
RAY_MONITOR_S = 10
NO_RESIZE = {"torchrun": "no: a new size is a new torchrun (stop, then start from a checkpoint)"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(argv, log, env=ENV, **options):
    """A process of the run, its output in `log`."""
    with open(log, "a") as f:
        return subprocess.Popen(argv, env=env, stdout=f, stderr=subprocess.STDOUT, **options)


def torchrun(argv, log, env=ENV):
    return start([os.path.join(BIN, "torchrun"), "--nnodes", "1:1", "--max-restarts", "3", "--rdzv-backend", "c10d",
                  "--rdzv-endpoint", f"127.0.0.1:{free_port()}", *argv], log, env)


class Job:
    """One run of the job under `system` in folder `out`: started, driven through its scenario, ended."""

    def __init__(self, system, model, epochs, out, resize_at=None):
        self.system, self.out, self.procs, self.resize_at = system, out, [], resize_at
        self.args = ["--model", model, "--epochs", str(epochs), "--out", out]
        getattr(self, "start_" + system)()

    def start_torchrun(self):
        self.procs.append(torchrun(["--nproc-per-node", str(SHARDS), JOB, "torchrun", *self.args],
                                   self.log("torchrun")))

    def start_torchft(self):
        port = free_port()
        self.lighthouse = start([os.path.join(BIN, "torchft_lighthouse"), "--min_replicas", "1", "--quorum_tick_ms",
                                 "100", "--join_timeout_ms", "10000", "--bind", f"127.0.0.1:{port}"],
                                self.log("lighthouse"))
        self.ft_env = dict(ENV, TORCHFT_LIGHTHOUSE=f"http://127.0.0.1:{port}", NUM_REPLICA_GROUPS=str(SHARDS))
        self.groups = {g: self.start_group(g) for g in range(SHARDS)}
        self.procs.extend(self.groups.values())

    def start_group(self, group):
        return torchrun(["--nproc-per-node", "1", JOB, "torchft", *self.args], self.log(f"group{group}"),
                        dict(self.ft_env, REPLICA_GROUP_ID=str(group)))

    def start_ray(self):
        resize = ["--resize", ",".join(map(str, self.resize_at)), "--monitor-s", str(RAY_MONITOR_S)] \
            if self.resize_at else []
        self.procs.append(start([sys.executable, JOB, "ray", *self.args, *resize], self.log("ray")))

    def start_easyscale(self):
        launcher = subprocess.Popen([os.path.join(BIN, "easyscale"), "run", "--procs", str(SHARDS), "--", JOB,
                                     "easyscale", *self.args], env=ENV, stdout=subprocess.PIPE,
                                    stderr=open(self.log("easyscale"), "w"), text=True)
        self.procs.append(launcher)
        self.store = launcher.stdout.readline().split()[4].rstrip(";")  # "easyscale: job store at HOST:PORT; ..."

    def log(self, name):
        return os.path.join(self.out, name + ".log")

    def kill_at(self, step):
        self.wait_for(step)
        with open(os.path.join(self.out, "pid.2")) as f:
            os.kill(int(f.read()), signal.SIGKILL)
        event(self.out, "kill")

    def resize(self):
        for at, procs in zip(self.resize_at, (2, SHARDS)):
            self.wait_for(at)
            event(self.out, "shrink" if procs == 2 else "grow")
            if self.system == "easyscale":
                request_scale(self.store, procs)  # what `easyscale scale --store ... --procs N` sends
            elif procs == 2:  # torchft: two replica groups stop (their agents pass SIGTERM on and do not restart)
                for g in (2, 3):
                    self.groups[g].send_signal(signal.SIGTERM)
            else:
                for g in (2, 3):
                    self.groups[g] = self.start_group(g)
                    self.procs.append(self.groups[g])

    def wait_for(self, step, timeout_s=600):
        deadline = time.monotonic() + timeout_s
        while not steps_done(self.out, step):
            if time.monotonic() > deadline or all(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"{self.system}: step {step} never came")
            time.sleep(0.02)

    def finish(self, timeout_s=600):
        try:
            deadline = time.monotonic() + timeout_s
            while not os.path.exists(os.path.join(self.out, "sha256")) or \
                    any(p.poll() is None for p in self.procs):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.system}: job not done after {timeout_s} s (see {self.out})")
                if all(p.poll() is not None for p in self.procs) and \
                        not os.path.exists(os.path.join(self.out, "sha256")):
                    raise RuntimeError(f"{self.system}: job ended without a final state (see {self.out})")
                time.sleep(0.1)
        finally:
            for p in self.procs + ([self.lighthouse] if self.system == "torchft" else []):
                kill_tree(p)


def read(out):
    def lines(name):
        path = os.path.join(out, name)
        return [json.loads(line) for line in open(path) if line.strip()] if os.path.exists(path) else []
    with open(os.path.join(out, "sha256")) as f:
        digest = f.read()
    steps = sorted(lines("steps.jsonl"), key=lambda r: r["t"])
    return dict(steps=steps, lead=[r for r in steps if r["lead"]], events=lines("events.jsonl"), sha256=digest)


def steady_step_s(run):
    lead = run["lead"][3:]  # after warm-up
    return statistics.median(b["t"] - a["t"] for a, b in zip(lead, lead[1:]) if b["step"] == a["step"] + 1)


def after_event(run, what, procs=None, new_configuration=True):
    """Seconds from the event `what` to the first completed step after it (in another configuration than the one
    running at the event; on `procs` processes if given), and the longest gap between steps meanwhile; None
    where no such step came before the job ended."""
    t = next(e["t"] for e in run["events"] if e["what"] == what)
    before = [r for r in run["lead"] if r["t"] <= t]
    gen = before[-1]["gen"] if before else None
    after = [r for r in run["lead"] if r["t"] > t and (not new_configuration or r["gen"] != gen)
             and (procs is None or r["procs"] == procs)]
    if not after:
        return None, None
    window = [r["t"] for r in run["lead"] if before and before[-1]["t"] <= r["t"] <= after[0]["t"]]
    return after[0]["t"] - t, max((b - a for a, b in zip(window, window[1:])), default=after[0]["t"] - t)


def redone_lost(run, total):
    seen, trained = {}, {}
    for r in run["lead"]:
        seen[r["step"]] = seen.get(r["step"], 0) + 1
    for r in run["steps"]:
        trained.setdefault(r["step"], set()).update(r["shards"])
    lost = sum(SHARDS - len(trained.get(s, ())) for s in range(1, total + 1)) * BATCH
    return sum(n - 1 for n in seen.values()), lost


def plot(path, title, runs):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, run in runs.items():
        last = {r["step"]: r["loss"] for r in run["lead"] if r["loss"] is not None}
        ax.plot(list(last), list(last.values()), label=label, lw=1, alpha=0.8)
    ax.set(xlabel="step", ylabel="loss (shard 0's micro-batch)", title=title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def measure(system, model, epochs, runs, out):
    """Every scenario `runs` times under `system`; the row's numbers (medians) and the plot."""
    total = epochs * STEPS_PER_EPOCH
    # Half-way between two checkpoints (every 10 steps), never at an epoch's end (22 steps: even).
    between = lambda step: step - step % 10 + 5  # noqa: E731
    kill_step, resize_at = between(total // 2), (between(total // 4), between(total // 2))
    res = {k: [] for k in ("step", "next", "full", "redone", "lost", "kill_bits", "shrink", "shrink_pause",
                           "grow", "grow_pause", "resize_bits")}
    for i in range(runs):
        done = {}
        for scenario in ("free", "kill", "resize"):
            if scenario == "resize" and system in NO_RESIZE:
                continue
            folder = os.path.join(out, f"{system}-{model}-{scenario}-{i}")
            os.makedirs(folder)
            job = Job(system, model, epochs, folder, resize_at if scenario == "resize" else None)
            try:
                if scenario == "kill":
                    job.kill_at(kill_step)
                elif scenario == "resize" and system != "ray":  # Ray's driver resizes its own cluster
                    job.resize()
            finally:
                job.finish()
            done[scenario] = read(folder)
        free = done["free"]
        res["step"].append(steady_step_s(free))
        kill = done["kill"]
        res["next"].append(after_event(kill, "kill")[0])
        res["full"].append(after_event(kill, "kill", SHARDS)[0])
        redone, lost = redone_lost(kill, total)
        res["redone"].append(redone)
        res["lost"].append(lost)
        res["kill_bits"].append(kill["sha256"] == free["sha256"])
        if "resize" in done:
            for what, procs in (("shrink", 2), ("grow", SHARDS)):
                to, pause = after_event(done["resize"], what, procs, new_configuration=False)
                res[what].append(to)
                res[what + "_pause"].append(pause)
            res["resize_bits"].append(done["resize"]["sha256"] == free["sha256"])
        if i == 0:
            plot(os.path.join(out, f"loss_{system}_{model}.png"), f"{system}, {model}: loss per step", done)
    return res


def median(values, fmt="{:.2f}"):
    """The median of the runs' values; where some run had none, how many did."""
    have = [v for v in values if v is not None]
    if not have:
        return "not within the job"
    text = fmt.format(statistics.median(have))
    return text if len(have) == len(values) else f"{text} ({len(have)} of {len(values)} runs)"


def bits(values):
    return "yes" if all(values) else "no" if not any(values) else f"{sum(values)} of {len(values)}"


def row(system, model, res, ddp_step):
    step = statistics.median(res["step"])
    ratio = f"{step / ddp_step:.2f}" if ddp_step else "n/a (torchrun not run)"
    if system in NO_RESIZE:
        resize = [NO_RESIZE[system]] * 2 + ["n/a"]
    else:
        resize = [f"{median(res[w])} (pause {median(res[w + '_pause'])})" for w in ("shrink", "grow")] + \
                 [bits(res["resize_bits"])]
    return [system, model, f"{step * 1e3:.1f}", ratio, median(res["next"]), median(res["full"]),
            f"{median(res['redone'], '{:.0f}')} / {median(res['lost'], '{:.0f}')}", bits(res["kill_bits"]),
            *resize]


HEADER = ["system", "model", "step ms", "step / torch DDP", "kill -9: s to next step", "kill -9: s to 4 procs",
          "kill -9: redone steps / lost samples", "kill -9: bits equal", "resize 4->2: s (pause s)",
          "resize 2->4: s (pause s)", "resize: bits equal"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=40, help=f"{STEPS_PER_EPOCH} steps each")
    ap.add_argument("--models", default="cnn,transformer")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--out", default=None, help="plots and every run's logs (default: a temporary folder)")
    args = ap.parse_args()
    systems = [s for s in SYSTEMS if s in args.systems.split(",")]
    out = args.out or tempfile.mkdtemp(prefix="bench-peers-")
    os.makedirs(out, exist_ok=True)
    versions = {"torch": "torch", "torchft": "torchft", "ray": "ray", "easyscale": "easyscale_ext"}
    from importlib.metadata import version
    print(f"{args.runs} runs each, medians; {args.epochs} epochs of {STEPS_PER_EPOCH} steps, 4 processes, "
          f"{os.cpu_count()} CPU cores; " + ", ".join(f"{k} {version(v)}" for k, v in versions.items()
                                                        if k in ("torch", *systems)) + "\n")
    print("| " + " | ".join(HEADER) + " |\n|" + "---|" * len(HEADER), flush=True)
    for model in args.models.split(","):
        ddp_step = None
        for system in systems:
            try:
                res = measure(system, model, args.epochs, args.runs, out)
            except Exception as e:  # the row says why; the others still run
                print(f"| {system} | {model} | not run: {str(e).splitlines()[0]} |" + " |" * (len(HEADER) - 3),
                      flush=True)
                continue
            if system == "torchrun":
                ddp_step = statistics.median(res["step"])
            print("| " + " | ".join(row(system, model, res, ddp_step)) + " |", flush=True)
    if "ray" in systems:
        print(f"\nray: elastic_resize_monitor_interval_s={RAY_MONITOR_S} (Ray's default 60 s); its 4 -> 2 is a node of "
              "2 slots removed (its workers die), its 2 -> 4 the node added back.")
    print(f"logs and loss plots: {out}")


if __name__ == "__main__":
    main()
