"""Sia (Jayaram Subramanya et al., SOSP'23): heterogeneity-aware, goodput-optimised allocation by an integer program.

Each round every job is offered configurations on each GPU type: 1, 2, 4, ... GPUs within one node, then whole
nodes (k x the GPUs per node), up to twice the most GPUs it has been measured on, a limit shared by all types (the
artifact's `--share_max_replicas`). A configuration's value is the job's goodput there, batch tuned for goodput,
under a throughput model fitted per GPU type to the step times the job measured on that type. For a type it has
not run on, Sia bootstraps (`--project_throughputs`) from the first type it has a model for: that type's goodput on
the same number of GPUs times the ratio of the two types' 1-GPU throughputs in the profiles (largest per-GPU batch
over the step time). A job measured nowhere yet is offered 1 GPU of each type, valued alike.

Goodputs of different jobs are not comparable, so each job's values are divided by its least one (its goodput on
one GPU of its slowest type): values >= 1. A configuration other than the job's current one is scaled by Pollux's
restart factor max(age - restarts * R, 0) / (age + R) (1 while age < R). With p = -0.5 a chosen configuration costs
value^p <= 1, convex in the value so that starving a job costs more than slowing one; every job left without GPUs
costs lambda_n = 1.1 more than any allocation (so every job runs while GPUs last), and a change of allocation
lambda_a = 0.01 more. The integer program (HiGHS, scipy.optimize.milp) picks at most one configuration per job, within
each type's GPU count, at least cost. Jobs still restarting keep their configuration. Each type's jobs are then
placed on its nodes, largest first: a job whose type and count are unchanged keeps its GPUs, one that fits on a node
goes to the fullest node that holds it.
"""
from functools import lru_cache

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import csr_array

from ..models.goodput import GoodputModel
from ..models.throughput import fit_perf_params
from .base import Policy, place

MAX_GPUS = 64  # the artifact's cap on a job's GPUs
CLIP = 3000.0  # the artifact's cap on a configuration's cost: a restart factor of 0 then only deters a change
TINY = 1e-12


def gpu_counts(per_node: int, num_nodes: int) -> list:
    """Sia's configurations on nodes of `per_node` GPUs: powers of two below a node, then whole nodes."""
    within = [1 << k for k in range(per_node.bit_length()) if 1 << k < per_node]
    return within + [per_node * k for k in range(1, num_nodes + 1)]


@lru_cache(maxsize=None)
def one_gpu_throughput(app, gpu_type) -> float:
    """Samples per second on one GPU at the largest profiled per-GPU batch, as the artifact rates a GPU type."""
    bsz, step, _ = app.profile(gpu_type).exact[(1,)]
    return float(bsz.max() / step.max())


