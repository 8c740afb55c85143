"""One job model for every policy: what a reallocation costs, freezing as a per-job opt-in, and the
throughput of a job on mixed GPU types; each against figures computed by hand."""
from dataclasses import replace

import pytest

from easyscale_ext.sched.models import freezing as fz
from easyscale_ext.sched.models.cluster import Cluster
from easyscale_ext.sched.models.job import make_job
from easyscale_ext.sched.models.reallocation import MODEL_STATE, PAUSE_S, in_place_cost, reallocation_cost
from easyscale_ext.sched.models.workload import JobSpec, load_workload
from easyscale_ext.sched.policies import POLICIES
from easyscale_ext.sched.policies.fifo import FifoPolicy
from easyscale_ext.sched.policies.elastic_goodput import ElasticGoodputPolicy
from easyscale_ext.sched.simulator import SIA_RESTARTS, SimConfig, simulate

CLUSTER = Cluster.parse("2x4:t4")  # nodes 0 and 1, four GPUs each
CONFIG = SimConfig(in_place_s=0.1, intra_node_gbps=10.0, inter_node_gbps=2.0)


def job_of(apps, app="imagenet", **spec):
    job = make_job(JobSpec("j", 0, 2, app, 400, **spec), apps, 400)
    job.starts = 1
    return job


def test_an_in_place_move_costs_the_pause_plus_the_bytes_over_the_links_it_crosses(apps):
    job = job_of(apps)  # ResNet-50: 25.6 M fp32 parameters + one momentum slot = 204.8 MB of state
    state = 25.6e6 * 4 * 2
    assert MODEL_STATE["imagenet"].state_bytes == pytest.approx(state)
    # 2 -> 4 GPUs on the same node: the new replicas get the state within the node.
    assert in_place_cost(job, (0, 0), (0, 0, 0, 0), CLUSTER, CONFIG) == pytest.approx(0.1 + state / 10e9)
    # 2 -> 3 GPUs, the third on the other node: the state crosses the network once (one new GPU there).
    assert in_place_cost(job, (0, 0), (0, 0, 1), CLUSTER, CONFIG) == pytest.approx(0.1 + state / 2e9)
    # 2 -> 4, two on the other node: over the network once, then copied within that node.
    assert in_place_cost(job, (0, 0), (0, 0, 1, 1), CLUSTER, CONFIG) == pytest.approx(
        0.1 + state / 2e9 + state / 10e9)
    # Shrinking within a node: only the leaving GPU's context (0.2 MB of BatchNorm buffers) moves, within the node.
    context = MODEL_STATE["imagenet"].context_bytes
    assert in_place_cost(job, (0, 0), (0,), CLUSTER, CONFIG) == pytest.approx(0.1 + context / 10e9)
    # A move to the other node altogether: state over the network, copied to the second new GPU there, and the
    # two leaving GPUs' contexts over the network.
    assert in_place_cost(job, (0, 0), (1, 1), CLUSTER, CONFIG) == pytest.approx(
        0.1 + state / 2e9 + state / 10e9 + 2 * context / 2e9)
    # Across nodes costs more than within one; both far less than a restart.
    assert in_place_cost(job, (0, 0), (0, 0, 0, 0), CLUSTER, CONFIG) < in_place_cost(
        job, (0, 0), (0, 0, 1, 1), CLUSTER, CONFIG) < 1.0


def test_the_cost_depends_on_how_the_job_runs_not_on_the_policy(apps):
    job = job_of(apps)
    # Restart-based: the flat restart, or Sia's per-application seconds (imagenet 250 s), in place or not alike
    # for a job that held nothing.
    assert reallocation_cost(job, (0, 0), (0, 0, 0, 0), CLUSTER, CONFIG, in_place=False) == 30.0
    assert reallocation_cost(job, (0, 0), (0, 0, 0, 0), CLUSTER, SIA_RESTARTS, in_place=False) == 250
    assert reallocation_cost(job, (), (0, 0), CLUSTER, CONFIG, in_place=True) == 30.0
    assert reallocation_cost(job, (0, 0), (0,), CLUSTER, CONFIG, in_place=True) < 0.2


