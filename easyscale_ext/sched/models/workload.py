"""Workloads: the jobs to simulate, read from the Pollux artifact's workload files, EasyScale's, or the Philly trace.

EasyScale's artifact describes a job by its virtual workers D (`max_parallelism`), a batch per virtual worker,
its epochs, whether it may run on mixed GPU types (`enable_heterogeneous_deterministic`, which needs D2) and a
preferred GPU type. Such a job asks for D GPUs of its preferred type (one virtual worker each, as plain DDP
would run it); its global batch is D times the per-worker batch, whatever GPUs run it.
"""
import csv
import math
from dataclasses import dataclass, replace
from typing import Optional

import numpy as np

from .traces import read_csv


@dataclass(frozen=True)
class JobSpec:
    """One submitted job. `app` names a profiled application; trace jobs have none and instead a fixed
    `duration` (seconds on `num_gpus` GPUs), which is all the Philly trace records."""
    name: str
    arrival: float
    num_gpus: int
    app: Optional[str] = None
    batch_size: Optional[int] = None  # global
    duration: Optional[float] = None
    virtual_workers: Optional[int] = None  # EasyScale's max_parallelism: at most this many GPUs, any split
    heterogeneous: bool = False  # may mix GPU types (D2)
    runs_d2: bool = False  # runs at D2 on any GPUs (a cluster job submitted at --level D2), not only when mixing
    preferred_gpu: Optional[str] = None
    epochs: Optional[int] = None  # None: the application's
    freeze: bool = False  # opts in to layer freezing (models/freezing.py; a workload's optional `freeze` column)
    model: Optional[str] = None  # the application as the workload names it, where a stand-in runs in its place
    min_gpus: int = 1  # the fewest GPUs it runs on, and the most (None: no bound), whatever the policy decides
    max_gpus: Optional[int] = None  # (sched/limits.py; a workload's optional `min_gpus`, `max_gpus` columns)
    keeps_batch: bool = False  # its global batch is its own (a real job's virtual workers fix it), not the policy's


D2_MAX_COST = 1.1  # a job may mix GPU types where D2 costs its model at most this (step time over plain DDP's)


