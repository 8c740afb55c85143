"""Benchmarks of the easyscale_ext core from Python.

1. Context switch: save + restore of one virtual worker's context through
   es.ContextStore, against
     (a) a Python loop of per-tensor clone() (save) and copy_() (restore),
     (a') the same loop copying into preallocated buffers (no allocation),
     (b) torch.save / torch.load through a tmpfs file (/dev/shm),
     (c) the memcpy limit: one big tensor copy_ of the same total bytes.
   Contexts: ResNet-50 parameters (the real 161 shapes, 25.6M floats),
   BERT-base parameters (the real 199 shapes, 110M floats) and ResNet-50's
   BatchNorm buffers (53 x running_mean, running_var, num_batches_tracked).
2. Reductions: es.canonical_sum vs torch.stack(xs).sum(0) and an add_ loop;
   es.fold_ over the 161 ResNet-50 tensors vs a per-tensor add_(alpha=) loop.

Every case is timed as the median of --repeats runs after --warmup runs that
are discarded (the first save allocates the store's slabs, the first clone /
torch.save / memcpy touch their pages: every contender gets the same warm-up).
The contenders of one case are interleaved (each repeat times each of them
once, in turn), so load from other processes hits them alike. Small cases run
an inner loop so that one timed run lasts >= --min-run-ms.
CUDA cases (locations 'pinned' and 'device') run when torch.cuda is available.

    .venv/bin/python bench/bench_core.py [--quick] [--json results.json]
"""
import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import torch

import easyscale_ext as es

# ---------------------------------------------------------------- shapes


def resnet50_shapes():
    """(params, bn_buffers) of torchvision's resnet50, in registration order."""
    params, bn = [], []

    def conv(cout, cin, k):
        params.append(("w", (cout, cin, k, k)))

    def bnorm(c):
        params.append(("w", (c,)))
        params.append(("w", (c,)))
        bn.extend([("f", (c,)), ("f", (c,)), ("i", ())])

    conv(64, 3, 7)
    bnorm(64)
    cin = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            conv(width, cin, 1)
            bnorm(width)
            conv(width, width, 3)
            bnorm(width)
            conv(width * 4, width, 1)
            bnorm(width * 4)
            if b == 0:
                conv(width * 4, cin, 1)
                bnorm(width * 4)
            cin = width * 4
    params.append(("w", (1000, 2048)))
    params.append(("w", (1000,)))
    return [s for _, s in params], bn


def bert_base_shapes():
    """HF BertModel (bert-base-uncased) parameter shapes: 199 tensors."""
    h, ff, vocab = 768, 3072, 30522
    s = [(vocab, h), (512, h), (2, h), (h,), (h,)]
    for _ in range(12):
        s += [(h, h), (h,)] * 4  # query, key, value, attention output
        s += [(h,), (h,)]  # attention LayerNorm
        s += [(ff, h), (ff,), (h, ff), (h,)]  # intermediate, output
        s += [(h,), (h,)]  # output LayerNorm
    s += [(h, h), (h,)]  # pooler
    return s


