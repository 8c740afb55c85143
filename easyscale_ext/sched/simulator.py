"""The simulated cluster: the scheduling loop's (rounds.py) backend that advances a clock and the job models through
arrivals, (re)allocation delays and completions, checking invariants.

Time moves in rounds of `round_s`. In each round every job holding GPUs progresses; at the round's end the
jobs that arrived during it join, finished ones leave, and the policy reallocates. A job whose allocation
changes makes no progress for a while, by how the job runs, whichever policy moved it (models/reallocation.py):
a restart-based job pays `restart_s` (`start_s` at its first start; the Pollux artifact's 30 s) or its
application's `restart_by_app` seconds (Sia's); a job on this runtime, whose GPUs change between two non-empty
allocations, pays the measured in-place pause (`in_place_s`) plus the bytes that move over the links they cross
(`intra_node_gbps`, `inter_node_gbps`). Whether jobs run in place is the policy's `in_place` unless `in_place`
here says "on" or "off" for every job (the ablation "Sia + in place"). Layer freezing is off unless a job opts in
or `freezing` is "on" (models/freezing.py).
"""
import math
from collections import Counter, deque
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field

import numpy as np

from . import rounds
from .ledger import Ledger
from .costs import RuntimeCosts
from .models.freezing import timeline_for
from .models.easyscale import EasyScaleJob
from .models.job import make_job
from .models.reallocation import INTER_NODE_GBPS, INTRA_NODE_GBPS, PAUSE_S, reallocation_cost
from .models.workload import as_virtual_workers

IN_PLACE_MODES = ("policy", "on", "off")


@dataclass(frozen=True)
class SimConfig:
    round_s: float = 60.0
    restart_s: float = 30.0
    start_s: float = 30.0
    in_place_s: float = PAUSE_S  # an in-place scale event's measured pause, before the bytes that move
    in_place: str = "policy"  # jobs run in place if the policy's do ("policy"), always ("on"), never ("off")
    intra_node_gbps: float = INTRA_NODE_GBPS  # GB/s between GPUs of one node (reallocation.py says why)
    inter_node_gbps: float = INTER_NODE_GBPS  # GB/s between nodes
    freezing: str = "job"  # layer freezing where a job opts in ("job"), for every job ("on"), for none ("off")
    timelines: dict = field(default_factory=dict)  # application -> freezing.Freezing, over freezing.TIMELINES
    check: bool = True  # check the invariants every round
    max_idle_rounds: int = 100  # rounds with jobs waiting, none arriving and no GPU allocated: a policy that hangs
    slowdown: dict = field(default_factory=dict)  # application -> how many times slower it progresses (SIA below)
    restart_by_app: dict = field(default_factory=dict)  # application -> its (re)start seconds, over the two above
    per_type_batch: bool = False  # per-GPU batches bounded by each GPU type's own profile, not by the T4's
    job_model: str = "project"  # how jobs progress: the project's models (models/job.py), or EasyScale's artifact's
    # ("easyscale": models/easyscale.py, its micro-batches' compute times from `easyscale_speed`, one of SPEED_SOURCES)
    easyscale_speed: str = "mean-d2"


# The Sia artifact's job model (sia-simulator/simulator_config.py SLOWDOWNS, applications.py): calibrated to its
# testbed, every job progresses that many times slower than its profiles say (its agent still measures the profiled
# step times), and every (re)start of an application costs its own seconds instead of 30; a job's per-GPU batch is
# bounded by the profile of the GPU type it runs on.
SIA = SimConfig(slowdown={"cifar10": 1.8, "imagenet": 1.2, "yolov3": 1.2, "bert": 1.2, "deepspeech2": 1.2, "ncf": 1.5},
                restart_by_app={"cifar10": 50, "deepspeech2": 25, "bert": 120, "yolov3": 80, "imagenet": 250,
                                "ncf": 15}, per_type_batch=True)
# Sia's per-application restart seconds alone: how its artifact costs a restart, without the testbed slowdowns.
SIA_RESTARTS = SimConfig(restart_by_app=SIA.restart_by_app)
# EasyScale's artifact's simulator: its job model, a one-off 20 s start, rescaling that costs nothing, 60 s rounds.
EASYSCALE = SimConfig(job_model="easyscale", start_s=20.0, restart_s=0.0, in_place_s=0.0, intra_node_gbps=math.inf,
                      inter_node_gbps=math.inf)
JOB_MODELS = ("project", "easyscale")


class InvariantError(AssertionError):
    pass


