"""The records a policy reads of real jobs (cluster.live): the models of a simulation of them, written by the jobs'
reports (Job.report), held to the jobs' limits by the round."""
from dataclasses import replace

import pytest

from easyscale_ext.cluster import live
from easyscale_ext.sched.limits import hold
from easyscale_ext.sched.models.application import Applications
from easyscale_ext.sched.models.cluster import Cluster
from easyscale_ext.sched.models.job import make_job
from easyscale_ext.sched.models.traces import data_dir
from easyscale_ext.sched.policies import POLICIES, RUNNABLE

CLUSTER = Cluster("2x2:t4", (2, 2), ("t4", "t4"))
TWO_TYPES = Cluster.parse("1x2:a100,1x2:t4")


@pytest.mark.parametrize("name, d2, spans", [("easyscale-heter", True, True), ("elastic-goodput", True, True),
                                             ("easyscale-heter", False, False), ("easyscale-homo", True, False),
                                             ("sia", True, False)])
def test_a_job_that_needs_more_slots_than_one_type_has_starts_where_the_policy_may_span_it(name, d2, spans):
    """A job at D2 of minimum 3 on two types of 2 slots each: what `submit` admits (the policy's spans_types) is
    what starts in the first round. EasyScale starts every job on one GPU; elastic-goodput would give a CNN two
    A100s."""
    apps = Applications(data_dir())
    policy = POLICIES[name](0)
    job = live.job_model("j", 0.0, 8, 8, apps["cifar10"], None, policy, d2=d2, min_procs=3)
    assert policy.spans_types(job) == spans
    decided = hold(policy, 0.0, [job], TWO_TYPES, {})
    if spans:
        assert len(decided["j"]) == 3 and {TWO_TYPES.types[n] for n in decided["j"]} == {"a100", "t4"}, decided
    else:
        assert decided == {}


def test_easyscale_spreads_a_d2_job_over_both_types_where_its_model_runs_it_faster():
    """A job at D2 pays D2 on one type too, so EasyScale's model weighs a spread fairly: DeepSpeech2 of 4 virtual
    workers steps faster on 2 A100 + 2 T4 slots than on the 2 A100s, and grows onto all four, one increment a
    round (CIFAR-10 does not: two of its workers on an A100 beat one on a T4)."""
    apps = Applications(data_dir())
    policy = POLICIES["easyscale-heter"](0)
    held = {}
    for app in ("deepspeech2", "cifar10"):
        job = live.job_model("j", 0.0, 4, 4, apps[app], None, policy, d2=True)
        allocations = {}
        for round_ in range(4):
            allocations = hold(policy, round_ * 5.0, [job], TWO_TYPES, allocations)
            live.place(job, TWO_TYPES.groups(allocations["j"]))
            job.report(5.0, runs=True)
        held[app] = sorted(allocations["j"])
    assert held == {"deepspeech2": [0, 0, 1, 1], "cifar10": [0, 0]}, held


@pytest.mark.parametrize("name", sorted(RUNNABLE))
def test_every_policy_runs_on_live_job_models_without_stopping_a_running_job(name):
    apps = Applications(data_dir())
    policy = RUNNABLE[name](0)
    models = [live.job_model(f"j{i}", i * 10.0, 4, 4, apps["cifar10"], None, policy) for i in range(5)]
    allocations = {}
    for round_ in range(4):
        decided = hold(policy, round_ * 60.0, models, CLUSTER, allocations, preempt=False)
        assert all(u <= g for u, g in zip(CLUSTER.used(decided), CLUSTER.gpus)), decided
        assert all(decided.get(n) for n in allocations), f"a running job was stopped: {allocations} -> {decided}"
        for job in models:
            if decided.get(job.name, ()) != allocations.get(job.name, ()):
                job.allocate(CLUSTER.groups(decided[job.name]), 0.0)
            if job.placement:
                job.report(60.0, done=0.2 * (round_ + 1), step_s=0.5)
        allocations = decided
    assert allocations, f"{name} started no job"


def test_a_record_takes_the_real_jobs_progress_and_step_time_and_never_its_models():
    """A report writes what the real job measured, and nothing of the simulated model: an hour on 2 T4s at twice
    the profiled step time is half of its steps, whatever the model would have run; only the real job ends it."""
    apps = Applications(data_dir())
    job = live.job_model("j", 0.0, 4, 4, apps["cifar10"])
    job.allocate({"t4": (2,)}, 0.0)
    modelled = job.iteration_time()
    job.report(3600.0, done=0.5, step_s=2 * modelled, runs=True)
    assert job.progress == 0.5 * job.app.noise.progress_at(job.epochs)
    assert job.app.noise.progress_at(job.epoch) <= job.progress < job.app.noise.progress_at(job.epoch + 1)
    assert job.step_s == 2 * modelled and job.attained == 7200.0 and job.attained_on == {"t4": 7200.0}
    job.report(10 ** 7, runs=True)  # far past the model's end, no progress reported: as it was
    assert job.progress == 0.5 * job.app.noise.progress_at(job.epochs) and job.completion is None
    job.report(60.0, done=1.0)  # its last step is done: it runs its last epoch until the real job has ended
    assert job.completion is None and job.epoch == job.epochs - 1 and job.step_s == 2 * modelled
    job.allocate({"t4": (4,)}, 0.0)
    assert job.step_s is None  # measured on other slots


