"""Preemption: a process asked to leave (SIGTERM, `easyscale scale --release`) leaves in place at the next step
boundary, its virtual workers move to the others, and the job ends bitwise equal to the fixed run; when every
process leaves, the job checkpoints and a restart continues bitwise."""
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from support.jobs import reference, run_elastic, run_job

pytestmark = pytest.mark.multiprocess  # each case starts real processes


@pytest.mark.parametrize("leaver", ["w1", "w0"])  # a member, and rank 0 (the next survivor coordinates)
def test_sigterm_makes_that_process_leave_in_place_bitwise(leaver, tmp_path):
    events, samples, fixed = tmp_path / "events", tmp_path / "samples", tmp_path / "fixed"
    assert run_elastic(3, "", n=4, sigterm_at=f"{leaver}:2", log_events=events, log_samples=samples) == reference(n=4)
    seen = {tuple(line.split()[:3]) for line in events.read_text().splitlines()}
    assert seen in ({("2", "3", "2")}, {("3", "3", "2")})  # at the signal's step boundary, or the next
    run_job("easyscale", procs=2, n=4, log_samples=fixed)
    lines = samples.read_text().splitlines()  # exactly-once data across the departure
    assert len(lines) == len(set(lines)) and sorted(lines) == sorted(fixed.read_text().splitlines())


def test_a_second_sigterm_terminates_at_once_and_the_others_recover_bitwise(tmp_path):
    faults = tmp_path / "faults"
    assert run_elastic(3, "", n=4, sigterm_at="w1:2", sigterm_twice=1, log_faults=faults) == reference(n=4)
    lines = faults.read_text().splitlines()
    assert sum(line.startswith("signal w1 SIGTERM") for line in lines) == 2
    assert not any(line.startswith("exit w1") for line in lines)  # ended by the signal, not by leaving


def test_a_joiner_sent_sigterm_before_admission_withdraws_and_is_replaced(tmp_path):
    # SIGTERM while it prepares: it withdraws (exit 0, never admitted) and a replacement joins; had SIGTERM
    # killed it, the launcher would count a failed joiner and start none; had it been admitted, it would leave.
    events = tmp_path / "events"
    assert run_elastic(2, "2:3", n=4, kill9_at="w2:0:start-term", log_events=events) == reference(n=4)
    joined = [e for e in _events(events) if e[1] < e[2]]
    assert [e[1:3] for e in joined][-1] == (2, 3) and not any(e[1] > e[2] for e in _events(events))


def test_when_every_process_leaves_the_job_checkpoints_and_resumes_bitwise(tmp_path):
    ckpt = tmp_path / "ckpt"
    assert run_elastic(1, "", stops=True, n=4, sigterm_at="w0:3", ckpt_dir=ckpt, ckpt_every=100) == ""
    assert sorted(p.name for p in ckpt.iterdir() if p.suffix == ".ckpt") == ["step-0000000003.ckpt"]
    assert run_job("easyscale", procs=2, n=4, ckpt_dir=ckpt, resume=1) == reference(n=4)


def release(port, worker):
    return subprocess.run([sys.executable, "-m", "easyscale_ext.cli", "scale", "--store", f"127.0.0.1:{port}",
                           "--release", worker], capture_output=True, text=True, timeout=60)


def test_release_names_a_current_process_and_never_the_last():
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30))
    store.set("gen/0/members", '["w0", "w1"]')
    store.set("gen/1/members", '["w0", "w2"]')  # the latest generation counts
    out = release(store.port, "w1")
    assert out.returncode != 0 and "has no process 'w1'; its processes are w0, w2" in out.stderr
    assert "Traceback" not in out.stderr
    out = release(store.port, "w2")
    assert out.returncode == 0 and store.get("releases") == b"w2\n", out.stderr
    store.set("gen/2/members", '["w0"]')
    out = release(store.port, "w0")
    assert out.returncode != 0 and "w0 is the job's last process: to stop the job, send it SIGTERM" in out.stderr


