"""Goodput = throughput x statistical efficiency, and the batch configuration that maximises it (Pollux, 3.3).

A configuration on `r` replicas is a per-GPU micro-batch m and a number s of extra accumulation steps, the
global batch being M = r * m * (s + 1). Candidate batch sizes are 50 points spaced geometrically between
max(M0, r * m_min) and the application's largest validated batch, as in the artifact.
"""
import math
from collections import OrderedDict
from functools import lru_cache, wraps

import numpy as np

from . import throughput
from .efficiency import efficiency

EPS = 1e-8  # slack for ceil() of ratios that are integers up to rounding
CANDIDATES = 50
# best() computes a call's distinct pairs only above this many: a grid (a Pollux speedup table) repeats most of its
# pairs, a handful of pairs rarely any, and finding them costs more than it saves
DISTINCT_FROM = 32
SPEEDS_BYTES = 128 * 2 ** 20  # _speeds' results kept, the most recently used: elastic-goodput's and Sia's rounds on
# Philly's trace reuse 97 % of theirs from ~70 MB; a Pollux speedup table's can be 1 MB each


def split_batch(batch_size, num_replicas, max_local_bsz, init_batch_size):
    """(micro-batch, accumulation steps) that realise `batch_size` on `num_replicas` GPUs: as few accumulation
    steps as fit under `max_local_bsz`, and at least one on a single GPU above M0 (Pollux measures the gradient
    noise between micro-batches, which needs two of them)."""
    local = np.ceil(np.asarray(batch_size, dtype=float) / num_replicas - EPS)
    accum = np.ceil(local / max_local_bsz - EPS) - 1
    single = (np.asarray(num_replicas) == 1) & (batch_size > init_batch_size + EPS)
    accum = np.where(single, np.maximum(accum, 1), accum)
    return np.ceil(local / (accum + 1) - EPS).astype(int), accum.astype(int)


class GoodputModel:
    """A job's goodput per configuration. A job whose global batch is fixed (`batch_size`: a real job keeps the
    batch it was submitted with) is valued at that batch, not the best one; `micro_batch` fixes its micro-batch
    too (virtual workers': a GPU runs its share of them, the step lasting as long as the busiest GPU's)."""

    def __init__(self, perf: throughput.PerfParams, grad_sqr: float, grad_var: float, app, max_local_bsz=None,
                 batch_size=None, micro_batch=None):
        self.perf, self.grad_sqr, self.grad_var, self.app = perf, grad_sqr, grad_var, app
        self.max_local_bsz = max_local_bsz or app.max_local_bsz  # the GPU type's per-GPU batch limit
        self.batch_size, self.micro_batch = batch_size, micro_batch

    @property
    def max_replicas(self) -> int:
        """The most GPUs a step of the job can use."""
        return (self.batch_size or self.app.max_batch_size) // (self.micro_batch or self.app.min_local_bsz)

    def goodput(self, num_nodes, num_replicas, local_bsz, accum_steps, batch=None):
        """Progress (steps at M0) per second; `batch`: the global batch when not every GPU runs as many
        micro-batches (uneven virtual workers)."""
        batch = num_replicas * local_bsz * (accum_steps + 1) if batch is None else batch
        t = throughput.iteration_time(self.perf, num_nodes, num_replicas, local_bsz, accum_steps)
        return batch / t * efficiency(self.grad_sqr, self.grad_var, batch / self.app.init_batch_size)

    def best(self, num_nodes, num_replicas):
        """Best (goodput, micro-batch, accumulation steps) for each (nodes, replicas) pair (arrays); with a fixed
        batch, that batch's (goodput 0 where it cannot run)."""
        nodes = np.atleast_1d(np.asarray(num_nodes, dtype=float))
        reps = np.atleast_1d(np.asarray(num_replicas, dtype=float))
        if self.batch_size is not None:
            return self._at_batch(nodes, reps)
        inverse = slice(None)
        if len(reps) > DISTINCT_FROM:
            # A pair's values depend on its nodes only through whether there is more than one (sync_time): each
            # distinct (replicas, several nodes) is computed once, element by element as for all (the same bits).
            distinct, inverse = np.unique(2 * reps + (nodes > 1), return_inverse=True)
            nodes, reps = 1.0 + distinct % 2, distinct // 2
        batch, local, accum, speed = _speeds(self.perf, self.app, self.max_local_bsz, tuple(nodes), tuple(reps))
        good = speed * efficiency(self.grad_sqr, self.grad_var, batch / self.app.init_batch_size)
        pick = np.argmax(good, axis=0)[inverse], np.arange(len(reps))[inverse]
        return good[pick], local[pick], accum[pick]

    def _at_batch(self, nodes, reps):
        batch = self.batch_size
        if self.micro_batch is None:
            local, accum = split_batch(batch, reps, self.max_local_bsz, self.app.init_batch_size)
        else:
            local = np.full(reps.shape, self.micro_batch)
            accum = (np.ceil(batch / (reps * self.micro_batch) - EPS) - 1).astype(int)
        good = np.where(reps <= self.max_replicas, self.goodput(nodes, reps, local, accum, batch), 0.0)
        return good, local, accum


