"""The round (sched/rounds.py) over a backend of its own: typed decisions in a fixed order, cuts that events force
before the policy decides, limits held for every policy, node keys that are not the policy's indices."""
from easyscale_ext.sched import rounds
from easyscale_ext.sched.models.cluster import Cluster
from easyscale_ext.sched.models.workload import JobSpec
from easyscale_ext.sched.policies.base import Policy
from easyscale_ext.sched.rounds import Change, Cut, Decision, View
from easyscale_ext.sched.simulator import SimConfig, simulate


class Script(Policy):
    """Decides, round after round, what it is told; remembers what it saw."""
    name = "script"

    def __init__(self, *decisions):
        self.decisions, self.seen = list(decisions), []

    def optimize(self, now, jobs, cluster, allocations):
        self.seen.append((cluster.gpus, dict(allocations)))
        return dict(self.decisions.pop(0))


class Job:
    def __init__(self, name, min_gpus=1, max_gpus=None):
        self.name, self.spec = name, JobSpec(name, 0.0, 1, min_gpus=min_gpus, max_gpus=max_gpus)


class Backend:
    """Rounds at t = 0, 1, ... over nodes named "a", "b", "c" of 2 GPUs each; `events[t]`: the nodes lost (and the
    cuts their loss forces) before round t."""

    def __init__(self, jobs, rounds_, lost=None):
        self.jobs, self.rounds, self.lost = jobs, rounds_, lost or {}
        self.nodes, self.held, self.ran, self.carried, self.accounted = ["a", "b", "c"], {}, set(), [], []
        self.now = -1

    def next_round(self):
        self.now += 1
        return self.now if self.now < self.rounds else None

    def deciding(self):
        from contextlib import nullcontext
        return nullcontext()

    def view(self, now):
        cuts = []
        for node in self.lost.get(now, ()):
            self.nodes.remove(node)
            cuts += [Cut(job, tuple(n for n in nodes if n != node), f"{node} lost") for job, nodes in self.held.items()
                     if node in nodes]
        cluster = Cluster(",".join("1x2:t4" for _ in self.nodes), (2,) * len(self.nodes), ("t4",) * len(self.nodes))
        return View(self.jobs, cluster, dict(self.held), tuple(self.nodes), cuts)

    def has_run(self, job):
        return job in self.ran

    def carry_out(self, now, changes):
        self.carried.append((now, changes))
        for change in changes:
            if change.new:
                self.held[change.job] = change.new
                self.ran.add(change.job)
            else:
                del self.held[change.job]

    def account(self, now, held):
        assert held == self.held
        self.accounted.append(now)


def kinds(backend):
    return [[(d.job, d.change) for d in changes] for _, changes in backend.carried]


def test_each_change_is_typed_and_in_the_policys_order_then_the_stopped_jobs():
    jobs = [Job("x"), Job("y"), Job("z")]
    policy = Script({"y": (0,), "x": (1,)},  # both start, in the policy's order
                    {"x": (1, 1), "y": (0,), "z": (2,)},  # x grows, z starts
                    {"z": (2,), "x": (1,)},  # x shrinks, y stopped: last
                    {"x": (0,), "y": (1, 1)},  # x moves, y resumes, z suspended
                    {})
    backend = Backend(jobs, 5)
    rounds.run(backend, policy)
    assert kinds(backend) == [[("y", Change.START), ("x", Change.START)],
                              [("x", Change.GROW), ("z", Change.START)],
                              [("x", Change.SHRINK), ("y", Change.SUSPEND)],
                              [("x", Change.MOVE), ("y", Change.RESUME), ("z", Change.SUSPEND)],
                              [("x", Change.SUSPEND), ("y", Change.SUSPEND)]]
    assert backend.accounted == [0, 1, 2, 3, 4]
    first = backend.carried[0][1][0]
    assert first == Decision("y", Change.START, (), ("a",), "by script")  # node keys, not the policy's indices


