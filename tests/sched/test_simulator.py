"""The event loop's invariants on a real workload, determinism, and the command line end to end."""
import argparse
import itertools
import json

import pytest

from easyscale_ext.cli import simulate as simulate_cli
from easyscale_ext.sched.metrics import summarize
from easyscale_ext.sched.costs import RuntimeCosts
from easyscale_ext.sched.models.application import Applications
from easyscale_ext.sched.models.cluster import Cluster
from easyscale_ext.sched.models.job import make_job
from easyscale_ext.sched.models.throughput import fit_perf_params
from easyscale_ext.sched.models.traces import ENV_VAR, data_dir
from easyscale_ext.sched.models.workload import JobSpec, load_workload
from easyscale_ext.sched.policies.base import Policy
from easyscale_ext.sched.policies.fifo import FifoPolicy
from easyscale_ext.sched.policies.pollux import PolluxPolicy
from easyscale_ext.sched.policies.tiresias import TiresiasPolicy
from easyscale_ext.sched.simulator import InvariantError, SimConfig, simulate


@pytest.fixture(scope="module")
def workload(data):
    return data / "pollux" / "workloads" / "workload-6.csv"


def test_missing_data_says_what_to_pass(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    with pytest.raises(FileNotFoundError, match="--data"):
        data_dir()


def test_cluster_spec():
    c = Cluster.parse("6x4:t4,2x8:a100")
    assert c.total_gpus == 40 and c.types[5:7] == ("t4", "a100")
    with pytest.raises(ValueError, match="COUNTxGPUS"):
        Cluster.parse("sixteen")


@pytest.mark.parametrize("policy", [TiresiasPolicy, lambda: PolluxPolicy(seed=3, population=16, generations=4)])
def test_invariants_hold_on_a_real_workload(data, workload, policy):
    specs = load_workload(workload, limit=25)
    result = simulate(specs, policy(), Cluster.parse("8x4"), Applications(data), SimConfig(check=True))
    assert len(result.jobs) == 25 and all(j["completion"] > j["arrival"] for j in result.jobs)
    assert max(result.timeline["gpus"]) <= 32
    summary = summarize(result, 32)
    assert summary["p50_jct"] <= summary["p99_jct"] and 0 < summary["gpu_util"] <= 1


class Greedy(Policy):
    name = "greedy"

    def optimize(self, now, jobs, cluster, allocations):
        return {j.name: (0,) * j.spec.num_gpus for j in jobs}  # everything on node 0


class Idle(Policy):
    name = "idle"

    def optimize(self, now, jobs, cluster, allocations):
        return {}


def test_overallocation_is_caught():
    jobs = [JobSpec("a", 0, 2, duration=100), JobSpec("b", 0, 2, duration=100)]
    with pytest.raises(InvariantError, match="node 0 has 4 GPUs allocated of 2"):
        simulate(jobs, Greedy(), Cluster.parse("2x2"), None)


def test_a_policy_that_never_runs_a_job_is_caught():
    with pytest.raises(InvariantError, match="would never finish"):
        simulate([JobSpec("a", 0, 1, duration=100)], Idle(), Cluster.parse("1x1"), None)


def test_job_larger_than_the_cluster_is_refused():
    with pytest.raises(ValueError, match="more GPUs than the cluster"):
        simulate([JobSpec("a", 0, 8, duration=100)], Idle(), Cluster.parse("1x4"), None)
    with pytest.raises(ValueError, match="of one type"):
        simulate([JobSpec("a", 0, 6, duration=100)], Idle(), Cluster.parse("1x4:t4,1x4:v100"), None)


def parse(*argv):
    parser = argparse.ArgumentParser()
    simulate_cli.add_parser(parser.add_subparsers())
    return parser.parse_args(["simulate", *argv])


def test_same_seed_same_json(workload, tmp_path):
    outs = []
    for run in ("a", "b"):
        args = parse("--workload", str(workload), "--policy", "pollux", "--seed", "7", "--limit", "12",
                     "--out", str(tmp_path / run), "--no-progress")
        assert simulate_cli.main(args) == 0
        outs.append((tmp_path / run / "workload-6-pollux.json").read_text())
    assert outs[0] == outs[1]


def test_cli_end_to_end_all_policies(workload, tmp_path, capsys):
    args = parse("--workload", str(workload), "--policy", "all", "--limit", "10", "--cluster", "4x4",
                 "--out", str(tmp_path), "--no-progress")
    simulate_cli.main(args)
    table = capsys.readouterr().out
    for name in simulate_cli.POLICIES:
        assert name in table
        record = json.loads((tmp_path / f"workload-6-{name}.json").read_text())
        assert record["summary"]["jobs"] == 10 and record["cluster"] == "4x4"
    for figure in ("jct-cdf", "gpus", "summary"):
        assert (tmp_path / f"workload-6-all-{figure}.png").stat().st_size > 0
    assert (tmp_path / "workload-6-pollux-gantt.png").exists()


def test_trace_jobs_need_a_non_elastic_policy():
    with pytest.raises(ValueError, match="use fifo, yarn-cs or tiresias"):
        simulate([JobSpec("a", 0, 1, duration=100)], PolluxPolicy(), Cluster.parse("1x4"), None)


def test_a_calibrated_job_progresses_slower_and_pays_its_applications_restart(apps):
    spec = JobSpec("a", 0, 1, "cifar10", 128, epochs=3)

    def end(**calibration):  # alone on one GPU from t = 0, no other delay
        config = SimConfig(start_s=0, **calibration)
        return simulate([spec], FifoPolicy(), Cluster.parse("1x1"), apps, config).jobs[0]["completion"]

    plain = end()
    assert end(slowdown={"cifar10": 2.0}) == pytest.approx(2 * plain)  # half the progress per second
    assert end(restart_by_app={"cifar10": 50.0}) == pytest.approx(plain + 50)  # its own start cost, not start_s
    assert end(restart_by_app={"bert": 50.0}) == plain  # another application's


def test_per_type_batches_let_a_larger_gpu_run_fewer_accumulation_steps(apps):
    """`per_type_batch` (Sia's artifact): each GPU type bounds the per-GPU batch by its own profile, not the T4's,
    so an A100 runs cifar10's 4096 in two micro-batches of 2048 instead of four of 1024; a T4 is unchanged."""
    cifar10 = apps["cifar10"]
    assert cifar10.max_local_bsz_on("a100") == 4096 and cifar10.max_local_bsz == 1024
    assert cifar10.max_local_bsz_on("p100") == cifar10.max_local_bsz_on("t4") == 1024  # P100: the T4's memory
    assert apps["deepspeech2"].max_local_bsz_on("2080ti") == 57  # below its profile's 80: the artifact's cap
    spec = JobSpec("a", 0, 1, "cifar10", 4096, epochs=2)

    def end(gpu_type, **config):
        result = simulate([spec], FifoPolicy(), Cluster.parse(f"1x1:{gpu_type}"), apps,
                          SimConfig(start_s=0, **config))
        return result.jobs[0]["completion"]

    assert end("a100", per_type_batch=True) < end("a100")
    assert end("t4", per_type_batch=True) == end("t4")


def test_a_round_at_an_arrival_admits_the_job_whatever_the_last_bit_of_the_time_to_it():
    """The round at an arrival is at arrival + lag, to within a bit: stepping there from the last round, now +
    (arrival + lag - now), may land one bit short of it (these times do), and the next round, a poll (completion_poll_s) at a
    time, let no time pass for that bit: it admitted no one forever (a cluster run's simulation hung so)."""
    import signal

    lag, first, second = 0.07030439376831055, 0.0714025946899135, 3.9093694871854905
    assert (first + lag) + ((second + lag) - (first + lag)) < second + lag  # the step falls short
    jobs = [JobSpec("a", first, 1, duration=100), JobSpec("b", second, 1, duration=100)]

    def stuck(*_):
        raise TimeoutError("the simulation makes no progress")

    before = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(60)  # a guard against the hang, not a bound on speed: it takes milliseconds
    try:
        result = simulate(jobs, FifoPolicy(), Cluster.parse("1x2"), None, SimConfig(start_s=0),
                          costs=RuntimeCosts(rounds_at_arrivals=True, arrival_lag_s=lag, completion_poll_s=0.2))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)
    assert [j["start"] for j in result.jobs] == pytest.approx([first + lag, second + lag], abs=1e-9)


