"""A job's supervisor changes the job's slots in place, across nodes, and not a bit of the result."""
import os
import signal
import sys
import time

import pytest
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from easyscale_ext.cluster import NAMESPACE, SLOT
from easyscale_ext.cluster.lifecycle import Run
from easyscale_ext.cluster.reserve import ReservedSlot
from easyscale_ext.cluster.supervisor import JobSupervisor
from easyscale_ext.cluster.worker import SlotWorker, fork_server_name
from support.jobs import JOB, START_S, reference
from support.sockets import listening

pytestmark = pytest.mark.multiprocess
JOB_ARGS = dict(n=4, steps=8, epochs=2)  # 16 steps


def wait(condition, what: str, timeout: float = START_S):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout} s")
        time.sleep(0.2)


@ray.remote(num_cpus=0)
class Listener:
    """Keeps the news a supervisor sends, as the scheduler receives it."""

    def __init__(self):
        self.heard = []

    def news(self, job_id, token, report):
        self.heard.append((job_id, token, report))

    def all(self):
        return self.heard


def started_job(tmp_path, job_id, nodes, step_sleep, *extra, virtual_workers=4, listener=None):
    """A supervisor beside this driver running JOB_ARGS' job (its hash to tmp_path/hash) on `nodes`, after its
    first step; and a function returning the supervisor's status. `listener` hears its news (token "t")."""
    argv = [JOB, "--mode", "easyscale", "--elastic", "1", "--out", str(tmp_path / "hash"), "--virtual-workers",
            str(virtual_workers), "--steps", "8", "--epochs", "2", "--step-sleep", str(step_sleep), *extra]
    supervisor = JobSupervisor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        ray.get_runtime_context().get_node_id(), soft=False)).remote(
        job_id, argv, {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}, str(tmp_path),
        virtual_workers, listener, "t")
    status = lambda: ray.get(supervisor.status.remote())  # noqa: E731
    ray.get(supervisor.place.remote(nodes))
    wait(lambda: (status().progress or {}).get("step", 0) >= 1, "first step")
    return supervisor, status


def test_a_job_grows_onto_another_node_then_leaves_the_first_in_place_bitwise(cluster, tmp_path):
    """And the supervisor tells its listener each change as it happens, once: the growth, the departure, the end;
    until_ended() answers with the end."""
    a, b = cluster.node_ids()
    out, events = tmp_path / "hash", tmp_path / "events"
    listener = Listener.remote()
    supervisor, status = started_job(tmp_path, "job-test", [a], 0.5, "--log-events", str(events), listener=listener)
    try:
        ended = supervisor.until_ended.remote()
        host, _, port = status().address.rpartition(":")
        assert listening(int(port)) == [host] == ["127.0.0.1"]  # the job's store: on the node's address only
        ray.get(supervisor.place.remote([a, b]))  # grow across nodes: a joiner on b
        wait(lambda: sorted(status().nodes) == sorted([a, b]) or status().ended, "growth")
        ray.get(supervisor.place.remote([b]))  # leave a: its process is released, its virtual workers move
        wait(lambda: status().ended, "the end")
        assert status().run == Run.FINISHED
        seen = sorted({tuple(map(int, line.split()[1:3])) for line in events.read_text().splitlines()})
        assert seen == [(1, 2), (2, 1)], f"scale events (old, new): {seen}"
        assert out.read_text() == reference(**JOB_ARGS)
        assert ray.get(ended, timeout=10).run == Run.FINISHED
        wait(lambda: ray.get(listener.all.remote())[-1][2].ended, "the end's news", timeout=10)
        heard = ray.get(listener.all.remote())
    finally:  # ended as the scheduler ends them (a supervisor let go exits through Ray's graceful path)
        ray.kill(supervisor)
        ray.kill(listener)
    assert {(job, token) for job, token, _ in heard} == {("job-test", "t")}
    reports = [report for _, _, report in heard]
    assert all(later != earlier for earlier, later in zip(reports, reports[1:])), "news that says nothing new"
    assert any(sorted(r.nodes) == sorted([a, b]) for r in reports), "no news of the growth"
    assert reports[-1].run == Run.FINISHED and not any(r.ended for r in reports[:-1])


