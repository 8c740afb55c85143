"""Job models that follow real jobs: what the cluster scheduler hands its policy instead of simulated jobs.

The scheduler keeps, for each job of the cluster, the job model a simulation of it would use (models.job),
and before each round brings it to what the real job did: time passes for it as in the simulator (its
GPU-seconds of service, its agent's observations on the profiles), then its progress becomes the real job's
share of steps done, and the ratio of its measured step time to the modelled one becomes its slowdown. A job
given slots is reallocating (its processes start, or its joiners prepare) until the real job reports a step on
them, as a simulated one is until its modelled first step there (RuntimeCosts.reported_steps). So a policy reads the
same models, with the same fields, in both drivers.
"""
import math
from typing import Optional

from ..sched.models.job import AppJob, TraceJob, make_job
from ..sched.models.workload import JobSpec


class ElasticTraceJob(TraceJob):
    """A real job of unknown length and no profile: rigid to the policy (it asks for `max_procs` slots), yet the
    cluster may run it on fewer (a reservation took a slot, a node went) while it runs in place."""

    def _configure(self):
        pass


def job_model(name: str, arrival: float, virtual_workers: int, max_procs: int, app=None, batch_size=None,
              policy=None, d2: bool = False, min_procs: int = 1):
    """The model of a submitted job: a profiled application's (with `app`) or else a trace job of unknown
    length that asks for `max_procs` slots; it holds between `min_procs` and `max_procs`. `d2`: it runs at D2, so
    it may span device types, and its steps cost D2's compute on one type too. A real job keeps its global batch
    (its virtual workers' micro-batches, which keep its bits): a policy that would tune it models it at that
    batch."""
    limits = dict(min_gpus=min_procs, max_gpus=max_procs)
    if app is None:
        return ElasticTraceJob(JobSpec(name, arrival, max_procs, duration=float("inf"), heterogeneous=d2, **limits))
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
    """The job was given `groups` ({type: slots per node}); it is reallocating until `follow` says it runs on
    them: a real start has no modelled length."""
    job.allocate(groups, math.inf if groups else 0.0)


def follow(job, now: float, seconds: float, done: Optional[float] = None, step_s: Optional[float] = None,
           runs: bool = False) -> None:
    """Let `seconds` pass for `job` up to `now`, then set what was measured: `done`, the share of its steps
    the real job has run, `step_s`, its seconds per step on its current slots, and `runs`, whether it trains on
    every one of them (its start or its joiners' preparation is over). A job seen running has measured its
    slots over those seconds (its agent's observations), as a simulated one has from the end of its modelled
    start: its model would otherwise learn of them a round later, and a policy would value it as unmeasured."""
    if runs:
        job.delay_left = 0.0
    job.advance(now - seconds, seconds)
    job.completion = None  # the real job says when it ends
    if not isinstance(job, AppJob):
        return
    if done is not None:
        noise = job.app.noise
        job.progress = min(done, 1.0) * noise.progress_at(job.epochs)
        job.epoch = sum(noise.progress_at(e + 1) <= job.progress for e in range(job.epochs))
    job.epoch = min(job.epoch, job.epochs - 1)  # its last epoch runs until the real job ends
    if step_s is not None and job.placement:
        job.slowdown = step_s / job.iteration_time()