@dataclass
class Result:
    policy: str
    cluster: str
    config: dict
    jobs: list  # per job: name, app, arrival, first start, completion, GPUs asked for, restarts, GPU-seconds
    timeline: dict  # per round: time, allocated GPUs, active jobs
    segments: list  # (job, start, end, GPUs): who held how many GPUs when, for the Gantt chart

    def to_json(self) -> dict:
        return asdict(self)


def simulate(specs, policy, cluster, apps, config=SimConfig(), progress=None, costs=RuntimeCosts()) -> Result:
    """Run `specs` (sorted by arrival) to completion under `policy`. `progress` (e.g. a tqdm bar) is
    advanced by one per finished job. `costs`: what carrying decisions out costs beyond `config`'s restarts and
    pauses (costs.py: cluster mode's, as measured; by default nothing)."""
    validate(specs, policy, cluster, config.job_model, apps)
    if config.in_place not in IN_PLACE_MODES:
        raise ValueError(f"in_place {config.in_place!r}: expected one of {', '.join(IN_PLACE_MODES)}")
    if policy.virtual_workers:
        specs = [as_virtual_workers(s, apps[s.app]) for s in specs]
    make = job_maker(config)
    jobs = [make(s, apps, batch_of(s, policy, apps)) for s in specs]
    fits = {}  # the throughput fits this simulation's jobs share (AppJob._fit)
    for job in (j for j in jobs if j.spec.app is not None):  # layer freezing, where the job opts in
        job.fits = fits
        job.freezing = timeline_for(job.spec, config)
        job.slowdown = config.slowdown.get(job.spec.app, 1.0)
        job.per_type_batch = config.per_type_batch
        job.per_type_fit = policy.per_type_models
    for job in jobs:
        job.exit_s, job.exit_weight, job.reported_steps = costs.exit_s, costs.exit_weight, costs.reported_steps
    run = SimulatedCluster(jobs, policy, cluster, config, costs, progress)
    del jobs  # the cluster holds those still to arrive: a finished job's model is dropped (its record stays)
    rounds.run(run, policy)
    return Result(policy.name, cluster.spec, dict(asdict(config), **asdict(costs)),
                  sorted(run.records, key=lambda r: (r["arrival"], r["name"])),
                  {"time": run.times, "gpus": run.gpus_used, "active": run.num_active}, run.ledger.segments)


