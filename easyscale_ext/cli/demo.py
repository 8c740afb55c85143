"""`easyscale demo`: a small CNN on scikit-learn's handwritten digits (shipped
inside the package, nothing downloaded), trained with N virtual workers on an
elastic schedule of local CPU processes (in-place scale events and one
checkpoint-and-restart), then replayed on a fixed number of processes. The
verdict compares SHA-256 hashes of the final model and optimizer state.

The same file is the training script the launcher runs (`python -m
easyscale_ext.demo --worker ...`).
"""
import argparse
import json
import os
import sys
import time
from typing import List, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from ..runtime.digest import state_sha256


BATCH = 16  # per virtual worker
FREEZE_INTERVAL = 4  # optimizer steps between freezing evaluations


# -- the training script ---------------------------------------------------------------
def digits() -> Tuple[TensorDataset, TensorDataset]:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(d.target, dtype=torch.int64)
    g = torch.Generator().manual_seed(0)
    order = torch.randperm(len(y), generator=g)
    test, train = order[:360], order[360:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[test], y[test])


class Augmented(torch.utils.data.Dataset):
    """Random shifts of up to one pixel: augmentation whose bits EasyScale keeps placement-invariant."""

    def __init__(self, base):
        self.base = base

    def __len__(self):
        return len(self.base)

    def __getitem__(self, i):
        x, y = self.base[i]
        dx, dy = torch.randint(-1, 2, (2,)).tolist()
        return torch.roll(x, shifts=(dy, dx), dims=(1, 2)), y


def model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Dropout(0.1), nn.Flatten(), nn.Linear(32 * 16, 10))


def worker(args) -> int:
    import easyscale_ext as es
    from easyscale_ext.elastic import Balancer, Checkpointer, ElasticMember

    member = ElasticMember(balance=Balancer(interval=4) if args.balance else False)
    torch.manual_seed(args.seed)
    net = model()
    freezer = None
    if args.freeze:
        from easyscale_ext.runtime.freeze import GradientNormFreezer
        freezer = GradientNormFreezer(interval=FREEZE_INTERVAL, window=2, threshold=args.freeze)
    ddp = es.EasyScaleDDP(net, virtual_world_size=args.n, determinism_level=args.level, freezer=freezer)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.02, momentum=0.9)
    train_set, test = digits()
    loader = ddp.data_loader(Augmented(train_set), batch_size=BATCH, shuffle=True, seed=args.seed)
    ckpt = Checkpointer(os.path.join(args.out, f"checkpoints-{args.run}"), ddp, opt)
    position = member.start(ddp, opt, None, None if member.joining else ckpt.resume())
    loader.reassign(ddp.local_ranks)
    requests = dict(tuple(int(x) for x in item.split(":")) for item in args.requests.split(",") if item)
    with open(args.metrics, "a") as metrics:
        while True:
            try:
                code = train(args, member, ddp, net, opt, loader, ckpt, test, position, requests, metrics)
                break
            except Exception as error:  # a process died: the survivors go on in place
                position = member.recover(error, ddp, opt, None, loader)
    if dist.is_initialized():  # a member that left the job has destroyed its group already
        dist.destroy_process_group()
    return code


def train(args, member, ddp, net, opt, loader, ckpt, test, position, requests, metrics) -> int:
    from easyscale_ext.elastic import Position

    step = position.step
    for epoch in range(position.epoch, args.epochs):
        loader.set_epoch(epoch, position.step_in_epoch if epoch == position.epoch else 0)
        for step_batches in loader:
            losses = []
            for x, y in ddp.workers(step_batches):
                loss = F.cross_entropy(ddp(x), y)
                loss.backward()
                losses.append(loss.item())
            worker0_loss = losses[0] if ddp.local_ranks[0] == 0 else None
            opt.step()
            opt.zero_grad()
            step += 1
            here = Position(step, epoch, loader.next_step)
            record = {"step": step, "time": time.time(), "procs": dist.get_world_size(),
                      "split": [hi - lo for lo, hi in ddp.ranges],
                      "frozen": ddp.freezer.frozen if ddp.freezer is not None else 0}
            if worker0_loss is not None:
                record["loss"] = worker0_loss
            if loader.next_step == len(loader) and ddp.rank == 0:
                record["accuracy"] = accuracy(net, test)
            if ddp.rank == 0:
                metrics.write(json.dumps(record) + "\n")
                metrics.flush()
                if step in requests:
                    member.store.set_target(requests[step])
            if step == args.stop_after:
                ckpt.save(here)
                return 0
            if not member.step_boundary(ddp, opt, None, here, block=True):
                return 0
            loader.reassign(ddp.local_ranks)
    if ddp.rank == 0:
        with open(os.path.join(args.out, f"{args.run}.sha256"), "w") as f:
            f.write(state_sha256(net, opt))
    return 0


