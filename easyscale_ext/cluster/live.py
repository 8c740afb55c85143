"""The records a cluster scheduler's policy reads of its jobs: the job models of a simulation of them (models.job),
written by the real jobs' reports instead of the simulator.

The scheduler keeps, for each job of the cluster, the record a simulation of it would have, and before each round
writes into it what the real job reported (Job.report): the seconds it held its slots (its service, in all and on
each type), its share of steps done (its progress and epoch), its seconds per step, and whether it trains on every
slot it was given. Until it does, it is reallocating (its processes start, or its joiners prepare), as a simulated job
is until its modelled first step there (RuntimeCosts.reported_steps); once it does, its agent has measured those slots
(the profiles). So a policy reads the same records, with the same fields, in both drivers.
"""
import math
from typing import Optional

from ..sched.models.job import TraceJob, make_job
from ..sched.models.workload import JobSpec


def job_model(name: str, arrival: float, virtual_workers: int, max_procs: int, app=None, batch_size=None,
              policy=None, d2: bool = False, min_procs: int = 1):
    """The model of a submitted job: a profiled application's (with `app`) or else a trace job of unknown
    length that asks for `max_procs` slots; it holds between `min_procs` and `max_procs`. `d2`: it runs at D2, so
    it may span device types, and its steps cost D2's compute on one type too. A real job keeps its global batch
    (its virtual workers' micro-batches, which keep its bits): a policy that would tune it models it at that
    batch."""
    limits = dict(min_gpus=min_procs, max_gpus=max_procs)
    if app is None:
        return TraceJob(JobSpec(name, arrival, max_procs, duration=float("inf"), heterogeneous=d2, **limits))
    batch = batch_size or virtual_workers * max(1, app.init_batch_size // virtual_workers)
    spec = JobSpec(name, arrival, max_procs, app=app.name, batch_size=batch, virtual_workers=virtual_workers,
                   heterogeneous=d2, runs_d2=d2, keeps_batch=True, **limits)
    job = make_job(spec, {app.name: app}, batch)
    job.per_type_fit = policy is not None and policy.per_type_models  # as the simulator makes it
    return job


# What a model accumulates that no report of the real job gives back.
HISTORY = ("attained", "attained_on", "run_s", "starts")


def history(job) -> dict:
    """What the model has accumulated of its job's service (GPU-seconds held, in all and on each GPU type; seconds
    held; starts), which policies rank jobs by (Tiresias' and EDL's queues, Pollux's order, elastic-goodput's
    remaining work): the job table keeps it, so that a restarted scheduler's model goes on from it rather than from a
    job just submitted."""
    return {field: getattr(job, field) for field in HISTORY}


def restore(job, kept: Optional[dict]) -> None:
    """Give a new model of a job the `history` a model of it had (none: a job the scheduler sees first)."""
    for field, value in (kept or {}).items():
        if field in HISTORY:
            setattr(job, field, value)


def place(job, groups: dict) -> None:
    """The job was given `groups` ({type: slots per node}); it is reallocating until its report says it runs on
    them: a real start has no modelled length."""
    job.allocate(groups, math.inf if groups else 0.0)
