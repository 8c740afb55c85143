"""What a run achieved: JCT statistics, makespan, utilisation, reallocations, finish-time fairness."""
import math

import numpy as np

from .models.job import make_job


def isolated_runtimes(specs, apps, cluster, make=make_job) -> dict:
    """Per job, its runtime alone on the GPUs it asked for (the first node type's GPUs, packed), under the job
    model `make(spec, apps, batch)` makes (simulator.job_maker)."""
    per_node, gpu_type = cluster.gpus[0], cluster.types[0]
    return {s.name: isolated_runtime(s, apps, per_node, gpu_type, make) for s in specs}


def isolated_runtime(spec, apps, gpus_per_node, gpu_type, make=make_job) -> float:
    """Seconds the job needs alone on the GPUs it asked for, with its own batch size, packed on full nodes
    and never restarted: the reference for finish-time fairness. `make(spec, apps, batch)` makes its model."""
    job = make(spec, apps, spec.batch_size)
    full, rest = divmod(spec.num_gpus, gpus_per_node)
    job.allocate({gpu_type: (gpus_per_node,) * full + ((rest,) if rest else ())}, 0.0)
    horizon = spec.duration if spec.app is None else 1e9
    job.advance(0.0, horizon)
    return math.inf if job.completion is None else job.completion


def finish_time_fairness(result, isolated, total_gpus) -> np.ndarray:
    """Themis's rho per job: its JCT over its runtime on a 1/N share of the cluster, N being the mean number of
    jobs present during its life. A job cannot run faster than alone on what it asked for, so the share only
    lengthens the reference when the job asked for more than it. rho > 1: the job did worse than its share."""
    t = np.asarray(result.timeline["time"], dtype=float)
    active = np.asarray(result.timeline["active"], dtype=float)
    cum = np.concatenate([[0.0], np.cumsum(active)])
    rho = []
    for job in result.jobs:
        lo, hi = np.searchsorted(t, job["arrival"]), np.searchsorted(t, job["completion"], side="right")
        n = (cum[hi] - cum[lo]) / (hi - lo) if hi > lo else 1.0
        share = total_gpus / max(n, 1.0)
        rho.append(job["jct"] / (isolated[job["name"]] * max(1.0, job["gpus_asked"] / share)))
    return np.array(rho)


def summarize(result, total_gpus, isolated=None) -> dict:
    """The run's figures; finish-time fairness too given each job's `isolated` runtime."""
    jct = np.array([j["jct"] for j in result.jobs])
    start = min(j["arrival"] for j in result.jobs)
    end = max(j["completion"] for j in result.jobs)
    summary = {
        "jobs": len(jct),
        "avg_jct": float(jct.mean()),
        "p50_jct": float(np.percentile(jct, 50)),
        "p99_jct": float(np.percentile(jct, 99)),
        "makespan": float(end - start),
        "gpu_util": float(sum(j["gpu_seconds"] for j in result.jobs) / (total_gpus * (end - start))),
        "restarts_per_job": float(np.mean([j["restarts"] for j in result.jobs])),
    }
    if isolated is not None:
        rho = finish_time_fairness(result, isolated, total_gpus)
        summary.update(ftf_mean=float(rho.mean()), ftf_max=float(rho.max()), ftf_over_1=float(np.mean(rho > 1)))
    return summary
