"""Pollux (Qiao et al., OSDI'21): co-adaptive allocation that maximises the fairness-weighted goodput.

Each job's speedup for a (nodes, GPUs) choice is its best goodput there over its best goodput on a fair share
of the cluster (ceil(GPUs / jobs) GPUs on one node), each at the batch size and accumulation that maximise
goodput under its fitted throughput model and last gradient noise. A job whose allocation changes has its
speedup scaled by the restart factor max(age - restarts * delay, 0) / (age + delay). The cluster objective is
the power mean with p = -1 of the speedups (so starving a job costs much more than slowing one), maximised by
an evolutionary search over allocation matrices (jobs x nodes, GPUs per cell), seeded with the last round's
population. Constraints, as in the artifact: at most one multi-node job per node, a job grows to at most twice
the GPUs it has been measured on (it must explore before it believes its model), node capacities.
On a cluster of several GPU types Pollux runs as in Sia's artifact, unaware of types: one model per job fitted
to whatever it measured, at most as many GPUs as the smallest type has, and a job that the search spreads over
types keeps only the type it got most GPUs of (ties to the faster type); the others stay idle that round.
"""
import math

import numpy as np

from .base import Policy

FLOOR = 1e-3  # added to every speedup so that the power mean is finite when a job gets nothing
FASTER = ("a100", "v100", "p100", "rtx6000", "2080ti", "t4")  # the artifact's tie-break between GPU types