def test_a_node_lost_is_cut_before_the_policy_decides_which_sees_the_rest_under_new_indices():
    jobs = [Job("x"), Job("y")]
    policy = Script({"x": (0, 1), "y": (1,)},  # x on a and b, y on b
                    {"x": (0, 0), "y": (1,)})  # after b is lost: x grows on a, y stays on c (index 1 now)
    backend = Backend(jobs, 2, lost={1: ["b"]})
    rounds.run(backend, policy)
    cuts, decided = backend.carried[1][1], backend.carried[2][1]
    assert cuts == [Decision("x", Change.SHRINK, ("a", "b"), ("a",), "b lost"),
                    Decision("y", Change.SUSPEND, ("b",), (), "b lost")]
    assert policy.seen[1] == ((2, 2), {"x": (0,)})  # a and c; y holds nothing
    assert decided == [Decision("x", Change.GROW, ("a",), ("a", "a"), "by script"),
                       Decision("y", Change.RESUME, (), ("c",), "by script")]


def test_every_policy_is_held_to_each_jobs_limits_in_the_round():
    jobs = [Job("small", max_gpus=1), Job("big", min_gpus=3)]
    policy = Script({"small": (0, 0, 1), "big": (1,)})  # small above its maximum, big below its minimum
    backend = Backend(jobs, 1)
    rounds.run(backend, policy)
    assert backend.held == {"small": ("a",), "big": ("b", "b", "c")}  # its own node first, then the emptiest


def test_without_preemption_no_decision_of_the_policy_stops_a_running_job_but_a_cut_does():
    jobs = [Job("x"), Job("y")]
    policy = Script({"x": (1,)}, {"y": (0,)}, {"y": (0,)})
    backend = Backend(jobs, 3, lost={2: ["b"]})
    rounds.run(backend, policy, preempt=False)
    assert kinds(backend) == [[("x", Change.START)], [("y", Change.START)],
                              [("x", Change.SUSPEND)], []]  # round 1 kept x; b's loss took it
    assert backend.held == {"y": ("a",)}


def test_the_simulator_honours_a_workloads_limits(tmp_path):
    """A workload's `min_gpus` and `max_gpus` columns hold in `easyscale simulate` as in the cluster: EasyScale's
    policy would start a job on one GPU and grow it to its virtual workers."""
    from easyscale_ext.sched.models.application import Applications
    from easyscale_ext.sched.models.traces import data_dir
    from easyscale_ext.sched.models.workload import load_workload
    from easyscale_ext.sched.policies import POLICIES

    path = tmp_path / "w.csv"
    path.write_text("name,time,application,max_parallelism,batch_size,epochs,enable_heterogeneous_deterministic,"
                    "preferred_gpu,min_gpus,max_gpus\n"
                    "held,0,cifar10,8,32,1,0,t4,2,3\n"
                    "free,0,cifar10,8,32,1,0,t4,1,8\n")
    specs = load_workload(str(path))
    result = simulate(specs, POLICIES["easyscale-homo"](0), Cluster.parse("2x4:t4"), Applications(data_dir()),
                      SimConfig(round_s=60.0))
    held = {name: {gpus for job, _, _, gpus in result.segments if job == name} for name in ("held", "free")}
    assert min(held["held"]) >= 2 and max(held["held"]) <= 3, held
    assert min(held["free"]) < 2 or max(held["free"]) > 3, held  # unheld, the same policy goes past both


def test_a_workloads_limits_that_cannot_hold_are_refused_naming_the_job(tmp_path):
    import pytest

    from easyscale_ext.sched.models.workload import load_workload

    path = tmp_path / "w.csv"
    path.write_text("name,time,application,num_replicas,batch_size,min_gpus,max_gpus\nj,0,cifar10,2,64,3,2\n")
    with pytest.raises(ValueError, match="job j needs 1 <= min_gpus \\(3\\) <= max_gpus \\(2\\)"):
        load_workload(str(path))
