"""Each policy on tiny workloads whose outcome can be worked out by hand."""
import numpy as np
import pytest

from easyscale_ext.sched.models.cluster import Cluster
from easyscale_ext.sched.models.job import make_job
from easyscale_ext.sched.models.workload import JobSpec
from easyscale_ext.sched.policies.fifo import FifoPolicy
from easyscale_ext.sched.policies.optimus import OptimusPolicy
from easyscale_ext.sched.policies.pollux import PolluxPolicy, _Search, needed_nodes
from easyscale_ext.sched.policies.sia import SiaPolicy
from easyscale_ext.sched.policies.tiresias import TiresiasPolicy
from easyscale_ext.sched.simulator import SimConfig, simulate

FREE = SimConfig(round_s=60, restart_s=0, start_s=0)


def trace_job(name, arrival, gpus, duration):
    return JobSpec(name, arrival, gpus, duration=duration)


def jcts(result):
    return {j["name"]: j["jct"] for j in result.jobs}


def test_fifo_head_of_line_blocks_and_yarn_cs_runs_one_job_at_a_time():
    jobs = [trace_job("a", 0, 4, 100), trace_job("b", 0, 1, 50), trace_job("c", 0, 1, 50)]
    # a takes all 4 GPUs at t=0 (the first round) and ends at 100; b and c start at the round after, 120.
    fifo = simulate(jobs, FifoPolicy(), Cluster.parse("2x2"), None, FREE)
    assert jcts(fifo) == {"a": 100, "b": 170, "c": 170}
    # EasyScale's YARN-CS: c waits for b to end (170) though 3 GPUs are free, and starts at the round after, 180.
    yarn = simulate(jobs, FifoPolicy(exclusive=True), Cluster.parse("2x2"), None, FREE)
    assert jcts(yarn) == {"a": 100, "b": 170, "c": 230}
    assert simulate(jobs[1:], FifoPolicy(exclusive=True), Cluster.parse("2x2"), None, FREE).jobs[1]["start"] == 60


def test_fifo_packs_small_jobs_on_the_fullest_node():
    jobs = [trace_job("a", 0, 3, 1000), trace_job("b", 0, 1, 1000), trace_job("c", 0, 4, 1000)]
    result = simulate(jobs, FifoPolicy(), Cluster.parse("2x4"), None, FREE)
    assert {j["name"]: j["start"] for j in result.jobs} == {"a": 0, "b": 0, "c": 0}  # b fills a's node


def test_tiresias_demotes_after_16_gpu_hours_and_the_newcomer_preempts():
    hour = 3600
    jobs = [trace_job("long", 0, 4, 6 * hour), trace_job("short", hour, 4, hour)]
    result = simulate(jobs, TiresiasPolicy(), Cluster.parse("1x4"), None, FREE)
    got = {j["name"]: j for j in result.jobs}
    # long has used 16 GPU-hours after 4 h: demoted, preempted by short (4 h -> 5 h), then resumes.
    assert got["short"]["start"] == 4 * hour and got["short"]["jct"] == 4 * hour
    assert got["long"]["completion"] == 7 * hour and got["long"]["restarts"] == 1


def test_tiresias_backfills_a_job_that_fits():
    jobs = [trace_job("a", 0, 3, 600), trace_job("b", 0, 4, 600), trace_job("c", 0, 1, 600)]
    result = simulate(jobs, TiresiasPolicy(), Cluster.parse("1x4"), None, FREE)
    assert {j["name"]: j["start"] for j in result.jobs} == {"a": 0, "b": 600, "c": 0}


def test_optimus_gives_one_gpu_each_then_the_largest_marginal_gain(apps):
    jobs = [JobSpec("big", 0, 1, "cifar10", 2048), JobSpec("small", 0, 1, "cifar10", 128)]
    live = [make_job(s, apps, s.batch_size) for s in jobs]
    alloc = OptimusPolicy().optimize(60, live, Cluster.parse("1x4"), {})
    # By hand, from cifar10's placements.csv (T4; step, sync in s) and its validation files' iteration column.
    # Iteration time at r GPUs on one node = step + accumulation steps x (step - sync):
    #   big, 2048: r=1 two micro-batches of 1024: 2 x 0.702093 - 0.000547 = 1.403638; r=2 1024 each: 0.837972
    #   small, 128: r=1 (one GPU accumulates at least once) 2 x 0.103115 - 0.000525 = 0.205705 (128 between
    #   the measured 91 and 129); r=2 64 each: 0.065473; r=3 43 each: 0.057276 (between 32 and 45)
    # Iterations left, epoch 0 to 99: big 3178 - 112 = 3066; small 39062 - 390 = 38672.
    # Both get 1 GPU. Third GPU: big (1.403638 - 0.837972) x 3066 = 1734 against small
    # (0.205705 - 0.065473) x 38672 = 5423: small. Fourth: big 1734 against small (0.065473 - 0.057276) x 38672
    # = 317: big.
    assert {k: len(v) for k, v in alloc.items()} == {"big": 2, "small": 2}


