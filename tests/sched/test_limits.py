"""The round holds any policy's decision to each job's limits and, without preemption, keeps running jobs running
with no node over-filled (sched/limits.py)."""
import math

from easyscale_ext.sched.limits import hold
from easyscale_ext.sched.models.cluster import Cluster
from easyscale_ext.sched.models.job import TraceJob
from easyscale_ext.sched.models.workload import JobSpec
from easyscale_ext.sched.policies.base import Policy

CLUSTER = Cluster("2x2:t4", (2, 2), ("t4", "t4"))


class Fixed(Policy):
    """Decides what it is told: the decision to repair."""
    name = "fixed"

    def __init__(self, decision):
        self.decision = decision

    def optimize(self, now, jobs, cluster, allocations):
        return dict(self.decision)


def jobs(*names, **limits):
    """Trace jobs asking for 4 GPUs; `limits`: name -> (min, max) GPUs (default 1 and 4)."""
    return [TraceJob(JobSpec(n, float(i), 4, duration=math.inf, min_gpus=limits.get(n, (1, 4))[0],
                             max_gpus=limits.get(n, (1, 4))[1])) for i, n in enumerate(names)]


def test_a_running_job_the_policy_would_stop_keeps_its_slots_and_displaces_a_new_start():
    decided = hold(Fixed({"new": (0, 0, 1)}), 0, jobs("old", "new"), CLUSTER, {"old": (0,)}, preempt=False)
    assert decided == {"old": (0,)}  # the policy stopped "old" to start "new" where "old" runs


def test_a_start_that_fits_beside_a_kept_job_stays():
    decided = hold(Fixed({"new": (1, 1)}), 0, jobs("old", "new"), CLUSTER, {"old": (0,)}, preempt=False)
    assert decided == {"old": (0,), "new": (1, 1)}


def test_a_changed_running_job_goes_back_only_where_it_over_fills_a_node():
    # "a" grows onto node 1, which "b" keeps (the policy stopped it): a's change is undone; c's start fits
    result = hold(Fixed({"a": (0, 1, 1), "c": (0,)}), 0, jobs("a", "b", "c"), CLUSTER, {"a": (0,), "b": (1, 1)},
                  preempt=False)
    assert result == {"a": (0,), "b": (1, 1), "c": (0,)}


def test_limits_cap_an_allocation_and_top_up_a_start_below_the_minimum_where_slots_are_free():
    policy = Fixed({"a": (0, 0, 1), "b": (1,)})
    assert hold(policy, 0, jobs("a", "b", a=(1, 2), b=(2, 4)), CLUSTER, {}) == {"a": (0, 0), "b": (1, 1)}
    # one slot left for b, which needs two: it does not start
    assert hold(policy, 0, jobs("a", "b", a=(1, 3), b=(2, 4)), CLUSTER, {}) == {"a": (0, 0, 1)}



def test_a_job_put_back_that_over_fills_another_node_displaces_the_start_there():
    # b grows onto node 0 where a and c are kept: b goes back to node 1, where the new start d must then yield
    policy = Fixed({"b": (0, 0), "d": (1,), "e": (1,)})
    before = {"a": (0,), "c": (0,), "b": (1,), "e": (1,)}
    assert hold(policy, 0, jobs("a", "b", "c", "d", "e"), CLUSTER, before, preempt=False) == before


def test_a_running_job_the_policy_stops_is_preempted_and_its_slots_go_to_the_policys_choice():
    # the default: policies run as they are, preemptions included
    assert hold(Fixed({"new": (0, 0, 1)}), 0, jobs("old", "new"), CLUSTER, {"old": (0,)}) == {"new": (0, 0, 1)}
    # below its minimum, with one slot free: preempted too
    assert hold(Fixed({"old": (0,), "new": (0, 1, 1)}), 0, jobs("old", "new", old=(2, 4)), CLUSTER,
                {"old": (0, 1)}) == {"new": (0, 1, 1)}
    # with slots free, it keeps its minimum
    assert hold(Fixed({"old": (0,)}), 0, jobs("old", old=(2, 4)), CLUSTER, {"old": (0, 1)}) == {"old": (0, 0)}
