"""A lower limit on a workload's average JCT under the project's job model, whatever the policy: each job alone on
the cluster, in every epoch on the one-type allocation (any GPU type, any GPU count packed on full nodes) and the
batch on which it progresses fastest, moving between them for free, after its first start and before its exit.

A job under any policy shares the cluster, pays for its moves and runs one configuration for a round at least, so
it cannot finish sooner, with one exception left out on purpose: a two-type allocation (a job at D2 on this runtime)
is not offered here. It is faster than the fastest type alone only where that type runs out; alone, a job has
every GPU of it (bench_fair checks that no job of any table beat its limit). Batches: every candidate Pollux's agent
weighs (models/goodput.py) on every type's own per-GPU limit, and the job's own fixed batch, each also without
Pollux's extra accumulation step on one GPU (a virtual-worker job has none), so a policy that tunes batches and
one that keeps them are both bounded.
"""
from functools import lru_cache

import numpy as np

from .models.efficiency import gain
from .models.freezing import timeline_for
from .models.goodput import CANDIDATES, packed, split_batch
from .costs import RuntimeCosts
from .models.job import make_job
from .models.reallocation import restart_cost


def job_lower_bounds(specs, cluster, apps, config, costs=RuntimeCosts()) -> np.ndarray:
    """Seconds from arrival to completion below which no policy can finish each of `specs` on `cluster`
    (Cluster) under `config` (SimConfig, freezing off for every job: a frozen layer's backward is skipped)."""
    frozen = [s.name for s in specs if s.app is not None and timeline_for(s, config) is not None]
    if frozen:
        raise ValueError(f"{len(frozen)} jobs freeze layers under this configuration (e.g. {frozen[0]}); the limit "
                         "models jobs that train every layer: bound them with freezing off")
    totals = cluster.room(cluster.gpus)  # GPU type -> its GPUs in all
    per_node = {t: max(g for g, u in zip(cluster.gpus, cluster.types) if u == t) for t in totals}
    out = []
    for spec in specs:
        job = make_job(spec, apps, spec.batch_size)  # a fresh model: its first start, as restart_cost prices it
        seconds = restart_cost(job, config) + costs.exit_s  # the smallest exit: one process
        if spec.app is None:
            seconds += spec.duration
        else:
            app = apps[spec.app]
            fixed = spec.batch_size or 0
            rates = np.max([_rates(app, t, per_node[t], totals[t], fixed) for t in totals], axis=0)
            epochs = min(spec.epochs or app.epochs, app.epochs)
            ends = np.array([app.noise.progress_at(e) for e in range(epochs + 1)])
            seconds += float(np.sum(np.diff(ends) / rates[:epochs])) * config.slowdown.get(spec.app, 1.0)
        out.append(seconds)
    return np.array(out)


@lru_cache(maxsize=None)
def _rates(app, gpu_type, per_node, total, fixed_batch) -> np.ndarray:
    """The fastest progress (steps at the initial batch per second) per epoch of a job of `app` on up to `total`
    GPUs of `gpu_type`, `per_node` a node: over every GPU count and every candidate batch (and `fixed_batch`)."""
    max_local = max(app.max_local_bsz, app.max_local_bsz_on(gpu_type))
    most = 1 if app.single_gpu else min(total, app.max_batch_size // app.min_local_bsz)
    profile = app.profile(gpu_type)
    batches, times = [], []
    for gpus in range(1, most + 1):
        low = max(app.init_batch_size, app.min_local_bsz * gpus)
        wanted = [b for b in (fixed_batch, app.init_batch_size) if b >= gpus * app.min_local_bsz]
        candidates = np.unique(np.concatenate([np.geomspace(low, max(low, app.max_batch_size), CANDIDATES), wanted]))
        splits = [split_batch(candidates, gpus, max_local, init) for init in (app.init_batch_size, np.inf)]
        for m, s in zip(*(np.concatenate(part) for part in zip(*splits))):
            batch = gpus * int(m) * (int(s) + 1)
            if app.min_local_bsz <= m <= max_local and batch <= max(app.max_batch_size, fixed_batch):
                step, sync = profile.step_time(packed(gpus, per_node), int(m))
                batches.append(batch)
                times.append(step + s * (step - sync))
    batches, times = np.array(batches, dtype=float), np.array(times)
    order = np.lexsort((times, batches))  # each batch at its shortest step only
    first = np.r_[True, np.diff(batches[order]) > 0]
    batches, times = batches[order][first], times[order][first]
    noise = app.noise
    rates = [np.max(gain(np.interp(batches, noise.batch_sizes, noise.grad_sqr[:, epoch]),
                         np.interp(batches, noise.batch_sizes, noise.grad_var[:, epoch]),
                         batches / app.init_batch_size) / times) for epoch in range(app.epochs)]
    return np.array(rates, dtype=float)
