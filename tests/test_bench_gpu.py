"""bench/bench_gpu.py, the GPU figures' script, checked where there is no GPU: it refuses clearly and at once, and
its timing and profiling code runs end to end on the CPU, so that a GPU machine's few minutes are not spent on
finding its bugs."""
import json
import os
import subprocess
import sys

import pytest
import torch

import support.jobs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "bench", "bench_gpu.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import bench_gpu as bench  # noqa: E402  (bench_gpu names the function below)


def bench_gpu(*args, timeout=600):
    return subprocess.run([sys.executable, SCRIPT, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given where CUDA is missing")
def test_without_a_gpu_it_says_so_and_what_to_do():
    out = bench_gpu("--parts", "hashes")
    assert out.returncode != 0
    assert "needs a CUDA GPU" in out.stderr and "--device cpu" in out.stderr


def test_unknown_parts_are_named():
    out = bench_gpu("--device", "cpu", "--parts", "hashes,speed")
    assert out.returncode != 0 and "unknown --parts ['speed']" in out.stderr


@pytest.mark.slow
@pytest.mark.multiprocess
def test_timing_and_profiling_parts_run_on_the_cpu(tmp_path):
    result = tmp_path / "out.json"
    out = bench_gpu("--device", "cpu", "--parts", "ddp,profile,host,cudnn", "--models", "transformer,cnn",
                    "--rounds", "1", "--steps", "1", "--batch", "1", "--warmup", "0", "--json", str(result))
    assert out.returncode == 0, out.stderr
    found = json.loads(result.read_text())
    timed = found["ddp"]["transformer"]
    assert set(timed) == {"float32", "bfloat16", "float16"}
    assert all(v["step_s"] > 0 for by_variant in timed.values() for v in by_variant.values())
    assert set(found["profile"]) == {"D0", "D1"} and all(p["top"] for p in found["profile"].values())
    assert set(found["host"]) == {"transformer EasyScaleDDP N=4", "transformer accumulation x4"}
    assert all(p["host_top"] for p in found["host"].values())
    assert len(set(found["hashes cudnn off"]["cnn"].values())) == 1 and found["tensors cudnn off"]["cnn"]
    assert found["cudnn"] == torch.backends.cudnn.version()  # a part's result beside, not over, the versions


def test_the_unfilled_part_takes_the_filled_hashes_from_the_hashes_part(tmp_path, monkeypatch):
    """Every training job of the hashes and unfilled parts runs once: the filled runs' hashes are the hashes part's
    (no job is run here; the timing and profiling processes are stood in for)."""
    jobs = []

    def run_job(mode, env_per_rank, tensor_hashes=None, **options):
        jobs.append(json.dumps([mode, env_per_rank, options], sort_keys=True))
        if tensor_hashes:
            with open(tensor_hashes, "w") as f:
                json.dump([], f)
        return f"sha256 of job {len(jobs)}"

    profile = dict(total_us=1, top=[], host_total_us=1, host_top=[], waits=[])
    monkeypatch.setattr(support.jobs, "run_job", run_job)
    monkeypatch.setattr(bench, "levels", lambda models, rounds, steps, device, batch, runs:
                        {m: dict.fromkeys(runs, 1.0) for m in models})
    monkeypatch.setattr(bench, "in_children", lambda child, runs, *args: {label: [profile] for label in runs})
    result = tmp_path / "out.json"
    monkeypatch.setattr(sys, "argv", [SCRIPT, "--device", "cpu", "--parts", "hashes,unfilled", "--json", str(result)])
    bench.main()
    assert len(jobs) == len(set(jobs)), f"{len(jobs) - len(set(jobs))} of the {len(jobs)} jobs ran twice"
    found = json.loads(result.read_text())
    assert found["hashes unfilled"]["filled"] == {m: found["hashes"][m] for m in bench.AMP_MODELS}