def test_pollux_explores_then_scales_a_lone_job_out(apps):
    result = simulate([JobSpec("c", 0, 1, "cifar10", 128)], PolluxPolicy(seed=1), Cluster.parse("1x4"), apps)
    gpus = {g for _, _, _, g in result.segments}
    assert gpus == {1, 2, 4}  # at most twice what it has been measured on: 1, then 2, then 4


@pytest.mark.parametrize("search, start", [("elitist", 60), ("nsga2", 0)])
def test_pollux_shares_a_node_fairly(apps, search, start):
    jobs = [JobSpec("a", 0, 1, "cifar10", 128), JobSpec("b", 0, 1, "cifar10", 128)]
    result = simulate(jobs, PolluxPolicy(seed=1, search=search), Cluster.parse("1x4"), apps)
    first = {}
    for name, begin, _, gpus in result.segments:
        first.setdefault(name, (begin, gpus))
    # Both start in the same round, as p = -1 never starves one of two identical jobs. At age 0 the restart factor
    # makes starting add nothing to the power mean: the elitist search starts them in the next round, NSGA-II at
    # once (its second objective, the cluster utility, prefers it).
    assert first["a"][0] == first["b"][0] == start


def test_a_wrong_pollux_search_is_named():
    with pytest.raises(ValueError, match="expected one of nsga2, elitist"):
        PolluxPolicy(search="nsga3")


def test_a_wrong_pollux_node_choice_is_named():
    with pytest.raises(ValueError, match="expected one of all, needed"):
        PolluxPolicy(nodes="some")


def test_a_negative_count_of_exactly_solved_configurations_is_named():
    with pytest.raises(ValueError, match="exact_options -1: the most configurations solved exactly, 0 or more"):
        SiaPolicy(exact_options=-1)


def test_pollux_needed_nodes_are_the_held_ones_and_enough_free_ones_of_each_type():
    cluster = Cluster.parse("3x4:t4,3x4:a100")  # nodes in order: t4 0-2, a100 3-5
    base = np.array([[0, 2, 0, 0, 0, 0], [0, 0, 0, 0, 1, 0]])
    # free nodes of each type: as many as hold each job at its limit on whole 4-GPU nodes
    assert needed_nodes(base, cluster, np.array([4, 5])).tolist() == [0, 1, 2, 3, 4, 5]
    assert needed_nodes(base, cluster, np.array([1, 1])).tolist() == [0, 1, 2, 3, 4, 5]
    assert needed_nodes(base, cluster, np.array([3, 0])).tolist() == [0, 1, 3, 4]
    assert needed_nodes(base, cluster, np.array([0, 0])).tolist() == [1, 4]


def test_pollux_on_needed_nodes_decides_as_on_all_where_they_are_all_and_stays_within_them(apps):
    jobs = [JobSpec("a", 0, 1, "cifar10", 128), JobSpec("b", 30, 1, "cifar10", 128)]
    small = Cluster.parse("2x4")  # two jobs can use both nodes: the same nodes, the same random path
    assert simulate(jobs, PolluxPolicy(seed=1, nodes="needed"), small, apps).segments == \
        simulate(jobs, PolluxPolicy(seed=1), small, apps).segments
    large = Cluster.parse("40x4")
    searched = []

    class Recorded(PolluxPolicy):
        def optimize(self, now, jobs, cluster, allocations):
            chosen = super().optimize(now, jobs, cluster, allocations)
            searched.append(self._last[2])
            assert {n for alloc in chosen.values() for n in alloc} <= set(self._last[2].tolist())
            return chosen

    result = simulate(jobs, Recorded(seed=1, nodes="needed"), large, apps)
    assert {name for name, *_ in result.segments} == {"a", "b"}
    # the first round: one job never measured, limited to one GPU: one free node of the 40
    assert len(searched[0]) == 1