def make_tensors(shapes, device, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    out = []
    for shape in shapes:
        t = torch.randn(shape, generator=g, dtype=dtype) if shape else torch.randn((), generator=g, dtype=dtype)
        out.append(t.to(device))
    return out


def make_bn_buffers(spec, device):
    out = []
    for kind, shape in spec:
        if kind == "i":
            out.append(torch.tensor(1000, dtype=torch.int64, device=device))
        else:
            out.append(torch.rand(shape, device=device))
    return out


def nbytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


# ---------------------------------------------------------------- timing


class Timer:
    """Interleaved medians: every repeat times each contender once, in turn,
    so load from other processes on a shared machine hits all of them alike."""

    def __init__(self, repeats, warmup, min_run_ms, cuda):
        self.repeats, self.warmup, self.min_run_s, self.cuda = repeats, warmup, min_run_ms / 1e3, cuda

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def _once(self, steps):
        """Seconds spent in each step of one pass (synchronised around each)."""
        out = []
        for step in steps:
            self.sync()
            t0 = time.perf_counter()
            step()
            self.sync()
            out.append(time.perf_counter() - t0)
        return out

    def compare(self, contenders):
        """contenders: {name: [step, ...]} (e.g. [save, restore]; one pass runs
        the steps in order). Returns {name: [median total s, median s per step...]}."""
        for steps in contenders.values():
            for _ in range(self.warmup):
                self._once(steps)
        inner = {}
        for name, steps in contenders.items():
            one = max(sum(self._once(steps)), 1e-7)
            inner[name] = 1 if one >= self.min_run_s else max(1, min(10000, int(self.min_run_s / one) + 1))
        samples = {name: [] for name in contenders}
        for _ in range(self.repeats):
            for name, steps in contenders.items():
                acc = [0.0] * len(steps)
                for _ in range(inner[name]):
                    acc = [a + b for a, b in zip(acc, self._once(steps))]
                samples[name].append([a / inner[name] for a in acc])
        out = {}
        for name, rows in samples.items():
            out[name] = [statistics.median(sum(r) for r in rows)] + \
                        [statistics.median(r[i] for r in rows) for i in range(len(rows[0]))]
        return out


# ---------------------------------------------------------------- context switch


def bench_context(name, tensors, location, timer, shm_dir, log):
    device = tensors[0].device
    size = nbytes(tensors)
    res = {"case": name, "location": location, "tensors": len(tensors), "bytes": size}
    contenders = {}

    # The store.
    store = es.ContextStore(2 * size + (64 << 20), torch.get_num_threads())
    contenders["store"] = [lambda: store.save(0, "ctx", tensors, location=location),
                           lambda: store.restore(0, "ctx", tensors)]

    # (a) per-tensor clone() / copy_() (for 'pinned': per-tensor .to('cpu') / copy_ back).
    saved = [None]
    if location == "pinned":
        def save_a():
            saved[0] = [t.to("cpu") for t in tensors]
    else:
        def save_a():
            saved[0] = [t.clone() for t in tensors]

    def restore_a():
        for t, s in zip(tensors, saved[0]):
            t.copy_(s)
    contenders["loop"] = [save_a, restore_a]

    # (a') per-tensor copy_ into preallocated buffers: the loop without its
    # allocations, to show how much of (a) is allocation / page faults.
    if location == "pinned":
        pre = [torch.empty_like(t, device="cpu").pin_memory() for t in tensors]
    else:
        pre = [torch.empty_like(t) for t in tensors]

    def save_a2():
        for p, t in zip(pre, tensors):
            p.copy_(t)

    def restore_a2():
        for t, p in zip(tensors, pre):
            t.copy_(p)
    contenders["loop_prealloc"] = [save_a2, restore_a2]

    # (b) torch.save / torch.load through tmpfs. Restore = torch.load only (the
    # caller would swap the loaded tensors in): no copy back, which favours (b).
    path = os.path.join(shm_dir, f"es_bench_{os.getpid()}_{name}.pt")
    loaded = [None]

    def save_b():
        torch.save(tensors, path)

    def restore_b():
        loaded[0] = None
        loaded[0] = torch.load(path, map_location=device, weights_only=True)
    contenders["torch_save"] = [save_b, restore_b]

    # (c) the memcpy limit: one copy_ of `size` bytes (for 'pinned': one D2H
    # plus one H2D, i.e. the same bytes as save + restore).
    n = max(1, size // 4)
    if location == "pinned":
        big_dev = torch.empty(n, dtype=torch.float32, device=device).uniform_()
        big_host = torch.empty(n, dtype=torch.float32).pin_memory()
        contenders["memcpy"] = [lambda: big_host.copy_(big_dev), lambda: big_dev.copy_(big_host)]
    else:
        big_src = torch.empty(n, dtype=torch.float32, device=device).uniform_()
        big_dst = torch.empty_like(big_src)
        contenders["memcpy"] = [lambda: big_dst.copy_(big_src)]

    try:
        res.update(timer.compare(contenders))
    finally:
        if os.path.exists(path):
            os.unlink(path)
    # memcpy: seconds for `size` bytes one way (pinned: mean of D2H and H2D).
    res["memcpy_s"] = res["memcpy"][0] / (2 if location == "pinned" else 1)
    log(f"  {name}/{location}: " + ", ".join(f"{k} {res[k][0] * 1e3:.3f} ms" for k in contenders))
    return res  # the contenders' memory goes with this frame (the caller collects after each case)


def context_rows(res):
    size = res["bytes"]
    st, ss, sr = res["store"]
    lp = res["loop"][0]
    lp2 = res["loop_prealloc"][0]
    tsv = res["torch_save"][0]
    mem_gbs = size / res["memcpy_s"] / 1e9
    store_gbs = 2 * size / st / 1e9
    return {
        "case": res["case"], "location": res["location"], "tensors": res["tensors"], "MB": size / 1e6,
        "store_ms": st * 1e3, "store_save_ms": ss * 1e3, "store_restore_ms": sr * 1e3,
        "store_GBps": store_gbs, "memcpy_GBps": mem_gbs, "frac_memcpy": store_gbs / mem_gbs,
        "loop_ms": lp * 1e3, "loop_prealloc_ms": lp2 * 1e3, "torch_save_ms": tsv * 1e3,
        "x_vs_loop": lp / st, "x_vs_loop_prealloc": lp2 / st, "x_vs_torch_save": tsv / st,
        # per-step medians (ms): [save, restore]
        "loop_steps_ms": [x * 1e3 for x in res["loop"][1:]],
        "loop_prealloc_steps_ms": [x * 1e3 for x in res["loop_prealloc"][1:]],
        "torch_save_steps_ms": [x * 1e3 for x in res["torch_save"][1:]],
    }


# ---------------------------------------------------------------- reductions


def bench_reductions(sizes, ks, device, timer, log):
    rows = []
    g = torch.Generator().manual_seed(1)
    for n in sizes:
        for k in ks:
            xs = [torch.randn(n, generator=g).to(device) for _ in range(k)]

            def add_loop():
                acc = xs[0].clone()
                for x in xs[1:]:
                    acc.add_(x)
                return acc
            t = timer.compare({"es": [lambda: es.canonical_sum(xs)],
                               "stack": [lambda: torch.stack(xs).sum(0)],
                               "add": [add_loop]})
            t_es, t_stack, t_add = t["es"][0], t["stack"][0], t["add"][0]
            read = k * n * 4
            rows.append({
                "device": str(device), "numel": n, "k": k,
                "canonical_sum_ms": t_es * 1e3, "stack_sum_ms": t_stack * 1e3, "add_loop_ms": t_add * 1e3,
                "canonical_sum_GBps": read / t_es / 1e9, "stack_sum_GBps": read / t_stack / 1e9,
                "add_loop_GBps": read / t_add / 1e9,
                "x_vs_stack": t_stack / t_es, "x_vs_add_loop": t_add / t_es,
            })
            log(f"  canonical_sum n={n} k={k} on {device}: {t_es * 1e3:.3f} ms "
                f"(stack {t_stack * 1e3:.3f}, add_ loop {t_add * 1e3:.3f})")
            xs.clear()  # the tensors go before the next k's are made (the closures above still hold the list)
            gc.collect()
    return rows


def bench_fold(shapes, device, timer, log):
    src = make_tensors(shapes, device)
    acc = [torch.zeros_like(t) for t in src]
    scale = 0.25

    def loop():
        for a, s in zip(acc, src):
            a.add_(s, alpha=scale)
    t = timer.compare({"es": [lambda: es.fold_(acc, src, scale, True)], "loop": [loop]})
    t_es, t_loop = t["es"][0], t["loop"][0]
    read = 2 * nbytes(src)  # acc and src are both read (acc is also written)
    log(f"  fold_ on {device}: {t_es * 1e3:.3f} ms (loop {t_loop * 1e3:.3f})")
    return {"device": str(device), "tensors": len(src), "numel": sum(t.numel() for t in src),
            "fold_ms": t_es * 1e3, "loop_ms": t_loop * 1e3,
            "fold_GBps": read / t_es / 1e9, "loop_GBps": read / t_loop / 1e9, "x_vs_loop": t_loop / t_es}


# ---------------------------------------------------------------- output


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def md_table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def f(x, nd=2):
    return f"{x:.{nd}f}"


def render(results):
    parts = []
    ctx = results["context_switch"]
    parts.append("Context switch (save + restore of one worker's context; median ms; "
                 "GB/s counts 2 x context bytes)\n")
    parts.append(md_table(
        ["context", "loc", "tensors", "MB", "store ms (save / restore)", "store GB/s", "memcpy GB/s",
         "of memcpy", "(a) clone loop ms", "x vs (a)", "(a') prealloc loop ms", "x vs (a')",
         "(b) torch.save/load ms", "x vs (b)"],
        [[r["case"], r["location"], str(r["tensors"]), f(r["MB"], 1),
          f"{f(r['store_ms'], 3)} ({f(r['store_save_ms'], 3)} / {f(r['store_restore_ms'], 3)})",
          f(r["store_GBps"]), f(r["memcpy_GBps"]), f"{r['frac_memcpy'] * 100:.0f}%",
          f(r["loop_ms"], 3), f(r["x_vs_loop"], 1) + "x", f(r["loop_prealloc_ms"], 3),
          f(r["x_vs_loop_prealloc"], 1) + "x", f(r["torch_save_ms"], 3), f(r["x_vs_torch_save"], 1) + "x"]
         for r in ctx]))
    red = results["canonical_sum"]
    parts.append("\n\nReductions: canonical_sum of K tensors of N float32 (GB/s counts K x N x 4 bytes read)\n")
    parts.append(md_table(
        ["device", "N", "K", "canonical_sum ms", "GB/s", "stack().sum(0) ms", "GB/s", "add_ loop ms", "GB/s",
         "x vs stack", "x vs add_ loop"],
        [[r["device"], f"{r['numel'] / 2**20:.0f}M", str(r["k"]), f(r["canonical_sum_ms"], 3),
          f(r["canonical_sum_GBps"]), f(r["stack_sum_ms"], 3), f(r["stack_sum_GBps"]), f(r["add_loop_ms"], 3),
          f(r["add_loop_GBps"]), f(r["x_vs_stack"]) + "x", f(r["x_vs_add_loop"]) + "x"] for r in red]))
    fo = results["fold"]
    parts.append("\n\nfold_ (acc += scale * src) over ResNet-50's 161 parameter tensors "
                 "(GB/s counts acc + src bytes read)\n")
    parts.append(md_table(
        ["device", "tensors", "numel", "es.fold_ ms", "GB/s", "add_(alpha) loop ms", "GB/s", "x vs loop"],
        [[r["device"], str(r["tensors"]), f"{r['numel'] / 1e6:.1f}M", f(r["fold_ms"], 3), f(r["fold_GBps"]),
          f(r["loop_ms"], 3), f(r["loop_GBps"]), f(r["x_vs_loop"]) + "x"] for r in fo]))
    return "".join(parts)


def goals(results):
    """The goals (>= 80% of memcpy for contexts >= 50 MB; >= 5x vs (a) for >= 100 tensors; >= 10x vs (b)),
    evaluated on the measured rows."""
    out = []
    for r in results["context_switch"]:
        g = {"case": r["case"], "location": r["location"]}
        if r["MB"] >= 50:
            g["ge_80pct_memcpy"] = r["frac_memcpy"] >= 0.8
        if r["tensors"] >= 100:
            g["ge_5x_vs_clone_loop"] = r["x_vs_loop"] >= 5
        g["ge_10x_vs_torch_save"] = r["x_vs_torch_save"] >= 10
        out.append(g)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="small fast variant: 3 repeats, no BERT-base, 1M-element reductions only")
    p.add_argument("--json", metavar="PATH", help="write the results (and the environment) as JSON")
    p.add_argument("--repeats", type=int, help="timed runs per case (default 7; --quick 3)")
    p.add_argument("--warmup", type=int, help="discarded runs per case (default 2)")
    p.add_argument("--min-run-ms", type=float, default=20.0,
                   help="small cases loop inside one timed run until it lasts this long (default 20)")
    p.add_argument("--no-bert", action="store_true", help="skip the BERT-base context (0.44 GB per copy)")
    p.add_argument("--no-cuda", action="store_true", help="skip the CUDA cases even if a GPU is present")
    p.add_argument("--shm", default="/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir(),
                   help="tmpfs directory for the torch.save baseline (default /dev/shm)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    args = p.parse_args(argv)
    repeats = args.repeats or (3 if args.quick else 7)
    warmup = args.warmup if args.warmup is not None else 2
    use_cuda = torch.cuda.is_available() and not args.no_cuda

    def log(msg):
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    rn_params, rn_bn = resnet50_shapes()
    assert len(rn_params) == 161 and len(rn_bn) == 159
    contexts = [("resnet50-params", lambda d: make_tensors(rn_params, d)),
                ("resnet50-bn-buffers", lambda d: make_bn_buffers(rn_bn, d))]
    if not (args.quick or args.no_bert):
        contexts.insert(1, ("bert-base-params", lambda d: make_tensors(bert_base_shapes(), d)))

    env = {"torch": torch.__version__, "python": platform.python_version(), "cpu": cpu_model(),
           "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
           "cuda": torch.cuda.get_device_name(0) if use_cuda else None,
           "repeats": repeats, "warmup": warmup, "quick": args.quick, "argv": sys.argv[1:],
           "loadavg_start": os.getloadavg()}
    results = {"env": env, "context_switch": [], "canonical_sum": [], "fold": []}
    t_start = time.perf_counter()

    cpu_timer = Timer(repeats, warmup, args.min_run_ms, cuda=False)
    gpu_timer = Timer(repeats, warmup, args.min_run_ms, cuda=True)
    targets = [("cpu", "host", cpu_timer)]
    if use_cuda:
        targets += [("cuda", "pinned", gpu_timer), ("cuda", "device", gpu_timer)]

    log("context switch")
    for name, make in contexts:
        for device, location, timer in targets:
            tensors = make(torch.device(device))
            raw = bench_context(name, tensors, location, timer, args.shm, log)
            results["context_switch"].append(context_rows(raw))
            del tensors
            gc.collect()

    log("reductions")
    sizes = [1 << 20] if args.quick else [1 << 20, 1 << 24]
    for device, timer in [("cpu", cpu_timer)] + ([("cuda", gpu_timer)] if use_cuda else []):
        results["canonical_sum"] += bench_reductions(sizes, [2, 4, 8], torch.device(device), timer, log)
        results["fold"].append(bench_fold(rn_params, torch.device(device), timer, log))

    results["goals"] = goals(results)
    env["elapsed_s"] = time.perf_counter() - t_start
    env["loadavg_end"] = os.getloadavg()

    print(f"torch {env['torch']}, {env['cpus']} CPUs ({env['cpu']}), torch threads {env['torch_threads']}, "
          f"GPU: {env['cuda'] or 'none'}; median of {repeats} interleaved runs after {warmup} warm-up(s); "
          f"1-min load average {env['loadavg_start'][0]:.2f} at start, {env['loadavg_end'][0]:.2f} at end, "
          f"{env['elapsed_s']:.0f} s\n")
    print(render(results))
    print("\nGoals (>= 80% of memcpy for contexts >= 50 MB; >= 5x vs (a) for >= 100 tensors; >= 10x vs (b)):")
    for g in results["goals"]:
        checks = ", ".join(f"{k}={'met' if v else 'NOT met'}" for k, v in g.items() if k not in ("case", "location"))
        print(f"  {g['case']} / {g['location']}: {checks}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)
        log(f"wrote {args.json}")


if __name__ == "__main__":
    main()