def test_a_model_seen_running_has_measured_its_slots_at_once():
    """The round that first sees a real job run on its slots finds its model measured there (as a simulated job
    is once its modelled start is over), not a round later."""
    apps = Applications(data_dir())
    job = live.job_model("j", 0.0, 4, 4, apps["cifar10"])
    live.place(job, {"t4": (2,)})
    job.report(10.0)  # still starting
    assert job.reallocating and not job.observed
    job.report(20.0, done=0.1, runs=True)
    assert not job.reallocating and job.configuration in job.observed and job.grad is not None


@pytest.mark.parametrize("policy", ["pollux", "sia", "elastic-goodput"])
def test_a_real_job_keeps_its_batch_whatever_the_policy_would_tune(policy):
    """A real job's global batch is its virtual workers' micro-batches, fixed (they keep its bits): a policy that
    tunes batches models it, and the simulation of the cluster runs it, at that batch."""
    from easyscale_ext.sched.models.job import AppJob, VirtualWorkerJob

    app = Applications(data_dir())["yolov3"]
    from easyscale_ext.sched.simulator import batch_of

    held = live.job_model("j", 0.0, 4, 4, app, policy=POLICIES[policy](0))
    free = replace(held.spec, keeps_batch=False)
    assert type(make_job(free, {app.name: app}, batch_of(free, POLICIES[policy](0), {app.name: app}))) is AppJob
    assert isinstance(held, VirtualWorkerJob) and held.spec.batch_size == 4 * (app.init_batch_size // 4)


def test_a_real_jobs_goodput_is_valued_at_its_own_micro_batches():
    """A job of 4 virtual workers records its step times on one type as any job's agent does, and its goodput
    model values it at its batch: each GPU runs its share of the micro-batches (2 GPUs: 2 each, 3 GPUs: the busiest
    2), and it cannot use more GPUs than it has virtual workers."""
    app = Applications(data_dir())["yolov3"]
    job = live.job_model("j", 0.0, 4, 4, app, policy=POLICIES["sia"](0))
    for gpus in (1, 2, 4):
        job.allocate({"t4": (gpus,)}, 0.0)
        job.iteration_time()
    assert sorted(job.observed) == [(1, g, job.micro_batch) for g in (1, 2, 4)]
    model = job.goodput_model()
    good, local, accum = model.best([1] * 5, [1, 2, 3, 4, 5])
    assert list(local) == [job.micro_batch] * 5 and list(accum) == [3, 1, 1, 0, 0]
    assert good[4] == 0 and good[0] < good[1] < good[3] and good[2] < good[1] * 1.5  # 3 GPUs: 2 micro-batches
    adaptive = make_job(replace(job.spec, name="k", keeps_batch=False), {app.name: app}, None)
    adaptive.allocate({"t4": (1,)}, 0.0)
    adaptive.iteration_time()
    assert adaptive.goodput_model().best(1, 8)[0][0] > 0  # an adaptive job's batch grows with its GPUs


@pytest.mark.parametrize("name", ["pollux", "sia", "elastic-goodput"])
def test_policies_that_read_measurements_grow_a_real_job_and_prefer_its_faster_type(name):
    """On models of real jobs (which keep their batch), the policies that value jobs by what they measured see
    them: a lone job grows past 1 GPU (they offer at most twice what it has been measured on), and the type-aware
    ones move it to its faster type (Sia once offered 1 GPU of each type, valued alike, to a job that never
    measured anything, and Pollux never more than 1 GPU)."""
    from easyscale_ext.sched.models.workload import JobSpec
    from easyscale_ext.sched.simulator import SimConfig, simulate

    apps = Applications(data_dir())
    cluster = Cluster.parse("1x4:t4,1x4:a100")
    policy = POLICIES[name](0)
    spec = JobSpec("j", 0.0, 4, app="bert", batch_size=4 * (apps["bert"].init_batch_size // 4), virtual_workers=4,
                   keeps_batch=True)
    result = simulate([spec], policy, cluster, apps, SimConfig(round_s=60.0, start_s=10.0, restart_s=10.0))
    assert max(gpus for _, _, _, gpus in result.segments) > 1, result.segments
    if name == "pollux":  # one type in its model
        return
    job = live.job_model("j", 0.0, 4, 4, apps["bert"], policy=policy)
    job.allocate(cluster.groups((0,)), 0.0)  # 1 GPU of node 0, a T4: bert runs 3x as fast on an A100
    job.iteration_time()
    decided = hold(policy, 100.0, [job], cluster, {"j": (0,)})
    assert set(decided["j"]) == {1}, decided