def test_a_job_holds_its_gpus_until_it_has_exited_and_arrivals_and_ends_can_start_rounds():
    """Cluster mode's timings, off by default: a job's processes exit after its last step (`exit_s`, it keeps
    its GPUs meanwhile), a submission starts a round at once (`rounds_at_arrivals`), and so does a job's end, at
    the scheduler's next look for ended jobs (`completion_poll_s`)."""
    jobs = [JobSpec("a", 0, 1, duration=100), JobSpec("b", 1, 1, duration=100)]  # one GPU: b waits for a

    def run(**timing):
        result = simulate(jobs, FifoPolicy(), Cluster.parse("1x1"), None, SimConfig(start_s=0),
                          costs=RuntimeCosts(**timing))
        return [(j["start"], j["completion"]) for j in result.jobs]

    assert run() == [(0, 100), (120, 220)]  # rounds at 0, 60, 120: b starts at the first after a's end
    assert run(exit_s=30) == [(0, 130), (180, 310)]  # a's GPU is free only at 130
    assert run(rounds_at_arrivals=True) == [(0, 100), (121, 221)]  # rounds at 0, 1 (b's arrival), 61, 121
    assert run(completion_poll_s=1.0) == [(0, 100), (100, 200)]  # a round at a's end
    assert run(completion_poll_s=1.0, exit_s=30.5) == [(0, 130.5), (131, 261.5)]  # at the look after its exit
    two = [JobSpec("a", 0, 2, duration=100)]  # an exit of n processes takes exit_s * n ** exit_weight
    result = simulate(two, FifoPolicy(), Cluster.parse("1x2"), None, SimConfig(start_s=0),
                      costs=RuntimeCosts(exit_s=10, exit_weight=0.5))
    assert result.jobs[0]["completion"] == pytest.approx(100 + 10 * 2 ** 0.5)


