"""EasyScaleDDP's step overhead against gradient accumulation and torch DDP.

1. k virtual workers on one process vs a plain gradient-accumulation loop over
   the same k micro-batches on the same model (the lower bound for that work on
   one device): step time ratio and peak RSS, for a conv net with BatchNorm and
   a small transformer, k in {2, 4, 8} (--ks).
2. N = 2 on P = 2 processes vs torch DDP on 2 processes (gloo).
3. Cost of D1 and D2 against D0 (N = 4 on one process).
Each configuration runs in its own process (clean peak RSS); the contenders of
a configuration alternate step by step, and the median step time is reported.
`--wide`: models whose exchange is a large part of the step, a 21 M-parameter
MLP (5 x Linear(2048, 2048), batch 16 a micro-batch) and a 48 M-parameter
transformer (5 layers of width 768, 2 x 32 tokens a micro-batch), N = kP on P
processes (gloo, 1 intra-op thread each; `--per-process` k, default 1, torch
DDP then accumulating k micro-batches under no_sync(); `--node-size` for
EasyScaleDDP's two levels, several sizes one contender each), EasyScaleDDP
against torch DDP, alternating runs of --steps steps over --repeats rounds;
medians. `--hosts H`: the P processes on H hosts emulated in network
namespaces (tests/support/hosts.py; needs root), P / H each, in rank order,
their gloo traffic over each host's own link (within a host, its loopback),
every link held to `--link-mbit` megabits a second each way (0: unshaped):
what two levels save is the bytes that cross those links. With each
step's breakdown as both report it (`_get_ddp_logging_data()`, every step
sampled): forward, backward compute, the exchange (first collective started
to last finished), its overlap with backward, and the tail after both (DDP
copying the buckets into the gradients); for EasyScaleDDP also its
reducer's parts: folding gradients into the partial-sum slots during
backward, finishing the tree's top, waiting for collectives, writing
param.grad.

    .venv/bin/python bench/bench_ddp.py [--quick] [--ks 2,4,8,64] [--json PATH]
    .venv/bin/python bench/bench_ddp.py --wide [--procs 2,3,4,8] [--per-process 1,4] [--models mlp,transformer]
                                        [--repeats 3] [--node-size G]
    .venv/bin/python bench/bench_ddp.py --wide --models mlp --procs 8 --node-size 0,2 --hosts 4 --link-mbit 1000
"""
import argparse
import contextlib
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from ranks import run_ranks

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
        self.blocks = nn.Sequential(*[nn.TransformerEncoderLayer(dim, dim // 32, 4 * dim, dropout=0.1,
                                                                 batch_first=True)
                                      for _ in range(layers)])
        self.head = nn.Linear(dim, vocab)

    def forward(self, x):
        return self.head(self.blocks(self.embed(x)))


def make(model_name, batch):
    torch.manual_seed(0)
    if model_name == "mlp":  # 5 x (2048 x 2048 + 2048) = 21 M parameters, little compute per sample
        layers = [m for _ in range(5) for m in (nn.Linear(2048, 2048), nn.ReLU())]
        return nn.Sequential(*layers[:-1]), (torch.randn(batch, 2048), torch.randn(batch, 2048))
    if model_name == "wide-transformer":  # 5 layers of width 768 and an 8192-token vocabulary: 48 M parameters
        x = torch.randint(0, 8192, (batch, 32))
        return SmallTransformer(vocab=8192, dim=768, layers=5), (x, x.roll(-1, 1))
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