def test_a_move_past_the_jobs_virtual_workers_sheds_the_old_slots_before_growing_the_rest_bitwise(cluster, tmp_path):
    """A job of 2 virtual workers on one slot of a moves to both slots of b: joiners first would make it 3
    processes. It grows to 2 (one joiner), leaves a, then grows the rest (before, the second joiner waited for
    admission forever, holding its slot, and the process on a never left)."""
    a, b = cluster.node_ids()
    # Its 40 steps take 6 s each until the move is seen, then no more time than they need: the move starts two
    # processes, which took over 40 s on a loaded two-core machine.
    moved = tmp_path / "moved"
    supervisor, status = started_job(tmp_path, "job-past", [a], 6.0, "--steps", "20", "--sleep-until", str(moved),
                                     virtual_workers=2)
    try:
        ray.get(supervisor.place.remote([b, b]))
        wait(lambda: status().nodes == [b, b] or status().ended, "the move")
        assert status().nodes == [b, b], status()
        moved.touch()
        wait(lambda: status().ended, "the end")
        assert status().run == Run.FINISHED
    finally:  # its processes are detached actors: a failure must not leave them holding the slots
        ray.get(supervisor.cancel.remote())
        ray.kill(supervisor)
    assert (tmp_path / "hash").read_text() == reference(n=2, steps=20, epochs=2)


def test_a_slot_on_a_node_that_is_gone_is_given_up_and_the_job_ends_bitwise(cluster, tmp_path):
    """A scheduler may place a joiner on a node in the moment it goes: Ray cannot schedule that process. The
    supervisor gives the slot up (no retries there) and the job goes on and ends on the slots it has."""
    a, _ = cluster.node_ids()
    gone = "ab" * 28  # a node id no live node has
    out = tmp_path / "hash"
    supervisor, status = started_job(tmp_path, "job-gone", [a], 0.2)
    ray.get(supervisor.place.remote([a, gone]))
    wait(lambda: status().ended, "the end")
    assert status().run == Run.FINISHED
    assert ray.get(supervisor.names.remote()) == ["w0", "w1"]  # one try on the node that is gone
    assert out.read_text() == reference(**JOB_ARGS)


def slot_on(node):
    """An actor holding one slot on `node`: it starts once a slot there is free."""
    return ReservedSlot.options(resources={SLOT: 1},
                                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()


@pytest.mark.parametrize("how", ["shrink", "move", "cancel", "failure"])
def test_a_slot_is_free_again_at_once_when_its_process_leaves(cluster, tmp_path, how):
    """Whatever makes a process leave, its slot's actor ends with it: another process can start there within a
    second or two (before, the slot stayed held until the whole job ended)."""
    a, b = cluster.node_ids()
    supervisor, status = started_job(tmp_path, f"job-{how}", [a, a], 0.3, "--steps", "200")
    try:
        if how == "failure":  # kill -9 of a process: its replacement must find the slot free
            ray.get(ray.get_actor(f"job-{how}/w1", namespace=NAMESPACE).kill.remote())
            wait(lambda: status().members == ["w0", "w2"], "replacement admitted")
            return
        other = slot_on(a)  # node a is full: this waits for a slot the job leaves
        assert not ray.wait([other.node.remote()], timeout=1.0)[0]
        if how == "cancel":
            ray.get(supervisor.cancel.remote())
        else:
            ray.get(supervisor.place.remote([a] if how == "shrink" else [b, b]))
            wait(lambda: status().exited, "a process leaving")
        left = time.monotonic()
        assert ray.get(other.node.remote(), timeout=10) == a
        print(f"{how}: slot free {time.monotonic() - left:.2f} s after the process left")
        ray.kill(other)
    finally:
        ray.get(supervisor.cancel.remote())
        ray.kill(supervisor)


def test_a_job_suspended_before_its_processes_started_ends_suspended_and_never_starts(cluster, tmp_path):
    """A scheduler that dies takes the calls it had queued for a supervisor still starting: the next one asks a
    job it was suspending to suspend again, without placing it. With no process to leave, the job is done (and
    resumes from its newest checkpoint when it gets slots again) rather than suspending forever."""
    supervisor = JobSupervisor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        ray.get_runtime_context().get_node_id(), soft=False)).remote(
        "job-unstarted", [JOB], {"PYTHONPATH": os.pathsep.join(sys.path)}, str(tmp_path), 2)
    ray.get(supervisor.suspend.remote())
    ray.get(supervisor.place.remote([cluster.node_ids()[0]]))  # too late: it is done
    report = ray.get(supervisor.status.remote())
    assert report.run == Run.ORPHANED and report.why == "suspended before its processes started"
    assert report.holding == [] and ray.get(supervisor.names.remote()) == []
    ray.kill(supervisor)