def _events(path):
    return [tuple(int(x) for x in line.split()[:3]) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("procs,schedule,kill,at", [
    (2, "", "w1:3:mid", 2),        # a member, in the middle of its step: the survivors redo step 3
    (3, "", "w0:2:boundary", 2),   # rank 0, after its step: the next survivor coordinates
    (3, "", "w1:2:ckpt", 2),       # a member while rank 0 writes a checkpoint
    (1, "2:2", "w1:3:mid", 2),     # a joiner of a one-process job, in its first step
])
def test_kill9_of_a_member_continues_in_place_bitwise(procs, schedule, kill, at, tmp_path):
    events = tmp_path / "events"
    assert run_elastic(procs, schedule, n=4, kill9_at=kill, log_events=events, ckpt_dir=tmp_path / "ckpt",
                       ckpt_every=2) == reference(n=4)
    # Without a restart: the survivors go on from the step they all hold (the launcher then starts a
    # replacement, which joins in place).
    assert (at, 2 if schedule else procs, 1 if schedule else procs - 1) in _events(events)


@pytest.mark.parametrize("procs,accumulate,kill,at", [
    (2, 3, "w1:6:mid", 3),        # in the synced step 6: back to step 3 (w0 wrote step 6), steps 4-6 redone
    (3, 2, "w0:3:boundary", 2),   # rank 0 at an unsynced boundary
])
def test_kill9_during_gradient_accumulation_redoes_it_from_the_last_synced_step(procs, accumulate, kill, at,
                                                                                 tmp_path):
    # The kept gradients of the steps since the last synced one are in no replicated context: those steps are
    # redone. With accumulate=3, slots chosen by step % 3 would have put w0's step 6 over its step 3.
    events = tmp_path / "events"
    expected = reference(n=4, accumulate=accumulate)
    assert run_elastic(procs, "", n=4, accumulate=accumulate, kill9_at=kill, log_events=events) == expected
    assert (at, procs, procs - 1) in _events(events)
    assert expected != reference(n=4)  # accumulation changes the result: the test can fail


@pytest.mark.parametrize("procs", [3, 4])  # on 4, w2 does not watch w1: it cuts on w1's mark, which it reads
def test_a_member_that_stops_with_its_connections_open_is_cut_off_by_its_heartbeat(procs, tmp_path):
    # A lost machine: no collective fails before the group's 300 s timeout (the launcher's 120 s ends the
    # test first); its watchers see its beat stop (liveness_s 5) and mark it lost, and every member cuts the group.
    events = tmp_path / "events"
    assert run_elastic(procs, "", n=4, kill9_at="w1:3:stop", log_events=events, timeout=120) == reference(n=4)
    assert (2, procs, procs - 1) in _events(events)


def test_kill9_of_a_joiner_after_it_registered_does_not_stall_the_job(tmp_path):
    events = tmp_path / "events"
    assert run_elastic(2, "2:3", n=4, kill9_at="w2:0:ready", log_events=events) == reference(n=4)
    assert _events(events)[-1][2] == 3  # a replacement joined


@pytest.mark.parametrize("procs,schedule,victim,point", [
    (2, "", 1, "starting"),        # a first member, before the job's first group forms: the other starts alone
    (2, "2:3", 2, "registering"),  # the joiner, prepared, before it says it is ready
    (2, "2:3", 2, "admitted"),     # the joiner, admitted, before the new generation's group forms
    (2, "2:3", 2, "adopting"),     # the joiner, in the state broadcast
    (2, "2:3", 0, "admitting"),    # rank 0, once it has written the new generation and admitted the joiner
    (2, "2:3", 1, "adopting"),     # a member, in the state broadcast
    (3, "2:2", 0, "admitting"),    # rank 0 in a scale-in
])
def test_a_process_lost_at_any_point_of_a_rendezvous_never_stalls_the_job(procs, schedule, victim, point, tmp_path):
    """The points inside the runtime (faults.py); after registering and in the first step of the new
    generation: the kill9 tests above."""
    from easyscale_ext.elastic.faults import FAULT_ENV

    env = [{}] * 8  # the i-th process started; its replacements come later, without the fault
    env[victim] = {FAULT_ENV: point}
    assert run_elastic(procs, schedule, n=4, env_per_process=env, timeout=180) == reference(n=4)


@pytest.fixture
def member():
    """A one-process job's member in this process; the SIGTERM handler it installs is taken back after."""
    from easyscale_ext.elastic import ElasticMember

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30))
    store.set("gen/0/members", '["w0"]')
    previous = signal.getsignal(signal.SIGTERM)
    try:
        yield ElasticMember(f"127.0.0.1:{store.port}", "w0")
    finally:
        dist.destroy_process_group()
        signal.signal(signal.SIGTERM, previous)


def test_a_failure_that_is_no_lost_process_is_raised_as_it_is(member):
    bug = ValueError("a bug in the training code")
    with pytest.raises(ValueError, match="a bug in the training code"):
        member.recover(bug, None, None, None, None)


def test_sigterm_to_a_forked_child_ends_it_and_releases_nothing(member):
    # A DataLoader worker or a pool's process inherits the handler: SIGTERM must end it, as by default (a
    # pool's terminate() hung on it), not ask its parent's process to leave.
    ready, started = os.pipe()
    child = os.fork()
    if child == 0:
        os.write(started, b"1")  # a signal before Python's after-fork clean-up would be dropped
        time.sleep(30)
        os._exit(0)
    os.read(ready, 1)
    os.close(ready)
    os.close(started)
    os.kill(child, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while (done := os.waitpid(child, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    if done[0] == 0:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
    assert done[0] == child and os.WIFSIGNALED(done[1]) and os.WTERMSIG(done[1]) == signal.SIGTERM
    assert not member.store.releases()