class GrowAt(Policy):
    """One GPU, then two from `at` on (in place)."""
    name, profiled, in_place = "grow-at", True, True

    def __init__(self, at, gpus=(1, 2)):
        self.at, self.gpus = at, gpus

    def optimize(self, now, jobs, cluster, allocations):
        return {j.name: (0,) * self.gpus[now >= self.at] for j in jobs}

    def batch_size(self, spec, app):
        return 128


def test_processes_that_join_in_place_prepare_while_the_job_trains_as_before(apps):
    """`join_s`: the new processes of an in-place growth start while the job trains on its old GPUs, so the
    growth pays off that much later; a shrink starts no process and pays nothing."""
    spec = JobSpec("a", 0, 1, "cifar10", 128, epochs=8)  # 320 s on one GPU

    def end(policy, **timing):
        config = SimConfig(start_s=0, in_place_s=0)
        return simulate([spec], policy, Cluster.parse("1x2"), apps, config, costs=RuntimeCosts(**timing)).jobs[0][
            "completion"]

    alone, grown = end(GrowAt(at=1e9)), end(GrowAt(at=60))
    assert grown < end(GrowAt(at=60), join_s=30) < alone
    assert end(GrowAt(at=60), join_s=1e6) == alone  # its joiners never get ready: one GPU to the end
    assert end(GrowAt(at=60, gpus=(2, 1)), join_s=30) == end(GrowAt(at=60, gpus=(2, 1)))


