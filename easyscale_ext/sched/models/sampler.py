"""Workloads drawn from the Philly trace by the rules of Pollux's and Sia's workload samplers, for as many draws as
a validation needs. Pollux's sampler drew its artifact's workloads so (Sia's Philly workloads keep their arrivals;
Sia's sampler differs where RULES say):

- the pool: the trace's jobs of at least 60 s and under 1,000 GPU-hours submitted within the `window` (its first
  hour of the day, its hours; WINDOW) of any day of the trace; a job arrives at its time into that window;
- `round(jobs * load)` of them, uniformly without replacement (Pollux's 0.5x-2x "relative job load" workloads
  keep the window and scale the number of jobs);
- each job's application by its GPU-hours in the trace (APPLICATIONS): under 1 cifar10 (Pollux's rules: or ncf,
  one in two), under 10 deepspeech2 or bert (one in two), under 100 yolov3, else imagenet;
- its GPUs and batch uniformly among the application's configurations (`configurations`) on reference GPUs.

Drawn with Pollux's rules, every configuration is one of those of Pollux's shipped workloads and vice versa, and
each of their 1,280 jobs is a job of the pool in the band of its application (tests/sched/test_sampler.py).
"""
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .goodput import packed
from .traces import read_csv
from .workload import JobSpec

# The application of a Philly job by its GPU-hours: each band's upper bound and the applications drawn in it.
APPLICATIONS = ((1.0, ("cifar10", "ncf")), (10.0, ("deepspeech2", "bert")), (100.0, ("yolov3",)),
                (1000.0, ("imagenet",)))


@dataclass(frozen=True)
class Rules:
    """What differs between the two samplers: the applications left out, and the GPUs on which a job's
    configurations are judged (a GPU type, GPUs per node, the GPU counts tried)."""
    name: str
    excluded: tuple
    gpu_type: str  # None: the cluster's most plentiful type
    per_node: int  # None: that type's GPUs per node
    gpu_counts: tuple


# Pollux's: the artifact's 16 nodes of 4 T4s. Sia's: its rtx nodes (2080 Tis, 8 a node) up to 14 GPUs, no ncf;
# here the cluster's own most plentiful type stands in for the 2080 Ti, so that jobs fit the cluster they run on.
RULES = {
    "pollux": Rules("pollux", (), "t4", 4, (1, 2, 4, 6, 8, 12, 16, 24, 32, 48)),
    "sia": Rules("sia", ("ncf",), None, None, (1, *range(2, 16, 2))),
}
WINDOW = (2.0, 8.0)  # both samplers' default: from hour 2 of each day, 8 hours
JOBS = 160  # both samplers' default, at load 1


@lru_cache(maxsize=None)
def configurations(app, gpu_type, per_node, gpu_counts, efficiency=(0.5, 0.8), hours=12.0) -> tuple:
    """(GPUs, batch) a user would submit `app` with: each GPU count on which its run, packed on nodes of `per_node`
    GPUs of `gpu_type` at its fastest validated batch, takes under `hours` hours at a scaling efficiency (one GPU's
    time over its time times GPUs) strictly between `efficiency`'s bounds. Where no count is that fast, those in
    the efficiency band at any length (the samplers fall back to one GPU there, which on GPUs slower than their
    reference makes an ImageNet job of weeks); one GPU at its fastest batch where none is in the band. Times count
    the application's whole run (every epoch) at the measured step times, with as few accumulation steps as the
    per-GPU batch limit allows."""
    profile, noise = app.profile(gpu_type), app.noise
    lo, hi = efficiency
    in_band, single = [], None
    for gpus in gpu_counts:
        if gpus * app.min_local_bsz > app.max_batch_size:
            break
        placement, fastest = packed(gpus, per_node), None
        for batch in noise.batch_sizes:
            local = math.ceil(batch / gpus - 1e-8)
            if local < app.min_local_bsz:
                continue
            accum = math.ceil(local / app.max_local_bsz - 1e-8) - 1
            step, sync = profile.step_time(placement, math.ceil(local / (accum + 1) - 1e-8))
            seconds = noise.iterations(batch, app.epochs - 1) * (step + accum * (step - sync))
            if fastest is None or seconds < fastest[0]:
                fastest = (seconds, int(batch))
        if gpus == 1:
            single = fastest
        elif lo < single[0] / fastest[0] / gpus < hi:
            in_band.append((fastest[0], gpus, fastest[1]))
    fast = [c for c in in_band if c[0] < hours * 3600] or in_band
    return tuple((gpus, batch) for _, gpus, batch in fast) or ((1, single[1]),)


def reference(rules, cluster) -> tuple:
    """(GPU type, GPUs per node) on which `rules` judge configurations for jobs bound for `cluster`: the rules' own,
    else the cluster's type with the most GPUs (ties: the larger nodes, then the name)."""
    if rules.gpu_type:
        return rules.gpu_type, rules.per_node
    per_type = {}
    for gpus, gpu_type in zip(cluster.gpus, cluster.types):
        total, per_node = per_type.get(gpu_type, (0, 0))
        per_type[gpu_type] = (total + gpus, max(per_node, gpus))
    gpu_type = max(per_type, key=lambda t: (*per_type[t], t))
    return gpu_type, per_type[gpu_type][1]


@lru_cache(maxsize=4)
def philly_pool(trace_csv, start, hours) -> tuple:
    """(arrival seconds into the window, GPU-hours) of the trace's jobs the samplers draw from."""
    cols = read_csv(trace_csv)
    stamps = cols["timestamp"].astype("datetime64[s]") - np.timedelta64(int(start * 3600), "s")
    into_day = (stamps - stamps.astype("datetime64[D]")).astype(float)
    keep = (cols["duration"] >= 60) & (cols["gpu_time"] < 1000 * 3600) & (into_day < hours * 3600)
    return into_day[keep], cols["gpu_time"][keep] / 3600


def sample_workload(trace_csv, apps, cluster, seed, load=1.0, rules="sia", jobs=JOBS, window=WINDOW) -> list:
    """A Pollux-format workload (JobSpecs sorted by arrival, named `<application>-<index>`) drawn with `rules`
    ("sia" or "pollux") and `seed` from the Philly trace at `trace_csv`, for `cluster`."""
    rules = RULES[rules]
    if not 0 < load < math.inf:
        raise ValueError(f"load {load}: the number of jobs relative to the samplers' {jobs}, a positive number")
    arrival, gpu_hours = philly_pool(str(trace_csv), *window)
    count = round(jobs * load)
    if count > len(arrival):
        raise ValueError(f"load {load} asks for {count} jobs; the trace's window holds {len(arrival)}")
    rng = np.random.default_rng(seed)
    picks = np.sort(rng.choice(len(arrival), size=count, replace=False))
    gpu_type, per_node = reference(rules, cluster)
    bounds = [bound for bound, _ in APPLICATIONS]
    bands = [tuple(a for a in names if a not in rules.excluded) for _, names in APPLICATIONS]
    drawn = []
    for pick in picks:
        names = bands[int(np.searchsorted(bounds, gpu_hours[pick], side="right"))]
        app = apps[str(rng.choice(names))]
        options = configurations(app, gpu_type, per_node, rules.gpu_counts)
        gpus, batch = options[rng.integers(len(options))]
        drawn.append((float(arrival[pick]), app.name, gpus, batch))
    drawn.sort()
    return [JobSpec(f"{name}-{i}", t, gpus, name, batch) for i, (t, name, gpus, batch) in enumerate(drawn)]
