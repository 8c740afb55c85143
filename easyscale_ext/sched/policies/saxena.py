"""Saxena et al. (MASCOTS'20): elastic GPU counts and batch sizes within each job's accuracy-neutral range.

A job's accuracy-neutral batch sizes are the validated ones whose statistical efficiency, averaged over its
training (each epoch weighted by its progress), stays at least 0.9: a batch that needs at most ~11 % more
samples than the initial batch M0 to reach the same progress. (The worst epoch is no bound to use: the first
epochs' gradients are so clean that every batch above M0 is inefficient there.) The user's batch is always
allowed. On every arrival and completion, a dynamic program over jobs x GPUs picks each job's GPU count and
batch to maximise the sum of the jobs' useful throughput (progress per second: measured step time x
statistical efficiency of the batch, at the job's current epoch), each normalised by its useful throughput on
one GPU so that applications with cheap steps do not take everything. Between those events nothing moves.
`adaptive_batch=False` is the paper's baseline: the same dynamic program with every job at its user's batch.

The simulator's policy interface cannot hand a job its batch: with `adaptive_batch` jobs tune their own batch
for goodput (as Pollux's agents do, over all validated batches), so the program's batch choice values GPU
counts but does not bind the job.
"""
from functools import lru_cache

import numpy as np

from ... import _search
from ..models import goodput
from ..models.efficiency import efficiency, gain
from .base import Policy, place_counts

NEUTRAL_EFFICIENCY = 0.9
STAY = 1e-6  # added to a job's current GPU count: among equal choices, move nothing
EARLIER = 1e-9  # per place in arrival order, added to any allocation: among equal jobs, the earlier runs


@lru_cache(maxsize=None)
def neutral_batches(app) -> tuple:
    """The validated batch sizes whose progress-weighted mean efficiency over training is >= 0.9."""
    noise = app.noise
    weights = np.diff(noise.epoch_end[:app.epochs], prepend=0.0)
    return tuple(int(b) for b in noise.batch_sizes if np.average(
        [efficiency(*noise.grad_stats(b, e), b / app.init_batch_size) for e in range(app.epochs)],
        weights=weights) >= NEUTRAL_EFFICIENCY)


@lru_cache(maxsize=None)
def useful_throughputs(app, epoch, batches, per_node, gpu_type, total_gpus) -> np.ndarray:
    """Best progress per second over `batches` on 0..max GPUs packed on full nodes (0 where no batch fits),
    configured as a job runs a fixed batch."""
    max_gpus = 1 if app.single_gpu else min(max(batches) // app.min_local_bsz, total_gpus)
    rates = np.zeros(max_gpus + 1)
    for r in range(1, max_gpus + 1):
        for b in batches:
            local, accum = goodput.fixed_batch_config(b, r, app)
            local = goodput.cap_local_bsz(local, accum, r, app)
            if local < app.min_local_bsz:
                continue
            step, sync = app.profile(gpu_type).step_time(goodput.packed(r, per_node), local)
            batch = r * local * (accum + 1)
            rate = gain(*app.noise.grad_stats(batch, epoch), batch / app.init_batch_size) / (
                step + accum * (step - sync))
            rates[r] = max(rates[r], float(rate))
    return rates


def allocate(values, gpus) -> list:
    """GPU counts c_j maximising sum_j values[j][c_j] subject to sum_j c_j <= gpus (values[j][0] = 0): a
    knapsack over jobs x GPUs, best[c] being the best total of the jobs so far on at most c GPUs, compiled
    (csrc/sched/knapsack.cpp; of equal totals, the smallest count).

    Two shortcuts that change no pick. best is non-decreasing in c, so a count worth no more than a smaller one is
    never picked: each job's values end at their last record. And the jobs so far can use at most `reach` GPUs, so
    best[c] is best[reach] for every c past it: those rows are not computed."""
    return _search.knapsack([np.asarray(v, dtype=float) for v in values], gpus)


class SaxenaPolicy(Policy):
    profiled = True
    one_gpu_type = True

    def __init__(self, adaptive_batch: bool = True):
        self.adaptive_batch = adaptive_batch
        self.name = "saxena" if adaptive_batch else "saxena-fixed"
        self._jobs = None  # the jobs present at the last decision

    def batch_size(self, spec, app):
        if not self.adaptive_batch:
            return spec.batch_size
        return max(neutral_batches(app)) if app.single_gpu else None

    def batches(self, job) -> tuple:
        if not self.adaptive_batch:
            return (job.spec.batch_size,)
        return tuple(sorted(set(neutral_batches(job.app)) | {job.spec.batch_size}))

    def optimize(self, now, jobs, cluster, allocations):
        jobs = list(jobs)
        names = [j.name for j in jobs]
        if names == self._jobs:
            return allocations
        self._jobs = names
        per_node, gpu_type, total = max(cluster.gpus), cluster.types[0], cluster.total_gpus
        values = []
        for rank, job in enumerate(jobs):
            rates = useful_throughputs(job.app, job.epoch, self.batches(job), per_node, gpu_type, total)
            v = rates / rates[1]
            v[1:] += EARLIER * (len(jobs) - rank)
            current = len(allocations.get(job.name, ()))
            if 0 < current < len(v):
                v[current] += STAY
            values.append(v)
        counts = dict(zip(names, allocate(values, total)))
        return place_counts(counts, allocations, cluster, gpu_type)
