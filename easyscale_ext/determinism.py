"""Determinism levels, one job-wide setting.

D0  consistent data order, RNG streams and gradient reduction (always on).
D1  D0 + deterministic kernels (torch.use_deterministic_algorithms, cuDNN
    deterministic and no autotuning, CUBLAS_WORKSPACE_CONFIG) and one fixed
    intra-op thread count on every process (conv weight gradients change bits
    with the thread count on CPU).
D2  D1 + the same instruction set on every process: oneDNN and MKL capped at
    AVX2 on CPU (ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS), which must be in
    the environment before they initialise, i.e. before Python starts: launch
    with `environment(level)` merged into the environment.
    GPU: D2 covers the same GPU model, driver, CUDA, cuDNN and cuBLAS versions
    on every process; it does not make different GPU architectures agree
    (kernels and their reduction orders are chosen per architecture).
"""
import os
from typing import Dict

import torch

LEVELS = ("D0", "D1", "D2")
ISA_CAP = {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def parse(level) -> str:
    text = str(level).upper()
    if text in ("0", "1", "2"):
        text = "D" + text
    if text not in LEVELS:
        raise ValueError(f"unknown determinism level {level!r}: use one of D0, D1, D2")
    return text


def environment(level) -> Dict[str, str]:
    """Variables a launcher must set before starting each process."""
    level = parse(level)
    env = {}
    if level in ("D1", "D2"):
        env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    if level == "D2":
        env.update(ISA_CAP)
    return env


def apply(level, num_threads: int, cuda: bool) -> None:
    """Configure this process for `level`; raises if the environment is missing what it needs."""
    level = parse(level)
    if level == "D0":
        return
    needed = environment(level)
    if not cuda:
        needed.pop("CUBLAS_WORKSPACE_CONFIG")
    missing = {k: v for k, v in needed.items() if os.environ.get(k) != v}
    if missing:
        settings = " ".join(f"{k}={v}" for k, v in missing.items())
        raise RuntimeError(f"determinism {level} needs {settings} in the environment before Python starts "
                           f"(oneDNN, MKL and cuBLAS read them once); launch with `easyscale run` or export them")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.set_num_threads(num_threads)
