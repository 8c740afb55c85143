"""Our policy and the simulator's in-place reallocation, on tiny cases."""
from easyscale_ext.sched.cluster import Cluster
from easyscale_ext.sched.fifo import FifoPolicy
from easyscale_ext.sched.job import make_job, virtual_worker_step
from easyscale_ext.sched.ours import OursPolicy
from easyscale_ext.sched.simulator import SimConfig, simulate
from easyscale_ext.sched.workload import JobSpec


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


def test_fixed_batch_jobs_stay_within_their_virtual_workers_and_their_type(apps):
    cluster = Cluster.parse("1x8:v100,1x4:t4")
    bound = make_job(JobSpec("bound", 0, 4, "cifar10", 4 * 128, virtual_workers=4, preferred_gpu="t4"), apps, None)
    free = make_job(JobSpec("free", 0, 2, "bert", 2 * 12, virtual_workers=2, heterogeneous=True,
                            preferred_gpu="t4"), apps, None)
    values = OursPolicy()._values(bound, ["v100", "t4"], {"v100": [1, 2, 4, 8], "t4": [1, 2, 4]},
                                  {"v100": 8, "t4": 4})
    assert set(values) == {("t4", 1), ("t4", 2), ("t4", 4)}  # no D2: its preferred type only; at most D = 4
    step = {g: virtual_worker_step(bound.app, 4, 128, (("t4", (g,)),))[0] for g in (1, 2, 4)}
    assert values[("t4", 4)] == step[1] / step[4] and min(values.values()) == 1.0
    values = OursPolicy()._values(free, ["v100", "t4"], {"v100": [1, 2, 4, 8], "t4": [1, 2, 4]},
                                  {"v100": 8, "t4": 4})
    assert set(values) == {(t, g) for t in ("v100", "t4") for g in (1, 2)}  # D2: any type
    result = simulate([bound.spec, free.spec], OursPolicy(), cluster, apps, SimConfig())
    assert all(j["completion"] > j["arrival"] for j in result.jobs)
    assert all(g <= 4 for name, _, _, g in result.segments if name == "bound")
