"""What a real cluster carries out: Limits repairs any policy's decision so that limits hold, and (without preemption)
running jobs keep slots and no node is over-filled; job models follow what real jobs measured."""
import pytest

from easyscale_ext.sched import live
from easyscale_ext.sched.models.application import Applications
from easyscale_ext.sched.models.cluster import Cluster
from easyscale_ext.sched.models.traces import data_dir
from easyscale_ext.sched.policies import POLICIES, RUNNABLE
from easyscale_ext.sched.policies.base import Policy
from easyscale_ext.sched.policies.limits import Limits

CLUSTER = Cluster("2x2:t4", (2, 2), ("t4", "t4"))


class Fixed(Policy):
    """Decides what it is told: the decision to repair."""
    name = "fixed"

    def __init__(self, decision):
        self.decision = decision

    def optimize(self, now, jobs, cluster, allocations):
        return dict(self.decision)


def jobs(*names):
    return [live.job_model(n, float(i), 4, 4) for i, n in enumerate(names)]


def test_a_running_job_the_policy_would_stop_keeps_its_slots_and_displaces_a_new_start():
    policy = Limits(Fixed({"new": (0, 0, 1)}), preempt=False)  # stops "old" to start "new" where "old" runs
    assert policy.optimize(0, jobs("old", "new"), CLUSTER, {"old": (0,)}) == {"old": (0,)}


def test_a_start_that_fits_beside_a_kept_job_stays():
    policy = Limits(Fixed({"new": (1, 1)}), preempt=False)
    assert policy.optimize(0, jobs("old", "new"), CLUSTER, {"old": (0,)}) == {"old": (0,), "new": (1, 1)}


def test_a_changed_running_job_goes_back_only_where_it_over_fills_a_node():
    # "a" grows onto node 1, which "b" keeps (the policy stopped it): a's change is undone; c's start fits
    policy = Limits(Fixed({"a": (0, 1, 1), "c": (0,)}), preempt=False)
    result = policy.optimize(0, jobs("a", "b", "c"), CLUSTER, {"a": (0,), "b": (1, 1)})
    assert result == {"a": (0,), "b": (1, 1), "c": (0,)}


def test_limits_cap_an_allocation_and_top_up_a_start_below_the_minimum_where_slots_are_free():
    policy = Limits(Fixed({"a": (0, 0, 1), "b": (1,)}))
    policy.limits = {"a": (1, 2), "b": (2, 4)}
    assert policy.optimize(0, jobs("a", "b"), CLUSTER, {}) == {"a": (0, 0), "b": (1, 1)}
    policy.limits = {"a": (1, 3), "b": (2, 4)}  # one slot left for b, which needs two: it does not start
    assert policy.optimize(0, jobs("a", "b"), CLUSTER, {}) == {"a": (0, 0, 1)}


TWO_TYPES = Cluster.parse("1x2:a100,1x2:t4")


@pytest.mark.parametrize("name, d2, spans", [("easyscale-heter", True, True), ("elastic-goodput", True, True),
                                             ("easyscale-heter", False, False), ("easyscale-homo", True, False),
                                             ("sia", True, False)])
def test_a_job_that_needs_more_slots_than_one_type_has_starts_where_the_policy_may_span_it(name, d2, spans):
    """A job at D2 of minimum 3 on two types of 2 slots each: what `submit` admits (the policy's spans_types) is
    what starts in the first round. EasyScale starts every job on one GPU; elastic-goodput would give a CNN two
    A100s."""
    apps = Applications(data_dir())
    policy = Limits(POLICIES[name](0))
    job = live.job_model("j", 0.0, 8, 8, apps["cifar10"], None, policy, d2=d2)
    policy.limits = {"j": (3, 8)}
    assert policy.spans_types(job) == spans
    decided = policy.optimize(0.0, [job], TWO_TYPES, {})
    if spans:
        assert len(decided["j"]) == 3 and {TWO_TYPES.types[n] for n in decided["j"]} == {"a100", "t4"}, decided
    else:
        assert decided == {}


