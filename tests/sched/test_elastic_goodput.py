"""Our policy and the simulator's in-place reallocation, on tiny cases."""
import math

import pytest

from easyscale_ext.sched.models.cluster import Cluster
from easyscale_ext.sched.models.job import make_job
from easyscale_ext.sched.models.workload import JobSpec
from easyscale_ext.sched.policies.fifo import FifoPolicy
from easyscale_ext.sched.policies.elastic_goodput import ElasticGoodputPolicy, remaining_work
from easyscale_ext.sched.policies.sia import SiaPolicy, one_gpu_throughput
from easyscale_ext.sched.simulator import SimConfig, simulate
from test_sia import running


class Resizer(FifoPolicy):
    """Gives the one job 1 GPU, then 2, then none, then 1: two reallocations and a restart."""
    plan = [(0,), (0, 0), (), (0,)]

    def optimize(self, now, jobs, cluster, allocations):
        step = min(int(now // 60) - 1, len(self.plan) - 1)
        return {j.name: self.plan[step] for j in jobs}


def test_in_place_policies_pay_the_pause_between_allocations_and_a_restart_after_none(apps):
    spec = JobSpec("a", 0, 1, "cifar10", 128, epochs=10)
    config = SimConfig(restart_s=30.0, start_s=30.0, in_place_s=0.5)
    end = {}
    for in_place in (False, True):
        policy = Resizer()
        policy.in_place = in_place
        end[in_place] = simulate([spec], policy, Cluster.parse("1x4"), apps, config).jobs[0]["completion"]
    # The same allocations. In place, the 1 -> 2 GPU change pauses 0.5 s, not 30 s: 29.5 s more on 2 GPUs,
    # which would take between 29.5 s and twice that on the 1 GPU the job ends on. The start after holding
    # nothing costs 30 s either way (else 59 s would be saved).
    assert 29.5 < end[False] - end[True] < 59.0


def test_elastic_goodput_discounts_a_change_by_the_in_place_pause_not_a_restart(apps):
    # A job measured on 2 GPUs, restarted once, 40 s old: Sia's restart factor (40 - 30) / (40 + 30) = 1/7
    # makes growing to 4 GPUs look worse than staying; at its 1 s the factor is ~1 and it grows.
    job = running(apps, "a", 2, "t4", seconds=40)
    job.starts = 2
    cluster, current = Cluster.parse("1x4:t4"), {"a": (0, 0)}
    assert len(SiaPolicy().optimize(40, [job], cluster, current)["a"]) == 2
    policy = ElasticGoodputPolicy()
    policy._record([job])
    values = policy._values(job, ["t4"], {"t4": [1, 2, 4]}, {"t4": 4})
    assert values["t4", 4] > values["t4", 2]  # 4 GPUs are worth more, undiscounted
    assert len(policy.optimize(40, [job], cluster, current)["a"]) == 4


def test_elastic_goodput_never_stops_a_running_job_for_a_waiting_one_of_the_same_value(apps):
    """One GPU, a job on it and a new one, each worth 1 (normalised): a swap gains nothing and costs a suspension
    and a resume. Before, the solver broke the tie by job order: listed first, the new job took the GPU."""
    for app in ("cifar10", "bert"):
        held = running(apps, "a", 1, "t4", app=app)
        new = make_job(JobSpec("b", 0, 1, app, 128), apps, None)
        for jobs in ([held, new], [new, held]):
            assert ElasticGoodputPolicy().optimize(600, jobs, Cluster.parse("1x1:t4"), {"a": (0,)}) == {"a": (0,)}


def test_elastic_goodput_gives_more_gpus_to_the_job_nearer_its_end(apps):
    """Two jobs alike but for their share done, 6 GPUs: one gets 4, the other 2. With the remaining-work weight
    the one with less work left gets 4, whichever it is and in whichever order the jobs are listed (without it,
    elastic-goodput-no-remaining gives the 4 to the same job whichever is nearer)."""
    cluster = Cluster.parse("1x4:t4,1x2:t4")
    unweighted = []
    for near in ("a", "b"):
        jobs = [running(apps, name, 2, "t4") for name in "ab"]
        for job in jobs:
            job.progress = (0.9 if job.name == near else 0.1) * job.app.noise.progress_at(job.epochs)
        far = "b" if near == "a" else "a"
        left = {job.name: remaining_work(job) for job in jobs}  # GPU-seconds held x (1 - f) / f
        assert left[near] == pytest.approx(1200 / 9) and left[far] == pytest.approx(1200 * 9)
        for order in (jobs, jobs[::-1]):
            alloc = ElasticGoodputPolicy().optimize(600, order, cluster, {"a": (0, 0), "b": (1, 1)})
            assert {name: len(a) for name, a in alloc.items()} == {n: 4 if n == near else 2 for n in "ab"}
        ablation = ElasticGoodputPolicy(remaining=False)
        alloc = ablation.optimize(600, jobs, cluster, {"a": (0, 0), "b": (1, 1)})
        unweighted.append({name: len(a) for name, a in alloc.items()})
    assert ablation.name == "elastic-goodput-no-remaining" and unweighted[0] == unweighted[1]


def test_remaining_work_counts_a_second_on_a_slower_type_as_the_share_of_one_on_the_fastest(apps):
    """Two jobs alike, each half done after 240 GPU-seconds, one on T4s, one on A100s: in GPU-seconds held both
    have as much left; in seconds of the cluster's type fastest for them, the one on T4s has a T4's one-GPU
    throughput over an A100's of that (1 / 6.9): a second on a slow type is less work done and less left."""
    jobs = [running(apps, "a", 2, "t4", seconds=120), running(apps, "b", 2, "a100", seconds=120)]
    for job in jobs:
        job.progress = 0.5 * job.app.noise.progress_at(job.epochs)
    assert [job.attained_on for job in jobs] == [{"t4": 240.0}, {"a100": 240.0}]
    assert remaining_work(jobs[0]) == remaining_work(jobs[1]) == pytest.approx(240.0)
    slower = one_gpu_throughput(jobs[0].app, "t4") / one_gpu_throughput(jobs[0].app, "a100")
    assert slower == pytest.approx(1 / 6.8993, rel=1e-4)
    assert remaining_work(jobs[0], ("t4", "a100")) == pytest.approx(240.0 * slower)
    assert remaining_work(jobs[1], ("t4", "a100")) == pytest.approx(240.0)
    assert remaining_work(jobs[0], ("t4",)) == pytest.approx(240.0)  # on a cluster of T4s only, T4s are fastest


@pytest.mark.parametrize("weigh_types,fast", [(True, "near"), (False, "far")])
def test_the_remaining_work_weight_decides_who_grows_not_who_gets_the_faster_type(apps, weigh_types, fast):
    """An A100 and a T4, two jobs measured on a T4: DeepSpeech2 nine tenths done (2.5 times as fast on the A100) and
    BERT a tenth done (10.8 times). Weighting a job's every value by its remaining work gives the A100 to the job
    nearer its end; weighting only what it gains above one GPU of each type, to the job it speeds up most."""
    near, far = running(apps, "near", 1, "t4", app="deepspeech2"), running(apps, "far", 1, "t4", app="bert")
    for job, share in ((near, 0.9), (far, 0.1)):
        job.progress = share * job.app.noise.progress_at(job.epochs)
    cluster = Cluster.parse("1x1:a100,1x1:t4")
    alloc = ElasticGoodputPolicy(weigh_types=weigh_types).optimize(600, [near, far], cluster, {})
    assert alloc[fast] == (0,) and cluster.types[0] == "a100"


@pytest.mark.parametrize("age_s,floor", [(math.inf, 0.0), (2400.0, 0.25), (1000.0, 0.6), (300.0, 1.0)])
def test_the_age_bound_lifts_a_held_back_job_towards_the_median_with_its_time_in_the_system(apps, age_s, floor):
    """The job far from its end is weighted median / its remaining work (about 0.51 here) until it has been in the
    system for long enough: its weight is at least its age over age_s, up to the median job's (1)."""
    jobs = [running(apps, name, 2, "t4") for name in "ab"]
    for job, share in zip(jobs, (0.9, 0.1)):
        job.progress = share * job.app.noise.progress_at(job.epochs)
    policy = ElasticGoodputPolicy(age_s=age_s)
    policy.optimize(600, jobs, Cluster.parse("1x4:t4,1x2:t4"), {"a": (0, 0), "b": (1, 1)})
    left = {job.name: remaining_work(job) for job in jobs}
    median = (left["a"] + left["b"]) / 2
    assert policy._weights["a"] == pytest.approx(median / left["a"])  # far above any floor
    assert policy._weights["b"] == pytest.approx(max(median / left["b"], floor))
    assert policy.name == "elastic-goodput" + ("" if age_s == math.inf else f"-age-{age_s / 3600:g}h")


class TypesRecorded(ElasticGoodputPolicy):
    """Ours, recording the set of GPU types of every allocation it decides."""

    def __init__(self):
        super().__init__()
        self.types = set()

    def optimize(self, now, jobs, cluster, allocations):
        decided = super().optimize(now, jobs, cluster, allocations)
        self.types |= {frozenset(cluster.types[n] for n in alloc) for alloc in decided.values() if alloc}
        return decided


@pytest.mark.parametrize("declared", [False, True])
def test_elastic_goodput_spans_gpu_types_only_for_a_job_whose_workload_allows_it(apps, declared):
    """BERT (D2 cheap) on 4 T4s and 4 2080Tis: declared heterogeneous (EasyScale's workload column), it runs on
    both types at once and ends sooner; a Pollux-format job says nothing and keeps to one type at a time."""
    spec = JobSpec("b", 0, 4, "bert", 384, heterogeneous=declared)
    policy = TypesRecorded()
    jct = simulate([spec], policy, Cluster.parse("1x4:t4,1x4:2080ti"), apps).jobs[0]["jct"]
    assert (frozenset({"t4", "2080ti"}) in policy.types) == declared, policy.types
    assert (jct < 3000) == declared, jct  # about 2,830 s spanning, 3,540 s on one type at a time
