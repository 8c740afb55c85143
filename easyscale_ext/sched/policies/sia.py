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
each type's GPU count, at least cost; above `exact_options` configurations (by default 10,000: hundreds of jobs; on
2,400 GPUs or more, 2,000) it keeps the choices of its LP relaxation but for the few jobs that splits, which it
decides itself (_solve). Jobs still restarting (or whose joiners still prepare) keep their configuration. Each type's
jobs are then placed on its nodes, largest first: a job whose type and count are unchanged keeps its GPUs, one that
fits on a node goes to the fullest node that holds it.
"""
from functools import lru_cache
from typing import Optional

import numpy as np

from ..models.throughput import fit_perf_params
from .base import Policy, place

MAX_GPUS = 64  # the artifact's cap on a job's GPUs
CLIP = 3000.0  # the artifact's cap on a configuration's cost: a restart factor of 0 then only deters a change
TINY = 1e-12
CLEAR = 1e-6  # relative cost margin by which each_alone's choices must win
EXACT_OPTIONS = 10_000  # configurations up to which the integer program is solved as it is, by default (_solve)
# From this many GPUs (Philly's 300 x 8, where it was judged against the exact program: BENCHMARKS.md), programs above
# the policy's `at_scale_options` configurations are decided on their LP relaxation's terms by default. Every shipped
# workload runs on a smaller cluster: its figures are the exact program's.
AT_SCALE_GPUS = 2_400
# The restart seconds the artifact's simulator charges in a job's restart factor (sia.py, by job name; others 30 s):
# its cluster's measured restarts, not those its job model pays (simulator.SIA: cifar10 50 s, yolov3 80 s).
ARTIFACT_RESTARTS = {"deepspeech2": 25.0, "imagenet": 250.0, "cifar10": 30.0, "bert": 120.0, "yolov3": 45.0}


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
    per_type_models = True  # the artifact's jobs on a cluster of several types keep a model per type
    at_scale_options = 2_000  # exact_options by default on AT_SCALE_GPUS or more (judged there: BENCHMARKS.md)

    def __init__(self, p=-0.5, lambda_n=1.1, lambda_a=0.01, restart_s=30.0, restart_by_app=None, in_place=None,
                 exact_options=None, name=None):
        """`restart_by_app`: application -> the seconds its restart factor charges instead of `restart_s` (the
        artifact's simulator: ARTIFACT_RESTARTS). `exact_options`: the most configurations a round's integer
        program is solved as it is; a larger one is decided on its LP relaxation's terms (_solve). None: EXACT_OPTIONS,
        or `at_scale_options` on a cluster of AT_SCALE_GPUS or more; EXACT_OPTIONS there is the exact program."""
        if p >= 0:
            raise ValueError("Sia's costs value^p need p < 0 (its default is -0.5)")
        if exact_options is not None and exact_options < 0:
            raise ValueError(f"exact_options {exact_options}: the most configurations solved exactly, 0 or more")
        self.exact_options = exact_options
        self.p, self.lambda_n, self.lambda_a, self.restart_s = p, lambda_n, lambda_a, restart_s
        self.restart_by_app = restart_by_app or {}
        self.growth = 2  # a job is offered at most this many times the most GPUs it has been measured on
        self.mixes_types = False  # offers configurations spanning GPU types (elastic-goodput)
        self.offset = 0.0  # a constant in every configuration's cost (_solve takes it out of the objective)
        self.stop_cost = 0.0  # what stopping a running job costs over any configuration of it (Sia's: nothing)
        if in_place is not None:  # its jobs run in place (the ablation "Sia + in place"), discounting by restart_s
            self.in_place = in_place
        if name is not None:
            self.name = name
        self._measured = {}  # job -> GPU type -> {(nodes, replicas, micro-batch): (step time, sync time)}
        self._seen = {}  # job -> its measurements already attributed to a type
        self._fits = {}  # (application, GPU type, frozenset of configurations) -> PerfParams
        self._solved = None  # the last program (_program's arguments and the offset) and its solution
        self._shape = None  # the cluster's (GPUs, types) per node; its types, GPUs a node, configurations, GPUs a type

    def batch_size(self, spec, app):
        return app.max_batch_size if app is not None and app.single_gpu else None

    def optimize(self, now, jobs, cluster, allocations):
        jobs = list(jobs)
        self._record(jobs)
        if self._shape is None or self._shape[0] != (cluster.gpus, cluster.types):  # first, or a node lost or added
            types = list(dict.fromkeys(cluster.types))
            per_node = {t: max(g for g, u in zip(cluster.gpus, cluster.types) if u == t) for t in types}
            counts = {t: gpu_counts(per_node[t], cluster.types.count(t)) for t in types}
            self._shape = (cluster.gpus, cluster.types), types, per_node, counts, cluster.room(cluster.gpus)
        _, types, per_node, counts, capacity = self._shape
        options, costs, forced = [], [], []  # one variable per (job, configuration: ((GPU type, GPUs), ...))
        for j, job in enumerate(jobs):
            alloc = allocations.get(job.name)
            current = config_of(alloc, cluster) if alloc else None
            age, r = now - job.arrival, self.restart_by_app.get(job.app.name, self.restart_s)
            factor = 1.0 if age < r else max(age - job.restarts * r, 0) / (age + r)
            for config, value in self._configs(job, types, counts, per_node).items():
                change = current is not None and config != current  # starting a waiting job is no change
                if change:
                    value *= factor
                cost = self._cost(value)
                options.append((j, config))
                costs.append(cost + (self.lambda_a if change else 0.0) - (self.stop_cost if current else 0.0))
                forced.append(config == current and job.reallocating)  # no reallocation mid-restart or mid-join
        chosen = self._solve(len(jobs), options, np.array(costs), np.array(forced), capacity)
        return self._place({jobs[j].name: config for j, config in chosen}, allocations, cluster)

    def _cost(self, value) -> float:
        """A configuration's cost in the program: value^p <= 1 less lambda_n (Sia's)."""
        return min(max(value, TINY) ** self.p, CLIP) - self.lambda_n

    def _configs(self, job, types, counts, per_node) -> dict:
        """Normalised goodput per configuration ((GPU type, GPUs),) the job may be offered: one type each."""
        return {((t, g),): v for (t, g), v in self._values(job, types, counts, per_node).items()}

    def _values(self, job, types, counts, per_node) -> dict:
        """Normalised goodput per (GPU type, GPUs) the job may be offered."""
        goodput = self._goodputs(job, types, counts, per_node)
        least = min((v for v in goodput.values() if v > 0), default=1.0)
        return {c: v / least for c, v in goodput.items() if v > 0}

    def _limit(self, job) -> int:
        app = job.app
        return min(max(self.growth * job.max_profiled_replicas, 1), MAX_GPUS, app.max_batch_size // app.min_local_bsz)

    def _estimator(self, job, types):
        """gpu_type -> (goodput model, throughput scale, the type the model was fitted on): the type's own model,
        else the first type's with a model scaled by the two types' 1-GPU throughputs (Sia's bootstrapping); {} if
        none is measured."""
        models = {t: m for t in types if (m := self._model(job, t)) is not None}
        if not models:
            return {}
        source = next(iter(models))  # the first type in the cluster's order with a model, as in the artifact
        return {t: (models[t], 1.0, t) if t in models else (
            models[source], one_gpu_throughput(job.app, t) / one_gpu_throughput(job.app, source), source)
            for t in types}

    def _goodputs(self, job, types, counts, per_node) -> dict:
        """Goodput per (GPU type, GPUs) the job may be offered, not normalised."""
        app = job.app
        if app.single_gpu:  # the artifact's rigid jobs: rated by their 1-GPU throughputs only
            return {(t, 1): one_gpu_throughput(app, t) for t in types}
        limit = self._limit(job)
        estimator = self._estimator(job, types)
        if not estimator:
            return {(t, 1): 1.0 for t in types}
        goodput = {}
        for t in types:
            gpus = np.array([g for g in counts[t] if g <= limit])
            model, scale, fitted = estimator[t]
            nodes = np.ceil(gpus / per_node[fitted])
            goodput.update(zip(((t, int(g)) for g in gpus), model.best(nodes, gpus)[0] * scale))
        return goodput

    def _model(self, job, gpu_type):
        measured = self._measured.get(job.name, {}).get(gpu_type)
        if not measured or job.grad is None:
            return None
        key = (job.app.name, gpu_type, frozenset(measured))
        if key not in self._fits:
            self._fits[key] = fit_perf_params(*zip(*((*k, *v) for k, v in measured.items())))
        return job.goodput_model(self._fits[key], gpu_type)

    def _record(self, jobs):
        """Attribute what each job measured in the last round to the GPU type it ran on: the job's own record says
        no type, and keeps only the first measurement of a configuration whatever the type."""
        active = {}
        for job in jobs:
            seen = active[job.name] = self._seen.get(job.name, set())
            if job.gpu_type is not None:
                measured = self._measured.setdefault(job.name, {}).setdefault(job.gpu_type, {})
                measured.update((k, job.observed[k]) for k in job.observed.keys() - seen)
                key = job.configuration
                if key in job.observed and key not in measured:  # measured before, on another type
                    measured[key] = job.app.profile(job.gpu_type).step_time(job.placement, job.local_bsz)
            seen |= job.observed.keys()
        self._seen = active
        self._measured = {n: m for n, m in self._measured.items() if n in active}

    def _solve(self, num_jobs, options, costs, forced, capacity) -> list:
        """The (job, configuration) chosen: at most one per job, within each type's GPUs, least total cost.

        `self.offset`, a constant in every configuration's cost, is taken out of all of them, so that HiGHS's
        relative gap (0.01 %) is relative to what the choice is worth, not to that constant: each job then takes
        exactly one of its configurations or a "no GPUs" variable that carries the constant. Without one (Sia),
        the program keeps the form its figures against the artifact were measured with: HiGHS may break near-ties
        differently between equivalent forms (one moved Sia's p99 on its setting by 10 %). Above `exact_options`
        configurations (by default, by the cluster's GPUs: __init__) the integer program is solved on its LP
        relaxation's terms: jobs the relaxation gives a whole configuration (or none) keep it, and an integer program
        of their own decides the few it splits (at most a couple per GPU type), over all their options and the GPUs
        left. A round in which each job has a clear best choice and those fit together needs no solver (each_alone):
        its answer is the solver's.
        """
        if not options:
            return []
        alone = each_alone(options, costs, forced, capacity, self.offset)
        if alone is not None:
            return alone
        exact = self.exact_options if self.exact_options is not None else (
            self.at_scale_options if sum(capacity.values()) >= AT_SCALE_GPUS else EXACT_OPTIONS)
        if len(options) <= exact:
            return [options[i] for i in np.flatnonzero(self._program(num_jobs, options, costs, forced, capacity) > 0.5)]
        x = self._program(num_jobs, options, costs, forced, capacity, integral=False)
        owner = np.array([j for j, _ in options])
        split = np.isin(owner, owner[(x > 1e-9) & (x < 1 - 1e-9)])
        taken = [options[i] for i in np.flatnonzero(~split & (x > 0.5))]
        rest = np.flatnonzero(split)
        if not rest.size:
            return taken
        number = {j: k for k, j in enumerate(dict.fromkeys(owner[rest]))}  # the split jobs, numbered anew
        left = {t: capacity[t] - sum(g for _, config in taken for u, g in config if u == t) for t in capacity}
        x = self._program(len(number), [(number[owner[i]], options[i][1]) for i in rest], costs[rest], forced[rest],
                          left)
        return taken + [options[i] for i in rest[x > 0.5]]

    def _program(self, num_jobs, options, costs, forced, capacity, integral=True) -> np.ndarray:
        """Each configuration's value in the program's solution (or its LP relaxation's). A program equal to the
        last one solved (one round in ten or so: nothing arrived, ended or aged in a way that moves a cost) has the
        last one's solution, which HiGHS, deterministic, would find again."""
        program = (num_jobs, integral, self.offset, capacity, costs, forced, options)
        if self._solved is not None and _same(self._solved[0], program):
            return self._solved[1]
        x = self._solve_program(*program)
        self._solved = program, x
        return x

    def _solve_program(self, num_jobs, integral, offset, capacity, costs, forced, options) -> np.ndarray:
        # here, not at the top: the CLI's parsers import this module (`status` stays quick)
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import csr_array

        idle = num_jobs if offset else 0  # the "no GPUs" variables, after the configurations
        size = len(options) + idle
        owner = np.concatenate([[j for j, _ in options], np.arange(idle)]).astype(int)
        types = list(capacity)
        rows, cols, gpus = [], [], []
        for i, (_, config) in enumerate(options):
            for gpu_type, g in config:
                rows.append(types.index(gpu_type))
                cols.append(i)
                gpus.append(float(g))
        constraints = [LinearConstraint(csr_array((np.ones(size), (owner, np.arange(size))), shape=(num_jobs, size)),
                                        1 if idle else 0, 1),
                       LinearConstraint(csr_array((gpus, (rows, cols)), shape=(len(types), size)),
                                        0, [capacity[t] for t in types])]
        result = milp(np.concatenate([costs - offset, np.full(idle, -offset)]),
                      integrality=np.full(size, int(integral)),
                      bounds=Bounds(np.concatenate([forced, np.zeros(idle)]).astype(float), 1.0),
                      constraints=constraints)
        if result.x is None:
            raise RuntimeError(f"Sia's integer program failed: {result.message}")
        return result.x[:len(options)]

    @staticmethod
    def _place(chosen, allocations, cluster) -> dict:
        """Node indices for each job's configuration: unchanged ones stay, the rest go largest first, each part on
        its type's nodes (one that fits on a node to the fullest node that holds it)."""
        result = {n: a for n, a in allocations.items() if n in chosen and config_of(a, cluster) == chosen[n]}
        free = cluster.free(result)
        size = lambda n: -sum(g for _, g in chosen[n])  # noqa: E731
        for name in sorted((n for n in chosen if n not in result), key=size):
            result[name] = sum((place(free, gpus, cluster.nodes_of(gpu_type), best_fit=True)
                                for gpu_type, gpus in chosen[name]), ())
        return result


def _same(a: tuple, b: tuple) -> bool:
    """Whether two programs (_program's tuples) are equal, their cheapest differences compared first."""
    return all(np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y for x, y in zip(a, b))


def each_alone(options, costs, forced, capacity, offset=0.0) -> Optional[list]:
    """The program's solution where it needs no solver: each job's forced configuration, else its least-cost one
    where that costs less than no GPUs, when those fit every type's GPUs together and each job's choice is clear
    (its best configuration, or none, beats the next by a margin far above HiGHS's tolerances). Then it is the
    only optimum, the one HiGHS returns; else None. On a large cluster most rounds are such."""
    coef = costs - offset  # as the program has them; no GPUs costs -offset (an idle variable) or 0 (none)
    owner = np.fromiter((j for j, _ in options), int, len(options))
    order = np.lexsort((coef, owner))  # by job, then cost
    grouped = owner[order]
    starts = np.flatnonzero(np.r_[True, grouped[1:] != grouped[:-1]])
    ends = np.r_[starts[1:], len(order)]
    none, used, chosen = -offset, dict.fromkeys(capacity, 0), []
    for start, end in zip(starts, ends):
        group = order[start:end]
        pinned = group[forced[group]]
        if pinned.size:
            best = pinned[0]
        else:
            ranked = sorted([none, *coef[group[:2]]])
            if ranked[1] - ranked[0] <= CLEAR * max(1.0, abs(ranked[0])):
                return None
            best = group[0] if coef[group[0]] < none else None
        if best is not None:
            chosen.append(options[best])
            for gpu_type, g in options[best][1]:
                used[gpu_type] += g
    return chosen if all(used[t] <= capacity[t] for t in capacity) else None


def config_of(alloc, cluster) -> tuple:
    """An allocation's configuration: ((GPU type, GPUs), ...) in the cluster's order of types."""
    counts = {}
    for node in alloc:
        counts[cluster.types[node]] = counts.get(cluster.types[node], 0) + 1
    if len(counts) == 1:  # most are: the order of the cluster's types need not be found
        return tuple(counts.items())
    order = list(dict.fromkeys(cluster.types))
    return tuple(sorted(counts.items(), key=lambda item: order.index(item[0])))