class PolluxPolicy(Policy):
    name = "pollux"
    profiled = True

    def __init__(self, seed=0, p=-1.0, restart_s=30.0, population=64, generations=24, distinct=False):
        self.rng = np.random.default_rng(seed)
        self.p, self.restart_s = p, restart_s
        self.population, self.generations = population, generations
        self.distinct = distinct  # every individual distinct, as pymoo keeps the artifact's (_Search.run)
        self._last = ([], None)  # (job names, population) of the previous round
        self._tables = {}

    def batch_size(self, spec, app):
        return app.max_batch_size if app is not None and app.single_gpu else None

    def optimize(self, now, jobs, cluster, allocations):
        jobs = sorted(jobs, key=lambda j: (j.attained, j.arrival))  # earlier jobs win capacity conflicts
        capacity = np.asarray(cluster.gpus)
        base = np.zeros((len(jobs), cluster.num_nodes), dtype=np.int64)
        for j, job in enumerate(jobs):
            np.add.at(base[j], list(allocations.get(job.name, ())), 1)
        smallest_type = min(cluster.room(cluster.gpus).values())  # the whole cluster when homogeneous
        max_gpus = np.array([_max_gpus(job, smallest_type) for job in jobs])
        speedup = self._speedup_tables(jobs, cluster, max_gpus)
        age = np.array([now - job.arrival for job in jobs])
        restarts = np.array([job.restarts for job in jobs])
        factor = np.maximum(age - restarts * self.restart_s, 0) / (age + self.restart_s)
        search = _Search(base, capacity, max_gpus, speedup, factor, self.p, cluster.num_nodes / cluster.total_gpus,
                         self.rng)
        population = search.run(self._seed_population(jobs, base), self.population, self.generations, self.distinct)
        self._last = ([j.name for j in jobs], population)
        best = population[0]
        result = {}
        for j, job in enumerate(jobs):
            row = _one_type(best[j], cluster)
            if np.array_equal(row, base[j]):
                alloc = allocations.get(job.name, ())
            else:
                alloc = tuple(int(n) for n in np.repeat(np.arange(cluster.num_nodes), row))
            if alloc:
                result[job.name] = alloc
        return result

    def _seed_population(self, jobs, base):
        """Last round's population with rows moved to this round's job order (new jobs get nothing), and the
        current allocation."""
        names, last = self._last
        seeds = np.zeros((0 if last is None else len(last), *base.shape), dtype=np.int64)
        if last is not None:
            index = {n: i for i, n in enumerate(names)}
            for j, job in enumerate(jobs):
                if job.name in index:
                    seeds[:, j] = last[:, index[job.name]]
        return np.concatenate([base[None], seeds])

    def _speedup_tables(self, jobs, cluster, max_gpus):
        """speedup[j, nodes, GPUs], for GPUs up to the job's limit and nodes up to the cluster's."""
        per_node = max(cluster.gpus)
        fair = math.ceil(cluster.total_gpus / len(jobs))
        table = np.zeros((len(jobs), cluster.num_nodes + 1, int(max_gpus.max()) + 1))
        tables = {}
        for j, job in enumerate(jobs):
            model = job.goodput_model()
            if model is None:  # never measured: assume it scales linearly
                table[j, :, 1:] = np.arange(1, table.shape[2]) / fair
                continue
            key = (model.perf, model.grad_sqr, model.grad_var, model.max_local_bsz, int(max_gpus[j]), fair)
            if key not in self._tables:
                reps = np.arange(1, max_gpus[j] + 1)
                nodes = np.arange(1, cluster.num_nodes + 1)
                n, r = (a.ravel() for a in np.meshgrid(nodes, reps, indexing="ij"))
                ok = (n <= r) & (r <= n * per_node)
                values = np.zeros((cluster.num_nodes + 1, max_gpus[j] + 1))
                values[n[ok], r[ok]] = model.best(n[ok], r[ok])[0]
                fair_gpus = min(fair, job.app.max_batch_size // job.app.min_local_bsz)
                self._tables[key] = values / model.best(1, fair_gpus)[0][0]
            tables[key] = self._tables[key]
            table[j, :, : max_gpus[j] + 1] = tables[key]
        self._tables = tables  # keep only what this round used
        return table


def _one_type(row, cluster):
    """GPUs per node of one job with only the GPU type it has most of kept (ties to the faster type)."""
    types = np.asarray(cluster.types)
    counts = {t: int(row[types == t].sum()) for t in set(types[row > 0])}
    if len(counts) <= 1:
        return row
    rank = lambda t: FASTER.index(t) if t in FASTER else len(FASTER)  # noqa: E731
    keep = max(counts, key=lambda t: (counts[t], -rank(t)))
    return np.where(types == keep, row, 0)


def _max_gpus(job, total_gpus) -> int:
    app = job.app
    if app.single_gpu:
        return 1
    return min(max(2 * job.max_profiled_replicas, 1), total_gpus, app.max_batch_size // app.min_local_bsz)


class _Search:
    """Evolutionary search (mu + lambda, elitist) over allocation matrices of shape (jobs, nodes)."""

    def __init__(self, base, capacity, max_gpus, speedup, factor, p, scale, rng):
        self.base, self.capacity, self.max_gpus = base, capacity, max_gpus
        self.speedup, self.factor, self.p, self.scale, self.rng = speedup, factor, p, scale, rng
        self.rows = np.arange(base.shape[0])

    def objective(self, states):
        """Power mean of the (restart-discounted) speedups, per state; higher is better."""
        nodes, gpus = np.count_nonzero(states, axis=2), states.sum(axis=2)
        s = self.speedup[self.rows, nodes, gpus]
        s = np.where((states != self.base).any(axis=2), s * self.factor, s) * self.scale + FLOOR
        return np.mean(s ** self.p, axis=1) ** (1 / self.p)

    def repair(self, states):
        """Make states feasible, favouring earlier jobs (and, within a job, randomly chosen nodes)."""
        # One multi-node job per node: later multi-node jobs leave a node an earlier one uses.
        spread = np.count_nonzero(states, axis=2, keepdims=True) > 1
        states[((states > 0) & spread).cumsum(axis=1) > 1] = 0
        # No job beyond its GPU limit: trim the excess from randomly ordered nodes. The order is drawn for every
        # job, but only the jobs over their limit change (so are sorted).
        noise, over = self.rng.random(states.shape), states.sum(axis=2) > self.max_gpus
        rows, order = states[over], np.argsort(noise[over], axis=1)
        trimmed = _trim(np.take_along_axis(rows, order, axis=1), self.max_gpus[over.nonzero()[1], None])
        np.put_along_axis(rows, order, trimmed, axis=1)
        states[over] = rows
        # Node capacities: earlier jobs first (only the nodes over capacity change).
        by_node = states.transpose(0, 2, 1)
        over = by_node.sum(axis=2) > self.capacity
        by_node[over] = _trim(by_node[over], self.capacity[over.nonzero()[1], None])
        return states

    def mutate(self, states):
        rng, (pop, jobs, _) = self.rng, states.shape
        reset = rng.random((pop, jobs, 1)) < 0.1
        states = np.where(reset, self.base, states)
        states[(rng.random((pop, jobs, 1)) < 0.1) & (rng.random(states.shape) < 0.1)] = 0
        # Grow each job, on average, on one node with free GPUs and on one of its own nodes with free GPUs:
        # growth into full nodes would only be undone by the repair. A node is chosen with probability p_room (the
        # same for every job), one of the job's own with p_own, either with p_room + p_own - p_room * p_own.
        room = states.sum(axis=1, keepdims=True) < self.capacity  # (population, 1, nodes)
        own = room & (states > 0)
        p_room = room / np.maximum(room.sum(axis=2, keepdims=True), 1)
        p_own = 1 / np.maximum(own.sum(axis=2, keepdims=True), 1)  # where own
        draw = rng.random(states.shape)
        grow = draw < p_room
        k, j, n = own.nonzero()
        grow[k, j, n] = draw[k, j, n] < p_room[k, 0, n] + p_own[k, j, 0] - p_room[k, 0, n] * p_own[k, j, 0]
        return np.where(grow, rng.integers(states, self.capacity + 1), states)

    def crossover(self, a, b):
        """Single point over jobs: the first jobs' rows from one parent, the rest from the other."""
        cut = self.rng.integers(0, a.shape[1] + 1, size=(len(a), 1, 1)) > self.rows[:, None]
        return np.concatenate([np.where(cut, a, b), np.where(cut, b, a)])

    def run(self, seeds, size, generations, distinct=False):
        """The final population, best first. With `distinct`, no two individuals are the same: each generation
        mates again (up to DISTINCT_TRIES times) until it has `size` children new to the population, as pymoo's
        NSGA-II (`eliminate_duplicates`) does in the artifact; without it most children copy an elite one and
        the population collapses onto a few allocations (BENCHMARKS.md, "Where Pollux's gap is")."""
        population = self.repair(seeds.copy())
        if distinct:
            population = population[np.sort(np.unique(population.reshape(len(population), -1), axis=0,
                                                      return_index=True)[1])]
        value = self.objective(population)
        for _ in range(generations):
            children = (self._distinct_offspring if distinct else self._offspring)(population, value, size)
            if not len(children):
                continue
            population = np.concatenate([population, children])
            value = np.concatenate([value, self.objective(children)])
            keep = np.argsort(-value, kind="stable")[:size]
            population, value = population[keep], value[keep]
        return population

    def _offspring(self, population, value, size):
        """`size` children (an even number): binary tournaments pick the parents, then crossover, mutation and
        repair."""
        pairs = self.rng.integers(0, len(population), size=(2, size))
        parents = np.where(value[pairs[0]] >= value[pairs[1]], pairs[0], pairs[1])
        half = size // 2
        children = self.crossover(population[parents[:half]], population[parents[half:2 * half]])
        return self.repair(self.mutate(children))

    def _distinct_offspring(self, population, value, size):
        """Up to `size` children, each new to the population and to the others: mates up to DISTINCT_TRIES
        times."""
        seen, children = {s.tobytes() for s in population}, []
        for _ in range(DISTINCT_TRIES):
            children += [c for c in self._offspring(population, value, size) if _new(c, seen)]
            if len(children) >= size:
                break
        return np.array(children[:size])


DISTINCT_TRIES = 4  # matings per generation, at most, to find children new to the population


def _new(state, seen) -> bool:
    """Whether `state` is not in `seen` (the bytes of the states met so far); it is from now on."""
    key = state.tobytes()
    if key in seen:
        return False
    seen.add(key)
    return True


def _trim(rows, limit):
    """Each row (a job's GPUs per node, or a node's per job) cut to `limit` in all, the excess taken off its end."""
    return np.diff(np.minimum(rows.cumsum(axis=1), limit), axis=1, prepend=0)
