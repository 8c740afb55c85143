"""Pollux (Qiao et al., OSDI'21): co-adaptive allocation that maximises the fairness-weighted goodput.

Each job's speedup for a (nodes, GPUs) choice is its best goodput there over its best goodput on a fair share
of the cluster (ceil(GPUs / jobs) GPUs on one node), each at the batch size and accumulation that maximise
goodput under its fitted throughput model and last gradient noise. A job whose allocation changes has its
speedup scaled by the restart factor max(age - restarts * delay, 0) / (age + delay). The cluster objective is
the power mean with p = -1 of the speedups (so starving a job costs much more than slowing one), maximised by
an evolutionary search over allocation matrices (jobs x nodes, GPUs per cell) with the artifact's crossover,
mutation and repair, compiled (csrc/sched/pollux_search.cpp). Two searches use them: the default, `search="nsga2"`,
is the artifact's, pymoo's NSGA-II (100 individuals, 100 generations, every individual distinct, two objectives: the
power mean and the cluster utility; seeded with the last round's Pareto set, it takes the set's best power mean),
checked against pymoo's on recorded rounds (tests/sched/test_pollux_nsga2.py). `search="elitist"`, a (mu + lambda)
search of 64 individuals for 24 generations, is the earlier fast one (BENCHMARKS.md, "Pollux's search").
`nodes="needed"` (off by default: not the artifact's) searches only the (virtual) nodes a job holds and, of each
GPU type, as many free nodes as hold every job at its GPU limit on whole nodes: allocations that spread a job
thinner over free nodes are not searched, and the search's random path differs, so decisions do too. On a large
cluster with few jobs a round then costs the jobs' nodes, not the cluster's (BENCHMARKS.md, "Scheduler cost").
Constraints, as in the artifact: at most one multi-node job per node, a job grows to at most twice the GPUs it has
been measured on (it must explore before it believes its model), node capacities.
On a cluster of several GPU types Pollux runs as in Sia's artifact, unaware of types: one model per job fitted
to whatever it measured, at most as many GPUs as the smallest type has, nodes seen as virtual nodes of the
smallest type's node size (`virtual_nodes`), and a job that the search spreads over types keeps only the type it
got most GPUs of (ties to the faster type); the others stay idle that round.
"""
import math

import numpy as np

from ... import _search
from ..models.cluster import Cluster
from .base import Policy

FASTER = ("a100", "v100", "p100", "rtx6000", "2080ti", "t4")  # the artifact's tie-break between GPU types