def test_pollux_search_keeps_allocations_when_moving_gains_nothing():
    # Two jobs, linear speedups: any full allocation has the same value, but a change costs its restart factor.
    base = np.array([[2, 0], [0, 2]])
    speedup = np.tile(np.arange(5.0), (2, 3, 1))
    search = _Search(base, np.array([2, 2]), np.array([4, 4]), speedup, np.array([0.5, 0.5]), -1.0, 0.5,
                     np.random.default_rng(0))
    best = search.run(base[None], 16, 10)[0]
    assert np.array_equal(best, base)


def test_pollux_nsga2_keeps_every_individual_distinct():
    """As pymoo's NSGA-II (`eliminate_duplicates`) in the artifact: after as many generations, its Pareto set holds
    as many allocations as the elitist search's population, all different; the elitist search collapses onto
    copies of its best."""
    base = np.zeros((3, 4), dtype=np.int64)  # 3 jobs, 4 nodes of 2 GPUs, linear speedups up to 8 GPUs
    speedup = np.tile(np.arange(9.0), (3, 5, 1))
    search = _Search(base, np.full(4, 2), np.full(3, 8), speedup, np.ones(3), -1.0, 0.25, np.random.default_rng(0))
    population = search.run(base[None], 16, 10)
    assert len({s.tobytes() for s in population}) < 16
    front = search.nsga2(base[None], 16, 10)
    assert len(front) > 1 and len({s.tobytes() for s in front}) == len(front)
    assert (front.sum(axis=1) <= 2).all() and (front.sum(axis=2) <= 8).all()  # feasible: the repair ran


def test_pollux_search_objective_is_the_power_mean():
    base = np.zeros((2, 1), dtype=np.int64)
    speedup = np.tile(np.arange(5.0), (2, 2, 1))
    search = _Search(base, np.array([4]), np.array([4, 4]), speedup, np.ones(2), -1.0, 1.0, None)
    value = search.objective(np.array([[[1], [3]]]))[0]
    assert value == pytest.approx(2 / (1 / 1.001 + 1 / 3.001))


def test_pollux_speedup_table_needs_nodes_used_only_up_to_the_gpus_a_job_may_take():
    """A job on n nodes holds at least n GPUs: a table of 6 nodes' columns where no job takes more than 2 GPUs needs
    3 (0-2 nodes used); a shorter one is refused, a longer one changes nothing."""
    base = np.zeros((2, 6), dtype=np.int64)
    speedup = np.random.default_rng(0).random((2, 7, 3))
    states = np.zeros((3, 2, 6), dtype=np.int64)
    states[1, 0, :2] = 1
    states[2, :, 3] = 1, 1
    full, short = (_Search(base, np.full(6, 4), np.array([2, 2]), table, np.ones(2), -1.0, 0.5, None)
                   for table in (speedup, speedup[:, :3]))
    assert np.array_equal(full.objective(states), short.objective(states))
    assert np.array_equal(full.utility(states), short.utility(states))
    with pytest.raises(ValueError, match="node axis"):
        _Search(base, np.full(6, 4), np.array([2, 2]), speedup[:, :2], np.ones(2), -1.0, 0.5, None)


def test_fifo_and_tiresias_keep_each_job_on_one_gpu_type():
    jobs = [trace_job("a", 0, 3, 600), trace_job("b", 0, 3, 600), trace_job("c", 0, 2, 600)]
    cluster = Cluster.parse("1x4:t4,1x4:v100")
    for policy in (FifoPolicy(), TiresiasPolicy()):
        result = simulate(jobs, policy, cluster, None, FREE)  # the simulator checks no job spans types
        starts = {j["name"]: j["start"] for j in result.jobs}
        assert starts == {"a": 0, "b": 0, "c": 600}, policy.name  # c fits in 2 free GPUs, but not of one type


def test_optimus_refuses_mixed_clusters(apps):  # Pollux runs there unaware of types (test_sia.py)
    live = [make_job(JobSpec("c", 0, 1, "cifar10", 128), apps, 128)]
    with pytest.raises(ValueError, match="mixes several"):
        simulate([live[0].spec], OptimusPolicy(), Cluster.parse("1x4:t4,1x4:v100"), apps)


def test_p100_profile_scales_compute_by_easyscale_ratio(apps):
    app = apps["imagenet"]  # ResNet50 in EasyScale's measurements: P100 0.415 s, T4 0.6097 s per step
    assert app.step_ratio("p100") == pytest.approx(0.415 / 0.6097)
    t4, p100 = app.profile("t4").step_time((4, 4), 100), app.profile("p100").step_time((4, 4), 100)
    assert p100[1] == t4[1] and p100[0] - p100[1] == pytest.approx((t4[0] - t4[1]) * 0.415 / 0.6097)