def accuracy(net: nn.Module, test: TensorDataset) -> float:
    net.eval()
    with torch.no_grad():
        x, y = test.tensors
        correct = (net(x).argmax(1) == y).sum().item()
    net.train()
    return correct / len(y)


# -- the driver ----------------------------------------------------------------------------
RUNS = ("elastic", "fixed", "unfrozen")

def parse_schedule(text: str, n: int) -> List[List[int]]:
    """'1,2,4|3,1' -> segments of process counts; '|' is a restart from a checkpoint."""
    segments = []
    for part in text.split("|"):
        counts = [int(c) for c in part.split(",") if c.strip()]
        if not counts:
            raise ValueError(f"empty segment in schedule {text!r}")
        for c in counts:
            if c < 1 or c > n:
                raise ValueError(f"schedule {text!r}: process count {c} must be between 1 and N={n}")
        segments.append(counts)
    return segments


def progress(metrics_path: str, total: int, label: str, proc) -> None:
    """A tqdm bar over the steps the run's metrics file has recorded, while `proc` runs."""
    from tqdm import tqdm

    with tqdm(total=total, desc=f"  {label}", unit="step", initial=0, dynamic_ncols=True) as bar:
        while proc.poll() is None:
            time.sleep(0.2)
            lines = open(metrics_path).read().splitlines() if os.path.exists(metrics_path) else []
            if lines:
                last = json.loads(lines[-1])
                bar.set_postfix_str(f"P={last['procs']}", refresh=False)
                bar.update(last["step"] - bar.n)


def run_phase(args, run: str, procs: int, requests: str, stop_after: int, total: int) -> None:
    import threading

    from ..elastic.launcher import ElasticLauncher

    metrics = os.path.join(args.out, f"{run}.jsonl")
    argv = [sys.executable, "-m", "easyscale_ext.cli.demo", "--worker", "--run", run, "--metrics", metrics,
            "--requests", requests, "--stop-after", str(stop_after), "--n", str(args.n), "--epochs",
            str(args.epochs), "--seed", str(args.seed), "--level", args.level, "--out", args.out,
            "--freeze", str(0.0 if run == "unfrozen" else args.freeze)]
    from .. import determinism

    env = dict(os.environ, OMP_NUM_THREADS="1", **determinism.environment(args.level, args.isa))
    cpus = None
    if args.balance and run == "elastic":  # one process alone on a core, two sharing another
        argv.append("--balance")
        cores = sorted(os.sched_getaffinity(0))
        cpus = [cores[0], cores[1], cores[1]]
    launcher = ElasticLauncher(argv, procs, env=env, log_dir=os.path.join(args.out, "logs"), cpus=cpus)
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("code", launcher.run(timeout_s=1800)))
    thread.start()

    class Alive:
        def poll(self):
            return None if thread.is_alive() else 0

    progress(metrics, total, run, Alive())
    thread.join()
    if result.get("code") != 0:
        raise SystemExit(f"easyscale demo: the {run} run failed; see {os.path.join(args.out, 'logs')}")


def steps_per_epoch(n: int) -> int:
    from ..runtime.loader import VirtualDataLoader

    return len(VirtualDataLoader(digits()[0], BATCH, n, [0]))