def spawn(args, env=None):
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(args)], capture_output=True, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})))
    if out.returncode:
        raise RuntimeError(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def spawn_pair(kind, steps, model_name, procs=2, k=1, node_size=0, hosts=None):
    """Every rank's result (child_pair's); on `hosts` (emulated), procs / len(hosts) a host in rank order."""
    spec = lambda r, init: ["pair", kind, r, init, steps, model_name, procs, k, node_size]  # noqa: E731
    if hosts is None:
        return run_ranks(__file__, procs, spec)
    names = list(hosts.namespace)
    return run_ranks(__file__, procs, spec, lambda r, argv: hosts.argv(names[r * len(names) // procs], argv),
                     {"GLOO_SOCKET_IFNAME": "eth0"})  # each host's own interface (its address; its loopback within)


def emulated_hosts(count: int, mbit: float):
    """`count` hosts in network namespaces, each link held to `mbit` (0: as fast as the machine forwards)."""
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    from support.hosts import Hosts, unavailable

    why = unavailable()
    if why:
        raise SystemExit(f"--hosts: {why}")
    hosts = Hosts([f"h{i}" for i in range(count)])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill still removes the hosts (wide's finally)
    for host in hosts.namespace if mbit else ():
        hosts.shape(host, mbit)
    return hosts


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--child")
    ap.add_argument("--ks", default="", help="local workers k of the first table (default 2,4,8)")
    ap.add_argument("--wide", action="store_true", help="only wide models against torch DDP, with breakdowns")
    ap.add_argument("--procs", default="2,3,4,8", help="--wide: process counts")
    ap.add_argument("--per-process", default="1", help="--wide: virtual workers a process, k (N = kP; torch DDP "
                    "accumulates k micro-batches)")
    ap.add_argument("--node-size", default="0", help="--wide: EasyScaleDDP's node_size (0: one level); several, "
                    "comma-separated, are one contender each")
    ap.add_argument("--hosts", type=int, default=0, help="--wide: emulated hosts the processes are spread over")
    ap.add_argument("--link-mbit", type=float, default=0, help="--hosts: each host's link, megabits a second")
    ap.add_argument("--models", default=",".join(WIDE_MODELS), help="--wide: of " + ", ".join(WIDE_MODELS))
    ap.add_argument("--repeats", type=int, default=3, help="--wide: rounds (each runs both contenders)")
    ap.add_argument("--steps", type=int, default=8, help="--wide: timed steps a run, after 2 warm-ups")
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
    if args.wide:
        procs = [int(p) for p in args.procs.split(",")]
        if args.hosts and any(p % args.hosts for p in procs):
            raise SystemExit(f"--hosts {args.hosts}: every --procs must be a multiple of it, got {args.procs}")
        hosts = emulated_hosts(args.hosts, args.link_mbit) if args.hosts else None
        try:
            return wide(args.models.split(","), procs, [int(k) for k in args.per_process.split(",")],
                        [int(g) for g in args.node_size.split(",")], args.repeats, args.steps, args.json, hosts,
                        args.link_mbit)
        finally:
            if hosts is not None:
                hosts.close()
    from easyscale_ext import determinism

    steps = 5 if args.quick else 15
    ks = [int(k) for k in args.ks.split(",")] if args.ks else (2, 4) if args.quick else (2, 4, 8)
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
        es_t, ddp_t = (max(r["step"] for r in spawn_pair(kind, steps, model_name)) for kind in ("easyscale", "ddp"))
        results["pair"].append(dict(model=model_name, easyscale=es_t, ddp=ddp_t))
        print(f"| {model_name} | {es_t:.1f} | {ddp_t:.1f} | {es_t / ddp_t:.3f}x |")  # child_pair's ms
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


def wide(models, procs, ks, node_sizes, repeats, steps, json_path, hosts=None, link_mbit=0) -> None:
    """Each model at each P and k: EasyScaleDDP (N = kP) at each of `node_sizes` and torch DDP (k micro-batches a
    step, no_sync() but on the last) in runs taking turns, `repeats` rounds; a run's figure is its slowest rank's
    median step, and that rank's breakdown as each reports it (torch DDP's covers its synced micro-batch only)."""
    results = []
    links = f"links of {link_mbit:g} Mb/s" if link_mbit else "unshaped links"
    where = f"{len(hosts.namespace)} emulated hosts, {links}" if hosts else "one machine"
    print(f"torch {torch.__version__}, gloo, 1 intra-op thread a process, {where}, N = kP (torch DDP: k micro-batches "
          f"a step, accumulated under no_sync()); medians over {repeats} rounds of runs of {steps} steps (after 2 "
          "warm-ups); a run's figure is its slowest rank's, in ms; the ratio is the median of each round's, with the "
          "lowest and highest\n")
    print("| model | P | k | node size | EasyScaleDDP | torch DDP | ratio [min, max] | "
          + " | ".join(f"{k} (ES / DDP)" for k in BREAKDOWN) + " | reducer: " + ", ".join(REDUCER_PARTS) + " |")
    print("|---|---:|---:|---:|---:|---:|---:|" + "---:|" * (len(BREAKDOWN) + 1))
    contenders = ["ddp", *node_sizes]  # torch DDP, then EasyScaleDDP at each node size
    for model_name in models:
        for p in procs:
            for k in ks:
                runs = {c: [] for c in contenders}
                for r in range(repeats):
                    for c in contenders[r % len(contenders):] + contenders[:r % len(contenders)]:  # turns rotate
                        ranks = spawn_pair("ddp" if c == "ddp" else "easyscale", steps, model_name, p, k,
                                           0 if c == "ddp" else c, hosts)
                        runs[c].append(max(ranks, key=lambda x: x["step"]))
                med = {c: {key: statistics.median(run[key] for run in rs) for key in rs[0]} for c, rs in runs.items()}
                ddp_ = med["ddp"]
                for g in node_sizes:
                    es_ = med[g]
                    # a round's runs are neighbours in time: their ratio is freer of the machine's drift
                    ratios = sorted(e["step"] / d["step"] for e, d in zip(runs[g], runs["ddp"]))
                    results.append(dict(model=model_name, procs=p, k=k, node_size=g,
                                        hosts=len(hosts.namespace) if hosts else 0, link_mbit=link_mbit,
                                        runs={"easyscale": runs[g], "ddp": runs["ddp"]},
                                        medians={"easyscale": es_, "ddp": ddp_}, ratios=ratios))
                    print(f"| {model_name} | {p} | {k} | {g or '-'} | {es_['step']:.1f} | {ddp_['step']:.1f} | "
                          f"{statistics.median(ratios):.3f}x [{ratios[0]:.2f}, {ratios[-1]:.2f}] | "
                          + " | ".join(f"{es_[key]:.1f} / {ddp_[key]:.1f}" for key in BREAKDOWN) + " | "
                          + ", ".join(f"{es_[key]:.1f}" for key in REDUCER_PARTS) + " |", flush=True)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=1)


WIDE_MODELS = {"mlp": 16, "wide-transformer": 2}  # model: batch a process
PAIR_BATCH = {"convbn": 32, "transformer": 16, **WIDE_MODELS}
BREAKDOWN = ("cpu", "forward", "backward", "exchange", "overlap", "tail")
REDUCER_PARTS = ("fold", "send", "wait", "top", "gather", "grads")


def _time_reducer(parts) -> None:
    """Accumulate into `parts` (seconds) where CanonicalReducer's step goes: `fold` (gradients into the
    partial-sum slots, during backward), `send` (a bucket's exchange started), `wait` (for sends, receives and
    collectives), `top` (the tree's top over received chunks), `grads` (param.grad written), and `gather` (the
    rest of finish(): the gathers started)."""
    from easyscale_ext.runtime import reducer

    cls = reducer.CanonicalReducer
    fold, fold_plan, start, complete, finish, write = (reducer.fold_, reducer.fold_plan_, cls._start_exchange,
                                                       cls._complete, cls.finish, cls._write_grads)

    def clocked(part, fn, *args):
        t = time.perf_counter()
        try:
            return fn(*args)
        finally:
            parts[part] += time.perf_counter() - t

    class Work:  # a handle whose wait is clocked
        def __init__(self, work):
            self.work = work

        def wait(self):
            clocked("wait", self.work.wait)

    def start_exchange(self, i):
        clocked("send", start, self, i)
        if self._exchanges[-1] is not None:
            self._exchanges[-1] = Work(self._exchanges[-1])

    def complete_(self, *args):
        gather = complete(self, *args)
        return None if gather is None else Work(gather)

    def finish_(self, *args):
        others = ("send", "wait", "top", "grads")
        t, before = time.perf_counter(), sum(parts[k] for k in others)
        try:
            return finish(self, *args)
        finally:
            parts["gather"] += time.perf_counter() - t - (sum(parts[k] for k in others) - before)

    reducer.fold_ = lambda *args: clocked("fold", fold, *args)
    reducer.fold_plan_ = lambda *args: clocked("top", fold_plan, *args)
    cls._start_exchange, cls._complete, cls.finish = start_exchange, complete_, finish_
    cls._write_grads = lambda self, *args: clocked("grads", write, self, *args)


def child_pair(kind, rank, init, steps, model_name, procs, k=1, node_size=0):
    """One rank of a `procs`-process job, EasyScaleDDP N = k procs (`easyscale`) or torch DDP accumulating k
    micro-batches a step (`ddp`): the median step, and its breakdown from the logging data both keep (and
    EasyScaleDDP's reducer parts), in ms."""
    import torch.distributed as dist

    import easyscale_ext as es

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=procs)
    model, batch = make(model_name, PAIR_BATCH[model_name])
    ddp = nn.parallel.DistributedDataParallel(model) if kind == "ddp" else \
        es.EasyScaleDDP(model, virtual_world_size=k * procs, node_size=node_size)
    ddp._set_ddp_runtime_logging_sample_rate(1)
    parts = dict.fromkeys(REDUCER_PARTS, 0.0)
    if kind == "easyscale":
        _time_reducer(parts)
    rows, ends, reducer_parts = [], [], []
    for i in range(steps + 3):
        dist.barrier()
        for part in parts:
            parts[part] = 0.0
        t, cpu = time.time_ns(), time.process_time()  # the clock both loggers' timestamps are on; every thread's CPU
        if kind == "easyscale" and k > 1:
            for b in ddp.workers([(v, batch) for v in ddp.local_ranks]):
                loss_of(ddp, b).backward()
        else:  # torch DDP's accumulation; with k = 1 EasyScaleDDP in DDP's own loop
            for j in range(k):
                with ddp.no_sync() if j < k - 1 else contextlib.nullcontext():
                    loss_of(ddp, batch).backward()
        ends.append(time.time_ns())
        rows.append({"step": (ends[-1] - t) / 1e6, "cpu": (time.process_time() - cpu) * 1e3})
        reducer_parts.append({k: v * 1e3 for k, v in parts.items()})
        if i >= 1:  # the logging data tell of the step before, as DDP publishes a step's at the next forward
            d = ddp._get_ddp_logging_data()
            rows[-2].update(forward=d["forward_compute_time"] / 1e6, backward=d["backward_compute_time"] / 1e6,
                            exchange=d["backward_comm_time"] / 1e6,
                            overlap=d["backward_compute_comm_overlap_time"] / 1e6,
                            tail=(ends[-2] - max(d["backward_compute_time_end"], d["backward_comm_time_end"])) / 1e6,
                            **reducer_parts[-2])
    rows = rows[2:-1]  # two warm-ups; the last step's data are not published
    dist.destroy_process_group()
    return {key: statistics.median(r[key] for r in rows) for key in rows[0]}


if __name__ == "__main__":
    main()
