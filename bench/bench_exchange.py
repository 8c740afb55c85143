"""What the canonical exchange sends as P grows, counted on real runs, and a latency-bandwidth model of its time at
up to 1,024 GPUs against ring and tree all-reduce.

Counted: EasyScaleDDP on P gloo processes (N = P and N = 4P; an 8.4-million-parameter MLP, 8 x Linear(1024, 1024),
in two 25 MB buckets; 3 steps after one warm-up), every message each process hands to torch.distributed in a step
(a point-to-point send, or one call of a collective) and its bytes, beside what the closed form below says of the
same configuration. The counts do not depend on the machine; the times on a 2-core machine shared by 32 processes
would say nothing of a cluster's links, so the model is not fitted to them.

The model (per bucket of B bytes, one reduction's time, no overlap with backward; P GPUs, g a node, n = P / g nodes):
a message costs alpha (a_net between nodes, a_nvl inside one) plus its bytes over the link's bandwidth, where a
node's NIC carries what all its g GPUs send off the node (bw_net a node) and NVLink what each GPU sends inside it
(bw_nvl a GPU); a phase in which every GPU sends to several peers at once takes the latency of its messages in turn
and the bytes of its busiest link.

- flat (this runtime's exchange, N = P): each GPU sends its chunk of the bucket for every other GPU (P - 1 messages
  of B / P), then its finished chunk to every other GPU (P - 1 more): per node, g (P - g) B / P bytes leave each
  phase.
- hierarchical (fold inside the node first, the canonical association kept where each node's virtual workers are an
  aligned block): a reduce-scatter inside the node (g - 1 messages of B / g), across nodes among GPUs of the same
  local rank (n - 1 messages of B / (g n)), the same two gathers back: per node (n - 1) B / n leave a phase.
- halving-doubling (recursive halving then doubling over aligned power-of-two blocks of GPUs, the first log2 g
  steps inside the node): 2 log2 P messages, each halving; the canonical tree's top exactly, with a ring's bytes.
- ring all-reduce: 2 (P - 1) steps of B / P through every node in turn.
- tree all-reduce (NCCL's double binary tree across nodes, a chain inside them): 2 log2 n + 2 (g - 1) messages'
  latency, the bucket's bytes twice through each node's NIC, pipelined.

    .venv/bin/python bench/bench_exchange.py                      # the counts at P = 2 .. 32 and the model's table
    .venv/bin/python bench/bench_exchange.py --procs "" --plot docs/exchange-model.png   # the model alone, its figure
    .venv/bin/python bench/bench_exchange.py --procs "" --net-gbps 400
"""
import argparse
import json
import math
import sys

import torch
import torch.nn.functional as F
from torch import nn

from ranks import run_ranks

WIDTH, LAYERS, BATCH, STEPS = 1024, 8, 4, 3
BUCKET_MB = 25.0


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])


def counted_child(rank: int, procs: int, n: int, g: int, levels: int, init: str) -> dict:
    """One rank, one or two levels: the messages it sends a step, their bytes, and the bytes to processes of other
    nodes (of g consecutive ranks, emulated: every process is on this machine)."""
    import torch.distributed as dist

    import easyscale_ext as es

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=procs)
    ddp = es.EasyScaleDDP(mlp(), virtual_world_size=n, bucket_cap_mb=BUCKET_MB, node_size=g if levels == 2 else 0)
    sent = [0, 0, 0]
    batch_p2p, all_reduce = dist.batch_isend_irecv, dist.all_reduce

    def batch_isend_irecv(ops):
        for op in ops:
            if op.op is dist.isend:
                size = op.tensor.numel() * op.tensor.element_size()
                sent[0], sent[1] = sent[0] + 1, sent[1] + size
                sent[2] += size if op.peer // g != rank // g else 0
        return batch_p2p(ops)

    def all_reduce_(tensor, *args, **kwargs):  # counted as one message of its bytes: gloo's algorithm is its own
        size = tensor.numel() * tensor.element_size()
        sent[0], sent[1], sent[2] = sent[0] + 1, sent[1] + size, sent[2] + (size if procs > g else 0)
        return all_reduce(tensor, *args, **kwargs)

    dist.batch_isend_irecv, dist.all_reduce = batch_isend_irecv, all_reduce_
    x = torch.randn(BATCH, WIDTH)
    for step in range(STEPS + 1):
        if step == 1:
            sent[:] = [0, 0, 0]  # the warm-up step's are not counted
        for b in ddp.workers([(v, x) for v in ddp.local_ranks]):
            F.mse_loss(ddp(b), b).backward()
    gradient = sum(b.numel * b.acc_dtype.itemsize for b in ddp.reducer.buckets)
    dist.barrier()
    return {"messages": sent[0] / STEPS, "bytes": sent[1] / STEPS, "off_node": sent[2] / STEPS,
            "levels": 2 if ddp.reducer.node_size else 1, "gradient": gradient}


