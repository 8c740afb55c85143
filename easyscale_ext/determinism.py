"""Determinism levels and D2's instruction-set floor, job-wide settings.

D0  consistent data order, RNG streams and gradient reduction (always on).
D1  D0 + deterministic kernels (torch.use_deterministic_algorithms, cuDNN
    deterministic and no autotuning, CUBLAS_WORKSPACE_CONFIG) and one fixed
    intra-op thread count on every process (conv weight gradients change bits
    with the thread count on CPU).
D2  D1 + one instruction set on every process: oneDNN, MKL and ATen's vector
    kernels capped at the job's floor `isa` (default AVX2; AVX and SSE4.1
    accepted) through ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS and
    ATEN_CPU_CAPABILITY, which the libraries read once: they must be in the
    environment before Python starts, so launch with `environment("D2", isa)`
    merged into it (`easyscale run --level D2 --isa ...` does). A CPU below the
    floor cannot run the job and fails at start. Measured: the floor makes CPUs of
    one vendor agree, not Intel and AMD (tests/runtime/test_d2_golden.py).
    GPU: D2 covers the same GPU model, driver, CUDA, cuDNN and cuBLAS versions
    on every process; it does not make different GPU models agree (kernels and
    their reduction orders are chosen per device). Measured: an H100 and an
    H200 (one architecture, the same versions) agree for three models of four;
    ResNet-18 does not, its convolutions' algorithms being cuDNN's choice.
    EASYSCALE_CUDNN=0 in the environment turns cuDNN off at D1 and D2:
    convolutions and batch norm then run ATen's own CUDA kernels (im2col and
    cuBLAS matrix products), the candidate for one hash across GPU models
    (not yet checked on two; it costs 13-14x the step of a conv net on an H200).
D1 and D2 keep torch's fill of uninitialized memory (every new tensor's memory
set to NaN before first use, so a kernel that reads memory it never wrote reads
the same on every run). It costs a kernel launch per allocation; where a job's
code never reads memory it did not write, EASYSCALE_FILL_UNINITIALIZED=0 in the
environment turns it off, and the job stays as deterministic (torch's docs for
torch.utils.deterministic.fill_uninitialized_memory).
"""
import os
from typing import Dict, Optional, Set

LEVELS = ("D0", "D1", "D2")
ISAS = ("SSE4.1", "AVX", "AVX2", "AVX512")  # lowest first
DEFAULT_ISA = "AVX2"
FLOORS = ISAS[:3]  # D2 can hold a job to these (AVX-512 CPUs are too rare in mixed fleets to be a floor)
ISA_ENV = "EASYSCALE_ISA"  # the job's floor, for EasyScaleDDP built without isa=
FILL_ENV = "EASYSCALE_FILL_UNINITIALIZED"  # "0": D1 and D2 leave new tensors' memory unfilled
CUDNN_ENV = "EASYSCALE_CUDNN"  # "0": D1 and D2 run convolutions and batch norm without cuDNN

# What each floor caps. ATen has no AVX kernels, so below AVX2 it runs its plain ones;
# MKL's lowest x86-64 code path is SSE4.2.
_CAPS = {
    "SSE4.1": {"ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ATEN_CPU_CAPABILITY": "default"},
    "AVX": {"ONEDNN_MAX_CPU_ISA": "AVX", "MKL_ENABLE_INSTRUCTIONS": "AVX", "ATEN_CPU_CAPABILITY": "default"},
    "AVX2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"},
}
# The CPU flags (as /proc/cpuinfo names them) each level needs.
_FLAGS = {
    "SSE4.1": {"sse4_1", "sse4_2"},
    "AVX": {"avx"},
    "AVX2": {"avx2", "fma"},
    "AVX512": {"avx512f", "avx512bw", "avx512vl", "avx512dq"},
}
# Values of the cap variables, read back as the highest level they allow.
_CAP_LEVEL = {
    "ONEDNN_MAX_CPU_ISA": {"SSE41": "SSE4.1", "AVX": "AVX", "AVX2": "AVX2"},
    "MKL_ENABLE_INSTRUCTIONS": {"SSE4_2": "SSE4.1", "AVX": "AVX", "AVX2": "AVX2"},
    "ATEN_CPU_CAPABILITY": {"default": "AVX", "avx2": "AVX2"},
}


def parse(level) -> str:
    text = str(level).upper()
    if text in ("0", "1", "2"):
        text = "D" + text
    if text not in LEVELS:
        raise ValueError(f"unknown determinism level {level!r}: use one of D0, D1, D2")
    return text


def parse_isa(isa) -> str:
    text = str(isa).upper().replace("_", ".")
    text = {"SSE41": "SSE4.1", "SSE4": "SSE4.1"}.get(text, text)
    if text not in FLOORS:
        raise ValueError(f"unknown instruction-set floor {isa!r}: use one of {', '.join(FLOORS)}")
    return text


