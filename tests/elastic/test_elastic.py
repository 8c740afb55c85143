"""Elastic scaling ends with the same bits as the job that never changed.

In-place (stop-free) scaling under easyscale_ext.launcher, checkpoint-and-
restart on other process counts, torchrun restarting after kill -9, and the
checkpoint file's failure modes.
"""
import os
import re
import socket
import subprocess
import sys
import textwrap

import pytest
import torch

import easyscale_ext as es
from easyscale_ext.elastic import CheckpointError, Checkpointer, Position
from support.jobs import kill_tree, reference, run_elastic, run_job, run_torchrun

pytestmark = pytest.mark.multiprocess  # each case starts real processes

SCHEDULE = [1, 2, 4, 3, 1]  # processes over the run's segments


@pytest.mark.parametrize("n", [4, 8])
def test_in_place_scaling_schedule_matches_fixed_placement(n, tmp_path):
    log = tmp_path / "samples"
    fixed_log = tmp_path / "fixed"
    events = tmp_path / "events"
    requests = ",".join(f"{step}:{p}" for step, p in enumerate(SCHEDULE[1:], start=1))
    assert run_elastic(1, requests, n=n, log_samples=log, log_events=events) == reference(n=n)
    # the on_scale hook fired on the processes of every new membership, joiners included
    seen = [tuple(map(int, line.split()[:3])) for line in events.read_text().splitlines()]
    expected = [(step, old, new) for step, (old, new) in enumerate(zip(SCHEDULE, SCHEDULE[1:]), start=1)]
    assert sorted(set(seen)) == expected
    assert len(seen) == sum(new for _, _, new in expected)
    run_job("easyscale", procs=2, n=n, log_samples=fixed_log)
    # exactly-once data: the same (epoch, step, virtual rank, sample ids), no line twice
    lines = log.read_text().splitlines()
    assert len(lines) == len(set(lines))
    assert sorted(lines) == sorted(fixed_log.read_text().splitlines())


@pytest.mark.parametrize("schedule", ["1:4", "3:2"])  # scale-out, then in, between no_sync() steps
def test_scaling_during_gradient_accumulation_carries_the_kept_gradients(schedule):
    # A process's only worker keeps its gradients in p.grad as a DDP rank does; its exported context must carry
    # them, and a process that takes a worker alone must put them back there (each was lost before).
    procs = {"1:4": 1, "3:2": 3}[schedule]
    expected = reference(n=4, accumulate=2)
    assert run_elastic(procs, schedule, n=4, accumulate=2) == expected
    assert expected != reference(n=4)


@pytest.mark.parametrize("first,then", [(4, 2), (2, 4)])
def test_checkpoint_between_no_sync_steps_resumes_bitwise(first, then, tmp_path):
    # The same kept gradients through a checkpoint at step 3 (accumulate=2: unsynced), restarted on other counts.
    run_job("easyscale", procs=first, n=4, accumulate=2, ckpt_dir=tmp_path, ckpt_every=1, stop_after=3)
    assert run_job("easyscale", procs=then, n=4, accumulate=2, ckpt_dir=tmp_path, resume=1) == \
        reference(n=4, accumulate=2)


def test_joiners_take_the_lr_scheduler_state():
    # Joiners built as the README shows (member.join(ddp, optimizer, scheduler)) continue the
    # members' StepLR count: the 1 -> 3 run ends equal to the fixed one.
    fixed = run_job("easyscale", procs=2, n=4, scheduler=1)
    assert run_elastic(1, "2:3", n=4, scheduler=1) == fixed
    assert fixed != reference()  # the scheduler changes the result: the test can fail


def test_joiner_without_the_jobs_scheduler_fails_clearly_and_the_job_goes_on(caplog):
    with pytest.raises(RuntimeError) as failed:  # the launcher reports the joiner's exit code
        run_elastic(1, "2:3", n=4, scheduler=1, join_scheduler=0)
    log = str(failed.value)
    assert "a final state was written" in log
    assert "does not hold the running job's state (LR scheduler: StepLR in the job, None here)" in log
    assert "member.start(ddp, optimizer, scheduler)" in log
    assert "failed (exit code 1) before it was admitted; the job stays on 1 processes" in caplog.text


@pytest.mark.parametrize("n", [4, 8])
def test_checkpoint_restart_schedule_matches_fixed_placement(n, tmp_path):
    for segment, procs in enumerate(SCHEDULE):
        last = segment == len(SCHEDULE) - 1
        final = run_job("easyscale", procs=procs, n=n, ckpt_dir=tmp_path, resume=int(segment > 0),
                        stop_after=0 if last else segment + 1)
    assert final == reference(n=n)
    assert len(Checkpointer(str(tmp_path), None, None).paths()) == 3  # keep-last-3


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_torchrun_recovers_from_kill_9_bitwise(tmp_path):
    kill_at = int(torch.randint(2, 6, ()).item())  # a random step of the six
    log = tmp_path / "samples"
    digest, stderr = run_torchrun(2, n=4, ckpt_dir=tmp_path / "ckpt", ckpt_every=2, resume=1, kill_at=kill_at,
                                  log_samples=log, port=free_port())
    assert digest == reference()
    assert "failed (exitcode: -9)" in stderr  # torchrun's agent saw the kill -9, then restarted the group
    steps = [tuple(line.split()[:3]) for line in log.read_text().splitlines()]
    redone = len(steps) - len(set(steps))
    assert 0 < redone <= 2 * 4, f"redid {redone} worker-steps; at most the 2 steps since the checkpoint"


