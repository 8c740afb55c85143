"""Seconds per step of D virtual workers spread over GPUs, of one type or (at D2) several: EasyScale's runtime as
the scheduler models it. Workers go to GPUs by measured speed (placement.optimal_split, the runtime's own rule); a
GPU computes its workers one after another, the last overlapped with the gradients' exchange."""
from functools import lru_cache

from ...placement import optimal_split


@lru_cache(maxsize=None)
def virtual_worker_step(app, virtual_workers, local_bsz, groups, d2=False) -> tuple:
    """(seconds per step, EasyScale's waste) of `virtual_workers` workers of `local_bsz` samples on `groups`
    ((GPU type, GPUs per node) pairs). Workers are spread by speed with placement.optimal_split, the runtime's own
    rule. A GPU running k of them computes k - 1, then the last one overlapped with the exchange, as
    accumulation steps do; the step lasts as long as the slowest GPU's. Mixed GPU types run at D2 (and so does
    every step of a job with `d2`), whose compute costs the application's measured D2/D0 ratio. Waste: the share
    of the GPUs' time idle while the slowest computes."""
    cost = d2_factor(app, groups, d2)
    types = [t for t, p in groups for _ in range(sum(p))]
    compute = {t: cost * app.worker_compute_time(t, local_bsz) for t, _ in groups}
    sizes, waste = balanced_split(virtual_workers, [compute[t] for t in types])
    return max(gpu_step(app, local_bsz, groups, t, k, d2) for k, t in zip(sizes, types)), waste


def d2_factor(app, groups, d2=False) -> float:
    """What D2 multiplies a worker's compute by on `groups`: its measured cost where the job runs at D2 (on mixed
    types, or everywhere with `d2`), else 1."""
    return app.d2_cost if d2 or len(groups) > 1 else 1.0


def balanced_split(virtual_workers, compute) -> tuple:
    """(workers per GPU, EasyScale's waste) of `virtual_workers` spread over GPUs that compute one worker in
    `compute` seconds each, by placement.optimal_split. Waste: the GPUs' idle share while the slowest computes."""
    sizes = optimal_split(virtual_workers, [1 / c for c in compute])
    busy = [k * c for k, c in zip(sizes, compute)]
    return sizes, 1 - sum(busy) / (len(busy) * max(busy))


def gpu_step(app, local_bsz, groups, gpu_type, workers, d2=False) -> float:
    """Seconds one GPU of `gpu_type` takes for its `workers` virtual workers of a step of a job on `groups` ((GPU
    type, GPUs per node) pairs): k - 1 workers computed, then the last one overlapped with the exchange."""
    cost = d2_factor(app, groups, d2)
    full, sync = app.profile(gpu_type).step_time(sum((p for _, p in groups), ()), local_bsz)
    return (workers - 1) * cost * app.worker_compute_time(gpu_type, local_bsz) + cost * (full - sync) + sync


def mixed_step(app, workers, local_bsz, groups, d2=False) -> float:
    """Seconds per step of a job of any kind on GPUs of several types (`groups`: (GPU type, GPUs per node)
    pairs): its global batch as `workers` virtual workers of `local_bsz` samples, split by the GPUs' measured
    speeds (virtual_worker_step: placement.optimal_split, D2's measured cost, EasyScale's waste in the slowest
    GPU's time). A job that mixes types runs on this runtime: it keeps its bits across types only at D2 (`d2`: it
    runs at D2 on one type too)."""
    return virtual_worker_step(app, workers, local_bsz, groups, d2)[0]