def demo(args) -> int:
    segments = [[3]] if args.balance else parse_schedule(args.schedule, args.n)
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    if not os.access(args.out, os.W_OK):
        raise SystemExit(f"easyscale demo: output folder {args.out} is not writable")
    import shutil
    for run in RUNS:
        for stale in (f"{run}.jsonl", f"{run}.sha256"):
            if os.path.exists(os.path.join(args.out, stale)):
                os.unlink(os.path.join(args.out, stale))
        shutil.rmtree(os.path.join(args.out, f"checkpoints-{run}"), ignore_errors=True)
    total = steps_per_epoch(args.n) * args.epochs
    events = sum(len(s) for s in segments) - 1
    stride = max(1, total // (events + 1))
    print(f"easyscale demo: {args.n} virtual workers, {args.epochs} epochs ({total} steps) on digits; "
          + ("elastic run on 3 processes, one alone on a core and two sharing another, rebalanced by measured "
             "speed" if args.balance else f"elastic schedule {args.schedule} ('|' = restart from a checkpoint)")
          + f", then a fixed run on {args.fixed_procs} processes")
    at = 0
    for i, counts in enumerate(segments):
        requests = []
        for c in counts[1:]:
            at += stride
            requests.append(f"{at}:{c}")
        at += stride
        stop = at if i < len(segments) - 1 else 0
        run_phase(args, "elastic", counts[0], ",".join(requests), stop, total)
    run_phase(args, "fixed", args.fixed_procs, "", 0, total)
    if args.freeze:  # the same fixed job without freezing, for accuracy and time
        run_phase(args, "unfrozen", args.fixed_procs, "", 0, total)
    return report(args, total)


def report(args, total: int) -> int:
    runs = {}
    for run in RUNS[:3 if args.freeze else 2]:
        records = [json.loads(line) for line in open(os.path.join(args.out, f"{run}.jsonl"))]
        runs[run] = records
        phases, start = [], 0
        for i in range(1, len(records) + 1):
            if i == len(records) or records[i]["split"] != records[start]["split"]:
                seg = records[start:i]
                secs = (seg[-1]["time"] - seg[0]["time"]) / (len(seg) - 1) if len(seg) > 1 else float("nan")
                split = ",".join(map(str, seg[0]["split"]))
                phases.append(f"P={seg[0]['procs']} ({split}): steps {seg[0]['step']}-{seg[-1]['step']}, "
                              f"{args.n * BATCH / secs:.0f} samples/s, {1000 * secs:.1f} ms/step")
                start = i
        acc = [r["accuracy"] for r in records if "accuracy" in r]
        seconds = records[-1]["time"] - records[0]["time"]
        print(f"  {run}: " + "; ".join(phases) + f"; {seconds:.1f} s; final accuracy {acc[-1]:.3f}")
    for step, layers in freezing(runs["fixed"]):
        print(f"  froze layer{'s' if len(layers) > 1 else ''} {', '.join(map(str, layers))} after step {step} "
              "(the same steps in the elastic run: see the verdict)")
    plot(args, runs)
    digests = {run: open(os.path.join(args.out, f"{run}.sha256")).read() for run in ("elastic", "fixed")}
    print("SHA-256 of the final state (model, buffers, optimizer):")
    for run, digest in digests.items():
        print(f"  {run:<8} {digest}")
    if digests["elastic"] == digests["fixed"]:
        print("verdict: bitwise identical")
        return 0
    losses = [(a["step"], a["loss"], b["loss"]) for a, b in zip(runs["elastic"], runs["fixed"]) if a["loss"] != b["loss"]]
    where = f"first at step {losses[0][0]} (worker-0 loss {losses[0][1]!r} vs {losses[0][2]!r})" if losses else \
        "in the state after the last step"
    print(f"verdict: DIFFERENT; they diverge {where}")
    return 1


def freezing(records) -> List[Tuple[int, List[int]]]:
    """(step, layers newly frozen after it) from a run's metrics."""
    out, frozen = [], 0
    for r in records:
        if r["frozen"] > frozen:
            out.append((r["step"], list(range(frozen, r["frozen"]))))
            frozen = r["frozen"]
    return out


def plot(args, runs) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for run, style in zip(runs, ("-", "--", ":")):
        rec = runs[run]
        ax_loss.plot([r["step"] for r in rec], [r["loss"] for r in rec], style, label=run, linewidth=1)
        acc = [(r["step"], r["accuracy"]) for r in rec if "accuracy" in r]
        ax_acc.plot([s for s, _ in acc], [a for _, a in acc], style + "o", label=run)
    elastic = runs["elastic"]
    for prev, cur in zip(elastic, elastic[1:]):
        if cur["procs"] != prev["procs"]:
            for ax in (ax_loss, ax_acc):
                ax.axvline(prev["step"] + 0.5, color="grey", alpha=0.4)
            ax_loss.annotate(f"P={cur['procs']}", (prev["step"] + 0.5, ax_loss.get_ylim()[1]), fontsize=8,
                             va="top")
    for step, layers in freezing(runs["fixed"]):
        for ax in (ax_loss, ax_acc):
            ax.axvline(step + 0.5, color="tab:blue", alpha=0.4, linestyle=":")
        ax_loss.annotate(f"froze {','.join(map(str, layers))}", (step + 0.5, ax_loss.get_ylim()[0]), fontsize=8,
                         va="bottom", color="tab:blue")
    ax_loss.set(xlabel="step", ylabel="loss (virtual worker 0)", title="loss")
    ax_acc.set(xlabel="step", ylabel="test accuracy", title="accuracy (end of each epoch)")
    ax_loss.legend()
    ax_acc.legend()
    fig.tight_layout()
    path = os.path.join(args.out, "demo.png")
    fig.savefig(path, dpi=100)
    print(f"plot: {path} (grey lines: scale events of the elastic run; blue dotted: layers frozen)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m easyscale_ext.demo")
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--run", default="elastic")
    ap.add_argument("--metrics", default="")
    ap.add_argument("--requests", default="")
    ap.add_argument("--stop-after", type=int, default=0)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--level", default="D1")
    ap.add_argument("--out", default="out")
    ap.add_argument("--freeze", type=float, default=0.0)
    ap.add_argument("--balance", action="store_true")
    args = ap.parse_args(argv)
    return worker(args)


if __name__ == "__main__":
    sys.exit(main())
