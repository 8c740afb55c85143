"""Layer freezing: backward time, gradient elements exchanged and accuracy, with and without.

A 6-block CNN on scikit-learn's digits, N = 4 virtual workers on one process, 8 epochs. Runs, interleaved
and repeated (medians reported):
  unfrozen   no freezer
  frozen     GradientNormFreezer(interval 4, window 2, --threshold, --warmup, --max-frozen)
  idle       a freezer evaluating every step that never freezes (threshold 0): its overhead per step
"Elements exchanged" counts the reduction plan's gradient elements summed over the steps: what a
multi-process job sends through its all-to-all and all-gather (4 bytes each).

    .venv/bin/python bench/bench_freeze.py [--repeats 3] [--epochs 8] [--threshold 0.1] [--warmup 0] [--max-frozen 0.8]
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

import easyscale_ext as es
from easyscale_ext.cli.demo import BATCH, digits
from easyscale_ext.runtime.freeze import GradientNormFreezer

N = 4


def deep_cnn() -> nn.Module:
    blocks = [nn.Sequential(nn.Conv2d(1 if i == 0 else 32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU())
              for i in range(6)]
    return nn.Sequential(*blocks, nn.Flatten(), nn.Linear(32 * 64, 10))


def run(kind: str, epochs: int, threshold: float, warmup: int, cap: float) -> dict:
    torch.manual_seed(0)
    net = deep_cnn()
    freezer = {"unfrozen": None,
               "frozen": GradientNormFreezer(interval=4, window=2, threshold=threshold, warmup=warmup,
                                             max_frozen_fraction=cap),
               "idle": GradientNormFreezer(interval=1, window=2, threshold=0.0)}[kind]
    ddp = es.EasyScaleDDP(net, virtual_world_size=N, freezer=freezer)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.02, momentum=0.9)
    train, test = digits()
    loader = ddp.data_loader(train, batch_size=BATCH, seed=0)
    backward = total = 0.0
    elements = 0
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for step_batches in loader:
            start = time.perf_counter()
            for x, y in ddp.workers(step_batches):
                loss = F.cross_entropy(ddp(x), y)
                t = time.perf_counter()
                loss.backward()
                backward += time.perf_counter() - t
            elements += sum(b.numel for b in ddp.reducer.buckets)
            opt.step()
            opt.zero_grad()
            total += time.perf_counter() - start
    net.eval()
    with torch.no_grad():
        x, y = test.tensors
        accuracy = (net(x).argmax(1) == y).float().mean().item()
    return {"backward": backward, "total": total, "elements": elements, "accuracy": accuracy,
            "frozen": [(d.step, d.layers) for d in freezer.log] if freezer is not None else []}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--threshold", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=0, help="the freezer's warm-up steps (no decision before)")
    ap.add_argument("--max-frozen", type=float, default=0.8, help="the freezer's cap on the frozen fraction")
    args = ap.parse_args()
    torch.set_num_threads(1)
    results = {k: [] for k in ("unfrozen", "frozen", "idle")}
    for _ in range(args.repeats):
        for kind in results:
            results[kind].append(run(kind, args.epochs, args.threshold, args.warmup, args.max_frozen))
    med = {k: {m: statistics.median(r[m] for r in rs) for m in ("backward", "total", "elements", "accuracy")}
           for k, rs in results.items()}
    base, frozen, idle = med["unfrozen"], med["frozen"], med["idle"]
    print(f"deep CNN on digits, N={N}, {args.epochs} epochs, medians of {args.repeats} interleaved runs")
    print(f"{'run':<10}{'backward s':>12}{'step s':>10}{'elements':>14}{'accuracy':>10}")
    for k, m in med.items():
        print(f"{k:<10}{m['backward']:>12.2f}{m['total']:>10.2f}{m['elements']:>14.0f}{m['accuracy']:>10.3f}")
    print(f"freezing decisions (step, layers): {results['frozen'][0]['frozen']}")
    print(f"frozen vs unfrozen: backward time x{frozen['backward'] / base['backward']:.2f}, "
          f"step time x{frozen['total'] / base['total']:.2f}, elements x{frozen['elements'] / base['elements']:.2f}, "
          f"accuracy {100 * (frozen['accuracy'] - base['accuracy']):+.1f} points")
    print(f"idle freezer (evaluates every step, never freezes): step time x{idle['total'] / base['total']:.3f}")


if __name__ == "__main__":
    main()