def test_easyscale_spreads_a_d2_job_over_both_types_where_its_model_runs_it_faster():
    """A job at D2 pays D2 on one type too, so EasyScale's model weighs a spread fairly: DeepSpeech2 of 4 virtual
    workers steps faster on 2 A100 + 2 T4 slots than on the 2 A100s, and grows onto all four, one increment a
    round (CIFAR-10 does not: two of its workers on an A100 beat one on a T4)."""
    apps = Applications(data_dir())
    policy = Limits(POLICIES["easyscale-heter"](0))
    held = {}
    for app in ("deepspeech2", "cifar10"):
        job = live.job_model("j", 0.0, 4, 4, apps[app], None, policy, d2=True)
        allocations = {}
        for round_ in range(4):
            allocations = policy.optimize(round_ * 5.0, [job], TWO_TYPES, allocations)
            live.place(job, TWO_TYPES.groups(allocations["j"]))
            live.follow(job, round_ * 5.0 + 5.0, 5.0, runs=True)
        held[app] = sorted(allocations["j"])
    assert held == {"deepspeech2": [0, 0, 1, 1], "cifar10": [0, 0]}, held


@pytest.mark.parametrize("name", sorted(RUNNABLE))
def test_every_policy_runs_on_live_job_models_without_stopping_a_running_job(name):
    apps = Applications(data_dir())
    policy = Limits(RUNNABLE[name](0), preempt=False)
    models = [live.job_model(f"j{i}", i * 10.0, 4, 4, apps["cifar10"], None, policy) for i in range(5)]
    allocations = {}
    for round_ in range(4):
        decided = policy.optimize(round_ * 60.0, models, CLUSTER, allocations)
        assert all(u <= g for u, g in zip(CLUSTER.used(decided), CLUSTER.gpus)), decided
        assert all(decided.get(n) for n in allocations), f"a running job was stopped: {allocations} -> {decided}"
        for job in models:
            if decided.get(job.name, ()) != allocations.get(job.name, ()):
                job.allocate(CLUSTER.groups(decided[job.name]), 0.0)
            if job.placement:
                live.follow(job, round_ * 60.0 + 60, 60.0, done=0.2 * (round_ + 1), step_s=0.5)
        allocations = decided
    assert allocations, f"{name} started no job"


def test_a_model_follows_the_real_jobs_progress_and_step_time():
    apps = Applications(data_dir())
    job = live.job_model("j", 0.0, 4, 4, apps["cifar10"])
    job.allocate({"t4": (2,)}, 0.0)
    modelled = job.iteration_time()
    live.follow(job, 3600.0, 3600.0, done=0.5, step_s=2 * modelled)
    assert job.progress == 0.5 * job.app.noise.progress_at(job.epochs)
    assert job.app.noise.progress_at(job.epoch) <= job.progress < job.app.noise.progress_at(job.epoch + 1)
    assert job.slowdown == 2.0 and job.completion is None
    live.follow(job, 10 ** 7, 10 ** 7)  # far past the model's end: only the real job ends a job
    assert job.completion is None and job.epoch == job.epochs - 1


def test_a_model_seen_running_has_measured_its_slots_at_once():
    """The round that first sees a real job run on its slots finds its model measured there (as a simulated job
    is once its modelled start is over), not a round later."""
    apps = Applications(data_dir())
    job = live.job_model("j", 0.0, 4, 4, apps["cifar10"])
    live.place(job, {"t4": (2,)})
    live.follow(job, 10.0, 10.0)  # still starting
    assert job.reallocating and not job.observed
    live.follow(job, 30.0, 20.0, done=0.1, runs=True)
    assert not job.reallocating and job.configuration in job.observed and job.grad is not None


def test_a_job_put_back_that_over_fills_another_node_displaces_the_start_there():
    # b grows onto node 0 where a and c are kept: b goes back to node 1, where the new start d must then yield
    policy = Limits(Fixed({"b": (0, 0), "d": (1,), "e": (1,)}), preempt=False)
    before = {"a": (0,), "c": (0,), "b": (1,), "e": (1,)}
    assert policy.optimize(0, jobs("a", "b", "c", "d", "e"), CLUSTER, before) == before


def test_a_running_job_the_policy_stops_is_preempted_and_its_slots_go_to_the_policys_choice():
    policy = Limits(Fixed({"new": (0, 0, 1)}))  # the default: policies run as they are, preemptions included
    assert policy.optimize(0, jobs("old", "new"), CLUSTER, {"old": (0,)}) == {"new": (0, 0, 1)}
    policy = Limits(Fixed({"old": (0,), "new": (0, 1, 1)}))
    policy.limits = {"old": (2, 4)}  # below its minimum, with one slot free: preempted too
    assert policy.optimize(0, jobs("old", "new"), CLUSTER, {"old": (0, 1)}) == {"new": (0, 1, 1)}
    policy = Limits(Fixed({"old": (0,)}))
    policy.limits = {"old": (2, 4)}  # with slots free, it keeps its minimum
    assert policy.optimize(0, jobs("old"), CLUSTER, {"old": (0, 1)}) == {"old": (0, 0)}


