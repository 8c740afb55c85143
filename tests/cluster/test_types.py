"""Device types on a real two-node Ray cluster of two types (this machine emulates them: the second type's node runs
its processes one instruction set below this CPU's, so a job's bits differ between the types unless it runs at D2).
A D2 job spanning both types, EasyScale's policy spreading one over both, and a D2 job suspended on one type and
resumed on the other at another size, end with their fixed-size run's bits."""
import re
import sys
import time

import pytest
import ray

from easyscale_ext.cluster.scheduler import launch
from easyscale_ext.sched.policies.base import Policy
from easyscale_ext.cluster.lifecycle import LIVE
from support.jobs import START_S, reference
from test_scheduler import ENV, job_argv, resumable_argv, stop, wait_for_step

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def typed():
    from easyscale_ext.cluster.local import LocalCluster

    local = LocalCluster(nodes=2, slots=2, types=("t4", "a100"), emulate=True)
    try:
        yield local
    finally:
        local.shutdown()


class Spread(Policy):
    """Every job on one slot of each node: across both types."""
    name = "spread"

    def optimize(self, now, jobs, cluster, allocations):
        return {job.name: tuple(range(len(cluster.gpus))) for job in jobs}


ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the scheduler's process cannot import tests


def fixed(level, steps=4):
    """The job's single-process run at `level` on this machine's own instruction set (the t4 node's)."""
    return reference(n=4, steps=steps, level=level)


def wait_until_ended(scheduler, jobs, seconds=240):
    deadline = time.monotonic() + seconds
    while any((s := ray.get(scheduler.status.remote(j))[0])["state"] in LIVE for j in jobs):
        assert time.monotonic() < deadline, f"did not end: {s}"
        time.sleep(0.5)
    return [ray.get(scheduler.status.remote(j))[0] for j in jobs]


def test_a_d2_job_spanning_both_types_keeps_its_fixed_size_bits_and_a_d0_one_does_not(typed, tmp_path):
    scheduler = launch(str(tmp_path / "state"), Spread(), 0.5)
    try:
        assert sorted(n["type"] for n in ray.get(scheduler.nodes.remote())) == ["a100", "t4"]
        jobs = {level: ray.get(scheduler.submit.remote(job_argv(tmp_path / level, 4) + ["--level", level], 4, 1,
                                                       2, level, ENV, None, None, level))
                for level in ("D2", "D0")}
        assert [j["state"] for j in wait_until_ended(scheduler, jobs.values())] == ["finished"] * 2
        log = (tmp_path / "state" / "logs" / jobs["D2"] / "w0.log").read_text()
        assert (tmp_path / "D2").read_text() == fixed("D2"), log[-2000:]
        if typed.isas["a100"] is not None:  # the emulation works: across types, D0's bits are not the reference's
            assert (tmp_path / "D0").read_text() != fixed("D0"), "the two types' processes agree without D2"
    finally:
        stop(scheduler)


def test_a_d2_job_suspended_on_one_type_resumes_on_the_other_smaller_bitwise(typed, tmp_path):
    t4, a100 = typed.node_ids()
    scheduler = launch(str(tmp_path / "state"), "easyscale-homo", 0.5)  # elastic: it takes what there is
    try:
        assert ray.get(scheduler.reserve.remote(2, a100)) == [a100, a100]  # the job starts on the t4 node
        argv = resumable_argv(tmp_path / "hash", 4, tmp_path / "ckpt", 1000, sleep_until=tmp_path / "hit") + [
            "--level", "D2"]
        job = ray.get(scheduler.submit.remote(argv, 4, 1, 2, "moved", ENV, "cifar10", None, "D2"))
        status = lambda: ray.get(scheduler.status.remote(job))[0]  # noqa: E731
        deadline = time.monotonic() + START_S
        wait_for_step(status, 3, deadline)
        assert status()["nodes"] == [t4, t4]
        assert ray.get(scheduler.reserve.remote(2, t4)) == [t4, t4]  # suspends it
        while status()["state"] != "suspended":
            assert time.monotonic() < deadline + 60, f"not suspended: {status()}"
            time.sleep(0.2)
        (tmp_path / "hit").touch()
        assert ray.get(scheduler.unreserve.remote(1, a100)) == 1  # it resumes on one a100 slot
        [ended] = wait_until_ended(scheduler, [job])
        log = (tmp_path / "state" / "logs" / job / "w0.log").read_text()
        assert ended["state"] == "finished" and re.search(r"^resumed at step [1-9]", log, re.M), log[-2000:]
        assert (tmp_path / "hash").read_text() == fixed("D2", steps=12)
    finally:
        stop(scheduler)


def test_easyscale_heter_admits_and_spreads_a_d2_job_over_both_types_bitwise(typed, tmp_path):
    """The README's two-type cluster under EasyScale's heterogeneous policy: a D2 job that needs 3 of the 4 slots
    is admitted and starts on both types (EasyScale starts jobs on one GPU: the limits top it up), grows onto all
    4 where its model steps faster so (DeepSpeech2), and ends with its fixed-size run's bits; a D0 job cannot span
    types, so the same minimum is refused, saying why."""
    scheduler = launch(str(tmp_path / "state"), "easyscale-heter", 0.5)
    try:
        with pytest.raises(ray.exceptions.RayTaskError, match="a job spans types only at --level D2"):
            ray.get(scheduler.submit.remote(job_argv(tmp_path / "d0", 4), 4, 3, 4, "d0", ENV, "deepspeech2"))
        grown = tmp_path / "grown"  # its steps take 0.3 s until it is seen on all 4 slots, then what they need
        argv = job_argv(tmp_path / "hash", 4, steps=40) + ["--level", "D2", "--sleep-until", str(grown)]
        job = ray.get(scheduler.submit.remote(argv, 4, 3, 4, "spread", ENV, "deepspeech2", None, "D2"))
        types = dict(zip(typed.node_ids(), ("t4", "a100")))
        held, deadline = [], time.monotonic() + START_S
        while (status := ray.get(scheduler.status.remote(job))[0])["state"] in LIVE:
            assert time.monotonic() < deadline, f"did not end: {status}"
            held.append(sorted(types[n] for n in status["nodes"]))
            if held[-1] == ["a100", "a100", "t4", "t4"]:
                grown.touch()
            time.sleep(0.2)
        log = (tmp_path / "state" / "logs" / job / "w0.log").read_text()
        assert status["state"] == "finished", log[-2000:]
        assert ["a100", "a100", "t4", "t4"] in held and all(len(h) >= 3 for h in held if h), held
        assert (tmp_path / "hash").read_text() == fixed("D2", steps=40)
    finally:
        stop(scheduler)