def closed_form(levels: int, P: int, g: int, gradient: float) -> tuple:
    """(bytes, bytes to other nodes) a GPU sends for one reduction of `gradient` bytes (one local root each)."""
    if levels == 1:
        return 2 * (P - 1) / P * gradient, 2 * max(P - g, 0) / P * gradient
    n = P // g
    return 2 * ((g - 1) / g + (n - 1) / (n * g)) * gradient, 2 * (n - 1) / (n * g) * gradient


def count(procs: int, n: int, g: int, levels: int) -> list:
    """Every rank's counts."""
    return run_ranks(__file__, procs, lambda r, init: [r, procs, n, g, levels, init])


# -- the model -----------------------------------------------------------------------------------------------------
def exchange_seconds(design: str, P: int, g: int, B: float, a_net: float, a_nvl: float, bw_net: float,
                     bw_nvl: float) -> float:
    """One bucket of B bytes reduced over P GPUs, g a node (see the module's text)."""
    g = min(g, P)
    n = P // g
    if design == "flat":
        # each phase: P - 1 messages in turn (g - 1 of them inside the node); the node's NIC carries g (P - g) B / P
        latency = (P - g) * a_net + (g - 1) * a_nvl
        return 2 * (latency + max(g * (P - g) * B / P / bw_net, (g - 1) * B / P / bw_nvl))
    if design == "hierarchical":
        inside = (g - 1) * (a_nvl + B / g / bw_nvl)
        across = (n - 1) * a_net + (n - 1) * B / n / bw_net
        return 2 * (inside + across)
    if design == "halving-doubling":
        inside = sum(a_nvl + B / 2 ** (k + 1) / bw_nvl for k in range(int(math.log2(g))))
        # a step across nodes: each GPU sends what is left (B / g / 2^k), all g of a node at once through its NIC
        across = sum(a_net + g * B / g / 2 ** (k + 1) / bw_net for k in range(int(math.log2(n))))
        return 2 * (inside + across)
    if design == "ring":
        crossing = n > 1  # every step moves B / P across each node boundary the ring passes
        return 2 * (P - 1) * ((a_net if crossing else a_nvl) + B / P / (bw_net if crossing else bw_nvl))
    if design == "tree":
        latency = 2 * math.ceil(math.log2(n)) * a_net + 2 * (g - 1) * a_nvl if n > 1 else 2 * (g - 1) * a_nvl
        return latency + 2 * B / (bw_net if n > 1 else bw_nvl)
    raise ValueError(design)


DESIGNS = ("flat", "hierarchical", "halving-doubling", "ring", "tree")
NAMES = {"flat": "one level", "hierarchical": "two levels", "halving-doubling": "halving-doubling", "ring": "ring",
         "tree": "tree"}


def model_table(params: float, args) -> list:
    gradient = 4 * params
    buckets = math.ceil(gradient / (BUCKET_MB * 2 ** 20))
    B = gradient / buckets
    rows = []
    for P in (8, 16, 32, 64, 128, 256, 512, 1024):
        rows.append((P, {d: buckets * exchange_seconds(d, P, args.gpus_per_node, B, args.a_net * 1e-6,
                                                       args.a_nvl * 1e-6, args.net_gbps * 1e9 / 8,
                                                       args.nvl_gbps * 1e9) for d in DESIGNS}))
    return rows