def job_isa(level, isa=None) -> Optional[str]:
    """The job's instruction-set floor: D2's `isa` (default $EASYSCALE_ISA, else AVX2); None below D2."""
    if parse(level) != "D2":
        if isa is not None:
            raise ValueError(f"isa={isa!r} applies to determinism D2 only; drop it or run at D2")
        return None
    return parse_isa(isa or os.environ.get(ISA_ENV) or DEFAULT_ISA)


def isa_caps(isa: str) -> Dict[str, str]:
    """The environment that caps oneDNN, MKL and ATen at `isa` (also how tests emulate an older CPU)."""
    return dict(_CAPS[parse_isa(isa)])


def environment(level, isa=None) -> Dict[str, str]:
    """Variables a launcher must set before starting each process."""
    level = parse(level)
    floor = job_isa(level, isa)
    env = {}
    if level in ("D1", "D2"):
        env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    if floor is not None:
        env.update(isa_caps(floor))
        env[ISA_ENV] = floor
    return env


def cpu_flags() -> Optional[Set[str]]:
    """This CPU's feature flags, or None where /proc/cpuinfo does not list them."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def cpu_isa(flags: Optional[Set[str]] = None) -> Optional[str]:
    """The highest level of ISAS this CPU supports; None if unknown or below SSE4.1."""
    flags = cpu_flags() if flags is None else flags
    if flags is None:
        return None
    supported = [isa for isa in ISAS if _FLAGS[isa] <= flags]
    return supported[-1] if supported else None


def native_isa(env=None) -> Optional[str]:
    """The level kernels run at here: the CPU's, lowered to any cap already in the environment
    (so a run pinned to AVX2 counts as an AVX2 machine)."""
    env = os.environ if env is None else env
    levels = [cpu_isa()]
    levels += [_CAP_LEVEL[k].get(env[k]) for k in _CAP_LEVEL if k in env]
    known = [lvl for lvl in levels if lvl is not None]
    return min(known, key=ISAS.index) if known else None


def isa_below(isa: Optional[str]) -> Optional[str]:
    """The next lower level (an older machine to emulate), or None if there is none."""
    if isa is None or ISAS.index(isa) == 0:
        return None
    return ISAS[ISAS.index(isa) - 1]


def check_cpu(isa: str, flags: Optional[Set[str]] = None) -> None:
    """Raise if this CPU cannot run the floor `isa` (nothing to check where its flags are unknown)."""
    flags = cpu_flags() if flags is None else flags
    if flags is None or _FLAGS[isa] <= flags:
        return
    have = cpu_isa(flags)
    choice = f"--isa {have} (or lower)" if have in FLOORS else "a machine with SSE4.1 or better"
    raise RuntimeError(f"determinism D2 holds this job to {isa}, but this CPU lacks "
                       f"{', '.join(sorted(_FLAGS[isa] - flags))}: run the whole job with {choice}")


def apply(level, num_threads: int, cuda: bool, isa: Optional[str] = None) -> None:
    """Configure this process for `level` (and D2's floor `isa`); raises if the environment lacks
    what it needs or the CPU is below the floor."""
    level = parse(level)
    if level == "D0":
        return
    if level == "D2":
        check_cpu(isa)
    needed = environment(level, isa)
    needed.pop(ISA_ENV, None)
    if not cuda:
        needed.pop("CUBLAS_WORKSPACE_CONFIG")
    missing = {k: v for k, v in needed.items() if os.environ.get(k) != v}
    if missing:
        settings = " ".join(f"{k}={v}" for k, v in missing.items())
        raise RuntimeError(f"determinism {level} needs {settings} in the environment before Python starts "
                           f"(oneDNN, MKL, ATen and cuBLAS read them once); launch with `easyscale run` or "
                           f"export determinism.environment({level!r}{', isa=' + repr(isa) if isa else ''})")
    import torch  # here: launchers and the cluster's scheduler read this module without torch

    fill = _switch(FILL_ENV, "D1 and D2 fill new tensors' memory", "leave it unfilled")
    cudnn = _switch(CUDNN_ENV, "D1 and D2 use cuDNN", "ATen's own CUDA kernels instead")
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = fill
    if not cudnn:  # never turned on here: a user may have turned it off
        torch.backends.cudnn.enabled = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.set_num_threads(num_threads)


def _switch(name: str, on: str, off: str) -> bool:
    """An on/off setting from the environment: unset or "1" is on."""
    value = os.environ.get(name, "1")
    if value not in ("0", "1"):
        raise RuntimeError(f"{name}={value!r}: set it to 1 (the default: {on}) or 0 ({off})")
    return value == "1"