def test_a_job_that_reports_by_steps_leaves_gpus_in_place_at_its_next_step_boundary(apps):
    """`reported_steps`: a shrink in place takes effect when the step in flight ends (cluster mode's members leave
    at a step boundary), the job training on all its GPUs until then."""
    spec = JobSpec("a", 0, 1, "cifar10", 128, epochs=8)

    def end(at, **timing):
        return simulate([spec], GrowAt(at=at, gpus=(2, 1)), Cluster.parse("1x2"), apps,
                        SimConfig(start_s=0, in_place_s=0), costs=RuntimeCosts(**timing)).jobs[0]["completion"]

    assert end(1e9) < end(60, reported_steps=4) < end(60)


class Newest(Policy):
    """The newest job takes the one GPU (a preemption of the one before)."""
    name = "newest"

    def optimize(self, now, jobs, cluster, allocations):
        return {list(jobs)[-1].name: (0,)}


def test_a_job_placed_on_gpus_a_preempted_job_is_leaving_starts_once_it_has_left():
    """`suspend_s`: a preempted job leaves its GPUs at its next step boundary, after saving a checkpoint; the job
    given them starts that much later. The preempted job resumes (a restart) once the newer one is done."""
    jobs = [JobSpec("a", 0, 1, duration=100), JobSpec("b", 30, 1, duration=100)]

    def run(**timing):
        costs = RuntimeCosts(rounds_at_arrivals=True, **timing)
        return {j["name"]: (j["start"], j["completion"]) for j in simulate(
            jobs, Newest(), Cluster.parse("1x1"), None, SimConfig(start_s=0, restart_s=10), costs=costs).jobs}

    # rounds at 0, 30 (b's arrival), 90, 150: a runs 30 s, then from 150 (+10 s restart) its other 70 s
    assert run() == {"a": (0, 230), "b": (30, 130)}
    assert run(suspend_s=5) == {"a": (0, 230), "b": (30, 135)}  # b waits for a to leave


class Scheduled(Policy):
    """Runs on GPU 0 the job `schedule` names from each time on (None: none); once that job is done, the first
    job it sees."""
    name = "scheduled"

    def __init__(self, schedule):
        self.schedule = schedule

    def optimize(self, now, jobs, cluster, allocations):
        jobs = [j.name for j in jobs]
        named = [name for at, name in self.schedule if at <= now][-1]
        if named is not None and named not in jobs:  # done
            named = jobs[0] if jobs else None
        return {named: (0,)} if named else {}


def test_a_job_waits_only_for_the_gpus_it_needs_that_preempted_jobs_still_leave():
    """A node's free GPUs go first; a job waits only for GPUs that a preempted job still leaves, whether preempted
    in this round or an earlier one (cluster mode's slots, taken where free)."""
    def run(cluster, schedule, *jobs):
        costs = RuntimeCosts(rounds_at_arrivals=True, suspend_s=5)
        return {j["name"]: j["completion"] for j in simulate(
            list(jobs), Scheduled(schedule), Cluster.parse(cluster), None, SimConfig(start_s=0, restart_s=10),
            costs=costs).jobs}

    a, b, c = (JobSpec(name, at, 1, duration=100) for name, at in (("a", 0), ("b", 30), ("c", 32)))
    assert run("1x1", [(0, "a"), (30, "b")], a, b)["b"] == 135  # a leaves the one GPU until 35
    assert run("1x2", [(0, "a"), (30, "b")], a, b)["b"] == 130  # the node's other GPU is free: no wait
    # a preempted at 30 with no job given its GPU; c, given it at 32, starts once a has left it at 35
    assert run("1x1", [(0, "a"), (30, None), (32, "c")], a, b, c)["c"] == 135