class PolluxPolicy(Policy):
    name = "pollux"
    profiled = True

    def __init__(self, seed=0, p=-1.0, restart_s=30.0, search="nsga2", population=None, generations=None,
                 nodes="all"):
        if search not in SEARCHES:
            raise ValueError(f"search {search!r}: expected one of {', '.join(SEARCHES)}")
        if nodes not in NODES:
            raise ValueError(f"nodes {nodes!r}: expected one of {', '.join(NODES)}")
        self.nodes = nodes
        self.rng = np.random.default_rng(seed)
        self.p, self.restart_s, self.search = p, restart_s, search
        self.population = population or SEARCHES[search][0]
        self.generations = generations or SEARCHES[search][1]
        self._last = ([], None, None)  # (job names, the states the next round starts from, their nodes) of last round
        self._virtual = {}  # job -> its GPUs per virtual node, as chosen last round
        self._tables = {}

    def batch_size(self, spec, app):
        return app.max_batch_size if app is not None and app.single_gpu else None

    def optimize(self, now, jobs, cluster, allocations):
        jobs = sorted(jobs, key=lambda j: (j.attained, j.arrival))  # earlier jobs win capacity conflicts
        held = np.zeros((len(jobs), cluster.num_nodes), dtype=np.int64)
        for j, job in enumerate(jobs):
            np.add.at(held[j], list(allocations.get(job.name, ())), 1)
        owner, view = virtual_nodes(cluster)
        base = self._virtual_rows(jobs, held, owner, view)
        smallest_type = min(view.room(view.gpus).values())  # the whole cluster when homogeneous
        max_gpus = np.array([_max_gpus(job, smallest_type) for job in jobs])
        cols = np.arange(view.num_nodes) if self.nodes == "all" else needed_nodes(base, view, max_gpus)
        searched = view if len(cols) == view.num_nodes else \
            Cluster(view.spec, tuple(view.gpus[c] for c in cols), tuple(view.types[c] for c in cols))
        speedup = self._speedup_tables(jobs, searched, max_gpus, view.total_gpus)
        age = np.maximum([now - job.arrival for job in jobs], 0.0)  # a job handed over before its arrival: new
        restarts = np.array([job.restarts for job in jobs])
        factor = np.maximum(age - restarts * self.restart_s, 0) / (age + self.restart_s)
        search = _Search(base[:, cols], np.asarray(searched.gpus), max_gpus, speedup, factor, self.p,
                         view.num_nodes / view.total_gpus, self.rng)
        run = search.nsga2 if self.search == "nsga2" else search.run
        population = run(self._seed_population(jobs, base[:, cols], cols), self.population, self.generations)
        self._last = ([j.name for j in jobs], population, cols)
        best = np.zeros_like(base)
        best[:, cols] = population[0]
        result, self._virtual = {}, {}
        for j, job in enumerate(jobs):
            self._virtual[job.name] = chosen = _one_type(best[j], view)
            row = np.bincount(owner, weights=chosen, minlength=cluster.num_nodes).astype(np.int64)
            if np.array_equal(row, held[j]):  # a move between virtual nodes of one node is none
                alloc = allocations.get(job.name, ())
            else:
                alloc = tuple(int(n) for n in np.repeat(np.arange(cluster.num_nodes), row))
            if alloc:
                result[job.name] = alloc
        return result

    def _virtual_rows(self, jobs, held, owner, view):
        """Each job's GPUs per virtual node: as Pollux chose them last round where that is still the job's
        allocation, else its GPUs on each node filled into that node's virtual nodes in order."""
        if len(owner) == held.shape[1]:
            return held
        rows = np.zeros((len(jobs), view.num_nodes), dtype=np.int64)
        last = [self._virtual.get(job.name) for job in jobs]
        kept = [v is not None and len(v) == len(owner) and
                np.array_equal(np.bincount(owner, weights=v, minlength=held.shape[1]), held[j])
                for j, v in enumerate(last)]
        for j in np.flatnonzero(kept):
            rows[j] = last[j]
        free = np.asarray(view.gpus) - rows.sum(axis=0)
        for j in np.flatnonzero(~np.asarray(kept, dtype=bool)):
            for v in range(len(owner)):
                rows[j, v] = take = max(min(free[v], held[j, owner[v]] - rows[j, owner == owner[v]].sum()), 0)
                free[v] -= take
        return rows

    def _seed_population(self, jobs, base, cols):
        """Last round's result (the NSGA-II's Pareto set, the elitist search's population) with rows moved to this
        round's job order (new jobs get nothing) and columns to this round's nodes `cols` (GPUs on a node not
        searched now are dropped); the current allocation first, unless (as in the artifact's NSGA-II) there is a
        last round to start from."""
        names, last, last_cols = self._last
        if last is None:
            return base[None]
        seeds = np.zeros((len(last), *base.shape), dtype=np.int64)
        index = {n: i for i, n in enumerate(names)}
        if np.array_equal(cols, last_cols):
            now, then = slice(None), slice(None)
        else:
            position = dict(zip(last_cols.tolist(), range(len(last_cols))))
            now = np.array([k for k, c in enumerate(cols.tolist()) if c in position], dtype=np.int64)
            then = np.array([position[c] for c in cols[now].tolist()], dtype=np.int64)
        for j, job in enumerate(jobs):
            if job.name in index:
                seeds[:, j, now] = last[:, index[job.name], then]
        return seeds if self.search == "nsga2" else np.concatenate([base[None], seeds])

    def _speedup_tables(self, jobs, cluster, max_gpus, total_gpus):
        """speedup[j, nodes, GPUs], for GPUs up to the job's limit and nodes up to the (searched) cluster's or the
        most GPUs a job may take, whichever is fewer; a job's fair share is of the `total_gpus` of the whole
        cluster."""
        per_node = max(cluster.gpus)
        fair = math.ceil(total_gpus / len(jobs))
        gpu_axis = int(max_gpus.max()) + 1
        table = np.zeros((len(jobs), min(cluster.num_nodes + 1, gpu_axis), gpu_axis))
        tables = {}
        for j, job in enumerate(jobs):
            model = job.goodput_model()
            if model is None:  # never measured: assume it scales linearly
                table[j, :, 1:] = np.arange(1, table.shape[2]) / fair
                continue
            spread = min(cluster.num_nodes, int(max_gpus[j]))  # a job has a GPU on each of its nodes: more is 0
            key = (model.perf, model.grad_sqr, model.grad_var, model.max_local_bsz, int(max_gpus[j]), fair, spread,
                   per_node)
            if key not in self._tables:
                reps = np.arange(1, max_gpus[j] + 1)
                nodes = np.arange(1, spread + 1)
                n, r = (a.ravel() for a in np.meshgrid(nodes, reps, indexing="ij"))
                ok = (n <= r) & (r <= n * per_node)
                values = np.zeros((spread + 1, max_gpus[j] + 1))
                values[n[ok], r[ok]] = model.best(n[ok], r[ok])[0]
                fair_gpus = min(fair, model.max_replicas)
                self._tables[key] = values / model.best(1, fair_gpus)[0][0]
            tables[key] = self._tables[key]
            table[j, : spread + 1, : max_gpus[j] + 1] = tables[key]
        self._tables = tables  # keep only what this round used
        return table