class SiaPolicy(Policy):
    name = "sia"
    profiled = True

    def __init__(self, p=-0.5, lambda_n=1.1, lambda_a=0.01, restart_s=30.0):
        if p >= 0:
            raise ValueError("Sia's costs value^p need p < 0 (its default is -0.5)")
        self.p, self.lambda_n, self.lambda_a, self.restart_s = p, lambda_n, lambda_a, restart_s
        self._measured = {}  # job -> GPU type -> {(nodes, replicas, micro-batch): (step time, sync time)}
        self._seen = {}  # job -> its measurements already attributed to a type
        self._fits = {}  # (application, GPU type, frozenset of configurations) -> PerfParams

    def batch_size(self, spec, app):
        return app.max_batch_size if app is not None and app.single_gpu else None

    def optimize(self, now, jobs, cluster, allocations):
        jobs = list(jobs)
        self._record(jobs)
        types = list(dict.fromkeys(cluster.types))
        per_node = {t: max(g for g, u in zip(cluster.gpus, cluster.types) if u == t) for t in types}
        counts = {t: gpu_counts(per_node[t], cluster.types.count(t)) for t in types}
        options, costs, forced = [], [], []  # one variable per (job, GPU type, GPUs)
        for j, job in enumerate(jobs):
            alloc = allocations.get(job.name)
            current = (cluster.types[alloc[0]], len(alloc)) if alloc else None
            age, r = now - job.arrival, self.restart_s
            factor = 1.0 if age < r else max(age - job.restarts * r, 0) / (age + r)
            for config, value in self._values(job, types, counts, per_node).items():
                change = current is not None and config != current  # starting a waiting job is no change
                if change:
                    value *= factor
                cost = min(max(value, TINY) ** self.p, CLIP) - self.lambda_n
                options.append((j, *config))
                costs.append(cost + (self.lambda_a if change else 0.0))
                forced.append(config == current and job.delay_left > 0)  # no reallocation mid-restart
        chosen = self._solve(len(jobs), options, np.array(costs), np.array(forced), cluster.room(cluster.gpus))
        return self._place({jobs[j].name: (t, g) for j, t, g in chosen}, allocations, cluster)

    def _values(self, job, types, counts, per_node) -> dict:
        """Normalised goodput per (GPU type, GPUs) the job may be offered."""
        app = job.app
        if app.single_gpu:  # the artifact's rigid jobs: rated by their 1-GPU throughputs only
            rate = {t: one_gpu_throughput(app, t) for t in types}
            return {(t, 1): rate[t] / min(rate.values()) for t in types}
        limit = min(max(2 * job.max_profiled_replicas, 1), MAX_GPUS, app.max_batch_size // app.min_local_bsz)
        models = {t: m for t in types if (m := self._model(job, t)) is not None}
        if not models:
            return {(t, 1): 1.0 for t in types}
        source = next(iter(models))  # the first type in the cluster's order with a model, as in the artifact
        goodput = {}
        for t in types:
            gpus = np.array([g for g in counts[t] if g <= limit])
            model, scale = (models[t], 1.0) if t in models else (
                models[source], one_gpu_throughput(app, t) / one_gpu_throughput(app, source))
            nodes = np.ceil(gpus / per_node[t if t in models else source])
            goodput.update(zip(((t, int(g)) for g in gpus), model.best(nodes, gpus)[0] * scale))
        least = min((v for v in goodput.values() if v > 0), default=1.0)
        return {c: v / least for c, v in goodput.items() if v > 0}

    def _model(self, job, gpu_type):
        measured = self._measured.get(job.name, {}).get(gpu_type)
        if not measured or job.grad is None:
            return None
        key = (job.app.name, gpu_type, frozenset(measured))
        if key not in self._fits:
            self._fits[key] = fit_perf_params(*zip(*((*k, *v) for k, v in measured.items())))
        return GoodputModel(self._fits[key], *job.grad, job.app)

    def _record(self, jobs):
        """Attribute what each job measured in the last round to the GPU type it ran on: the job's own record says
        no type, and keeps only the first measurement of a configuration whatever the type."""
        active = {}
        for job in jobs:
            seen = active[job.name] = self._seen.get(job.name, set())
            if job.gpu_type is not None:
                measured = self._measured.setdefault(job.name, {}).setdefault(job.gpu_type, {})
                measured.update((k, job.observed[k]) for k in job.observed.keys() - seen)
                key = (len(job.placement), job.num_gpus, job.local_bsz)
                if key in job.observed and key not in measured:  # measured before, on another type
                    measured[key] = job.app.profile(job.gpu_type).step_time(job.placement, job.local_bsz)
            seen |= job.observed.keys()
        self._seen = active
        self._measured = {n: m for n, m in self._measured.items() if n in active}

    def _solve(self, num_jobs, options, costs, forced, capacity) -> list:
        """The (job, GPU type, GPUs) chosen: at most one per job, within each type's GPUs, least total cost."""
        if not options:
            return []
        jobs = np.array([j for j, _, _ in options])
        types = list(capacity)
        type_of = np.array([types.index(t) for _, t, _ in options])
        gpus = np.array([g for _, _, g in options], dtype=float)
        cols = np.arange(len(options))
        one_each = csr_array((np.ones(len(options)), (jobs, cols)), shape=(num_jobs, len(options)))
        fits = csr_array((gpus, (type_of, cols)), shape=(len(types), len(options)))
        result = milp(costs, integrality=np.ones(len(options)), bounds=Bounds(forced.astype(float), 1.0),
                      constraints=[LinearConstraint(one_each, 0, 1),
                                   LinearConstraint(fits, 0, [capacity[t] for t in types])])
        if result.x is None:
            raise RuntimeError(f"Sia's integer program failed: {result.message}")
        return [options[i] for i in np.flatnonzero(result.x > 0.5)]

    @staticmethod
    def _place(chosen, allocations, cluster) -> dict:
        """Node indices for each job's (GPU type, GPUs): unchanged ones stay, the rest go largest first."""
        result = {n: a for n, a in allocations.items()
                  if n in chosen and (cluster.types[a[0]], len(a)) == chosen[n]}
        free = cluster.free(result)
        for name in sorted((n for n in chosen if n not in result), key=lambda n: -chosen[n][1]):
            gpu_type, gpus = chosen[name]
            result[name] = place(free, gpus, cluster.nodes_of(gpu_type), best_fit=True)
        return result
