"""IceFrog (Gao et al., TPDS'25): layer-elastic scheduling. Jobs freeze their front layers as training
progresses, and the scheduler values GPUs by each job's layer-aware throughput net of the frozen penalty.

Freezing is the job model's (models/freezing.py): a job freezes where it opts in or a run turns freezing on
(`easyscale simulate --freezing on`), on its model family's published timeline; IceFrog's own experiments used
our runtime's measured timeline (freezing.MEASURED) for every application. With freezing off (the headline
tables) no job freezes and IceFrog is the same allocation as `icefrog-nofreeze`.

Scheduler (our reading of the paper's "layer-aware throughput and frozen penalty"): EDL's elastic Tiresias order
(2D-LAS on attained GPU-seconds, two queues, demotion at 16 GPU-hours); in that order every job gets one GPU while
GPUs last, then each further GPU goes to the job whose effective speedup grows most: progress per second (layer-
aware iteration time at its current frozen level, times 1 - penalty) over its unfrozen progress per second on one
GPU. Freezing trims compute more than sync, so a partly frozen job scales better and gains more from a GPU; the
penalty discounts that. Jobs keep their user's batch. `freeze=False` is the same policy valuing every job as
unfrozen (layer-unaware).
"""
from functools import lru_cache

import numpy as np

from ..models import goodput
from .base import grant_by_marginal_gain, place_counts
from .tiresias import TiresiasPolicy


@lru_cache(maxsize=None)
def step_parts(app, batch_size, per_node, gpu_type, total_gpus) -> tuple:
    """(compute, sync, accumulation steps) arrays of one step at the fixed global batch on 0..max GPUs packed on
    full nodes (index = GPUs, entry 0 unused), configured as the job configures itself; max as goodput's."""
    max_gpus = 1 if app.single_gpu else min(batch_size // app.min_local_bsz, total_gpus)
    parts = [(np.inf, 0.0, 0)]
    for r in range(1, max_gpus + 1):
        local, accum = goodput.fixed_batch_config(batch_size, r, app)
        local = goodput.cap_local_bsz(local, accum, r, app)
        step, sync = app.profile(gpu_type).step_time(goodput.packed(r, per_node), local)
        parts.append((step - sync, sync, accum))
    return tuple(np.array(c) for c in zip(*parts))


def effective_speedups(job, per_node, gpu_type, total_gpus, layer_aware=True) -> np.ndarray:
    """Progress per second on 0..max GPUs at the job's current frozen level, net of the penalty, over its
    unfrozen progress per second on one GPU (`layer_aware` False: as if unfrozen)."""
    compute, sync, accum = step_parts(job.app, job.batch_size, per_node, gpu_type, total_gpus)
    unfrozen = (accum + 1) * compute + sync
    frozen = layer_aware and job.freezing is not None
    c, s, p = job.freezing_factors() if frozen else (1.0, 1.0, 1.0)
    return p * unfrozen[1] / ((accum + 1) * compute * c + sync * s)


class IceFrogPolicy(TiresiasPolicy):
    profiled = True
    one_gpu_type = True

    def __init__(self, freeze: bool = True):
        super().__init__()
        self.layer_aware = freeze
        self.name = "icefrog" if freeze else "icefrog-nofreeze"

    @staticmethod
    def service(job) -> float:
        return job.attained  # an elastic job's GPU count changes: count what it held

    def optimize(self, now, jobs, cluster, allocations):
        by_name = {j.name: j for j in jobs}
        per_node, gpu_type, total = max(cluster.gpus), cluster.types[0], cluster.total_gpus
        speedup = {n: effective_speedups(by_name[n], per_node, gpu_type, total, self.layer_aware)
                   for n in self.priority(by_name)[:total]}
        count = dict.fromkeys(speedup, 1)

        def marginal(name):
            v, r = speedup[name], count[name]
            return v[r + 1] - v[r] if r + 1 < len(v) else 0.0

        grant_by_marginal_gain(count, total - len(count), marginal)
        return place_counts(count, allocations, cluster, gpu_type)
