"""Pollux (Qiao et al., OSDI'21): co-adaptive allocation that maximises the fairness-weighted goodput.

Each job's speedup for a (nodes, GPUs) choice is its best goodput there over its best goodput on a fair share
of the cluster (ceil(GPUs / jobs) GPUs on one node), each at the batch size and accumulation that maximise
goodput under its fitted throughput model and last gradient noise. A job whose allocation changes has its
speedup scaled by the restart factor max(age - restarts * delay, 0) / (age + delay). The cluster objective is
the power mean with p = -1 of the speedups (so starving a job costs much more than slowing one), maximised by
an evolutionary search over allocation matrices (jobs x nodes, GPUs per cell) with the artifact's crossover,
mutation and repair. Two searches use them: `search="nsga2"` is the artifact's, pymoo's NSGA-II (100 individuals,
100 generations, every individual distinct, two objectives: the power mean and the cluster utility; seeded with
the last round's Pareto set, it takes the set's best power mean), written with numpy and checked against pymoo's
on recorded rounds (tests/sched/test_pollux_nsga2.py). The default, `search="elitist"`, a (mu + lambda) search of
64 individuals for 24 generations, lands as close to the artifact's results at a seventh of the CPU
(BENCHMARKS.md, "Pollux's search"). Constraints, as in the artifact: at most one multi-node job per node, a job
grows to at most twice the GPUs it has been measured on (it must explore before it believes its model), node
capacities.
On a cluster of several GPU types Pollux runs as in Sia's artifact, unaware of types: one model per job fitted
to whatever it measured, at most as many GPUs as the smallest type has, nodes seen as virtual nodes of the
smallest type's node size (`virtual_nodes`), and a job that the search spreads over types keeps only the type it
got most GPUs of (ties to the faster type); the others stay idle that round.
"""
import math
import warnings

import numpy as np

from ..models.cluster import Cluster
from .base import Policy

FLOOR = 1e-3  # added to every speedup so that the power mean is finite when a job gets nothing
FASTER = ("a100", "v100", "p100", "rtx6000", "2080ti", "t4")  # the artifact's tie-break between GPU types


class PolluxPolicy(Policy):
    name = "pollux"
    profiled = True

    def __init__(self, seed=0, p=-1.0, restart_s=30.0, search="elitist", population=None, generations=None,
                 distinct=None):
        if distinct is not None:  # the elitist search with distinct individuals gave way to the artifact's NSGA-II
            warnings.warn("PolluxPolicy(distinct=...) is deprecated: use search='nsga2' (every individual distinct, "
                          "as the artifact's) or search='elitist'", DeprecationWarning, stacklevel=2)
            search = "nsga2" if distinct else search
        if search not in SEARCHES:
            raise ValueError(f"search {search!r}: expected one of {', '.join(SEARCHES)}")
        self.rng = np.random.default_rng(seed)
        self.p, self.restart_s, self.search = p, restart_s, search
        self.population = population or SEARCHES[search][0]
        self.generations = generations or SEARCHES[search][1]
        self._last = ([], None)  # (job names, the states the next round starts from) of the previous round
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
        speedup = self._speedup_tables(jobs, view, max_gpus)
        age = np.maximum([now - job.arrival for job in jobs], 0.0)  # a job handed over before its arrival: new
        restarts = np.array([job.restarts for job in jobs])
        factor = np.maximum(age - restarts * self.restart_s, 0) / (age + self.restart_s)
        search = _Search(base, np.asarray(view.gpus), max_gpus, speedup, factor, self.p,
                         view.num_nodes / view.total_gpus, self.rng)
        run = search.nsga2 if self.search == "nsga2" else search.run
        population = run(self._seed_population(jobs, base), self.population, self.generations)
        self._last = ([j.name for j in jobs], population)
        result, self._virtual = {}, {}
        for j, job in enumerate(jobs):
            self._virtual[job.name] = chosen = _one_type(population[0][j], view)
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

    def _seed_population(self, jobs, base):
        """Last round's result (the NSGA-II's Pareto set, the elitist search's population) with rows moved to this
        round's job order (new jobs get nothing); the current allocation first, unless (as in the artifact's
        NSGA-II) there is a last round to start from."""
        names, last = self._last
        if last is None:
            return base[None]
        seeds = np.zeros((len(last), *base.shape), dtype=np.int64)
        index = {n: i for i, n in enumerate(names)}
        for j, job in enumerate(jobs):
            if job.name in index:
                seeds[:, j] = last[:, index[job.name]]
        return seeds if self.search == "nsga2" else np.concatenate([base[None], seeds])

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
                fair_gpus = min(fair, model.max_replicas)
                self._tables[key] = values / model.best(1, fair_gpus)[0][0]
            tables[key] = self._tables[key]
            table[j, :, : max_gpus[j] + 1] = tables[key]
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
CROSSOVER_P = 0.9  # pymoo's: the share of matings that cross over; the others copy their parents
MATINGS = 100  # pymoo's: rounds of mating per generation, at most, to find children new to the population


