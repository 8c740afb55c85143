"""The GPU figures in one run on a GPU machine (an H100 or an H200), one part per call, most wanted first.

hashes   D2 training on this GPU of the demo's model (scikit-learn's digits), the tests' conv net, torchvision's
         ResNet-18 and a small transformer: the pure-torch reference and EasyScaleDDP with N = 4 on 1, 2 and 4
         processes sharing the GPU (gloo: NCCL refuses two ranks on one GPU). The SHA-256 covers parameters,
         buffers and optimizer state (tests/support/train_job.py).
ddp      what EasyScaleDDP costs against torch: N = 1 against torch DDP with world size 1, and N = 4 on one process
         against 4-micro-batch gradient accumulation on the bare model (one NCCL group of one process for all),
         each in float32, bfloat16 autocast and float16 autocast with GradScaler; torchvision's ResNet-50 at 32
         images of 224 x 224 per (virtual) worker and a small transformer. Median step time over --rounds rounds
         (the variants alternate) and peak memory (torch.cuda.max_memory_allocated).
amp      the hashes part's placements under bfloat16 autocast, and float16 autocast with GradScaler.
profile  one D0 and one D1 step of the transformer (N = 4, one process) under torch.profiler: the kernels with the
         most device time, to name what leaves its fused path under D1's deterministic settings.
levels   step time of D1 and D2 against D0: EasyScaleDDP with N = 4 on one process, ResNet-50 as above, a conv
         net with BatchNorm and the transformer. A level's settings are process-wide, so each level runs in a
         process of its own; the levels alternate over --rounds rounds.
unfilled D1 with and without torch's fill of uninitialized memory (EASYSCALE_FILL_UNINITIALIZED=0): the levels
         part's step times and the profile part's D1 profile without the fill, and the D2 hashes of the amp part's
         models both ways (equal where no kernel reads memory it did not write).
cudnn    D2 without cuDNN (EASYSCALE_CUDNN=0: convolutions and batch norm in ATen's own CUDA kernels): the hashes
         part's convolutional models on its placements, with the reference's per-tensor hashes, and the step time
         of the levels part's convolutional models at D2 with and without cuDNN.
host     where a bfloat16 step's host time goes: one step of EasyScaleDDP N = 4 and of 4-micro-batch accumulation,
         ResNet-50 and the transformer, under torch.profiler: the host operations with the most self time.
--compare OTHER.json: this GPU's hashes against another GPU's, model by model, for each set of hashes both hold.
--device cpu runs the same code on the CPU, a smoke run whose times mean nothing.

    PYTHONPATH=. python3 bench/bench_gpu.py --parts hashes --json OUT.json [--compare OTHER.json] [--rounds 3]
"""
import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

HASH_MODELS = ("digits", "cnn", "resnet18", "transformer")
AMP_MODELS = ("cnn", "resnet18", "transformer")
CONV_MODELS = ("cnn", "resnet18")
PLACEMENTS = {"reference": 1, "P=1": 1, "P=2": 2, "P=4": 4}  # processes sharing the GPU, N = 4
LEVEL_MODELS = ("resnet50", "convbn", "transformer")
LEVELS = ("D0", "D1", "D2")
TORCH_MODELS = ("resnet50", "transformer")
PRECISIONS = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}
VARIANTS = ("torch DDP", "EasyScaleDDP N=1", "accumulation x4", "EasyScaleDDP N=4")
WARMUP = 3  # untimed steps before each measurement (--warmup)