def test_a_job_waiting_for_its_gpus_neither_starts_nor_slows_the_starts_beside_it():
    """The wait for GPUs a preempted job leaves passes at the clock's pace, and its job's processes start only
    after it: they do not share the machine with other starts meanwhile (`parallel_starts`)."""
    class NewestTwo(Policy):
        name = "newest-two"

        def optimize(self, now, jobs, cluster, allocations):
            return {job.name: (node,) for node, job in enumerate(list(jobs)[-2:])}

    jobs = [JobSpec("a", 0, 1, duration=100), JobSpec("b", 30, 1, duration=100), JobSpec("c", 30, 1, duration=100)]
    costs = RuntimeCosts(rounds_at_arrivals=True, suspend_s=5, parallel_starts=1)
    done = {j["name"]: j["completion"] for j in simulate(jobs, NewestTwo(), Cluster.parse("2x1"), None,
                                                         SimConfig(start_s=10), costs=costs).jobs}
    # at 30 b takes a's GPU and waits until 35; c starts alone at full speed until then (5 s of 10), both at half
    # speed until c's start ends at 45, b's last 5 s alone, to 50
    assert (done["b"], done["c"]) == (150, 145)


class Watching(Newest):
    """Newest, recording the jobs it is shown each round."""

    def __init__(self):
        self.shown = []

    def optimize(self, now, jobs, cluster, allocations):
        self.shown.append((now, [j.name for j in jobs]))
        return super().optimize(now, jobs, cluster, allocations)


def test_a_preempted_job_is_out_of_the_policys_sight_until_it_has_left_and_its_leaving_starts_a_round():
    """As cluster mode's scheduler: a job that is leaving (suspend_s) is no job the policy may place, and the
    look that finds it gone starts a round."""
    jobs = [JobSpec("a", 0, 1, duration=100), JobSpec("b", 30, 1, duration=100), JobSpec("c", 32, 1, duration=100)]
    policy = Watching()
    costs = RuntimeCosts(rounds_at_arrivals=True, completion_poll_s=1.0, suspend_s=4.5)
    simulate(jobs, policy, Cluster.parse("1x1"), None, SimConfig(start_s=0, restart_s=10), costs=costs)
    # a leaves from 30 to 34.5, b (preempted by c) from 32 to 36.5: each is shown again at the next look
    assert policy.shown[:5] == [(0, ["a"]), (30, ["a", "b"]), (32, ["b", "c"]), (35, ["a", "c"]),
                                (37, ["a", "b", "c"])]


class Reading(Newest):
    """Newest, recording what it reads of the newest job each round: whether it is reallocating, its share done."""

    def __init__(self):
        self.read = []

    def optimize(self, now, jobs, cluster, allocations):
        job = list(jobs)[-1]
        self.read.append((now, job.reallocating, job.done))
        return super().optimize(now, jobs, cluster, allocations)


def test_a_job_that_reports_by_steps_is_reallocating_until_its_first_report_and_done_by_whole_steps():
    """`reported_steps`: as cluster mode's scheduler, the policy learns that a job runs on its GPUs from its first
    step's report there, and its share done as of its last report; without it, at the end of its modelled start and
    at every moment."""
    def read(**timing):
        policy = Reading()
        simulate([JobSpec("a", 0, 1, duration=100)], policy, Cluster.parse("1x1"), None,
                 SimConfig(round_s=10, start_s=10), costs=RuntimeCosts(**timing))
        return policy.read[1:6]  # rounds at 10 ... 50: it started at 0, trained from 10

    assert read() == [(10, False, 0.0), (20, False, 0.1), (30, False, 0.2), (40, False, 0.3), (50, False, 0.4)]
    # steps of 25 s: the first report, 25 s into its training, at 35
    assert read(reported_steps=4) == [(10, True, 0.0), (20, True, 0.0), (30, True, 0.0), (40, False, 0.25),
                                      (50, False, 0.25)]