class SimulatedCluster:
    """The simulator's backend of the scheduling loop (rounds.run): a clock that moves a round at a time (or to the
    next arrival, completion or departure, where those start rounds), and the job models it advances."""

    def __init__(self, jobs, policy, cluster, config, costs, progress=None):
        self.policy, self.cluster, self.config, self.progress = policy, cluster, config, progress
        self.coming, self.total = deque(jobs), len(jobs)  # still to arrive (arrival order); all
        self.costs = costs
        self.in_place = policy.in_place if config.in_place == "policy" else config.in_place == "on"
        # Per round, the work is proportional to the jobs holding GPUs and to the changes, not to the queue. Each
        # job's state is its record's (models.job); these index the records by name.
        self.active, self.running = {}, {}  # arrived and unfinished (arrival order); holding GPUs
        self.leaving = {}  # preempted, leaving their GPUs until their `leaves_at` (suspend_s): out of the policy's view
        self.being_left = {}  # node -> when each of its GPUs that preempted jobs leave is free, earliest first
        self.allocations, self.records, self.ledger = {}, [], Ledger()
        self.times, self.gpus_used, self.num_active = [], [], []
        self.now, self.idle = 0.0, 0
        self.lag = costs.arrival_lag_s if costs.rounds_at_arrivals else 0.0
        self.keys = tuple(range(cluster.num_nodes))  # a node's key is its index

    def next_round(self):
        config, costs, coming, now = self.config, self.costs, self.coming, self.now
        if len(self.records) == self.total:
            return None
        if not self.active:  # idle cluster: skip to the round in which the next job arrives
            now = max(now, coming[0].arrival + self.lag if costs.rounds_at_arrivals else
                      math.ceil(coming[0].arrival / config.round_s) * config.round_s)
        else:
            step = config.round_s
            if costs.rounds_at_arrivals and coming:
                step = min(step, coming[0].arrival + self.lag - now)
            if costs.completion_poll_s:  # the scheduler's look each poll: a job that ended or left starts a round
                if self.leaving:
                    poll, left = costs.completion_poll_s, min(j.leaves_at for j in self.leaving.values())
                    step = min(step, math.ceil(round((left - now) / poll, 9)) * poll)
                step = _advance_to_a_completion(self.running.values(), now, step, costs)
            else:
                _advance(self.running.values(), now, step, costs)
            now += step
        self.now = now
        while coming and coming[0].arrival + self.lag <= now + 1e-9:  # now + (t - now) may fall a bit short of t
            job = coming.popleft()
            self.active[job.name], job.stopped_at = job, job.progress
        for job in [j for j in self.running.values() if j.completion is not None]:
            self.records.append(_record(job, self.ledger.first_start.get(job.name)))
            self.ledger.held(job.completion, job.name, 0)
            del self.active[job.name], self.running[job.name], self.allocations[job.name]
            if self.progress is not None:
                self.progress.update(1)
        self.leaving = {name: j for name, j in self.leaving.items() if j.leaves_at > now + 1e-9 and name in self.active}
        return now

    def deciding(self):
        return nullcontext()

    def view(self, now):
        if not self.active:
            return None
        seen = [job for name, job in self.active.items() if name not in self.leaving]  # one leaving: out of sight
        return rounds.View(seen, self.cluster, self.allocations, self.keys)

    def has_run(self, name) -> bool:
        return name in self.ledger.first_start

    def carry_out(self, now, changes):
        config, costs, cluster = self.config, self.costs, self.cluster
        for change in changes:
            if change.new:
                self.allocations[change.job] = change.new
            else:
                del self.allocations[change.job]
        if config.check:
            _check(now, self.allocations, self.active, cluster)
        free_in = self._waits(now, changes) if costs.suspend_s else {}
        for change in changes:
            name, old, alloc, job = change.job, change.old, change.new, self.active[change.job]
            if config.check and job.stopped_at is not None and job.progress != job.stopped_at:
                raise InvariantError(f"t={now}: {name} progressed without GPUs")
            # In place only between allocations: a job that held no GPUs restarts from its checkpoint.
            delay = reallocation_cost(job, old, alloc, cluster, config, self.in_place) if alloc else 0.0
            wait = free_in.get(name, 0.0)
            if self.in_place and old and alloc and ((costs.join_s or wait) and change.gained or costs.reported_steps):
                gained = sum(change.gained.values())  # joiners start first; the change waits for the step in flight
                job.allocate_after(cluster.groups(alloc), delay, costs.join_s if gained else 0.0, gained, wait)
            else:
                job.allocate(cluster.groups(alloc), delay, starts=not (self.in_place and old), free_in=wait)
            self.ledger.held(now, name, len(alloc))
            if alloc:
                self.running[name], job.stopped_at = job, None
            else:
                del self.running[name]
                job.stopped_at = job.progress
                if costs.suspend_s:
                    job.leaves_at, self.leaving[name] = now + costs.suspend_s, job

    def _waits(self, now, changes) -> dict:
        """Job -> seconds until the GPUs it gains in `changes` are free: a node's free GPUs go first, in the changes'
        order, then those that preempted jobs (of this round or earlier ones) leave, earliest left first; a job's
        processes start on a GPU only once it is left (RuntimeCosts.suspend_s)."""
        left = {node: kept for node, times in self.being_left.items() if (kept := [t for t in times if t > now + 1e-9])}
        self.being_left = left
        for change in changes:
            if not change.new:
                for node in change.old:
                    left.setdefault(node, []).append(now + self.costs.suspend_s)
        gains = Counter()
        for change in changes:
            gains += change.gained
        held = Counter(node for nodes in self.allocations.values() for node in nodes)
        free = {node: self.cluster.gpus[node] - (held[node] - gains[node]) - len(left.get(node, ())) for node in gains}
        waits = {}
        for change in changes:
            for node, count in change.gained.items():
                taken = min(count, max(free[node], 0))
                free[node] -= taken
                queue = left.get(node, [])
                freed, queue[:count - taken] = queue[:count - taken], []
                if freed:
                    waits[change.job] = max(waits.get(change.job, 0.0), freed[-1] - now)
        return waits

    def account(self, now, held):
        self.allocations = decided = held  # the same, in the order of the policy, which reads it next round
        self.times.append(now)
        self.gpus_used.append(sum(map(len, decided.values())))
        self.num_active.append(len(self.active))
        self.idle = self.idle + 1 if not decided and not self.coming else 0
        if self.idle > self.config.max_idle_rounds:
            raise InvariantError(f"t={now}: {len(self.active)} jobs wait but {self.policy.name} has allocated nothing "
                                 f"for {self.idle} rounds and no job is left to arrive: they would never finish")


def batch_of(spec, policy, apps):
    """The global batch a job runs with: its own where it keeps it, else the policy's (None: the policy tunes it)."""
    return spec.batch_size if spec.keeps_batch else policy.batch_size(spec, spec.app and apps[spec.app])


def job_maker(config):
    """make(spec, apps, batch) -> the job's model under `config.job_model`."""
    if config.job_model == "project":
        return make_job
    return lambda spec, apps, batch: EasyScaleJob(spec, apps[spec.app], apps.data, config.easyscale_speed)