def plot(model: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(model), figsize=(5 * len(model), 4), sharex=True)
    for ax, (label, rows) in zip(axes, model.items()):
        for d in DESIGNS:
            ax.plot([r["procs"] for r in rows], [r[d] * 1e3 for r in rows], marker="o", label=NAMES[d])
        ax.set(xscale="log", yscale="log", xlabel="GPUs (8 a node)", ylabel="exchange ms a step", title=label)
        ax.set_xticks([r["procs"] for r in rows], [str(r["procs"]) for r in rows])
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(counted_child(*json.loads(sys.argv[2]))), flush=True)
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", default="2,4,8,16,32", help="process counts to count at (N = P and 4P)")
    ap.add_argument("--node-size", type=int, default=4, help="processes a node where the counts are taken")
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--net-gbps", type=float, default=100.0, help="a node's network bandwidth, Gb/s")
    ap.add_argument("--nvl-gbps", type=float, default=300.0, help="a GPU's NVLink bandwidth one way, GB/s")
    ap.add_argument("--a-net", type=float, default=10.0, help="a message's latency between nodes, us")
    ap.add_argument("--a-nvl", type=float, default=3.0, help="a message's latency inside a node, us")
    ap.add_argument("--json")
    ap.add_argument("--plot", help="PNG of the model's time against GPUs")
    args = ap.parse_args()
    results = {"counts": [], "model": {}}
    if args.procs:
        print(f"{LAYERS} x Linear({WIDTH}, {WIDTH}), {BUCKET_MB:g} MB buckets, nodes of {args.node_size} processes: "
              "what the busiest process sends a step, counted, and the closed form's bytes\n")
        print("| P | N | levels | messages | MB | closed form | MB to other nodes | closed form |\n"
              "|---:|---:|---:|---:|---:|---:|---:|---:|")
        for procs in map(int, args.procs.split(",")):
            for n in (procs, 4 * procs):
                for levels in ((1, 2) if procs > args.node_size else (1,)):
                    ranks = count(procs, n, args.node_size, levels)
                    busiest = max(ranks, key=lambda r: r["bytes"])
                    total, off = closed_form(busiest["levels"], procs, args.node_size, busiest["gradient"])
                    results["counts"].append({"procs": procs, "n": n, "levels": levels, "ranks": ranks,
                                              "closed_form": [total, off]})
                    print(f"| {procs} | {n} | {busiest['levels']} | {busiest['messages']:.0f} | "
                          f"{busiest['bytes'] / 1e6:.2f} | {total / 1e6:.2f} | {busiest['off_node'] / 1e6:.2f} | "
                          f"{off / 1e6:.2f} |", flush=True)
    print(f"\nmodel: {args.gpus_per_node} GPUs a node, {args.net_gbps:g} Gb/s a node between nodes ({args.a_net:g} us a "
          f"message), NVLink {args.nvl_gbps:g} GB/s a GPU ({args.a_nvl:g} us); one step's gradient reduction, "
          f"{BUCKET_MB:g} MB buckets, no overlap with backward, ms")
    for params, label in ((1e8, "100 M parameters"), (1e9, "1 B parameters")):
        rows = model_table(params, args)
        results["model"][label] = [{"procs": P, **t} for P, t in rows]
        print(f"\n{label}\n\n| GPUs | " + " | ".join(NAMES[d] for d in DESIGNS) + " | one level / tree | two levels / "
              "tree |\n|---:|" + "---:|" * (len(DESIGNS) + 2))
        for P, t in rows:
            print(f"| {P:,} | " + " | ".join(f"{t[d] * 1e3:,.1f}" for d in DESIGNS) +
                  f" | {t['flat'] / t['tree']:.1f}x | {t['hierarchical'] / t['tree']:.1f}x |")
    if args.plot:
        plot(results["model"], args.plot)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