def test_a_job_is_done_only_once_every_process_it_started_has_ended(cluster, tmp_path):
    """A scheduler resumes a suspended job as soon as its supervisor says it is done: no process of the job may run
    then, or the job runs twice at once. A joiner whose slot's actor cannot answer its kill (its host silent: the
    actor and the joiner's process stopped) used to outlive the job's end: the supervisor took its actor for
    killed, and the process, which ends when its actor's process does, cannot while stopped. Its node's fork
    server ends it now, and starts nothing of that incarnation again. Stopped this early, the joiner has not yet
    left its fork server's process group for a session of its own: the server ends the process alone and waits
    for its end (it used to kill its whole group, itself included, and so waited for nothing)."""
    a, b = cluster.node_ids()
    supervisor, status = started_job(tmp_path, "job-silent", [a], 6.0, "--steps", "200")
    stopped = []
    try:
        ray.get(supervisor.place.remote([a, b]))  # a joiner on b; admitted at a step boundary (every 6 s) once ready
        wait(lambda: "w1" in ray.get(supervisor.names.remote()), "a joiner")
        joiner = ray.get_actor("job-silent/w1", namespace=NAMESPACE)
        pid = ray.get(joiner.pid.remote(), timeout=START_S)
        slot_pid = ray._private.state.actors(joiner._actor_id.hex())["Pid"]  # no public call says an actor's pid
        for p in (slot_pid, pid):
            os.kill(p, signal.SIGSTOP)
            stopped.append(p)
        assert status().members == ["w0"], status()  # stopped before it was ready
        server = ray.get_actor(fork_server_name(b), namespace=NAMESPACE)
        ray.get(supervisor.suspend.remote())  # w0 leaves at its next boundary; w1 is withdrawn, then killed
        wait(lambda: status().ended, "the end")
        assert not running(str(pid)), "the joiner's process outlived its job's end"
        assert pid not in ray.get(server.running.remote([]), timeout=START_S)  # (RayActorError: it ended itself)
        assert status().run == Run.SUSPENDED and status().step is not None and status().holding == []
    finally:
        for p in stopped:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        ray.get(supervisor.cancel.remote())
        ray.kill(supervisor)


# A process that starts a process of its own, says whether torch was loaded before its first line, and waits.
STARTS_ONE = """\
import os, subprocess, sys, time
loaded = "torch" in sys.modules
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(sys.argv[1], "w") as f:
    f.write(f"{os.getpid()} {child.pid} {loaded}")
time.sleep(600)
"""


def test_a_slots_process_and_what_it_started_end_with_its_actor_forked_or_not(cluster, tmp_path):
    """On a new node the first process is forked from the node's fork server, started under its environment; one
    with another variable is the actor's own child, a fresh interpreter. Killing a slot's actor (as a crash would)
    ends its process either way; a forked one runs in a session of its own, which ends with it, the process's own
    children included (a fresh one's children end as orphans do: DataLoader workers watch their parent). (Last in
    the module: it adds a node.)"""
    index = cluster.add_node(slots=2)
    node = cluster.node_ids()[index]
    started = []  # every pid the scripts wrote: none may outlive the test, whatever fails
    try:
        script = tmp_path / "starts_one.py"
        script.write_text(STARTS_ONE)
        env = {"PYTHONPATH": os.pathsep.join(sys.path)}
        for name, extra, forked in (("a", {}, True), ("b", {"OTHER": "1"}, False)):
            actor = SlotWorker.options(resources={SLOT: 1}, scheduling_strategy=NodeAffinitySchedulingStrategy(
                node, soft=False)).remote([sys.executable, str(script), str(tmp_path / name)], dict(env, **extra),
                                          str(tmp_path / f"{name}.log"))
            wait(lambda: (tmp_path / name).exists() and (tmp_path / name).read_text(), f"process {name}")
            pid, child, loaded = (tmp_path / name).read_text().split()
            started += [pid, child]
            assert loaded == str(forked), (tmp_path / f"{name}.log").read_text()
            assert ray.get(actor.poll.remote()) is None
            ray.kill(actor)
            ended = (pid, child) if forked else (pid,)
            wait(lambda: not any(map(running, ended)), f"the end of {name}'s processes", timeout=20)
    finally:
        cluster.remove_node(index)
        for pid in filter(running, started):  # the fresh process's child, orphaned
            os.kill(int(pid), signal.SIGKILL)


def running(pid: str) -> bool:
    """Whether process `pid` exists and has not ended (a zombie waits only for its parent to read its code)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False