def as_virtual_workers(spec, app) -> JobSpec:
    """A job of another format as EasyScale runs it: its GPUs become virtual workers (more where its batch
    needs them to keep within the largest per-GPU batch, instead of accumulation steps) sharing its global
    batch; it may run on any GPU type, and mix types where D2 is cheap for its application."""
    if spec.virtual_workers is not None:
        return spec
    d = max(spec.num_gpus, -(-spec.batch_size // app.max_local_bsz))
    return replace(spec, batch_size=d * (spec.batch_size // d), virtual_workers=d,
                   heterogeneous=bool(app.d2_cost <= D2_MAX_COST))


EASYSCALE_COLUMNS = ("name", "time", "application", "max_parallelism", "batch_size", "epochs",
                     "enable_heterogeneous_deterministic", "preferred_gpu")
# The formats load_workload reads, by the columns each needs (others are ignored).
FORMATS = {
    "EasyScale": EASYSCALE_COLUMNS,
    "Pollux": ("name", "time", "application", "num_replicas", "batch_size"),
    "Philly trace": ("timestamp", "duration", "num_gpus"),
}


def load_workload(path, limit=None) -> list:
    """Jobs sorted by arrival (ties by name), from a file in one of FORMATS: the one whose columns it has most
    of, and a ValueError naming those it lacks. `limit` keeps the first jobs to arrive."""
    cols = read_csv(path)
    kind = max(FORMATS, key=lambda f: len(cols.keys() & set(FORMATS[f])))
    missing = [c for c in FORMATS[kind] if c not in cols]
    if len(missing) == len(FORMATS[kind]):
        raise ValueError(f"{path} is not a workload: expected the columns of one of "
                         + "; ".join(f"{f} ({','.join(c)})" for f, c in FORMATS.items()))
    if missing:
        raise ValueError(f"{path} lacks the column(s) {','.join(missing)} of a {kind} workload "
                         f"({','.join(FORMATS[kind])})")
    freeze = [bool(int(x)) for x in cols["freeze"]] if "freeze" in cols else None
    limits = {c: [int(x) for x in cols[c]] for c in ("min_gpus", "max_gpus") if c in cols}
    if kind == "EasyScale":
        specs = [JobSpec(str(n), float(t), int(d), str(a), int(d) * int(b), virtual_workers=int(d),
                         heterogeneous=bool(int(h)), preferred_gpu=str(g), epochs=int(e))
                 for n, t, a, d, b, e, h, g in zip(*(cols[c] for c in EASYSCALE_COLUMNS))]
    elif kind == "Pollux":
        specs = [JobSpec(str(n), float(t), int(g), str(a), int(b))
                 for n, t, a, g, b in zip(*(cols[c] for c in FORMATS[kind]))]
    else:
        stamps = cols["timestamp"].astype("datetime64[s]")
        arrival = (stamps - stamps.min()).astype(float)
        specs = [JobSpec(f"philly-{i}", float(t), int(g), duration=float(d))
                 for i, (t, g, d) in enumerate(zip(arrival, cols["num_gpus"], cols["duration"]))]
    if not specs:
        raise ValueError(f"{path} has no jobs")
    if freeze is not None:  # an optional column of any format: 1 where the job opts in to layer freezing
        specs = [replace(s, freeze=f) for s, f in zip(specs, freeze)]
    if limits:  # optional columns of any format: the GPUs each job must hold, at least and at most
        specs = [replace(s, **{c: v[i] for c, v in limits.items()}) for i, s in enumerate(specs)]
        bad = next((s for s in specs if s.min_gpus < 1 or s.max_gpus is not None and s.max_gpus < s.min_gpus), None)
        if bad is not None:
            raise ValueError(f"{path}: job {bad.name} needs 1 <= min_gpus ({bad.min_gpus}) <= max_gpus "
                             f"({bad.max_gpus})")
    order = sorted(range(len(specs)), key=lambda i: (specs[i].arrival, specs[i].name))
    specs = [specs[i] for i in order]
    return specs[:limit] if limit else specs


def unique_names(specs) -> tuple:
    """The jobs, a repeated name numbered from its second job on (`name#2`, `name#3`, ...), and the new names. The
    simulator needs a name per job (EasyScale's own test.csv repeats three; its simulator keeps the last of each)."""
    seen, out, renamed = set(), [], []
    for s in specs:
        name, k = s.name, 1
        while name in seen:
            k += 1
            name = f"{s.name}#{k}"
        if name != s.name:
            s = replace(s, name=name)
            renamed.append(name)
        seen.add(name)
        out.append(s)
    return out, renamed


def last_per_name(specs) -> tuple:
    """The jobs with only the last row of each repeated name, as EasyScale's simulator keys its jobs by name (its
    test.csv: 62 of 68 rows), and the names that repeated."""
    last = {s.name: s for s in specs}
    kept = [s for s in specs if last[s.name] is s]
    return kept, sorted({s.name for s in specs if last[s.name] is not s})


def with_stand_ins(specs, stand_ins) -> tuple:
    """The jobs with each application that `stand_ins` maps ({name: profiled application}) run as its stand-in,
    and {application: stand-in} of those this workload uses. A ValueError names every application that is
    neither profiled nor mapped."""
    from .application import EPOCHS

    names = dict.fromkeys(s.app for s in specs if s.app is not None)
    unknown = [a for a in names if a not in EPOCHS and a not in stand_ins]
    if unknown:
        raise ValueError(f"no profile for application(s) {', '.join(unknown)} (profiled: {', '.join(EPOCHS)})")
    used = {a: stand_ins[a] for a in names if a in stand_ins}
    return [replace(s, app=used[s.app], model=s.app) if s.app in used else s for s in specs], used


def easyscale_workload(trace, apps, cluster, jobs=80, hours=4.0, seed=0) -> list:
    """EasyScale-format jobs drawn from the Philly trace (`trace`: its JobSpecs) for the profiled applications.

    Jobs are drawn among the trace's multi-GPU jobs (a 1-GPU job has nothing to scale; EasyScale's own workloads
    declare 4 to 32 virtual workers). Each keeps its GPU count as its virtual workers D (at most the GPUs of its
    preferred type) and its duration: it gets the epochs that take about that long on D GPUs of its preferred
    type. Arrivals are uniform over `hours`. The application is drawn among those that can run D workers (NCF
    runs on one GPU); the preferred type in proportion to the cluster's GPUs of each type; the batch per worker
    is the application's initial batch over D, at least its smallest per-GPU batch measured on every type. A
    job allows mixing GPU types where D2 costs its model at most 10 % more (EasyScale's measurements: the
    transformers, not the CNNs), as in EasyScale's own workloads.
    """

    from .application import EPOCHS
    from .goodput import packed
    from .job import make_job

    rng = np.random.default_rng(seed)
    pool = [s for s in trace if s.num_gpus >= 2 and 300 <= s.duration <= 24 * 3600]
    picks = rng.choice(len(pool), size=jobs, replace=False)
    arrivals = np.sort(rng.uniform(0, hours * 3600, size=jobs)).round()
    room = cluster.room(cluster.gpus)
    per_node = {t: g for g, t in zip(cluster.gpus, cluster.types)}
    types = sorted(room)
    out = []
    for i, (pick, arrival) in enumerate(zip(picks, arrivals)):
        trace_job = pool[pick]
        gpu_type = str(rng.choice(types, p=[room[t] / sum(room.values()) for t in types]))
        d = min(trace_job.num_gpus, room[gpu_type])
        smallest = {n: max(apps[n].profile(t).min_local_bsz for t in types) for n in EPOCHS}  # on every type
        names = [n for n in sorted(EPOCHS) if d == 1 or not apps[n].single_gpu
                 and d * smallest[n] <= apps[n].max_batch_size]
        app = apps[str(rng.choice(names))]
        local = min(max(-(-app.init_batch_size // d), smallest[app.name]), app.max_local_bsz)
        spec = JobSpec(f"{app.name}-{i}", float(arrival), d, app.name, d * local, virtual_workers=d,
                       heterogeneous=bool(app.d2_cost <= D2_MAX_COST), preferred_gpu=gpu_type, epochs=app.epochs)
        job = make_job(spec, apps, spec.batch_size)
        job.allocate({gpu_type: packed(d, per_node[gpu_type])}, 0.0)
        job.advance(0.0, trace_job.duration)
        out.append(replace(spec, epochs=app.epochs if job.completion is not None else max(job.epoch, 1)))
    return out


# The application a Philly job runs, by its GPU-hours, for the whole trace: the bands of a later sampler modelled on
# Pollux's, kept to the six profiled applications (the samplers that drew the shipped workloads use coarser bands,
# sampler.APPLICATIONS): each bound in GPU-hours, and the applications drawn below it with their odds.
APPLICATIONS_BY_GPU_HOURS = ((0.1, {"cifar10": 0.8, "ncf": 0.2}), (1.0, {"bert": 1.0}), (5.0, {"deepspeech2": 1.0}),
                             (10.0, {"yolov3": 1.0}), (math.inf, {"imagenet": 1.0}))


def with_applications(trace, apps, gpu_type="t4", gpus_per_node=8, seed=0) -> list:
    """The Philly trace's jobs (`trace`: JobSpecs with a duration) as Pollux-format jobs of profiled applications,
    so that every policy can run the whole trace, keeping its arrivals and about its load.

    Each job's application is drawn by its GPU-hours (APPLICATIONS_BY_GPU_HOURS; NCF only for a 1-GPU job, as NCF
    runs on one). It keeps its GPUs (at most what the application's largest batch spreads over) and runs the
    application's initial batch, or the smallest batch its GPUs hold. Its epochs are those that take about its
    duration alone on its GPUs of `gpu_type` (at least 1, at most the application's), at the mean seconds per
    epoch of a whole run there."""
    from ..metrics import isolated_runtime

    rng = np.random.default_rng(seed)
    per_epoch = {}  # (application, GPUs, batch) -> seconds per epoch alone

    def shaped(spec, name):
        app = apps[name]
        gpus = min(spec.num_gpus, app.max_batch_size // app.min_local_bsz)
        batch = min(max(app.init_batch_size, gpus * app.min_local_bsz), app.max_batch_size)
        key = name, gpus, batch
        if key not in per_epoch:
            whole = JobSpec(name, 0.0, gpus, name, batch)
            per_epoch[key] = isolated_runtime(whole, apps, gpus_per_node, gpu_type) / app.epochs
        epochs = min(max(round(spec.duration / per_epoch[key]), 1), app.epochs)
        return replace(spec, name=f"{name}-{spec.name}", num_gpus=gpus, app=name, batch_size=batch, duration=None,
                       epochs=epochs)

    out = []
    for spec in trace:
        hours = spec.num_gpus * spec.duration / 3600
        odds = next(odds for bound, odds in APPLICATIONS_BY_GPU_HOURS if hours < bound)
        name = str(rng.choice(list(odds), p=list(odds.values())))
        out.append(shaped(spec, "cifar10" if name == "ncf" and spec.num_gpus > 1 else name))
    return out


def write_easyscale_workload(specs, path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(EASYSCALE_COLUMNS)
        for s in specs:
            writer.writerow([s.name, int(s.arrival), s.app, s.virtual_workers, s.batch_size // s.virtual_workers,
                             s.epochs, int(s.heterogeneous), s.preferred_gpu])


def write_pollux_workload(specs, path) -> None:
    """Pollux's format (Sia's too): name, arrival second, application, GPUs, global batch."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(FORMATS["Pollux"])
        for s in specs:
            writer.writerow([s.name, int(s.arrival), s.app, s.num_gpus, s.batch_size])
