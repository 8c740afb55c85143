"""EasyScale's policy in the simulator: the virtual-worker step model, its waste metric, the policy's rounds
on tiny clusters, and EasyScale-format workloads (read, written, drawn from the Philly trace)."""
import pytest

from easyscale_ext.sched.models.cluster import Cluster
from easyscale_ext.sched.models.job import make_job
from easyscale_ext.sched.models.virtual_workers import virtual_worker_step
from easyscale_ext.sched.models.workload import (JobSpec, easyscale_workload, load_workload,
                                                 write_easyscale_workload)
from easyscale_ext.sched.policies.easyscale import EasyScalePolicy
from easyscale_ext.sched.policies.fifo import FifoPolicy
from easyscale_ext.sched.simulator import InvariantError, SimConfig, simulate

MIXED = "1x4:v100,1x4:t4"


def spec(name="a", d=4, app="bert", heterogeneous=True, preferred="v100", arrival=0.0, epochs=1):
    return JobSpec(name, arrival, d, app, d * 12, virtual_workers=d, heterogeneous=heterogeneous,
                   preferred_gpu=preferred, epochs=epochs)


def vw_job(s, apps):
    """The job the simulator gives EasyScale's policy: D virtual workers at the user's batch."""
    return make_job(s, apps, s.batch_size)


def test_one_worker_per_gpu_is_the_measured_step(apps):
    app = apps["bert"]
    step, waste = virtual_worker_step(app, 4, 12, (("t4", (2, 2)),))
    assert step == app.profile("t4").step_time((2, 2), 12)[0] and waste == 0.0


def test_workers_follow_speed_and_waste_is_the_idle_share(apps):
    app = apps["bert"]
    v100, t4 = (app.d2_cost * app.worker_compute_time(t, 12) for t in ("v100", "t4"))
    assert v100 < t4 / 2  # bert: a V100 computes more than twice as fast as a T4
    # 5 workers on a V100 and a T4: the V100 takes 4 (4 v100 < 2 t4), the T4 one; D2's cost on both.
    step, waste = virtual_worker_step(app, 5, 12, (("v100", (1,)), ("t4", (1,))))
    busy = [4 * v100, t4]
    assert waste == pytest.approx(1 - sum(busy) / (2 * max(busy)))
    # each GPU: k - 1 workers' compute, then the last one's step on the job's placement, its sync included
    last = {t: app.profile(t).step_time((1, 1), 12) for t in ("v100", "t4")}
    ends = [(k - 1) * c + app.d2_cost * (last[t][0] - last[t][1]) + last[t][1]
            for k, c, t in ((4, v100, "v100"), (1, t4, "t4"))]
    assert step == pytest.approx(max(ends))
    # 4 workers on 4 equal GPUs waste nothing; 6 on 4 leave two GPUs idle half the time.
    assert virtual_worker_step(app, 4, 12, (("t4", (4,)),))[1] == 0.0
    assert virtual_worker_step(app, 6, 12, (("t4", (4,)),))[1] == pytest.approx(0.25)


def test_waiting_jobs_start_on_one_gpu_of_their_type_and_grow_by_doubling_at_most(apps):
    cluster, policy = Cluster.parse(MIXED), EasyScalePolicy()
    jobs = [vw_job(spec("a", 8), apps), vw_job(spec("b", 8, arrival=1.0), apps)]
    first = policy.optimize(60, jobs, cluster, {})
    assert [cluster.groups(first[n]) for n in "ab"] == [{"v100": (1,)}, {"v100": (1,)}]
    second = policy.optimize(120, jobs, cluster, first)
    for name in "ab":  # never shrunk, at most doubled
        assert set(first[name]) <= set(second[name]) and len(second[name]) <= 2 * len(first[name])
    assert sum(map(len, second.values())) > 2


def test_homo_mode_and_jobs_without_d2_never_mix_types(apps):
    cluster = Cluster.parse(MIXED)
    for policy, heterogeneous in ((EasyScalePolicy(heterogeneous=False), True), (EasyScalePolicy(), False)):
        jobs = [vw_job(spec(n, 8, heterogeneous=heterogeneous, arrival=i), apps) for i, n in enumerate("abcd")]
        jobs += [vw_job(spec("late", 4, heterogeneous=heterogeneous, arrival=9), apps)]
        alloc = {}
        for t in range(60, 1200, 60):
            alloc = policy.optimize(t, jobs, cluster, alloc)
            assert all(len(cluster.groups(a)) == 1 and cluster.types[a[0]] == "v100" for a in alloc.values())
        assert "late" not in alloc  # the V100s are taken and the T4s are not its type


def test_heter_mode_puts_a_d2_job_on_another_type_when_its_own_is_full(apps):
    cluster = Cluster.parse(MIXED)
    jobs = [vw_job(spec(n, 8, arrival=i), apps) for i, n in enumerate("abcd")]
    jobs.append(vw_job(spec("late", 4, arrival=9), apps))
    alloc = {n: (0,) for n in "abcd"}  # the four V100s (node 0)
    alloc = EasyScalePolicy().optimize(60, jobs, cluster, alloc)
    assert cluster.groups(alloc["late"]) == {"t4": (1,)}


def test_simulated_heter_beats_homo_beats_yarn_on_a_mixed_cluster(apps):
    cluster, config = Cluster.parse(MIXED), SimConfig(start_s=20, restart_s=0)
    specs = [spec(f"j{i}", 4, preferred="v100", arrival=60.0 * i, epochs=1) for i in range(4)]
    jct = {}
    for policy in (EasyScalePolicy(), EasyScalePolicy(heterogeneous=False), FifoPolicy(exclusive=True)):
        result = simulate(specs, policy, cluster, apps, config)
        jct[policy.name] = sum(j["jct"] for j in result.jobs) / len(result.jobs)
    assert jct["easyscale-heter"] < jct["easyscale-homo"] < jct["yarn-cs"]


def test_the_simulator_refuses_a_mixed_allocation_for_a_job_without_d2(apps):
    class Mixer(FifoPolicy):
        def optimize(self, now, jobs, cluster, allocations):
            return {j.name: (0, 1) for j in jobs}

    with pytest.raises(InvariantError, match="does not allow it"):
        simulate([spec(d=2, heterogeneous=False)], Mixer(), Cluster.parse("1x2:v100,1x2:t4"), apps)


def test_workload_round_trip_and_generator(tmp_path, apps, data):
    cluster = Cluster.parse("4x8:v100,2x8:p100,4x4:t4")
    trace = load_workload(data / "pollux" / "traces" / "philly.csv", limit=20000)
    specs = easyscale_workload(trace, apps, cluster, jobs=12, hours=1.0, seed=3)
    assert specs == easyscale_workload(trace, apps, cluster, jobs=12, hours=1.0, seed=3)  # seeded
    path = tmp_path / "w.csv"
    write_easyscale_workload(specs, path)
    back = load_workload(path)
    assert back == sorted(specs, key=lambda s: (s.arrival, s.name))
    room = cluster.room(cluster.gpus)
    for s in back:
        assert 2 <= s.virtual_workers <= room[s.preferred_gpu] and s.num_gpus == s.virtual_workers
        assert 1 <= s.epochs <= apps[s.app].epochs and s.heterogeneous == (apps[s.app].d2_cost <= 1.1)
        assert 0 <= s.arrival <= 3600 and s.batch_size % s.virtual_workers == 0