class Resizer(FifoPolicy):
    """The one job on 1 GPU, then 2 on the same node, then 2 on the other node: two reallocations."""
    plan = [(0,), (0, 0), (1, 1)]

    def optimize(self, now, jobs, cluster, allocations):
        return {j.name: self.plan[min(int(now // 60), 2)] for j in jobs}


@pytest.mark.parametrize("policy_in_place", [False, True])
def test_the_run_switch_sets_in_place_for_every_policy(apps, policy_in_place):
    spec = JobSpec("a", 0, 1, "cifar10", 128, epochs=20)
    runs = {}
    for switch in ("on", "off"):
        policy = Resizer()
        policy.in_place = policy_in_place  # whatever the policy says, the run's switch decides
        runs[switch] = simulate([spec], policy, CLUSTER, apps, replace(CONFIG, in_place=switch)).jobs[0]["completion"]
    # Two reallocations, each followed by 2 GPUs: 30 s each restart-based, in place the pause plus cifar10's
    # 89.6 MB of state within the node, then across (3.125 GB/s by default) and copied to the second GPU there.
    assert 59.0 < runs["off"] - runs["on"] < 60.0


def test_freezing_is_off_unless_a_job_opts_in_or_the_run_turns_it_on(apps, tmp_path):
    plain, opted = JobSpec("a", 0, 1, "cifar10", 128), JobSpec("b", 0, 1, "cifar10", 128, freeze=True)
    assert SimConfig().freezing == "job" and not plain.freeze
    assert fz.timeline_for(plain, SimConfig()) is None
    assert fz.timeline_for(opted, SimConfig()) is fz.TIMELINES["cifar10"]
    assert fz.timeline_for(opted, SimConfig(freezing="off")) is None
    assert fz.timeline_for(plain, SimConfig(freezing="on")) is fz.TIMELINES["cifar10"]
    # No published timeline for YOLOv3: it never freezes.
    assert fz.timeline_for(replace(opted, app="yolov3"), SimConfig(freezing="on")) is None
    # No policy makes its jobs freeze: elastic-goodput runs a workload exactly as with freezing off.
    path = tmp_path / "w.csv"
    path.write_text("name,time,application,num_replicas,batch_size,freeze\na,0,cifar10,1,128,0\nb,0,cifar10,1,128,1\n")
    specs = load_workload(path)
    assert [s.freeze for s in specs] == [False, True]
    one = [replace(s, freeze=False) for s in specs]
    default = simulate(one, POLICIES["elastic-goodput"](0), Cluster.parse("1x2"), apps, SimConfig()).jobs
    off = simulate(one, POLICIES["elastic-goodput"](0), Cluster.parse("1x2"), apps, SimConfig(freezing="off")).jobs
    assert default == off


def test_a_published_timeline_saves_its_share_of_a_compute_bound_run():
    timeline = fz.from_speedup(0.2, *fz.RAMP)
    steps = 100_000
    mean = sum(timeline.at((i + 0.5) / steps)[0] for i in range(steps)) / steps
    assert mean == pytest.approx(0.8, abs=1e-4) and timeline.penalty == 0.0


def test_mixed_types_run_the_balanced_split_of_the_measured_speeds(apps):
    # A bert job (D2 costs it 0.99x) on 1 A100 + 1 T4, batch 96 (micro-batches of at most 12: several workers per GPU).
    job = make_job(JobSpec("m", 0, 2, "bert", 96, heterogeneous=True), apps, 96)
    job.allocate({"a100": (1,), "t4": (1,)}, 0.0)
    app, local = job.app, job.local_bsz
    workers = 2 * (job.accum_steps + 1)
    cost = app.d2_cost
    compute = {t: cost * app.worker_compute_time(t, local) for t in ("a100", "t4")}
    # The balanced split by hand: the A100's share k minimising the slower side's compute.
    k = min(range(1, workers), key=lambda k: max(k * compute["a100"], (workers - k) * compute["t4"]))
    step = 0.0
    for t, n in (("a100", k), ("t4", workers - k)):
        full, sync = app.profile(t).step_time((1, 1), local)
        step = max(step, (n - 1) * compute[t] + cost * (full - sync) + sync)
    assert job.iteration_time() == pytest.approx(step)
    assert k > workers - k  # the faster GPU takes more workers


def test_ours_offers_two_type_configurations_only_where_d2_is_cheap(apps):
    cluster_types = ["t4", "a100", "2080ti"]
    counts = {"t4": [1, 2, 4], "a100": [1, 2, 4, 8], "2080ti": [1, 2, 4, 8]}
    per_node = {"t4": 4, "a100": 8, "2080ti": 8}
    found = {}
    for app in ("bert", "cifar10"):
        job = make_job(JobSpec(app, 0, 1, app, None, heterogeneous=True), apps, None)
        for gpus in (1, 2, 4):  # measured on up to 4 A100s
            job.allocate({"a100": (gpus,)}, 0.0)
            job.advance(0.0, 300)
        for policy in (ElasticGoodputPolicy(), ElasticGoodputPolicy(fast_growth=False)):
            policy._record([job])
            found[app, policy.name] = [c for c in policy._configs(job, cluster_types, counts, per_node) if len(c) > 1]
    # D2 costs BERT 0.99x and ResNets 2.4x (EasyScale's measurements): only BERT may mix (at most 10 %).
    assert found["bert", "elastic-goodput"] and not found["cifar10", "elastic-goodput"]
    # Any two types pair up, the faster for the job first: the A100 with either, and the 2080 Ti (1-GPU BERT
    # throughput 26.9 samples/s) with the T4 (13.0), though neither is the fastest.
    assert {(a, b) for (a, _), (b, _) in found["bert", "elastic-goodput"]} == {("a100", "t4"), ("a100", "2080ti"),
                                                                     ("2080ti", "t4")}
    # A pair grows as far as one type may: with cheap moves past twice the GPUs measured (8), without them not.
    assert max(sum(g for _, g in c) for c in found["bert", "elastic-goodput"]) == 12
    assert max(sum(g for _, g in c) for c in found["bert", "elastic-goodput-no-fast-growth"]) == 8
    assert ElasticGoodputPolicy(mixed=False).name == "elastic-goodput-no-mixed" and not ElasticGoodputPolicy(mixed=False).mixes_types


def test_in_place_pause_is_the_measured_one():
    assert PAUSE_S == pytest.approx(0.0721)  # the pause every simulated table charges (models/reallocation.py)