def make_job(n=4, width=8):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.BatchNorm1d(width), torch.nn.Linear(width, 2))
    ddp = es.EasyScaleDDP(model, virtual_world_size=n)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    return ddp, opt


def train_step(ddp, opt):
    for x in ddp.workers([(v, torch.randn(4, 4)) for v in ddp.local_ranks]):
        ddp(x).sum().backward()
    opt.step()
    opt.zero_grad()


def test_checkpoint_errors_are_clear_and_lose_nothing(tmp_path):
    ddp, opt = make_job()
    train_step(ddp, opt)
    good = Checkpointer(str(tmp_path), ddp, opt).save(Position(1, 0, 1))
    blob = open(good, "rb").read()

    with pytest.raises(CheckpointError, match="virtual_world_size=4"):
        Checkpointer(str(tmp_path), *make_job(n=8)).resume()
    with pytest.raises(CheckpointError, match="another model"):
        Checkpointer(str(tmp_path), *make_job(width=16)).resume()
    for damaged, message in ((blob[:len(blob) // 2], "truncated or corrupted"),
                             (blob[:10], "not an easyscale checkpoint"),
                             (blob[:-100] + bytes(100), "truncated or corrupted")):
        path = tmp_path / "bad" / "step-0000000009.ckpt"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(damaged)
        with pytest.raises(CheckpointError, match=message):
            Checkpointer(str(path.parent), *make_job()).resume(str(path))
        with pytest.raises(CheckpointError, match="none of the 1 checkpoints"):
            Checkpointer(str(path.parent), *make_job()).resume()
    assert open(good, "rb").read() == blob  # the good checkpoint was never touched


@pytest.mark.parametrize("setting,value,message", [
    ("determinism_level", "D1", "written at determinism D0, this job runs D1"),
    ("isa", "AVX", "held to None, this job is held to AVX"),
    ("broadcast_buffers", False, "written with broadcast_buffers=True"),
])
def test_a_checkpoint_of_another_setting_is_refused(tmp_path, setting, value, message):
    ddp, opt = make_job()
    Checkpointer(str(tmp_path), ddp, opt).save(Position(0, 0, 0))
    again, opt2 = make_job()
    setattr(again, setting, value)  # as a job built with that setting (without changing this process's kernels)
    with pytest.raises(CheckpointError, match=re.escape(message)):
        Checkpointer(str(tmp_path), again, opt2).resume()


def test_resume_falls_back_past_an_unreadable_newest_checkpoint(tmp_path, caplog):
    ddp, opt = make_job()
    train_step(ddp, opt)
    Checkpointer(str(tmp_path), ddp, opt).save(Position(1, 0, 1))
    expected = es.state_sha256(ddp, opt)
    train_step(ddp, opt)
    newest = Checkpointer(str(tmp_path), ddp, opt).save(Position(2, 0, 2))
    blob = open(newest, "rb").read()
    open(newest, "wb").write(blob[:len(blob) // 3])  # a full disk cut it short
    again, opt2 = make_job()
    assert Checkpointer(str(tmp_path), again, opt2).resume() == Position(1, 0, 1)
    assert es.state_sha256(again, opt2) == expected
    assert f"skipping an unreadable checkpoint (kept for inspection): {newest} is truncated" in caplog.text
    assert os.path.getsize(newest) == len(blob) // 3  # kept, untouched


def test_resume_continues_bitwise(tmp_path):
    ddp, opt = make_job()
    torch.manual_seed(1)
    for _ in range(2):
        train_step(ddp, opt)
    Checkpointer(str(tmp_path), ddp, opt).save(Position(2, 0, 2))
    state = torch.get_rng_state()
    for _ in range(2):
        train_step(ddp, opt)
    expected = es.state_sha256(ddp, opt)  # bytes of parameters, buffers and optimizer state
    again, opt2 = make_job()
    Checkpointer(str(tmp_path), again, opt2).resume()
    torch.set_rng_state(state)  # the data drawn outside the workers
    for _ in range(2):
        train_step(again, opt2)
    assert es.state_sha256(again, opt2) == expected


KILLED_WRITER = textwrap.dedent("""
    import os, sys, time, torch
    sys.path[:0] = [{tests!r}, os.path.dirname({tests!r})]  # this folder, and tests/ for support
    from test_elastic import make_job
    from easyscale_ext.elastic import Checkpointer, Position
    ddp, opt = make_job()
    ckpt = Checkpointer({folder!r}, ddp, opt)
    ckpt.save(Position(1, 0, 1))
    real_fsync = os.fsync
    def slow_fsync(fd):
        print("writing", flush=True)
        time.sleep(60)
    os.fsync = slow_fsync
    ckpt.save(Position(2, 0, 2))
""")


def test_kill_during_checkpoint_write_keeps_previous(tmp_path):
    tests = os.path.dirname(os.path.abspath(__file__))
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER.format(tests=tests, folder=str(tmp_path))],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "writing"  # step 2's bytes are out, not yet durable
    finally:
        kill_tree(child)
    ddp, opt = make_job()
    ckpt = Checkpointer(str(tmp_path), ddp, opt)
    assert [os.path.basename(p) for p in ckpt.paths()] == ["step-0000000001.ckpt"]
    assert ckpt.resume() == Position(1, 0, 1)