@pytest.mark.parametrize("policy", ["pollux", "sia", "elastic-goodput"])
def test_a_real_job_keeps_its_batch_whatever_the_policy_would_tune(policy):
    """A real job's global batch is its virtual workers' micro-batches, fixed (they keep its bits): a policy that
    tunes batches models it, and the simulation of the cluster runs it, at that batch."""
    from easyscale_ext.sched.models.job import AppJob, VirtualWorkerJob

    app = Applications(data_dir())["yolov3"]
    free = live.job_model("j", 0.0, 4, 4, app, policy=POLICIES[policy](0))
    held = live.job_model("j", 0.0, 4, 4, app, policy=Limits(POLICIES[policy](0)))
    assert type(free) is AppJob  # the policy alone would tune it: the test can fail
    assert isinstance(held, VirtualWorkerJob) and held.spec.batch_size == 4 * (app.init_batch_size // 4)


def test_a_real_jobs_goodput_is_valued_at_its_own_micro_batches():
    """A job of 4 virtual workers records its step times on one type as any job's agent does, and its goodput
    model values it at its batch: each GPU runs its share of the micro-batches (2 GPUs: 2 each, 3 GPUs: the busiest
    2), and it cannot use more GPUs than it has virtual workers."""
    app = Applications(data_dir())["yolov3"]
    job = live.job_model("j", 0.0, 4, 4, app, policy=Limits(POLICIES["sia"](0)))
    for gpus in (1, 2, 4):
        job.allocate({"t4": (gpus,)}, 0.0)
        job.iteration_time()
    assert sorted(job.observed) == [(1, g, job.micro_batch) for g in (1, 2, 4)]
    model = job.goodput_model()
    good, local, accum = model.best([1] * 5, [1, 2, 3, 4, 5])
    assert list(local) == [job.micro_batch] * 5 and list(accum) == [3, 1, 1, 0, 0]
    assert good[4] == 0 and good[0] < good[1] < good[3] and good[2] < good[1] * 1.5  # 3 GPUs: 2 micro-batches
    adaptive = live.job_model("k", 0.0, 4, 4, app, policy=POLICIES["sia"](0))
    adaptive.allocate({"t4": (1,)}, 0.0)
    adaptive.iteration_time()
    assert adaptive.goodput_model().best(1, 8)[0][0] > 0  # an adaptive job's batch grows with its GPUs


@pytest.mark.parametrize("name", ["pollux", "sia", "elastic-goodput"])
def test_policies_that_read_measurements_grow_a_real_job_and_prefer_its_faster_type(name):
    """Under Limits (the cluster's jobs keep their batch), the policies that value jobs by what they measured see
    them: a lone job grows past 1 GPU (they offer at most twice what it has been measured on), and the type-aware
    ones move it to its faster type (Sia once offered 1 GPU of each type, valued alike, to a job that never
    measured anything, and Pollux never more than 1 GPU)."""
    from easyscale_ext.sched.models.workload import JobSpec
    from easyscale_ext.sched.simulator import SimConfig, simulate

    apps = Applications(data_dir())
    cluster = Cluster.parse("1x4:t4,1x4:a100")
    policy = Limits(POLICIES[name](0))
    spec = JobSpec("j", 0.0, 4, app="bert", batch_size=4 * (apps["bert"].init_batch_size // 4), virtual_workers=4)
    result = simulate([spec], policy, cluster, apps, SimConfig(round_s=60.0, start_s=10.0, restart_s=10.0))
    assert max(gpus for _, _, _, gpus in result.segments) > 1, result.segments
    if name == "pollux":  # one type in its model
        return
    job = live.job_model("j", 0.0, 4, 4, apps["bert"], policy=policy)
    job.allocate(cluster.groups((0,)), 0.0)  # 1 GPU of node 0, a T4: bert runs 3x as fast on an A100
    job.iteration_time()
    decided = policy.optimize(100.0, [job], cluster, {"j": (0,)})
    assert set(decided["j"]) == {1}, decided
