"""The GPU figures in one run on a GPU machine (an H100 or an H200): D2 hashes and D1/D2 step times.

hashes  D2 training on this GPU of the demo's model (scikit-learn's digits), the tests' conv net, torchvision's
        ResNet-18 and a small transformer: the pure-torch reference and EasyScaleDDP with N = 4 on 1, 2 and 4
        processes sharing the GPU (gloo: NCCL refuses two ranks on one GPU). The SHA-256 covers parameters,
        buffers and optimizer state (tests/support/train_job.py).
levels  step time of D1 and D2 against D0: EasyScaleDDP with N = 4 on one process, torchvision's ResNet-50 at 32
        images of 224 x 224 per virtual worker (EasyScale's own D2 figure), a conv net with BatchNorm and a small
        transformer. A level's settings are process-wide, so each level runs in a process of its own; the levels
        alternate over --rounds rounds and each figure is the median over rounds of a round's median step.
--compare OTHER.json: this GPU's hashes against another GPU's, model by model.

    PYTHONPATH=. python3 bench/bench_gpu.py --json OUT.json [--compare OTHER.json] [--rounds 3]
"""
import argparse
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
PLACEMENTS = {"reference": 1, "P=1": 1, "P=2": 2, "P=4": 4}  # processes sharing the GPU, N = 4
LEVEL_MODELS = ("resnet50", "convbn", "transformer")
LEVELS = ("D0", "D1", "D2")


def hashes():
    from easyscale_ext import determinism
    from support.jobs import run_job

    env = determinism.environment("D2")
    options = dict(n=4, device="cuda", level="D2", steps=5, batch=8, backend="gloo")

    def one(model, placement):
        procs = PLACEMENTS[placement]
        mode = "reference" if placement == "reference" else "easyscale"
        try:
            return run_job(mode, procs=procs, env_per_rank=[env] * procs, model=model, **options)
        except Exception as error:  # a placement that fails is a finding: record it, go on with the others
            return f"failed: {str(error)[-600:]}"

    jobs = [(m, p) for m in HASH_MODELS for p in PLACEMENTS]
    with ThreadPoolExecutor(4) as pool:
        found = list(pool.map(lambda job: one(*job), jobs))
    out = {m: {} for m in HASH_MODELS}
    for (m, p), h in zip(jobs, found):
        out[m][p] = h
    return out


def make(name):
    from torch import nn

    torch.manual_seed(0)
    if name == "resnet50":
        from torchvision.models import resnet50

        return resnet50(), torch.randn(32, 3, 224, 224), torch.randint(0, 1000, (32,))
    if name == "convbn":
        from bench_ddp import ConvBN  # bench/ is on the path: this file runs as a script

        return ConvBN(), torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,))
    layer = nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.1, batch_first=True)
    x = torch.randint(0, 1000, (32, 128))
    model = nn.Sequential(nn.Embedding(1000, 256), nn.TransformerEncoder(layer, 4), nn.Linear(256, 1000))
    return model, x, x.roll(-1, 1)


def child_levels(level, steps, device="cuda"):
    """One process at `level`: each model's median step (N = 4 virtual workers, optimizer step included)."""
    import torch.nn.functional as F

    import easyscale_ext as es

    out = {}
    for name in LEVEL_MODELS:
        model, x, y = make(name)
        model, x, y = model.to(device), x.to(device), y.to(device)
        ddp = es.EasyScaleDDP(model, virtual_world_size=4, determinism_level=level)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
        times = []
        for i in range(steps + 3):  # three warm-up steps
            torch.cuda.synchronize(device)
            start = time.perf_counter()
            for xb, yb in ddp.workers([(v, (x, y)) for v in range(4)]):
                logits = ddp(xb)
                F.cross_entropy(logits.reshape(-1, logits.shape[-1]), yb.reshape(-1)).backward()
            opt.step()
            opt.zero_grad()
            torch.cuda.synchronize(device)
            if i >= 3:
                times.append(time.perf_counter() - start)
        out[name] = statistics.median(times)
        del ddp, model, opt
        torch.cuda.empty_cache()
    return out


def levels(rounds, steps):
    from easyscale_ext import determinism

    found = {level: [] for level in LEVELS}
    for _ in range(rounds):
        for level in LEVELS:
            env = dict(os.environ, **determinism.environment(level))
            out = subprocess.run([sys.executable, __file__, "--child", level, "--steps", str(steps)], env=env,
                                 capture_output=True, text=True)
            if out.returncode:
                raise RuntimeError(f"the {level} process failed:\n{out.stderr[-3000:]}")
            found[level].append(json.loads(out.stdout.splitlines()[-1]))
    return {m: {level: statistics.median(r[m] for r in found[level]) for level in LEVELS} for m in LEVEL_MODELS}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--compare", help="another GPU's --json: compare its hashes with this one's")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--parts", default="hashes,levels")
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child_levels(args.child, args.steps)))
        return
    if not torch.cuda.is_available():
        sys.exit("bench_gpu.py needs a CUDA GPU")
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
              "cudnn": torch.backends.cudnn.version()}
    parts = args.parts.split(",")
    start = time.time()
    if "hashes" in parts:
        result["hashes"] = hashes()
        print(f"hashes on {result['device']} ({time.time() - start:.0f} s):")
        for model, found in result["hashes"].items():
            agree = len(set(found.values())) == 1
            print(f"  {model:12s} {'all placements equal' if agree else 'DIFFER'}: "
                  + " ".join(f"{p}={h[:12]}" for p, h in found.items()))
    if "levels" in parts:
        start = time.time()
        result["levels"] = levels(args.rounds, args.steps)
        print(f"step time, N = 4 on one process, median of {args.rounds} rounds ({time.time() - start:.0f} s):")
        for model, found in result["levels"].items():
            print(f"  {model:12s} D0 {found['D0'] * 1e3:7.1f} ms   D1 {found['D1'] / found['D0']:.3f}x   "
                  f"D2 {found['D2'] / found['D0']:.3f}x")
    if args.compare and "hashes" in result:
        with open(args.compare) as f:
            other = json.load(f)
        print(f"hashes, {result['device']} against {other['device']}:")
        for model, found in result["hashes"].items():
            theirs = other.get("hashes", {}).get(model, {})
            same = [p for p in found if theirs.get(p) == found[p]]
            print(f"  {model:12s} equal in {len(same)} of {len(found)} placements ({', '.join(same) or 'none'})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
