"""The scheduler runs jobs on a two-node cluster with the simulator's policy objects: concurrent submissions
never share a slot, every job ends with its fixed-size run's bits, and bad input changes nothing."""
import os
import re
import signal
import sys
import threading
import time

import pytest
import ray

from easyscale_ext.cluster.backend import policy_view
from easyscale_ext.cluster.scheduler import launch
from easyscale_ext.sched.policies.base import Policy
from easyscale_ext.cluster.lifecycle import LIVE
from support.jobs import JOB, START_S, reference
from test_supervisor import slot_on

pytestmark = pytest.mark.multiprocess
ENV = {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
PER_JOB = ("cluster.jobs", "cluster.seen", "cluster.reserved_cuts")  # what the scheduler keeps of each live job


def test_the_policy_sees_nodes_by_type_then_id_as_the_simulation_does():
    """Ray's node ids are random: the view orders nodes by type (a full node out), so the policy reads the cluster
    the simulation of `--cluster 1x4:a100,1x2:t4,1x4:t4` reads, whatever ids the nodes drew."""
    capacity = {"f0": 4, "0c": 2, "9e": 4, "77": 0}
    nodes, view = policy_view(capacity, {"f0": "t4", "0c": "t4", "9e": "a100", "77": "t4"})
    assert nodes == ["9e", "0c", "f0"]
    assert (view.spec, view.gpus, view.types) == ("1x4:a100,1x2:t4,1x4:t4", (4, 2, 4), ("a100", "t4", "t4"))


def stop(scheduler):
    """End a test's scheduler and the slots it reserved (detached actors: they would outlive it)."""
    try:
        ray.get(scheduler.unreserve.remote(), timeout=30)
    finally:
        ray.kill(scheduler)


def job_argv(out, n, steps=4):
    return [JOB, "--mode", "easyscale", "--elastic", "1", "--out", str(out), "--virtual-workers", str(n),
            "--steps", str(steps), "--step-sleep", "0.3"]


def resumable_argv(out, n, ckpt, every, sleep_until=None):
    """A 12-step job that checkpoints into `ckpt` every `every` steps (and when asked to leave) and resumes there;
    with `sleep_until`, its steps take their 0.3 s only until that file exists (the test has done what it waited
    for: the rest need no more time than they take)."""
    return job_argv(out, n, steps=12) + ["--ckpt-dir", str(ckpt), "--ckpt-every", str(every), "--resume", "1"] + (
        ["--sleep-until", str(sleep_until)] if sleep_until else [])


def step_of(job: dict) -> int:
    """The last step a job's status reports (0 before its first)."""
    return ((job["live"] or {}).get("progress") or {}).get("step", 0)


def wait_for_step(status, step: int, deadline: float) -> None:
    """Until `status()` reports step `step`, or fail at `deadline` (time.monotonic)."""
    while step_of(status()) < step:
        assert time.monotonic() < deadline, f"no {step} steps: {status()}"
        time.sleep(0.2)


def assert_holds_no_job(scheduler):
    """Once its jobs ended the scheduler keeps nothing of them (after a round, for the policy's view): one that
    runs for months holds what its live jobs need, not what every job left behind."""
    deadline = time.monotonic() + 10
    while any((sizes := ray.get(scheduler.footprint.remote())["sizes"])[name] for name in PER_JOB):
        assert time.monotonic() < deadline, sizes
        time.sleep(0.2)


@pytest.fixture
def scheduler(cluster, tmp_path):
    actor = launch(str(tmp_path / "state"), "fifo", 0.5)
    yield actor
    ray.kill(actor)


def test_concurrent_submissions_share_no_slot_and_keep_their_bits(cluster, scheduler, tmp_path):
    specs = [(4, 2), (2, 2), (2, 1)]  # (virtual workers, slots): 5 slots asked of 4
    ids = [None] * len(specs)

    def submit(i):
        n, procs = specs[i]
        ids[i] = ray.get(scheduler.submit.remote(job_argv(tmp_path / f"hash{i}", n), n, 1, procs, f"j{i}", ENV))

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(len(specs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    slots = {n: 2 for n in cluster.node_ids()}
    deadline = time.monotonic() + START_S
    while True:
        jobs = ray.get(scheduler.status.remote())
        held = [node for j in jobs if j["live"] for node in j["live"]["holding"]]
        assert all(held.count(n) <= slots[n] for n in slots), f"a slot held twice: {held}"
        if all(j["state"] in ("finished", "failed") for j in jobs):
            break
        assert time.monotonic() < deadline, [(j["id"], j["state"], j["live"] and {k: j["live"][k] for k in (
            "members", "exited", "run", "progress")}) for j in jobs]
        time.sleep(0.2)
    assert [j["state"] for j in jobs] == ["finished"] * 3, jobs
    for i, (n, _) in enumerate(specs):
        assert (tmp_path / f"hash{i}").read_text() == reference(n=n, steps=4)
    assert_holds_no_job(scheduler)


def test_a_job_that_ends_hands_its_slots_on_at_once_not_a_round_later(cluster, tmp_path):
    """Rounds 10 minutes apart: the queued job (it needs 3 of the 4 slots, the first holds 2) starts because the
    first one's end starts a round."""
    actor = launch(str(tmp_path / "state"), "fifo", 600)
    try:
        for name, n, min_procs in (("a", 2, 2), ("b", 4, 3)):
            ray.get(actor.submit.remote(job_argv(tmp_path / name, n), n, min_procs, n, name, ENV))
        deadline = time.monotonic() + START_S + 180  # its start, then its steps and moves
        jobs = ray.get(actor.status.remote())
        while not all(j["state"] == "finished" for j in jobs):
            assert time.monotonic() < deadline and all(j["state"] != "failed" for j in jobs), \
                [{k: j[k] for k in ("name", "state", "note", "started", "finished")} for j in jobs]
            time.sleep(0.5)
            jobs = ray.get(actor.status.remote())
        first, second = sorted(jobs, key=lambda j: j["name"])
        assert 0 < second["started"] - first["finished"] < 60, (first, second)  # a round later: 600 s
    finally:
        ray.kill(actor)


@pytest.mark.parametrize("argv,n,min_procs,env,message", [
    (["no/such/script.py"], 4, 1, None, "no training script at 'no/such/script.py'"),
    ([JOB], 8, 5, None, "needs at least 5 slots and the cluster has 4"),
    ([JOB], 2, 3, None, "need 1 <= min procs (3) <= max procs"),
    ([JOB], 2, 1, {"EASYSCALE_FORK_SERVER": "yes"}, "EASYSCALE_FORK_SERVER='yes': set 1"),
])
def test_a_submission_it_cannot_run_is_refused_and_nothing_is_queued(scheduler, argv, n, min_procs, env, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        try:
            ray.get(scheduler.submit.remote(argv, n, min_procs, None, None, env))
        except ray.exceptions.RayTaskError as e:
            raise e.as_instanceof_cause()
    assert ray.get(scheduler.status.remote()) == []


def test_an_unknown_policy_or_job_is_a_clear_error(cluster, scheduler, tmp_path):
    with pytest.raises(ray.exceptions.RayActorError, match="unknown policy 'nope': choose one of fifo"):
        ray.get(launch(str(tmp_path / "other"), "nope").status.remote())
    with pytest.raises(ray.exceptions.RayTaskError, match="models each job by its application: submit with"):
        ray.get(launch(str(tmp_path / "sia"), "sia").submit.remote([JOB], 4))
    with pytest.raises(ray.exceptions.RayTaskError, match="no profiled application 'gpt9'"):
        ray.get(scheduler.submit.remote([JOB], 4, application="gpt9"))
    with pytest.raises(ray.exceptions.RayTaskError, match="no job 'nope'"):
        ray.get(scheduler.cancel.remote("nope"))


@pytest.mark.parametrize("by", ["hand", "ray"])
def test_a_restarted_scheduler_takes_its_running_job_back(cluster, tmp_path, by):
    """A scheduler whose actor dies (its supervisors and their processes live on) is started again, by hand or by
    Ray (as `cluster start` makes it), and takes its running job back from the job table."""
    state = str(tmp_path / "state")
    first = launch(state, "fifo", 0.5, max_restarts=-1 if by == "ray" else 0)
    job = ray.get(first.submit.remote(job_argv(tmp_path / "hash", 2) + ["--steps", "12"], 2, 1, 1, "kept", ENV))
    deadline = time.monotonic() + START_S

    def attained(scheduler):
        """GPU-seconds its model held, as the job table keeps them."""
        return (ray.get(scheduler.status.remote(job))[0]["history"] or {}).get("attained", 0.0)

    while (ray.get(first.status.remote(job))[0]["live"] or {}).get("progress") is None or attained(first) < 1.0:
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.2)
    served = attained(first)  # GPU-seconds its model held: the next scheduler's model goes on from there
    pid = ray.get(first.__ray_call__.remote(lambda actor: os.getpid()))
    ray.kill(first, no_restart=by == "hand")  # as a crash of its actor
    second = launch(state, "fifo", 0.5) if by == "hand" else first

    def state_of_job():
        try:
            return ray.get(second.status.remote(job))[0]["state"]
        except ray.exceptions.RayActorError:  # a call that reached the actor as it died
            return "restarting"
    try:
        while state_of_job() in ("running", "restarting"):
            assert time.monotonic() < deadline + 120, "the job did not end under the new scheduler"
            try:
                assert attained(second) >= served, "the new scheduler modelled the job as if just submitted"
            except ray.exceptions.RayActorError:  # restarting
                pass
            time.sleep(0.2)
        assert state_of_job() == "finished"
        assert ray.get(second.__ray_call__.remote(lambda actor: os.getpid())) != pid  # another process
        assert (tmp_path / "hash").read_text() == reference(n=2, steps=12)
    finally:
        ray.kill(second)


def test_a_job_whose_first_placement_died_with_the_scheduler_starts_under_the_next(cluster, tmp_path):
    """A scheduler that died after marking a job running and starting its supervisor, before its place() call
    reached that supervisor (still starting: the call died with its caller). The next scheduler places the job again
    on the slots the table gives it: it would otherwise stay running with no process."""
    from easyscale_ext.cluster import NAMESPACE
    from easyscale_ext.cluster.jobtable import JobTable
    from easyscale_ext.cluster.supervisor import JobSupervisor

    state = tmp_path / "state"
    state.mkdir()
    table = JobTable(str(state / "jobs.sqlite"))
    job = table.add("unplaced", job_argv(tmp_path / "hash", 2), ENV, 2, 1, 1, logs=str(state / "logs"))
    table.move(job, "running", started=time.time(), nodes=[cluster.node_ids()[0]])
    JobSupervisor.options(name=f"job/{job}", namespace=NAMESPACE, lifetime="detached").remote(
        job, job_argv(tmp_path / "hash", 2), ENV, str(state / "logs" / job), 2)
    scheduler = launch(str(state), "fifo", 0.5)
    try:
        deadline = time.monotonic() + START_S + 180  # its start, then its steps and moves
        while (now := ray.get(scheduler.status.remote(job))[0])["state"] == "running":
            assert time.monotonic() < deadline, f"did not end: {now}"
            time.sleep(0.5)
        assert now["state"] == "finished"
        assert (tmp_path / "hash").read_text() == reference(n=2, steps=4)
    finally:
        stop(scheduler)


def test_a_job_whose_supervisor_is_lost_resumes_from_its_checkpoint_on_a_new_one_bitwise(cluster, tmp_path):
    """The supervisor hosts the job's store: when its actor dies, the job's processes are ended (never two of one
    job at once) and the job resumes from its newest checkpoint under a new supervisor, with its fixed-size bits."""
    scheduler = launch(str(tmp_path / "state"), "fifo", 0.5)
    try:
        argv = resumable_argv(tmp_path / "hash", 2, tmp_path / "ckpt", 2, sleep_until=tmp_path / "hit")
        job = ray.get(scheduler.submit.remote(argv, 2, 1, 2, "orphan", ENV))
        status = lambda: ray.get(scheduler.status.remote(job))[0]  # noqa: E731
        deadline = time.monotonic() + START_S
        wait_for_step(status, 5, deadline)
        ray.kill(ray.get_actor(f"job/{job}", namespace="easyscale"))  # as a crash of its actor
        (tmp_path / "hit").touch()
        while (now := status())["state"] in LIVE:
            assert time.monotonic() < deadline + 180, f"did not end: {now}"
            time.sleep(0.5)
        log = (tmp_path / "state" / "logs" / job / "w0.log").read_text()
        assert now["state"] == "finished" and re.search(r"^resumed at step [1-9]", log, re.M), (now, log[-2000:])
        assert (tmp_path / "hash").read_text() == reference(n=2, steps=12)
    finally:
        stop(scheduler)


def test_a_job_whose_supervisor_dies_before_it_places_the_job_is_queued_again_not_failed(cluster, tmp_path):
    """A supervisor killed before it ran (the 30-fault bench under Sia killed one as a resumed job started): its
    place() fails with the actor's death, which says nothing of the job. The job starts again under a new one
    and ends with its fixed-size bits (it was taken for a first start that cannot succeed, and failed)."""
    scheduler = launch(str(tmp_path / "state"), "fifo", 0.5)
    try:
        job = ray.get(scheduler.submit.remote(job_argv(tmp_path / "hash", 2), 2, 1, 2, "early", ENV))
        deadline = time.monotonic() + 60
        while True:  # its first supervisor, as soon as it has a name
            try:
                ray.kill(ray.get_actor(f"job/{job}", namespace="easyscale"))
                break
            except ValueError:
                assert time.monotonic() < deadline, "no supervisor was made"
                time.sleep(0.01)
        status = lambda: ray.get(scheduler.status.remote(job))[0]  # noqa: E731
        while (now := status())["state"] in LIVE:
            assert time.monotonic() < deadline + 180, f"did not end: {now}"
            time.sleep(0.5)
        assert now["state"] == "finished", now
        assert (tmp_path / "hash").read_text() == reference(n=2, steps=4)
    finally:
        stop(scheduler)


def test_a_job_whose_only_process_is_killed_or_stopped_from_outside_resumes_from_its_checkpoint(cluster, tmp_path):
    """kill -9 (as an OOM kill) or SIGTERM (as a node's drain) of a job's only process, one job each, side by side:
    nobody recovers in place, and neither is the job's end. It is queued again and resumes from its newest
    checkpoint, bitwise."""
    signals = {"killed": signal.SIGKILL, "stopped": signal.SIGTERM}
    scheduler = launch(str(tmp_path / "state"), "fifo", 0.5)
    try:
        jobs = {name: ray.get(scheduler.submit.remote(resumable_argv(
            tmp_path / name, 2, tmp_path / f"ckpt-{name}", 2, sleep_until=tmp_path / f"{name}-hit"), 2, 1, 1, name,
            ENV)) for name in signals}
        status = lambda name: ray.get(scheduler.status.remote(jobs[name]))[0]  # noqa: E731
        deadline, hit = time.monotonic() + START_S, set()
        while hit != set(signals):  # each job's process, once it is past step 5
            for name in set(signals) - hit:
                if step_of(status(name)) >= 5:
                    slot = ray.get_actor(f"{jobs[name]}/w0", namespace="easyscale")
                    os.kill(ray.get(slot.pid.remote()), signals[name])
                    (tmp_path / f"{name}-hit").touch()
                    hit.add(name)
            assert time.monotonic() < deadline, f"no 5 steps: {[status(name) for name in set(signals) - hit]}"
            time.sleep(0.2)
        for name in signals:
            while (now := status(name))["state"] in LIVE:
                assert time.monotonic() < deadline + 180, f"{name} did not end: {now}"
                time.sleep(0.5)
            log = (tmp_path / "state" / "logs" / jobs[name] / "w0.log").read_text()
            assert now["state"] == "finished" and re.search(r"^resumed at step [1-9]", log, re.M), \
                (name, now, log[-2000:])
            assert (tmp_path / name).read_text() == reference(n=2, steps=12), name
    finally:
        stop(scheduler)


def test_a_job_whose_every_process_went_with_its_node_starts_again_from_its_checkpoint(cluster, tmp_path):
    """No survivor to recover in place: the scheduler queues the job again, and it resumes from the checkpoint
    it wrote to a folder every node reads. Its bits are the fixed-size run's."""
    scheduler = launch(str(tmp_path / "state"), "fifo", 0.5)
    try:
        assert len(ray.get(scheduler.reserve.remote(4))) == 4  # nodes a and b: the job can only go to c
        c = cluster.add_node(slots=1)
        ckpt = tmp_path / "ckpt"
        argv = resumable_argv(tmp_path / "hash", 2, ckpt, 2, sleep_until=tmp_path / "hit")
        job = ray.get(scheduler.submit.remote(argv, 2, 1, 1, "orphan", ENV))
        status = lambda: ray.get(scheduler.status.remote(job))[0]  # noqa: E731
        deadline = time.monotonic() + START_S
        wait_for_step(status, 5, deadline)
        assert status()["nodes"] == [cluster.node_ids()[c]]
        cluster.remove_node(c)
        (tmp_path / "hit").touch()
        while status()["state"] != "suspended":
            assert time.monotonic() < deadline + 60, f"not queued again: {status()}"
            time.sleep(0.2)
        assert ray.get(scheduler.unreserve.remote()) == 4
        while status()["state"] in LIVE:
            assert time.monotonic() < deadline + 180, f"did not end: {status()}"
            time.sleep(0.5)
        assert status()["state"] == "finished"
        log = (tmp_path / "state" / "logs" / job / "w0.log").read_text()
        assert re.search(r"^resumed at step [1-9]", log, re.M), log[-2000:]  # not from the start
        assert (tmp_path / "hash").read_text() == reference(n=2, steps=12)
    finally:
        stop(scheduler)


def test_reserved_slots_are_taken_given_back_and_a_cancelled_job_frees_its_own(cluster, scheduler, tmp_path):
    """A reservation gets the slot the job left (at its next step boundary), the job grows back onto it when it
    is given back, and a cancelled job's slots are free at once."""
    job = ray.get(scheduler.submit.remote(job_argv(tmp_path / "hash", 4, steps=300), 4, 1, 2, "held", ENV))
    status = lambda: ray.get(scheduler.status.remote(job))[0]  # noqa: E731
    members = lambda: len((status()["live"] or {}).get("members", []))  # noqa: E731
    deadline = time.monotonic() + START_S
    while members() < 2 or step_of(status()) < 1:
        assert time.monotonic() < deadline, f"the job did not start on 2 slots: {status()}"
        time.sleep(0.2)
    assert len(ray.get(scheduler.reserve.remote(3))) == 3  # the 2 free slots, then one of the job's
    reserved = [ray.get_actor(name["name"], namespace=name["namespace"]) for name in
                ray.util.list_named_actors(all_namespaces=True) if name["name"].startswith("reserved/")]
    assert len(reserved) == 3
    assert len(ray.get([r.node.remote() for r in reserved], timeout=60)) == 3  # before: never, while the job ran
    assert members() == 1
    assert ray.get(scheduler.unreserve.remote()) == 3
    while members() < 2:  # fifo gives a job that lost slots its slots back
        assert time.monotonic() < deadline + 120, f"the job did not grow back: {status()}"
        time.sleep(0.2)
    ray.get(scheduler.cancel.remote(job))
    assert_holds_no_job(scheduler)
    nodes = cluster.node_ids()[:2]  # the module's first two (another test adds and removes a third)
    others = [slot_on(n) for n in nodes for _ in range(2)]  # all 4 slots: free at once
    try:
        # A held slot never frees; four actors' starts take 10 s and more on two loaded cores.
        assert sorted(ray.get([o.node.remote() for o in others], timeout=60)) == sorted(nodes * 2)
    finally:
        for o in others:
            ray.kill(o)


def test_a_type_aware_policy_sees_the_nodes_types_and_a_process_its_own(cluster, tmp_path):
    """A node declares its slots' type (`easyscale_slot_a100`); the scheduler hands the policy the typed cluster
    that `easyscale simulate --cluster` builds (Sia runs on it), and a process learns its slot's type from its
    environment."""
    c = cluster.add_node(slots=1, gpu_type="a100")
    scheduler = launch(str(tmp_path / "state"), "sia", 0.5)
    script = tmp_path / "where.py"
    script.write_text("import os; print('slot type', os.environ['EASYSCALE_SLOT_TYPE'])\n")
    try:
        nodes = {n["node"]: n["type"] for n in ray.get(scheduler.nodes.remote())}
        assert nodes == {**dict.fromkeys(cluster.node_ids()[:2], "t4"), cluster.node_ids()[c]: "a100"}
        assert len(ray.get(scheduler.reserve.remote(4))) == 4  # the t4 slots (the free slots of the fullest first)
        assert {n["type"]: n["reserved"] for n in ray.get(scheduler.nodes.remote())} == {"t4": 2, "a100": 0}
        job = ray.get(scheduler.submit.remote([str(script)], 1, 1, 1, "where", ENV, "cifar10"))
        deadline = time.monotonic() + START_S
        while ray.get(scheduler.status.remote(job))[0]["state"] in LIVE:
            assert time.monotonic() < deadline, ray.get(scheduler.status.remote(job))
            time.sleep(0.2)
        log = (tmp_path / "state" / "logs" / job / "w0.log").read_text()
        assert "slot type a100" in log, log
        assert ray.get(scheduler.report.remote()).cluster == "1 slots (a100), 4 slots (t4)"
        assert ray.get(scheduler.unreserve.remote()) == 4
    finally:
        stop(scheduler)
        cluster.remove_node(c)


def test_a_job_whose_last_slots_are_reserved_is_suspended_and_resumes_elsewhere_smaller_bitwise(cluster, tmp_path):
    """A reservation that needs a job's every slot suspends it: its processes leave at a step boundary, saving a
    checkpoint; it waits in the queue (status says why) and resumes from that checkpoint on another node, on fewer
    processes, with its fixed-size run's bits."""
    a, b = cluster.node_ids()[:2]
    scheduler = launch(str(tmp_path / "state"), "easyscale-homo", 0.5)
    try:
        assert ray.get(scheduler.reserve.remote(2, b)) == [b, b]  # the job starts on a
        argv = resumable_argv(tmp_path / "hash", 4, tmp_path / "ckpt", 1000, sleep_until=tmp_path / "hit")
        job = ray.get(scheduler.submit.remote(argv, 4, 1, 2, "suspended", ENV, "cifar10"))
        status = lambda: ray.get(scheduler.status.remote(job))[0]  # noqa: E731
        deadline = time.monotonic() + START_S
        wait_for_step(status, 3, deadline)
        assert ray.get(scheduler.reserve.remote(2, a)) == [a, a]  # every slot of the job: it is suspended
        while status()["state"] != "suspended":
            assert time.monotonic() < deadline + 60, f"not suspended: {status()}"
            time.sleep(0.2)
        assert re.fullmatch(r"suspended at step [1-9]\d*: its slots were reserved", status()["note"]), status()
        (tmp_path / "hit").touch()
        assert ray.get(scheduler.unreserve.remote(1, b)) == 1  # one slot on the other node: it resumes there
        resumed = set()
        while (now := status())["state"] in LIVE:
            assert time.monotonic() < deadline + 240, f"did not end: {now}"
            resumed.add(tuple(now["nodes"]))
            time.sleep(0.5)
        assert now["state"] == "finished" and resumed - {()} == {(b,)}, (now, resumed)
        log = (tmp_path / "state" / "logs" / job / "w0.log").read_text()
        assert re.search(r"^resumed at step [1-9]", log, re.M), log[-2000:]  # from the suspension's checkpoint
        assert (tmp_path / "hash").read_text() == reference(n=4, steps=12)
    finally:
        stop(scheduler)


class Newest(Policy):
    """The newest job takes every slot of the first node; the others wait (a running one is preempted)."""
    name = "newest"

    def optimize(self, now, jobs, cluster, allocations):
        return {list(jobs)[-1].name: (0,) * cluster.gpus[0]}


class Hopper(Policy):
    """Moves its one job to the other node whenever the job is not reallocating; writes what it saw each round."""
    name = "hopper"

    def __init__(self, seen):
        self.seen = str(seen)

    def optimize(self, now, jobs, cluster, allocations):
        if not jobs:
            return {}
        job = jobs[0]
        held = allocations.get(job.name)
        with open(self.seen, "a") as f:
            f.write(f"{int(job.reallocating)} {held[0] if held else -1}\n")
        if held and job.reallocating:
            return {job.name: held}
        return {job.name: (1 - held[0],) if held else (0,)}


ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the scheduler's process cannot import tests


def test_a_job_its_policy_preempts_is_suspended_and_resumes_when_the_policy_says_bitwise(cluster, tmp_path):
    """Policies run as they are: a running job the policy gives no slot leaves at a step boundary, saving a
    checkpoint, and resumes from it when the policy gives it slots again; both jobs end with their fixed-size
    bits."""
    b = cluster.node_ids()[1]
    scheduler = launch(str(tmp_path / "state"), Newest(), 0.5)
    try:
        assert ray.get(scheduler.reserve.remote(2, b)) == [b, b]  # one node of 2 slots left
        argv = resumable_argv(tmp_path / "old", 4, tmp_path / "ckpt", 1000, sleep_until=tmp_path / "hit")
        old = ray.get(scheduler.submit.remote(argv, 4, 1, 2, "old", ENV))
        status = lambda job: ray.get(scheduler.status.remote(job))[0]  # noqa: E731
        deadline = time.monotonic() + START_S
        wait_for_step(lambda: status(old), 3, deadline)
        new = ray.get(scheduler.submit.remote(job_argv(tmp_path / "new", 2), 2, 1, 2, "new", ENV))
        while status(old)["state"] != "suspended":
            assert time.monotonic() < deadline + 60, f"not suspended: {status(old)}"
            time.sleep(0.2)
        assert re.fullmatch(r"suspended at step [1-9]\d*: preempted by newest", status(old)["note"]), status(old)
        (tmp_path / "hit").touch()
        while status(old)["state"] in LIVE:
            assert time.monotonic() < deadline + 240, f"did not end: {status(old)}"
            time.sleep(0.5)
        assert status(new)["state"] == status(old)["state"] == "finished", (status(new), status(old))
        log = (tmp_path / "state" / "logs" / old / "w0.log").read_text()
        assert re.search(r"^resumed at step [1-9]", log, re.M), log[-2000:]
        assert (tmp_path / "old").read_text() == reference(n=4, steps=12)
        assert (tmp_path / "new").read_text() == reference(n=2, steps=4)
    finally:
        stop(scheduler)


def test_a_job_is_reallocating_until_the_real_job_runs_on_its_slots(cluster, tmp_path):
    """The policy sees a job given slots as reallocating until its processes train there, as the simulation models
    a start (Sia keeps such a job's configuration): a policy that moves every job it may moves this one only
    after its first start and after each move has completed, and it ends with its fixed-size bits."""
    seen = tmp_path / "seen"
    scheduler = launch(str(tmp_path / "state"), Hopper(seen), 0.5)
    try:
        job = ray.get(scheduler.submit.remote(job_argv(tmp_path / "out", 2, steps=6), 2, 1, 1, "hop", ENV))
        deadline = time.monotonic() + START_S + 180  # its start, then its steps and moves
        while ray.get(scheduler.status.remote(job))[0]["state"] in LIVE:
            assert time.monotonic() < deadline, ray.get(scheduler.status.remote(job))
            time.sleep(0.5)
        assert ray.get(scheduler.status.remote(job))[0]["state"] == "finished"
    finally:
        ray.kill(scheduler)
    rounds = [tuple(map(int, line.split())) for line in seen.read_text().splitlines()]
    moves = [i for i, (a, b) in enumerate(zip(rounds, rounds[1:])) if a[1] >= 0 and b[1] != a[1]]
    # Its start and each move take seconds (processes import torch), rounds 0.5 s: many rounds see it reallocating,
    # and each move comes after a round that saw it settled on the slot it left.
    assert moves and all(rounds[i][0] == 0 for i in moves), rounds
    assert sum(r[0] for r in rounds) >= 3 * len(moves), rounds
    assert (tmp_path / "out").read_text() == reference(n=2, steps=6)


SLOW_ELASTIC = """
import time
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset
import easyscale_ext as es

member = es.ElasticMember()
torch.manual_seed(0)
data = TensorDataset(torch.randn(320, 8), torch.randint(0, 2, (320,)))
ddp = es.EasyScaleDDP(nn.Linear(8, 2), virtual_world_size=2)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
loader = ddp.data_loader(data, batch_size=8, shuffle=True, seed=0)
first = []


def train_step(step):
    if not first:
        first.append(step.number)
        print("first step", step.number, flush=True)
    time.sleep(0.3)
    for x, y in ddp.workers(step.batches):
        F.cross_entropy(ddp(x), y).backward()


final = member.run(train_step, ddp, optimizer, loader, epochs=1)  # no checkpointer of its own
if final is not None:
    print("done at step", final.step, flush=True)
member.close()
"""


def test_a_job_without_a_checkpoint_folder_resumes_from_the_clusters(cluster, tmp_path):
    """`member.run` without a Checkpointer saves into the folder the cluster gives each job, so a suspended job
    resumes where it stopped instead of from its first step."""
    a, b = cluster.node_ids()[:2]
    script = tmp_path / "slow.py"
    script.write_text(SLOW_ELASTIC)
    scheduler = launch(str(tmp_path / "state"), "fifo", 0.5)
    try:
        assert ray.get(scheduler.reserve.remote(2, b)) == [b, b]
        job = ray.get(scheduler.submit.remote([str(script)], 2, 1, 1, "slow", ENV))
        status = lambda: ray.get(scheduler.status.remote(job))[0]  # noqa: E731
        deadline = time.monotonic() + START_S
        wait_for_step(status, 3, deadline)
        assert ray.get(scheduler.reserve.remote(2, a)) == [a, a]  # suspends the job
        while status()["state"] != "suspended":
            assert time.monotonic() < deadline + 60, f"not suspended: {status()}"
            time.sleep(0.2)
        assert ray.get(scheduler.unreserve.remote(1, b)) == 1
        while status()["state"] in LIVE:
            assert time.monotonic() < deadline + 180, f"did not end: {status()}"
            time.sleep(0.5)
        log = (tmp_path / "state" / "logs" / job / "w0.log").read_text()
        firsts = [int(n) for n in re.findall(r"^first step (\d+)$", log, re.M)]
        assert status()["state"] == "finished" and "done at step 20" in log, log[-2000:]
        assert firsts[0] == 1 and len(firsts) == 2 and firsts[1] > 3, log[-2000:]  # not from the start again
        assert list((tmp_path / "state" / "checkpoints" / job).glob("*")), "no checkpoint in the cluster's folder"
    finally:
        stop(scheduler)


@pytest.mark.parametrize("policy", ["fifo", "sia"])  # one that never preempts, one that does
def test_a_job_whose_first_processes_fail_as_they_start_fails_at_once_with_the_first_error(cluster, tmp_path, policy):
    """A script that raises before its first step (every process fails), and a job one of whose processes cannot
    join the first group (gloo bound to an interface this machine lacks) while the other waits in it, which would
    wait for the group's 300 s timeout: each fails at once with its first error line, its slots free."""
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('broken before its first step')\n")
    one_cannot_connect = tmp_path / "one_cannot_connect.py"
    one_cannot_connect.write_text(
        "import os, runpy, sys\n"
        "if os.environ['EASYSCALE_WORKER_ID'] == 'w1':\n"
        "    os.environ['GLOO_SOCKET_IFNAME'] = 'nosuch0'\n"
        "sys.argv = sys.argv[1:]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    scheduler = launch(str(tmp_path / "state"), policy, 0.5)
    try:
        says = {  # job -> what its note must say: the failed process, and its error's last line
            ray.get(scheduler.submit.remote([str(broken)], 4, 2, 2, "raises", ENV, "cifar10")):
            ("w0: RuntimeError: broken before its first step", "w1: RuntimeError: broken before its first step"),
            ray.get(scheduler.submit.remote([str(one_cannot_connect)] + job_argv(tmp_path / "nogroup", 4), 4, 2, 2,
                                            "nogroup", ENV, "cifar10")):
            ("w1: RuntimeError: ",)}
        deadline = time.monotonic() + START_S
        while any((now := ray.get(scheduler.status.remote(job))[0])["state"] != "failed" for job in says):
            assert time.monotonic() < deadline and now["state"] != "finished", now
            time.sleep(0.5)
        for job, notes in says.items():
            note = ray.get(scheduler.status.remote(job))[0]["note"]
            assert any(note.startswith(n) for n in notes), (job, note)
        assert all(n["held"] == 0 for n in ray.get(scheduler.nodes.remote()))
    finally:
        stop(scheduler)