def test_a_round_at_an_arrival_decides_after_the_schedulers_lag(apps):
    """Cluster mode's submit starts a round once the submission is recorded: the new job is `arrival_lag_s` old
    then. Pollux, whose restart factor is 0 at age 0, starts it in that round, not in the next one. (With the
    elitist search: NSGA-II's second objective, the cluster utility, undiscounted, starts it at age 0 too.)"""
    from easyscale_ext.sched.policies.pollux import PolluxPolicy

    def start(lag):
        costs = RuntimeCosts(rounds_at_arrivals=True, arrival_lag_s=lag)
        result = simulate([JobSpec("a", 3.0, 1, "bert", 12, epochs=1)], PolluxPolicy(0, search="elitist"),
                          Cluster.parse("1x4"), apps, SimConfig(round_s=15.0, start_s=5.0), costs=costs)
        return result.jobs[0]["start"]

    assert start(0.0) == 18.0 and start(0.1) == pytest.approx(3.1)


def test_processes_starting_beyond_parallel_starts_share_the_machine():
    """`parallel_starts`: k > that processes starting at once (first starts, resumes, joiners preparing) share the
    machine, each start at parallel_starts / k of its speed, until one ends (cluster mode on one machine); with
    `training_weight`, a process training beside them counts that much."""
    jobs = [JobSpec("a", 0, 1, duration=100), JobSpec("b", 5, 1, duration=100), JobSpec("c", 5, 2, duration=100)]

    def run(parallel, *specs, weight=1.0, training=0.0):
        costs = RuntimeCosts(rounds_at_arrivals=True, parallel_starts=parallel, start_weight=weight,
                             training_weight=training)
        return {j["name"]: j["completion"] for j in simulate(list(specs), FifoPolicy(), Cluster.parse("1x4"), None,
                                                              SimConfig(start_s=10), costs=costs).jobs}

    assert run(0, *jobs) == {"a": 110, "b": 115, "c": 115}  # no limit: 10 s each
    assert run(1, *jobs[:2]) == {"a": 115, "b": 120}  # a alone 5 s, then both at half speed: a ends at 15, b at 20
    # then a trains, weighing 0.5 beside b's start: b's last 5 s at 2/3 speed, to 22.5
    assert run(1, *jobs[:2], training=0.5) == {"a": 115, "b": 122.5}
    # a alone for 5 s; then 4 processes (c starts 2) at half speed: a's 5 s left take 10 (to 15); then b and c's
    # 3 processes, 5 s left, at 2/3 speed: to 22.5
    assert run(2, *jobs) == {"a": 115, "b": 122.5, "c": 122.5}
    assert run(4, *jobs) == {"a": 110, "b": 115, "c": 115}  # 4 processes at once: full speed


def test_a_runs_throughput_fits_are_its_own_whatever_ran_before_on_the_same_applications(apps):
    """A fit's last bits depend on the order of its measurements. Two runs' jobs with the same measurements in
    another order each get their own order's fit: a cache on the shared Application gave the second run the first
    run's fit, so a figure depended on what had been simulated before in the process."""
    profile = apps["cifar10"].profile("t4")
    measured = {(1, r, b): profile.step_time((r,), b) for r, b in ((1, 128), (2, 64), (4, 32))}
    measured[2, 8, 16] = profile.step_time((4, 4), 16)

    def fit(order):
        return fit_perf_params(*zip(*((*k, *v) for k, v in order.items())))

    first = dict(sorted(measured.items()))
    first_fit = fit(first)
    # another order whose fit differs in its last bits (which orders do depends on the CPU's kernels)
    other, other_fit = next((order, f) for order in map(dict, itertools.permutations(measured.items()))
                            if (f := fit(order)) != first_fit)
    spec = JobSpec("a", 0, 1, "cifar10", 128)
    assert [make_job(spec, apps, None)._fit(order) for order in (first, other)] == [first_fit, other_fit]
