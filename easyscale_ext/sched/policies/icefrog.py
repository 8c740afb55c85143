"""IceFrog (Gao et al., TPDS'25): layer-elastic scheduling. Jobs freeze their front layers as training
progresses, and the scheduler values GPUs by each job's layer-aware throughput net of the frozen penalty.

Freezing timeline. A job's frozen share of the model rises with its share of training done: nothing before
`start`, then linearly to the cap at `full`, the cap after that (front layers first, as AutoFreeze/Egeria and our
runtime's prefix-only GradientNormFreezer freeze). At the cap a share `backward` of the backward pass and
`exchanged` of the gradient elements are frozen. Backward is taken as 2/3 of a step's compute (twice the forward's
FLOPs; our CNN measured 0.59), so compute time shrinks by (2/3) x backward x level and sync time by exchanged x
level, level being the share of the cap reached. Frozen penalty: an iteration makes (1 - penalty x level) of its
progress, i.e. extra iterations to reach the same model quality.

The one timeline every application uses is derived from our own runtime (BENCHMARKS.md, "Layer freezing", the
aggressive threshold 0.10, 184 steps): the first layer froze at step 20, the prefix reached the 80 % cap at step 44;
over the run backward time was x0.36, exchanged elements x0.57, accuracy 0.6 points lower. Run averages weigh
the cap by (full - start) / 2 + (1 - full) under the linear ramp, which gives the cap's values. Assumption for the
penalty (no measurement of extra iterations exists): a run ending 0.6 points short is worth the progress at which an
unfrozen run first comes within 0.6 points of its final accuracy, about 0.70 of its training in the Pollux
validation traces of cifar10 (0.66-0.72) and imagenet (0.69-0.79). The moderate thresholds (0.07, 0.05) lose no
accuracy but freeze only after 87 % of training (backward x0.91): too late to matter to a scheduler.
Per application the timeline is in shares of that application's own training; we measured one model only.

Scheduler (our reading of the paper's "layer-aware throughput and frozen penalty"): EDL's elastic Tiresias order
(2D-LAS on attained GPU-seconds, two queues, demotion at 16 GPU-hours); in that order every job gets one GPU while
GPUs last, then each further GPU goes to the job whose effective speedup grows most: progress per second (layer-
aware iteration time at its current frozen level, times 1 - penalty) over its unfrozen progress per second on one
GPU. Freezing trims compute more than sync, so a partly frozen job scales better and gains more from a GPU; the
penalty discounts that. Jobs keep their user's batch. `freeze=False` is the same policy with jobs that never freeze.
"""
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..models import goodput
from .base import grant_by_marginal_gain, place_counts
from .tiresias import TiresiasPolicy

BACKWARD_SHARE = 2 / 3


@dataclass(frozen=True)
class Freezing:
    start: float  # share of training done before anything freezes
    full: float  # share of training done by which the frozen prefix reaches its cap
    backward: float  # share of the backward pass frozen at the cap
    exchanged: float  # share of the gradient elements frozen at the cap
    penalty: float  # share of an iteration's progress lost at the cap

    def level(self, share) -> float:
        """How much of the cap is frozen after `share` of the training."""
        if share >= self.full:
            return 1.0
        return float(np.clip((share - self.start) / (self.full - self.start), 0.0, 1.0))

    def at(self, share) -> tuple:
        """Factors on compute time, sync time and progress per iteration after `share` of the training."""
        x = self.level(share)
        return 1 - BACKWARD_SHARE * self.backward * x, 1 - self.exchanged * x, 1 - self.penalty * x


def from_run(steps, first, capped, backward, elements, worth) -> Freezing:
    """The timeline of a measured run of `steps` steps: first freeze at step `first`, cap at `capped`; run-average
    factors on backward time and exchanged elements; `worth` = its progress relative to an unfrozen run's."""
    start, full = first / steps, capped / steps
    weight = (full - start) / 2 + (1 - full)  # the cap's weight in a run average
    return Freezing(start, full, (1 - backward) / weight, (1 - elements) / weight, (1 - worth) / weight)


MEASURED = from_run(steps=184, first=20, capped=44, backward=0.36, elements=0.57, worth=0.70)


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


def effective_speedups(job, per_node, gpu_type, total_gpus) -> np.ndarray:
    """Progress per second on 0..max GPUs at the job's current frozen level, net of the penalty, over its
    unfrozen progress per second on one GPU."""
    compute, sync, accum = step_parts(job.app, job.batch_size, per_node, gpu_type, total_gpus)
    unfrozen = (accum + 1) * compute + sync
    c, s, p = (1.0, 1.0, 1.0) if job.freezing is None else job.freezing_factors()
    return p * unfrozen[1] / ((accum + 1) * compute * c + sync * s)


class IceFrogPolicy(TiresiasPolicy):
    profiled = True
    one_gpu_type = True

    def __init__(self, freeze: bool = True, timeline: Freezing = MEASURED):
        super().__init__()
        self.timeline = timeline if freeze else None
        self.name = "icefrog" if freeze else "icefrog-nofreeze"

    def freezing(self, spec, app):
        return self.timeline

    @staticmethod
    def service(job) -> float:
        return job.attained  # an elastic job's GPU count changes: count what it held

    def optimize(self, now, jobs, cluster, allocations):
        by_name = {j.name: j for j in jobs}
        per_node, gpu_type, total = max(cluster.gpus), cluster.types[0], cluster.total_gpus
        speedup = {n: effective_speedups(by_name[n], per_node, gpu_type, total)
                   for n in self.priority(by_name)[:total]}
        count = dict.fromkeys(speedup, 1)

        def marginal(name):
            v, r = speedup[name], count[name]
            return v[r + 1] - v[r] if r + 1 < len(v) else 0.0

        grant_by_marginal_gain(count, total - len(count), marginal)
        return place_counts(count, allocations, cluster, gpu_type)
