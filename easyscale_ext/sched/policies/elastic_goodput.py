"""Elastic goodput, this project's policy: Sia's goodput-optimising integer program (policies/sia.py) with three
allocation ideas that the EasyScale runtime makes possible and a weight for the average JCT, under the one job
model every policy shares (models/reallocation.py: restarts or in-place moves by how the job runs;
models/freezing.py: freezing off unless a job opts in).

- Mixed GPU types (`mixed`): with virtual workers a job can span GPU types and keep its bits (D2), its batch split
  by the GPUs' measured speeds (virtual_workers.mixed_step: placement.optimal_split, D2's measured cost,
  EasyScale's waste).
  Sia keeps a job on one type. Besides Sia's one-type configurations, a job that may mix types (JobSpec.heterogeneous:
  its workload says so, as EasyScale's `enable_heterogeneous_deterministic` does) and whose D2 costs at most 10 %
  (workload.D2_MAX_COST, EasyScale's own rule: the transformers, not the CNNs), or that pays D2 on one type too (a
  cluster job submitted at --level D2), is offered pairs of any two of the cluster's types: g1 GPUs of the type
  faster for it and g2 of the slower, each a count Sia would offer on that type, g1 + g2 within what one type may
  grow to (below). The program values a pair as the job's modelled goodput
  on g1 + g2 GPUs of the fast type (its best batch there), times that batch's step time on g1 + g2 fast GPUs over
  its step time on the pair (both virtual_workers.mixed_step on the profiles); a pair worth no more than either
  part alone is not offered. Each part counts on its type's GPUs.
- Cheap-move growth (`fast_growth`): an in-place move costs about a second (the measured pause plus the state
  over the links), not a restart, so the program discounts a change by that (Pollux's restart factor with
  R = 1 s, not 30 s), and a job may be offered up to the whole cluster on one type or a pair (Sia: twice the most
  GPUs it has been measured on, because a wrong guess costs it a restart; here a wrong guess is undone next round).
- Throughput-oriented objective (`utility`): Sia's cost value^-0.5 strongly favours equalising jobs' speedups.
  It maximises the sum of the square roots of the normalised goodputs (concave: still diminishing returns per
  job, so no job is starved of a second GPU by a well-scaling one), every job first getting a GPU while GPUs last
  (a constant far above any value, Sia's lambda_n in spirit). Reallocating towards throughput each round is what
  cheap moves allow. A preemption, though, is no cheap move (a suspension to a checkpoint, then a resume): it
  costs what a change does (Sia's lambda_a), so the program never stops a running job for a waiting one of the
  same value (with every job worth running, such ties are common, and the solver breaks them by job order).
- Remaining work (`remaining`): Smith's rule for the average JCT. A job's values are multiplied by the median
  job's remaining work over its own, so that the program favours the jobs nearest their end: remaining work = the
  GPU-seconds it has held x (1 - f) / f, f its share of its length done. That estimate needs no length in seconds:
  a real job reports its steps done of its total, and its GPU-seconds held are the scheduler's. A job that has done
  nothing yet is valued as the median. Smith's rule holds the longest jobs back, which the tail pays for; with an
  age bound (`age_s`, as Tiresias promotes a starved job) a job's weight rises linearly with its time in the system
  to the median's at `age_s` seconds (none by default; bench/bench_validate.py judges candidates). Two more
  settings, judged on decision draws and not adopted (BENCHMARKS.md): remaining work counted in seconds of the
  job's fastest GPU type (`typed_work`: a second held on a T4 is less work than one on a V100), and the weight on
  what a job gains above one GPU of each type only, not on which type it gets (`weigh_types=False`).
Runtime capability, not an allocation idea: its jobs run in place (`in_place`); `easyscale simulate --in-place off`
makes them restart-based (the ablation's "elastic-goodput, restart-based").

Ablations (policies.EXPERIMENTS): elastic-goodput-no-mixed, -no-fast-growth, -sia-objective and -no-remaining;
elastic-goodput-pairs-only is Sia's program with the pairs only, restart-based. Like every policy it reads job models
only, so a real scheduler can run it.
"""
import itertools
import math
import statistics

import numpy as np

from ..models.goodput import packed
from ..models.virtual_workers import mixed_step
from ..models.workload import D2_MAX_COST
from .sia import MAX_GPUS, TINY, SiaPolicy, one_gpu_throughput

REALLOCATION_S = 1.0  # the order of an in-place move's cost (reallocation.in_place_cost): pause + GBs at GB/s
EVERY_JOB = 1e3  # what running at all is worth over any value: every job gets a GPU while GPUs last
UTILITY = 0.5  # the exponent of the utility summed over jobs