def virtual_nodes(cluster):
    """(the node of each virtual node, the cluster of virtual nodes) that Pollux sees: as in Sia's artifact, on a
    cluster of several types, every node split into nodes of the smallest type's node size (an 8-GPU A100 node
    beside 4-GPU T4 nodes is two of 4; one multi-node job per node and the model's network term apply to them);
    on one type, the nodes themselves."""
    size = min(max(g for g, t in zip(cluster.gpus, cluster.types) if t == u) for u in set(cluster.types))
    owner, gpus = [], []
    for node, g in enumerate(cluster.gpus):
        parts = [size] * (g // size) + ([g % size] if g % size else [])
        owner += [node] * len(parts)
        gpus += parts
    if len(owner) == cluster.num_nodes:
        return np.arange(cluster.num_nodes), cluster
    return np.array(owner), Cluster(cluster.spec, tuple(gpus), tuple(cluster.types[n] for n in owner))


def needed_nodes(base, cluster, max_gpus):
    """The nodes `nodes="needed"` searches, in order: those any job holds, and of each GPU type the first free
    ones, as many as hold every job at its GPU limit on whole nodes of that type."""
    held = base.sum(axis=0) > 0
    types, gpus = np.asarray(cluster.types), np.asarray(cluster.gpus)
    keep = held.copy()
    for t in set(cluster.types):
        free = np.flatnonzero(~held & (types == t))
        if len(free):
            keep[free[:int(np.ceil(max_gpus / gpus[free].max()).sum())]] = True
    return np.flatnonzero(keep)


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


SEARCHES = {"nsga2": (100, 100), "elitist": (64, 24)}  # search -> its default (population, generations)
NODES = ("all", "needed")  # the nodes a round searches


class _Search:
    """The artifact's search problem over allocation matrices of shape (jobs, nodes) (objectives, repair, mutation,
    crossover) and the two searches that use it, compiled (csrc/sched/pollux_search.cpp); each random operation
    takes its seed from `rng`. States are int64 arrays of shape (count, jobs, nodes)."""

    def __init__(self, base, capacity, max_gpus, speedup, factor, p, scale, rng):
        self.base, self.rng = base, rng
        self.problem = _search.Problem(base, capacity, max_gpus, speedup, factor, p, scale)

    def _seed(self):
        return int(self.rng.integers(2 ** 63))

    def objective(self, states):
        """Power mean of the (restart-discounted) speedups, per state; higher is better."""
        return self.problem.objective(states)

    def utility(self, states):
        """The artifact's cluster utility, per state: the jobs' speedups over the GPUs of the nodes in use."""
        return self.problem.utility(states)

    def _goals(self, states):
        """Both objectives to minimise, as pymoo's F: (states, 2)."""
        return -np.column_stack([self.objective(states), self.utility(states)])

    def repair(self, states):
        """Feasible states, favouring earlier jobs (and, within a job, randomly chosen nodes)."""
        return self.problem.repair(states, self._seed())

    def mutate(self, states):
        return self.problem.mutate(states, self._seed())

    def crossover(self, a, b):
        """Single point over jobs, per pair: the first children of every pair, then the second ones."""
        return self.problem.crossover(a, b, self._seed())

    def run(self, seeds, size, generations):
        """The elitist search (mu + lambda): the final population, best first. Most children copy an elite one,
        and the population collapses onto a few allocations: the artifact's figures come from NSGA-II."""
        return self.problem.elitist(seeds, size, generations, self._seed())

    def nsga2(self, seeds, size, generations):
        """pymoo's NSGA-II as the artifact runs it: the final Pareto set (power mean, cluster utility), best power
        mean first. `generations` counts the first population, as pymoo's ("n_gen", 100) does."""
        return self.problem.nsga2(seeds, size, generations, self._seed())
