"""EasyScaleDDP's step overhead against gradient accumulation and torch DDP.

1. k virtual workers on one process vs a plain gradient-accumulation loop over
   the same k micro-batches on the same model (the lower bound for that work on
   one device): step time ratio and peak RSS, for a conv net with BatchNorm and
   a small transformer, k in {2, 4, 8}.
2. N = 2 on P = 2 processes vs torch DDP on 2 processes (gloo).
3. Cost of D1 and D2 against D0 (N = 4 on one process).
Each configuration runs in its own process (clean peak RSS); the contenders of
a configuration alternate step by step, and the median step time is reported.
`--overlap`: only the exchange's overlap with backward, on a 21 M
parameter MLP whose exchange is a large part of the step, N = 2 on 2 processes:
EasyScaleDDP with 25 MB buckets exchanged during backward, the same with one
bucket (the whole exchange after backward), torch DDP, and the compute alone
(one process, no exchange); pairs interleaved over --repeats, medians. Hidden
share = (one bucket - buckets) / (one bucket - compute).

    .venv/bin/python bench/bench_ddp.py [--quick] [--json PATH]
    .venv/bin/python bench/bench_ddp.py --overlap [--repeats 5]
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))


class ConvBN(nn.Module):
    """A small ResNet-style net on 32x32 images: conv + BatchNorm blocks."""

    def __init__(self, width=32):
        super().__init__()
        layers, cin = [], 3
        for cout in (width, width, 2 * width, 2 * width):
            layers += [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]
            cin = cout
        self.body = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 10))

    def forward(self, x):
        return self.body(x)


class SmallTransformer(nn.Module):
    def __init__(self, vocab=1000, dim=128, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.Sequential(*[nn.TransformerEncoderLayer(dim, 4, 4 * dim, dropout=0.1, batch_first=True)
                                      for _ in range(layers)])
        self.head = nn.Linear(dim, vocab)

    def forward(self, x):
        return self.head(self.blocks(self.embed(x)))


def make(model_name, batch):
    torch.manual_seed(0)
    if model_name == "mlp":  # 5 x (2048 x 2048 + 2048) = 21 M parameters, little compute per sample
        layers = [m for _ in range(5) for m in (nn.Linear(2048, 2048), nn.ReLU())]
        return nn.Sequential(*layers[:-1]), (torch.randn(batch, 2048), torch.randn(batch, 2048))
    if model_name == "convbn":
        return ConvBN(), (torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,)))
    x = torch.randint(0, 1000, (batch, 64))
    return SmallTransformer(), (x, x.roll(-1, 1))


def loss_of(model, batch):
    x, y = batch
    out = model(x)
    if y.is_floating_point():
        return F.mse_loss(out, y)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def child_overhead(model_name, k, steps, level):
    """One process: EasyScaleDDP(N=k) and gradient accumulation over k micro-batches, alternating."""
    import easyscale_ext as es

    model, batch = make(model_name, 32 if model_name == "convbn" else 16)
    plain = make(model_name, 1)[0]
    plain.load_state_dict(model.state_dict())
    ddp = es.EasyScaleDDP(model, virtual_world_size=k, determinism_level=level, num_threads=1)
    torch.set_num_threads(1)
    step_batches = [(v, batch) for v in range(k)]

    def es_step():
        for b in ddp.workers(step_batches):
            loss_of(ddp, b).backward()

    def accumulation_step():
        for p in plain.parameters():
            p.grad = None
        for _ in range(k):
            loss_of(plain, batch).backward()

    times = {"easyscale": [], "accumulation": []}
    for i in range(steps + 2):
        for name, fn in (("easyscale", es_step), ("accumulation", accumulation_step)):
            t = time.perf_counter()
            fn()
            if i >= 2:  # two warm-up steps
                times[name].append(time.perf_counter() - t)
    return {name: statistics.median(v) for name, v in times.items()}


def child_memory(model_name, k, steps, mode):
    """Peak RSS of one contender alone."""
    import easyscale_ext as es

    torch.set_num_threads(1)
    model, batch = make(model_name, 32 if model_name == "convbn" else 16)
    if mode == "easyscale":
        ddp = es.EasyScaleDDP(model, virtual_world_size=k, num_threads=1)
        for _ in range(steps):
            for b in ddp.workers([(v, batch) for v in range(k)]):
                loss_of(ddp, b).backward()
    else:
        for _ in range(steps):
            for p in model.parameters():
                p.grad = None
            for _ in range(k):
                loss_of(model, batch).backward()
    return {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def child_pair(kind, rank, init, steps, model_name, procs=2):
    """One rank of a `procs`-process job: EasyScaleDDP N = procs (`easyscale`; `easyscale-one-bucket`: the
    whole exchange after backward) or torch DDP (`ddp`)."""
    import torch.distributed as dist

    import easyscale_ext as es

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=procs)
    model, batch = make(model_name, 32 if model_name == "convbn" else 16)
    if kind == "ddp":
        ddp = nn.parallel.DistributedDataParallel(model)
    else:
        ddp = es.EasyScaleDDP(model, virtual_world_size=procs,
                              bucket_cap_mb=1e6 if kind.endswith("one-bucket") else None)
    times = []
    for i in range(steps + 2):
        dist.barrier()
        t = time.perf_counter()
        loss_of(ddp, batch).backward()
        if i >= 2:
            times.append(time.perf_counter() - t)
    dist.destroy_process_group()
    return {"step": statistics.median(times)}


def spawn(args, env=None):
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(args)], capture_output=True, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})))
    if out.returncode:
        raise RuntimeError(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def spawn_pair(kind, steps, model_name, procs=2):
    with tempfile.TemporaryDirectory() as tmp:
        init = "file://" + os.path.join(tmp, "rdzv")
        children = [subprocess.Popen([sys.executable, __file__, "--child",
                                      json.dumps(["pair", kind, r, init, steps, model_name, procs])],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=dict(os.environ, OMP_NUM_THREADS="1")) for r in range(procs)]
        results = []
        for p in children:
            out, err = p.communicate()
            if p.returncode:
                raise RuntimeError(err)
            results.append(json.loads(out.strip().splitlines()[-1]))
        return max(r["step"] for r in results)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--child")
    ap.add_argument("--overlap", action="store_true", help="only the overlap of the exchange with backward")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--procs", type=int, default=2, help="--overlap: processes (N = procs; 3: the general exchange)")
    args = ap.parse_args()
    if args.child:
        spec = json.loads(args.child)
        fn = {"overhead": child_overhead, "memory": child_memory, "pair": child_pair}[spec[0]]
        print(json.dumps(fn(*spec[1:])), flush=True)
        if spec[:2] == ["pair", "ddp"]:
            # Torch DDP keeps its gloo group alive into interpreter shutdown, where it can abort
            # the process (pytorch/pytorch#190489): leave without a shutdown.
            os._exit(0)
        return
    if args.overlap:
        return overlap(args.repeats, args.procs)
    from easyscale_ext import determinism

    steps = 5 if args.quick else 15
    ks = (2, 4) if args.quick else (2, 4, 8)
    results = {"overhead": [], "pair": [], "levels": []}
    print(f"torch {torch.__version__}, 1 intra-op thread, median of {steps} steps after 2 warm-ups\n")
    print("| model | k | EasyScaleDDP step ms | accumulation ms | ratio | peak RSS MB (ES / accum) |")
    print("|---|---|---|---|---|---|")
    for model_name in ("convbn", "transformer"):
        for k in ks:
            t = spawn(["overhead", model_name, k, steps, "D0"])
            m_es = spawn(["memory", model_name, k, 3, "easyscale"])["peak_rss_mb"]
            m_acc = spawn(["memory", model_name, k, 3, "accumulation"])["peak_rss_mb"]
            ratio = t["easyscale"] / t["accumulation"]
            results["overhead"].append(dict(model=model_name, k=k, **t, ratio=ratio, rss_es=m_es, rss_acc=m_acc))
            print(f"| {model_name} | {k} | {t['easyscale'] * 1e3:.1f} | {t['accumulation'] * 1e3:.1f} | "
                  f"{ratio:.3f}x | {m_es:.0f} / {m_acc:.0f} |")
    print("\n| model | EasyScaleDDP N=2 on 2 processes ms | torch DDP on 2 processes ms | ratio |")
    print("|---|---|---|---|")
    for model_name in ("convbn", "transformer"):
        es_t, ddp_t = spawn_pair("easyscale", steps, model_name), spawn_pair("ddp", steps, model_name)
        results["pair"].append(dict(model=model_name, easyscale=es_t, ddp=ddp_t))
        print(f"| {model_name} | {es_t * 1e3:.1f} | {ddp_t * 1e3:.1f} | {es_t / ddp_t:.3f}x |")
    print("\n| model | level | EasyScaleDDP N=4 step ms | vs D0 |")
    print("|---|---|---|---|")
    for model_name in ("convbn", "transformer"):
        base = None
        for level in ("D0", "D1", "D2"):
            env = determinism.environment(level)
            t = spawn(["overhead", model_name, 4, steps, level], env)["easyscale"]
            base = base or t
            results["levels"].append(dict(model=model_name, level=level, step=t))
            print(f"| {model_name} | {level} | {t * 1e3:.1f} | {t / base:.3f}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


def overlap(repeats: int, procs: int) -> None:
    runs = {k: [] for k in ("easyscale", "easyscale-one-bucket", "ddp", "compute")}
    for _ in range(repeats):
        for kind in runs:
            runs[kind].append(spawn(["overhead", "mlp", 1, 10, "D0"])["accumulation"] if kind == "compute"
                              else spawn_pair(kind, 10, "mlp", procs))
    t = {k: statistics.median(v) for k, v in runs.items()}
    print(f"21 M-parameter MLP, batch 16, N = {procs} on {procs} processes (gloo), medians of {repeats} runs of "
          "10 steps")
    print("| EasyScaleDDP, 25 MB buckets | one bucket | torch DDP | compute alone | vs DDP | hidden |")
    print("|---|---|---|---|---|---|")
    hidden = (t["easyscale-one-bucket"] - t["easyscale"]) / (t["easyscale-one-bucket"] - t["compute"])
    print(f"| {t['easyscale'] * 1e3:.1f} ms | {t['easyscale-one-bucket'] * 1e3:.1f} ms | {t['ddp'] * 1e3:.1f} ms | "
          f"{t['compute'] * 1e3:.1f} ms | {t['easyscale'] / t['ddp']:.2f}x | {hidden:.2f} |")


if __name__ == "__main__":
    main()