class ElasticGoodputPolicy(SiaPolicy):
    in_place = True
    at_scale_options = 0  # on AT_SCALE_GPUS or more every program on its relaxation's terms (judged: BENCHMARKS.md)

    def __init__(self, mixed: bool = True, fast_growth: bool = True, utility: bool = True, remaining: bool = True,
                 typed_work: bool = False, weigh_types: bool = True, reallocation_s: float = REALLOCATION_S,
                 age_s: float = math.inf, name=None, **sia):
        restart_s = reallocation_s if fast_growth else sia.pop("restart_s", 30.0)
        name = name or "elastic-goodput" + ("" if mixed else "-no-mixed") + (
            "" if fast_growth else "-no-fast-growth") + ("" if utility else "-sia-objective") + (
            "" if remaining else "-no-remaining") + ("-typed-work" if typed_work else "") + (
            "" if weigh_types else "-growth-weight") + (
            "" if age_s == math.inf else f"-age-{age_s / 3600:g}h")
        super().__init__(restart_s=restart_s, name=name, **sia)
        self.mixed, self.fast_growth, self.utility, self.remaining = mixed, fast_growth, utility, remaining
        self.typed_work, self.weigh_types, self.age_s = typed_work, weigh_types, age_s
        self._weights = {}  # job -> the median job's remaining work over its own (`remaining`), this round
        self.mixes_types = mixed
        self.growth = MAX_GPUS if fast_growth else 2
        if utility:
            self.offset = -EVERY_JOB
        self.stop_cost = self.lambda_a  # a preemption is a change too: no swap of a running job for an equal one

    def optimize(self, now, jobs, cluster, allocations):
        jobs = list(jobs)
        if self.remaining:
            types = tuple(dict.fromkeys(cluster.types)) if self.typed_work else ()
            work = {job.name: left for job in jobs if (left := remaining_work(job, types)) is not None}
            median = statistics.median(work.values()) if work else 1.0
            self._weights = {job.name: max(median / work[job.name], min((now - job.arrival) / self.age_s, 1.0))
                             for job in jobs if job.name in work}
        return super().optimize(now, jobs, cluster, allocations)

    def _cost(self, value) -> float:
        if not self.utility:
            return super()._cost(value)
        return -max(value, TINY) ** UTILITY - EVERY_JOB

    def _configs(self, job, types, counts, per_node) -> dict:
        goodput = {((t, g),): v for (t, g), v in self._goodputs(job, types, counts, per_node).items()}
        if len(types) > 1 and self.spans_types(job):
            goodput.update(self._pairs(job, types, counts, per_node, goodput))
        least = min((v for v in goodput.values() if v > 0), default=1.0)
        weight = self._weights.get(job.name, 1.0)
        if self.weigh_types:
            scale = least / weight  # as v * weight / least, in the pinned runs' order of operations
            return {c: v / scale for c, v in goodput.items() if v > 0}
        base = {}  # GPU type -> the job's least value on it (its fastest, in a pair)
        for c, v in goodput.items():
            if v > 0:
                base[c[0][0]] = min(base.get(c[0][0], v), v)
        return {c: (base[c[0][0]] + weight * (v - base[c[0][0]])) / least for c, v in goodput.items() if v > 0}

    def spans_types(self, job) -> bool:
        """A job that may mix types, of more than one GPU, where D2 is cheap or paid anyway (it runs at D2 on one
        type too). A Pollux- or Sia-format job says nothing and stays on one type: offering BERT's jobs pairs
        unasked paid nothing on the decision draws of bench/bench_validate.py (BENCHMARKS.md)."""
        return self.mixed and job.spec.heterogeneous and not job.app.single_gpu and (
            job.spec.runs_d2 or job.app.d2_cost <= D2_MAX_COST)

    def _pairs(self, job, types, counts, per_node, single) -> dict:
        """Goodput of each two-type configuration worth more than either part alone (module docstring)."""
        estimator = self._estimator(job, types)
        if not estimator:
            return {}
        app = job.app
        limit = self._limit(job)
        ranked = sorted(types, key=lambda t: one_gpu_throughput(app, t), reverse=True)
        out = {}
        for fast, other in itertools.combinations(ranked, 2):  # any two types, the faster for this job first
            model, scale, _ = estimator[fast]
            pairs = [(g1, g2) for g1 in counts[fast] if g1 < limit for g2 in counts[other] if g1 + g2 <= limit]
            if not pairs:
                continue
            g1, g2 = (np.array(x) for x in zip(*pairs))
            nodes = np.ceil(g1 / per_node[fast]) + np.ceil(g2 / per_node[other])
            good, local, accum = model.best(nodes, g1 + g2)
            for a, b, v, m, s in zip(g1, g2, good * scale, local, accum):
                a, b, workers = int(a), int(b), int((a + b) * (s + 1))
                if v <= 0 or m < 1:
                    continue
                mixed = mixed_step(app, workers, int(m), ((fast, packed(a, per_node[fast])),
                                                          (other, packed(b, per_node[other]))), job.spec.runs_d2)
                alone = mixed_step(app, workers, int(m), ((fast, packed(a + b, per_node[fast])),), job.spec.runs_d2)
                value = float(v) * alone / mixed
                if value > max(single.get(((fast, a),), 0.0), single.get(((other, b),), 0.0)):
                    out[(fast, a), (other, b)] = value
        return out


def remaining_work(job, types=()):
    """GPU-seconds a job has left, extrapolated from what it held for its share done; None before it progresses
    (or for a job of unknown length). With the cluster's GPU `types`, seconds of one of them fastest for the job: a
    second held on a slower type counts as the share of one on the fastest that its one-GPU throughput is."""
    done = job.done if getattr(job, "app", None) is not None else 0.0
    if not 0 < done < 1:
        return None
    held = job.attained
    if types and job.attained_on:
        speed = {t: one_gpu_throughput(job.app, t) for t in {*types, *job.attained_on}}
        fastest = max(speed.values())
        held = sum(seconds * speed[t] / fastest for t, seconds in job.attained_on.items())
    return held * (1 - done) / done if held > 0 else None