def _lru_bytes(limit):
    """functools.lru_cache bounded by the bytes of the arrays its function returns (a tuple of them), not by their
    number: results differ in size by a thousand times."""
    def decorate(function):
        kept, held = OrderedDict(), 0

        @wraps(function)
        def cached(*key):
            nonlocal held
            if key in kept:
                kept.move_to_end(key)
                return kept[key]
            kept[key] = result = function(*key)
            held += sum(a.nbytes for a in result)
            while held > limit and len(kept) > 1:
                held -= sum(a.nbytes for a in kept.popitem(last=False)[1])
            return result
        return cached
    return decorate


@_lru_bytes(SPEEDS_BYTES)
def _speeds(perf, app, max_local_bsz, nodes: tuple, reps: tuple):
    """(global batch, micro-batch, accumulation steps, samples per second; 0 where the micro-batch is out of
    bounds) of each candidate (rows) on each (nodes, replicas) pair (columns): what every job of `app` with these
    throughput parameters shares, whatever its gradient statistics (a round values thousands of jobs)."""
    nodes, reps = np.array(nodes), np.array(reps)
    low = np.maximum(app.init_batch_size, app.min_local_bsz * reps)
    candidates = np.geomspace(low, np.full_like(low, app.max_batch_size), CANDIDATES)  # (candidates, pairs)
    local, accum = split_batch(candidates, reps, max_local_bsz, app.init_batch_size)
    batch = reps * local * (accum + 1)
    speed = batch / throughput.iteration_time(perf, nodes, reps, local, accum)
    speed = np.where((local >= app.min_local_bsz) & (local <= max_local_bsz), speed, 0.0)
    for array in (batch, local, accum, speed):
        array.flags.writeable = False  # shared by every caller
    return batch, local, accum, speed


def fixed_batch_config(batch_size, num_replicas, app, max_local_bsz=None):
    """(micro-batch, accumulation steps) for a user-fixed global batch on `num_replicas` GPUs."""
    local, accum = split_batch(batch_size, num_replicas, max_local_bsz or app.max_local_bsz, app.init_batch_size)
    return int(local), int(accum)


def cap_local_bsz(local_bsz, accum_steps, num_replicas, app):
    """The artifact never lets the global batch exceed the largest validated one."""
    return min(local_bsz, math.floor(app.max_batch_size / (num_replicas * (accum_steps + 1))))


def packed(num_gpus, per_node) -> tuple:
    """GPUs per node of `num_gpus` GPUs packed on full nodes."""
    full, rest = divmod(num_gpus, per_node)
    return (per_node,) * full + ((rest,) if rest else ())


@lru_cache(maxsize=None)
def iteration_times(app, batch_size, per_node, gpu_type, total_gpus) -> tuple:
    """Measured time of one iteration at the fixed global batch `batch_size` on 0..max GPUs packed on full nodes
    (index = GPUs; entry 0 unused); the max as in the Pollux artifact: the batch over the smallest micro-batch
    (one GPU for single-GPU applications), at most the cluster's GPUs."""
    max_gpus = 1 if app.single_gpu else min(batch_size // app.min_local_bsz, total_gpus)
    times = [np.inf]
    for r in range(1, max_gpus + 1):
        local, accum = fixed_batch_config(batch_size, r, app)
        accum = max(accum, 1) if r == 1 else accum
        local = cap_local_bsz(local, accum, r, app)
        step, sync = app.profile(gpu_type).step_time(packed(r, per_node), local)
        times.append(step + accum * (step - sync))
    return tuple(times)