def hashes(models, device, env=None, **extra):
    """{model: {placement: SHA-256 or 'failed: ...'}} after D2 training, and {model: [[tensor, SHA-256], ...]} of
    the reference's final state, so that two GPUs' differing hashes name the first tensor that differs."""
    import tempfile

    from easyscale_ext import determinism
    from support.jobs import run_job

    env = dict(determinism.environment("D2"), **(env or {}))
    options = dict(n=4, device=device, level="D2", steps=5, batch=8, backend="gloo", **extra)
    tensors = {}

    def one(model, placement):
        procs = PLACEMENTS[placement]
        try:
            if placement != "reference":
                return run_job("easyscale", procs=procs, env_per_rank=[env] * procs, model=model, **options)
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "tensors.json")
                found = run_job("reference", env_per_rank=[env], model=model, tensor_hashes=path, **options)
                with open(path) as f:
                    tensors[model] = json.load(f)
                return found
        except Exception as error:  # a placement that fails is a finding: record it, go on with the others
            return f"failed: {str(error)[-600:]}"

    jobs = [(m, p) for m in models for p in PLACEMENTS]
    with ThreadPoolExecutor(max(4, (os.cpu_count() or 1) // 2)) as pool:
        found = list(pool.map(lambda job: one(*job), jobs))
    out = {m: {} for m in models}
    for (m, p), h in zip(jobs, found):
        out[m][p] = h
    return out, tensors


def first_difference(ours, theirs):
    """The first tensor, in the state hash's order, whose SHA-256 differs between two runs' tensor lists."""
    for (name, mine), (other_name, other) in zip(ours, theirs):
        if name != other_name or mine != other:
            return name
    return None


def compare(result, path):
    """Print, for each set of hashes this run and another GPU's both hold, which placements give equal hashes, and
    the first tensor that differs where the reference's per-tensor hashes are in both."""
    with open(path) as f:
        other = json.load(f)
    for key in sorted(k for k in result if k.startswith("hashes") and k in other):
        tensors = key.replace("hashes", "tensors")
        print(f"{key}, {result['device']} against {other['device']}:")
        for model, found in result[key].items():
            theirs = other[key].get(model, {})
            same = [p for p in found if theirs.get(p) == found[p]]
            print(f"  {model:12s} equal in {len(same)} of {len(found)} placements ({', '.join(same) or 'none'})")
            if len(same) < len(found) and model in result.get(tensors, {}) and model in other.get(tensors, {}):
                first = first_difference(result[tensors][model], other[tensors][model])
                print(f"  {'':12s} the first tensor that differs: {first}")


def print_hashes(title, found):
    print(title)
    for model, by_placement in found.items():
        agree = len(set(by_placement.values())) == 1
        print(f"  {model:12s} {'all placements equal' if agree else 'DIFFER'}: "
              + " ".join(f"{p}={h[:12]}" for p, h in by_placement.items()))


def make(name, batch):
    """The model, one (virtual) worker's inputs and its targets; `batch` 0: the model's own batch size."""
    from torch import nn

    torch.manual_seed(0)
    if name == "resnet50":
        from torchvision.models import resnet50

        batch = batch or 32
        return resnet50(), torch.randn(batch, 3, 224, 224), torch.randint(0, 1000, (batch,))
    if name == "convbn":
        from bench_ddp import ConvBN  # bench/ is on the path: this file runs as a script

        batch = batch or 64
        return ConvBN(), torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    layer = nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.1, batch_first=True)
    x = torch.randint(0, 1000, (batch or 32, 128))
    model = nn.Sequential(nn.Embedding(1000, 256), nn.TransformerEncoder(layer, 4), nn.Linear(256, 1000))
    return model, x, x.roll(-1, 1)


def loss_of(model, x, y, dtype):
    import torch.nn.functional as F

    with torch.autocast(x.device.type, dtype=dtype, enabled=dtype is not None):
        logits = model(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def timed(step, steps, device):
    """Median seconds of `step` over `steps` calls after WARMUP untimed ones, and the peak memory allocated
    on the device since the warm-up began (model and optimizer state included)."""
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(steps + WARMUP):
        sync(device)
        start = time.perf_counter()
        step()
        sync(device)
        if i >= WARMUP:
            times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else 0
    return statistics.median(times), peak


def training_step(name, variant, dtype, device, batch, level="D0"):
    """One training step (optimizer step included) of one model by one variant at one precision, as a function."""
    from torch.nn.parallel import DistributedDataParallel

    import easyscale_ext as es

    model, x, y = make(name, batch)
    model, x, y = model.to(device), x.to(device), y.to(device)
    if variant == "torch DDP":
        wrapped = DistributedDataParallel(model, device_ids=[0] if device == "cuda" else None)
    elif variant.startswith("EasyScaleDDP"):
        wrapped = es.EasyScaleDDP(model, virtual_world_size=int(variant.rsplit("=", 1)[1]), determinism_level=level)
    else:
        wrapped = model
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler(device, enabled=dtype is torch.float16)

    def step():
        if variant.startswith("EasyScaleDDP"):
            for xb, yb in wrapped.workers([(v, (x, y)) for v in wrapped.local_ranks]):
                scaler.scale(loss_of(wrapped, xb, yb, dtype)).backward()
        else:
            micro = 4 if variant == "accumulation x4" else 1
            for _ in range(micro):
                scaler.scale(loss_of(wrapped, x, y, dtype) / micro).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()

    return step


def one_variant(name, variant, dtype, steps, device, batch, level="D0"):
    """(median step seconds, peak bytes) of one model trained by one variant at one precision."""
    return timed(training_step(name, variant, dtype, device, batch, level), steps, device)


def release(device):
    """Free the last variant's model, optimizer and cached blocks before the next variant is measured."""
    gc.collect()  # a wrapped module's hooks hold reference cycles
    if device == "cuda":
        torch.cuda.empty_cache()


def against_torch(models, rounds, steps, device, batch):
    """{model: {precision: {variant: {"step_s", "peak_bytes"}}}}, in one process with a group of one."""
    import tempfile

    import torch.distributed as dist

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"file://{tmp}/rendezvous",
                                rank=0, world_size=1)
        found = {}
        for _ in range(rounds):
            for name in models:
                for precision, dtype in PRECISIONS.items():
                    for variant in VARIANTS:
                        key = (name, precision, variant)
                        found.setdefault(key, []).append(one_variant(name, variant, dtype, steps, device, batch))
                        release(device)
        dist.destroy_process_group()
    out = {}
    for (name, precision, variant), runs in found.items():
        out.setdefault(name, {}).setdefault(precision, {})[variant] = {
            "step_s": statistics.median(t for t, _ in runs), "peak_bytes": max(p for _, p in runs)}
    return out


def print_against_torch(found, rounds):
    print(f"EasyScaleDDP against torch, median step of {rounds} rounds and peak memory; ratios to torch's:")
    for name, by_precision in found.items():
        for precision, r in by_precision.items():
            for ours, theirs in (("EasyScaleDDP N=1", "torch DDP"), ("EasyScaleDDP N=4", "accumulation x4")):
                a, b = r[ours], r[theirs]
                print(f"  {name:11s} {precision:8s} {ours} {a['step_s'] * 1e3:7.1f} ms {a['peak_bytes'] / 2**20:6.0f} MiB"
                      f" | {theirs:15s} {b['step_s'] * 1e3:7.1f} ms {b['peak_bytes'] / 2**20:6.0f} MiB"
                      f" | {a['step_s'] / b['step_s']:.3f}x time {a['peak_bytes'] / max(b['peak_bytes'], 1):.3f}x memory")


def child_levels(models, level, steps, device, batch):
    """One process at `level`: each model's median step (N = 4 virtual workers, optimizer step included)."""
    out = {}
    for name in models:
        out[name] = one_variant(name, "EasyScaleDDP N=4", None, steps, device, batch, level)[0]
        release(device)
    return out


def child_profile(level, device, batch, name="transformer", variant="EasyScaleDDP N=4", precision="float32"):
    """The device kernels (CPU ops on a CPU) and the host operations with the most self time in one step at
    `level` of one model by one variant at one precision."""
    from torch.profiler import ProfilerActivity, profile

    step = training_step(name, variant, PRECISIONS[precision], device, batch, level)
    for _ in range(WARMUP):
        step()
    sync(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
        sync(device)
    key = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    events = prof.key_averages()
    by_device = sorted(events, key=lambda e: getattr(e, key), reverse=True)
    by_host = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)
    # Host calls that wait for the device: where a step's host time stops overlapping its device time.
    waits = [[e.key, e.count, e.self_cpu_time_total] for e in events
             if "Synchronize" in e.key or e.key in ("cudaMemcpyAsync", "aten::item", "aten::_local_scalar_dense")]
    return {"total_us": sum(getattr(e, key) for e in events),
            "top": [[e.key, e.count, getattr(e, key)] for e in by_device[:15]],
            "host_total_us": sum(e.self_cpu_time_total for e in events),
            "host_top": [[e.key, e.count, e.self_cpu_time_total] for e in by_host[:15]], "waits": waits}


def in_children(child, runs, rounds, steps, device, batch, models=()):
    """{label: [each round's child result]}: a process per run and round, the runs alternating. `runs` maps each
    label to (level, environment added to the level's, arguments added to the child's); a bare level: neither."""
    from easyscale_ext import determinism

    runs = {label: spec if isinstance(spec, tuple) else (spec, {}, []) for label, spec in runs.items()}
    found = {label: [] for label in runs}
    for _ in range(rounds):
        for label, (level, extra_env, extra_args) in runs.items():
            env = dict(os.environ, **determinism.environment(level), **extra_env)
            out = subprocess.run([sys.executable, __file__, "--child", child, "--level", level, "--steps", str(steps),
                                  "--device", device, "--batch", str(batch), "--warmup", str(WARMUP),
                                  "--models", ",".join(models), *extra_args],
                                 env=env, capture_output=True, text=True)
            if out.returncode:
                raise RuntimeError(f"the {label} process failed:\n{out.stderr[-3000:]}")
            found[label].append(json.loads(out.stdout.splitlines()[-1]))
    return found


def levels(models, rounds, steps, device, batch, runs=None):
    """{model: {label: median step seconds}}; `runs` as in_children's, default each of LEVELS."""
    runs = runs or {level: level for level in LEVELS}
    found = in_children("levels", runs, rounds, steps, device, batch, models)
    return {m: {label: statistics.median(r[m] for r in found[label]) for label in runs} for m in models}


def print_profile(title, profiles):
    print(title)
    for label, prof in profiles.items():
        print(f"  {label}: {prof['total_us'] / 1e3:.1f} ms in all")
        for kernel, count, us in prof["top"]:
            print(f"    {us / 1e3:8.2f} ms {count:5d}x  {kernel[:100]}")
        print(f"  {label}: {prof['host_total_us'] / 1e3:.1f} ms of host time; the most, then the waits:")
        for op, count, us in prof["host_top"] + prof["waits"]:
            print(f"    {us / 1e3:8.2f} ms {count:5d}x  {op[:100]}")


def main():
    global WARMUP
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--compare", help="another GPU's --json: compare its hashes with this one's")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--parts", default="hashes,ddp,amp,profile,levels,unfilled,cudnn,host")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--child", choices=["levels", "profile"])
    ap.add_argument("--level", default="D0")
    ap.add_argument("--warmup", type=int, default=WARMUP, help="untimed steps before each measurement")
    ap.add_argument("--batch", type=int, default=0, help="samples per (virtual) worker in the ddp, profile and "
                    "levels parts (default: 32 images for ResNet-50, 64 for the conv net, 32 sequences)")
    ap.add_argument("--model", default="transformer", help="the profiled model (--child profile)")
    ap.add_argument("--variant", default="EasyScaleDDP N=4", choices=VARIANTS, help="the profiled variant")
    ap.add_argument("--precision", default="float32", choices=PRECISIONS, help="the profiled precision")
    ap.add_argument("--models", default="", help="only these of the hashes, ddp and levels parts' models (comma-separated)")
    args = ap.parse_args()
    WARMUP = args.warmup
    chosen = set(filter(None, args.models.split(",")))

    def only(models):
        return tuple(m for m in models if not chosen or m in chosen)

    if args.child == "levels":
        print(json.dumps(child_levels(only(LEVEL_MODELS), args.level, args.steps, args.device, args.batch)))
        return
    if args.child == "profile":
        print(json.dumps(child_profile(args.level, args.device, args.batch, args.model, args.variant,
                                       args.precision)))
        return
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_gpu.py needs a CUDA GPU, and torch sees none here (torch.cuda.is_available() is False); "
                 "run it on a GPU machine, or pass --device cpu for a smoke run of the same code")
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    result = {"device": name, "torch": torch.__version__, "cuda": torch.version.cuda,
              "cudnn": torch.backends.cudnn.version()}
    parts = args.parts.split(",")
    known = ("hashes", "ddp", "amp", "profile", "levels", "unfilled", "cudnn", "host")
    unknown = set(parts) - set(known)
    if unknown:
        sys.exit(f"unknown --parts {sorted(unknown)}: choose from {', '.join(known)}")

    def done(part, value, started):
        result[part] = value
        if args.json:  # after every part: a run cut short keeps what finished
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
        return f"({time.time() - started:.0f} s)"

    if "hashes" in parts:
        started = time.time()
        found, tensors = hashes(only(HASH_MODELS), args.device)
        result["tensors"] = tensors
        took = done("hashes", found, started)
        print_hashes(f"D2 hashes on {name} {took}:", result["hashes"])
    if "ddp" in parts:
        started = time.time()
        took = done("ddp", against_torch(only(TORCH_MODELS), args.rounds, args.steps, args.device, args.batch), started)
        print(took)
        print_against_torch(result["ddp"], args.rounds)
    if "amp" in parts:
        for precision, flag in (("bfloat16", "bf16"), ("float16", "fp16")):
            started = time.time()
            took = done(f"hashes {precision}", hashes(AMP_MODELS, args.device, amp=flag)[0], started)
            print_hashes(f"D2 hashes under {precision} autocast on {name} {took}:", result[f"hashes {precision}"])
    if "profile" in parts:
        started = time.time()
        found = in_children("profile", {"D0": "D0", "D1": "D1"}, 1, args.steps, args.device, args.batch)
        took = done("profile", {level: runs[0] for level, runs in found.items()}, started)
        print_profile(f"transformer step, N = 4, the kernels with the most self time {took}:", result["profile"])
    if "levels" in parts:
        started = time.time()
        took = done("levels", levels(only(LEVEL_MODELS), args.rounds, args.steps, args.device, args.batch), started)
        print(f"step time, N = 4 on one process, median of {args.rounds} rounds {took}:")
        for model, found in result["levels"].items():
            print(f"  {model:12s} D0 {found['D0'] * 1e3:7.1f} ms   D1 {found['D1'] / found['D0']:.3f}x   "
                  f"D2 {found['D2'] / found['D0']:.3f}x")
    if "unfilled" in parts:
        from easyscale_ext.determinism import FILL_ENV

        unfilled = {FILL_ENV: "0"}
        started = time.time()
        runs = {"D0": "D0", "D1": "D1", "D1 unfilled": ("D1", unfilled, [])}
        steps = levels(only(LEVEL_MODELS), args.rounds, args.steps, args.device, args.batch, runs)
        profile = in_children("profile", {"D1 unfilled": runs["D1 unfilled"]}, 1, args.steps, args.device, args.batch)
        done("unfilled", {"levels": steps, "profile": profile["D1 unfilled"][0]}, started)
        print(f"D1 with and without the fill of uninitialized memory, median of {args.rounds} rounds:")
        for model, found in steps.items():
            print(f"  {model:12s} D0 {found['D0'] * 1e3:7.1f} ms   D1 {found['D1'] / found['D0']:.3f}x   "
                  f"D1 unfilled {found['D1 unfilled'] / found['D0']:.3f}x")
        print_profile("transformer step, N = 4, D1 unfilled:", {"D1 unfilled": result["unfilled"]["profile"]})
        started = time.time()
        # The filled runs are the hashes part's, where this invocation ran it: the same jobs, not run again.
        filled = {m: result["hashes"][m] for m in only(AMP_MODELS)} if "hashes" in result else \
            hashes(only(AMP_MODELS), args.device)[0]
        both = {"filled": filled, "unfilled": hashes(only(AMP_MODELS), args.device, unfilled)[0]}
        took = done("hashes unfilled", both, started)
        for label, found in both.items():
            print_hashes(f"D2 hashes, {label} {took}:", found)
    if "cudnn" in parts:
        from easyscale_ext.determinism import CUDNN_ENV

        off = {CUDNN_ENV: "0"}
        started = time.time()
        found, tensors = hashes(only(CONV_MODELS), args.device, off)
        result["tensors cudnn off"] = tensors
        took = done("hashes cudnn off", found, started)
        print_hashes(f"D2 hashes without cuDNN on {name} {took}:", found)
        started = time.time()
        runs = {"D2": "D2", "D2 cudnn off": ("D2", off, [])}
        steps = levels(only(LEVEL_MODELS[:2]), args.rounds, args.steps, args.device, args.batch, runs)
        took = done("levels cudnn off", steps, started)
        print(f"D2 with and without cuDNN, median of {args.rounds} rounds {took}:")
        for model, found in steps.items():
            ratio = found["D2 cudnn off"] / found["D2"]
            print(f"  {model:12s} D2 {found['D2'] * 1e3:7.1f} ms   without cuDNN {ratio:.3f}x")
    if args.compare:
        compare(result, args.compare)
    if "host" in parts:
        started = time.time()
        runs = {f"{name} {variant}": ("D0", {}, ["--model", name, "--variant", variant, "--precision", "bfloat16"])
                for name in only(TORCH_MODELS) for variant in ("EasyScaleDDP N=4", "accumulation x4")}
        found = in_children("profile", runs, 1, args.steps, args.device, args.batch)
        took = done("host", {label: r[0] for label, r in found.items()}, started)
        print_profile(f"bfloat16 steps, the host operations with the most self time {took}:", result["host"])


if __name__ == "__main__":
    main()