def _advance(jobs, now, seconds, costs):
    """Let `seconds` pass for the jobs holding GPUs. With `costs.parallel_starts`, k > that processes starting at
    once (a start of n counting n ** start_weight, each training process training_weight) share the machine, each
    start at parallel_starts / k of its speed; the share changes only where a start ends, so the span is cut
    there."""
    parallel, weight = costs.parallel_starts, costs.start_weight
    while True:
        starting = sum(j.processes_starting ** weight for j in jobs if j.processes_starting) if parallel else 0
        if starting:
            starting += costs.training_weight * sum(j.processes_training for j in jobs)
        rate = min(1.0, parallel / starting) if starting else 1.0
        span = min([seconds] + [j.starts_change_in(rate) for j in jobs]) if rate < 1.0 or costs.suspend_s else seconds
        for job in jobs:
            job.advance(now, span, rate)
        now, seconds = now + span, seconds - span
        if seconds <= 1e-9:
            return


def _advance_to_a_completion(jobs, now, seconds, costs):
    """Let up to `seconds` pass, a poll (costs.completion_poll_s) at a time, ending after the poll in which a job
    completed; returns the seconds passed."""
    passed = 0.0
    while passed < seconds - 1e-9:
        span = min(costs.completion_poll_s, seconds - passed)
        _advance(jobs, now + passed, span, costs)
        passed += span
        if any(j.completion is not None for j in jobs):
            break
    return passed


def validate(specs, policy, cluster, job_model="project", apps=None):
    """A ValueError if `policy` cannot run `specs` on `cluster` under `job_model` (EasyScale's needs `apps`), saying
    why; before anything is simulated."""
    if job_model not in JOB_MODELS:
        raise ValueError(f"job model {job_model!r}: expected one of {', '.join(JOB_MODELS)}")
    if job_model != "project":
        if any(s.virtual_workers is None for s in specs):
            raise ValueError("EasyScale's job model runs EasyScale-format workloads (virtual workers per job); this "
                             "one is not: simulate it with --calibration none")
        if any(batch_of(s, policy, apps) is None for s in specs):
            raise ValueError(f"{policy.name} tunes batch sizes, which EasyScale's job model fixes: simulate it with "
                             "--calibration none")
    if policy.profiled and any(s.app is None for s in specs):
        raise ValueError(f"{policy.name} needs jobs of profiled applications; this workload has trace jobs "
                         f"(duration only): use fifo, yarn-cs or tiresias, or draw their applications "
                         f"(workload.with_applications; easyscale simulate --applications SEED)")
    if policy.one_gpu_type and not cluster.homogeneous:
        raise ValueError(f"{policy.name} models one GPU type; the cluster {cluster.spec} mixes several")
    largest = max(cluster.room(cluster.gpus).values())  # a job runs on one GPU type
    too_big = [s.name for s in specs if max(s.num_gpus, s.min_gpus) > largest]
    if too_big:
        raise ValueError(f"{len(too_big)} jobs ask for more GPUs than the cluster {cluster.spec} has of one "
                         f"type, e.g. {too_big[0]}")
    lacking = sorted({s.preferred_gpu for s in specs if s.preferred_gpu} - set(cluster.types))
    if lacking:
        raise ValueError(f"jobs prefer GPU types the cluster {cluster.spec} lacks ({', '.join(lacking)}): "
                         "give it some of each")
    twice = sorted(name for name, count in Counter(s.name for s in specs).items() if count > 1)
    if twice:
        raise ValueError(f"job names repeat ({', '.join(twice[:3])}): each job needs its own "
                         "(workload.unique_names numbers repeats)")


def _check(now, allocations, active, cluster):
    unknown = set(allocations) - active.keys()
    if unknown:
        raise InvariantError(f"t={now}: allocations for jobs not present: {sorted(unknown)[:3]}")
    used = cluster.used(allocations)
    over = np.flatnonzero(used > np.asarray(cluster.gpus))
    if len(over):
        raise InvariantError(f"t={now}: node {over[0]} has {used[over[0]]} GPUs allocated of {cluster.gpus[over[0]]}")
    for name, alloc in allocations.items():
        if len({cluster.types[n] for n in alloc}) > 1 and not active[name].spec.heterogeneous:
            raise InvariantError(f"t={now}: {name} spans GPU types but does not allow it (D2)")


def _record(job, first_start):
    spec = job.spec
    return {"name": job.name, "app": spec.app, "arrival": job.arrival, "start": first_start,
            "completion": job.completion, "jct": job.completion - job.arrival, "gpus_asked": spec.num_gpus,
            "restarts": job.restarts, "gpu_seconds": job.attained}