class _Search:
    """The artifact's search problem over allocation matrices of shape (jobs, nodes): objectives, repair,
    mutation and crossover, with two searches that use them."""

    def __init__(self, base, capacity, max_gpus, speedup, factor, p, scale, rng):
        self.base, self.capacity, self.max_gpus = base, capacity, max_gpus
        self.speedup, self.factor, self.p, self.scale, self.rng = speedup, factor, p, scale, rng
        self.rows = np.arange(base.shape[0])

    def _speedups(self, states):
        return self.speedup[self.rows, np.count_nonzero(states, axis=2), states.sum(axis=2)]

    def objective(self, states):
        """Power mean of the (restart-discounted) speedups, per state; higher is better."""
        s = self._speedups(states)
        s = np.where((states != self.base).any(axis=2), s * self.factor, s) * self.scale + FLOOR
        return np.mean(s ** self.p, axis=1) ** (1 / self.p)

    def utility(self, states):
        """The artifact's cluster utility, per state: the jobs' speedups over the GPUs of the nodes in use (each
        job's speedup per GPU weighted by its share of them); higher is better."""
        in_use = (states.sum(axis=1) > 0) @ self.capacity
        return np.where(in_use > 0, self._speedups(states).sum(axis=1) / np.maximum(in_use, 1), 0.0)

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
        rng, (pop, jobs, nodes) = self.rng, states.shape
        states = np.where(rng.random((pop, jobs, 1)) < 0.1, self.base, states)  # back to the current allocation
        k, j = (rng.random((pop, jobs)) < 0.1).nonzero()  # zero some nodes of some jobs
        zero = rng.random((len(k), nodes)) < 0.1
        states[k[:, None], j[:, None], np.arange(nodes)] *= ~zero
        # Grow jobs on nodes with free GPUs, as the artifact does: on each such node, on average one of all jobs
        # and one of the jobs already there (the artifact sums its probabilities over jobs, not over nodes); a job
        # there grows with p_all + p_own - p_all * p_own. Growth into full nodes would only be undone by the repair.
        room = states.sum(axis=1, keepdims=True) < self.capacity  # (population, 1, nodes)
        own = room & (states > 0)
        p_all, p_own = room / jobs, 1 / np.maximum(own.sum(axis=1, keepdims=True), 1)
        draw = rng.random(states.shape, dtype=np.float32)
        grow = draw < p_all
        k, j, n = own.nonzero()
        grow[k, j, n] = draw[k, j, n] < p_all[k, 0, n] + p_own[k, 0, n] - p_all[k, 0, n] * p_own[k, 0, n]
        k, j, n = grow.nonzero()
        states[k, j, n] += (rng.random(len(k)) * (self.capacity[n] + 1 - states[k, j, n])).astype(states.dtype)
        return states

    def crossover(self, a, b):
        """Single point over jobs: the first jobs' rows (none to all but the last, as the artifact draws the point)
        from one parent, the rest from the other."""
        cut = self.rng.integers(0, a.shape[1], size=(len(a), 1, 1)) > self.rows[:, None]
        return np.concatenate([np.where(cut, a, b), np.where(cut, b, a)])

    def run(self, seeds, size, generations):
        """The elitist search (mu + lambda): the final population, best first. Most children copy an elite one,
        and the population collapses onto a few allocations (BENCHMARKS.md, "Where Pollux's gap is")."""
        population = self.repair(seeds.copy())
        value = self.objective(population)
        for _ in range(generations):
            pairs = self.rng.integers(0, len(population), size=(2, size))
            parents = np.where(value[pairs[0]] >= value[pairs[1]], pairs[0], pairs[1])
            half = size // 2
            children = self.crossover(population[parents[:half]], population[parents[half:2 * half]])
            children = self.repair(self.mutate(children))
            population = np.concatenate([population, children])
            value = np.concatenate([value, self.objective(children)])
            keep = np.argsort(-value, kind="stable")[:size]
            population, value = population[keep], value[keep]
        return population

    def nsga2(self, seeds, size, generations):
        """pymoo's NSGA-II as the artifact runs it: the final Pareto set (power mean, cluster utility), best power
        mean first. `generations` counts the first population, as pymoo's ("n_gen", 100) does."""
        population = _distinct(self.repair(seeds.copy()), set())
        goals = self._goals(population)
        rank, crowding, _ = _rank_and_crowding(goals, len(population), self.rng)
        for _ in range(generations - 1):
            children = self._distinct_children(population, goals, rank, crowding, size)
            if not len(children):
                break  # pymoo ends the search when no mating finds a new individual
            population = np.concatenate([population, children])
            goals = np.concatenate([goals, self._goals(children)])
            rank, crowding, keep = _rank_and_crowding(goals, size, self.rng)
            population, goals, rank, crowding = population[keep], goals[keep], rank[keep], crowding[keep]
        front = np.flatnonzero(rank == 0)
        return population[front[np.argsort(goals[front, 0], kind="stable")]]

    def _goals(self, states):
        """Both objectives to minimise, as pymoo's F: (states, 2)."""
        return -np.column_stack([self.objective(states), self.utility(states)])

    def _distinct_children(self, population, goals, rank, crowding, size):
        """Up to `size` children new to the population and to each other, from up to MATINGS rounds of matings of
        binary-tournament parents (Pareto dominance, then the larger crowding distance, then chance), crossover
        with probability CROSSOVER_P, mutation and repair. pymoo mates again for the children it still lacks, a
        round at a time; here one batch makes as many more as the share of copies in the last says it needs, and
        counts for the rounds it stands for, so that one batch usually suffices and the matings are pymoo's at
        most (the children are drawn alike either way)."""
        seen, children, new_share, rounds = {s.tobytes() for s in population}, [], 0.8, 0.0
        while rounds < MATINGS:
            need = size - len(children)
            if need <= 0:
                break
            matings = math.ceil(need / 2 / new_share)
            rounds += matings / math.ceil(need / 2)
            # pymoo's tournaments: pairs of consecutive entries of random permutations of the population
            permutations = self.rng.random((-(-4 * matings // len(population)), len(population))).argsort(axis=1)
            draws = permutations.ravel()[:4 * matings]
            a, b = draws.reshape(-1, 2).T
            wins = np.where(_dominates(goals[a], goals[b]), a, np.where(_dominates(goals[b], goals[a]), b, -1))
            tie = crowding[a] == crowding[b]
            by_crowding = np.where(tie, np.where(self.rng.random(len(a)) < 0.5, a, b),
                                   np.where(crowding[a] > crowding[b], a, b))
            parents = np.where(wins >= 0, wins, by_crowding).reshape(matings, 2)
            crossed = self.crossover(population[parents[:, 0]], population[parents[:, 1]])
            copied = np.concatenate([population[parents[:, 0]], population[parents[:, 1]]])
            keep = np.tile(self.rng.random(matings) < CROSSOVER_P, 2)[:, None, None]
            made = self.repair(self.mutate(np.where(keep, crossed, copied)))
            new = _distinct(made, seen)
            children += list(new[:need])
            new_share = max(len(new) / len(made), 1 / 16)
        return np.array(children, dtype=population.dtype).reshape(-1, *population.shape[1:])


def _distinct(states, seen):
    """`states` without those in `seen` (their bytes) or earlier in `states`; `seen` gains the ones kept."""
    keep = []
    for i, state in enumerate(states):
        key = state.tobytes()
        if key not in seen:
            seen.add(key)
            keep.append(i)
    return states[keep]


def _dominates(f, g):
    """Whether each point of `f` Pareto-dominates the point of `g` it meets (broadcast; two objectives, minimised)."""
    (f0, f1), (g0, g1) = np.moveaxis(f, -1, 0), np.moveaxis(g, -1, 0)
    return (f0 <= g0) & (f1 <= g1) & ((f0 < g0) | (f1 < g1))


def _rank_and_crowding(goals, survivors, rng):
    """pymoo's RankAndCrowding survival: fronts of non-dominated sorting until `survivors` are ranked, the last
    front cut by crowding distance (ties at random). Returns every point's front and crowding distance (those
    of unranked points: inf, 0) and the survivors' indices."""
    n = len(goals)
    beaten = _dominates(goals[:, None], goals[None])  # i beats j
    beaten_by = beaten.sum(axis=0)
    rank, ranked, front = np.full(n, np.inf), 0, 0
    while ranked < survivors and ranked < n:
        members = (beaten_by == 0) & np.isinf(rank)
        rank[members] = front
        beaten_by -= beaten[members].sum(axis=0)
        ranked, front = ranked + members.sum(), front + 1
    crowding = _crowding_distance(goals, rank)
    # all fronts but the last whole; of the last, the least crowded, equal distances in random order
    last = np.flatnonzero(rank == front - 1)
    shuffled = rng.permutation(last)
    cut = shuffled[np.argsort(-crowding[shuffled], kind="stable")][:len(last) - max(ranked - survivors, 0)]
    return rank, crowding, np.concatenate([np.flatnonzero(rank < front - 1), np.sort(cut)])


def _crowding_distance(goals, rank):
    """pymoo's crowding distance of each point within its front (unranked points: 0): per objective, the gap
    between its neighbours over the front's range (the front's ends: inf), averaged over the objectives; fronts of
    one or two points: inf."""
    fronts = np.flatnonzero(np.isfinite(rank))
    distance = np.zeros(len(goals))
    if not len(fronts):
        return distance
    front = rank[fronts]
    for objective in goals[fronts].T:
        order = np.lexsort((objective, front))  # by front, then by the objective
        value, same = objective[order], front[order]
        first = np.r_[True, same[1:] != same[:-1]]
        last = np.r_[first[1:], True]
        starts, ends = first.nonzero()[0], last.nonzero()[0]
        span = np.repeat(value[ends] - value[starts], ends - starts + 1)  # sorted: each front's last minus first
        gap = np.diff(value, prepend=value[0])
        around = np.where(first, np.inf, gap) + np.where(last, np.inf, np.r_[gap[1:], 0.0])
        with np.errstate(invalid="ignore"):
            distance[fronts[order]] += np.where(span > 0, around / np.where(span > 0, span, 1), 0.0)
    distance[fronts] /= goals.shape[1]
    size = np.bincount(front.astype(int))[front.astype(int)]
    distance[fronts[size <= 2]] = np.inf
    return distance


def _trim(rows, limit):
    """Each row (a job's GPUs per node, or a node's per job) cut to `limit` in all, the excess taken off its end."""
    return np.diff(np.minimum(rows.cumsum(axis=1), limit), axis=1, prepend=0)
