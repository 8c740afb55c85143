"""Cluster mode end to end on a two-node Ray cluster: a policy grows a job across nodes, a reservation takes a
slot back (the job leaves it in place), the slots return and the job grows across nodes again, a node is removed (the job
recovers in place on the other), two more jobs wait and run; every job ends with its fixed-size run's bits."""
import os
import sys
import time

import pytest
import ray

from easyscale_ext.cluster.scheduler import launch
from easyscale_ext.cluster.lifecycle import LIVE
from support.jobs import JOB, START_S, reference

pytestmark = pytest.mark.multiprocess
ENV = {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
LONG = dict(n=4, steps=50, epochs=2)  # 100 steps of >= 1 s until the events below are over: longer than them
SHORT = dict(n=2, steps=4, epochs=2)


def argv(out, events, n, steps, epochs, sleep):
    return [JOB, "--mode", "easyscale", "--elastic", "1", "--out", str(out), "--log-events", str(events),
            "--virtual-workers", str(n), "--steps", str(steps), "--epochs", str(epochs), "--step-sleep", str(sleep), "--block", "0"]


def test_grow_reserve_lose_a_node_and_queue_with_every_job_bitwise(cluster, tmp_path):
    a, b = cluster.node_ids()
    scheduler = launch(str(tmp_path / "state"), "easyscale-homo", 1.0)
    seen = tmp_path / "seen"  # the long job's steps take 1 s until the events are over, then no longer than they need
    long_job = ray.get(scheduler.submit.remote(argv(tmp_path / "h0", tmp_path / "e0", sleep=1.0, **LONG) + [
        "--sleep-until", str(seen)], 4, 1, 2, "long", ENV, "cifar10"))
    log = []

    def nodes():
        job = ray.get(scheduler.status.remote(long_job))[0]
        live = job["live"] or {}
        log.append((round(time.monotonic() - begin, 1), job["state"], live.get("members"),
                    [n[:6] for n in live.get("nodes", [])], (live.get("progress") or {}).get("step")))
        assert job["state"] in LIVE, f"the long job ended before the events: {log}"
        return sorted(live.get("nodes", []))

    def logs():  # pytest.fail, unlike assert, prints all of it
        return "\n".join(f"{p.relative_to(tmp_path)}: {p.read_text()[-800:]}" for p in tmp_path.glob("state/logs/*/*"))

    def wait(what, condition, timeout=START_S):
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} within {timeout} s: {log}\n{logs()}")
            time.sleep(0.3)

    begin = time.monotonic()
    wait("growth across both nodes", lambda: nodes() == sorted([a, b]))
    assert len(ray.get(scheduler.reserve.remote(3))) == 3  # the two free slots, then one of the long job's
    wait("release of a reserved slot", lambda: len(nodes()) == 1)
    assert sum(n["reserved"] for n in ray.get(scheduler.nodes.remote())) == 3
    assert ray.get(scheduler.unreserve.remote()) == 3
    wait("growth onto the slots given back", lambda: nodes() == sorted([a, b]))
    grown = log[-1][-1] or 0
    wait("steps on both nodes", lambda: nodes() and (log[-1][-1] or 0) >= grown + 3)  # not mid-rendezvous
    cluster.remove_node(1)
    wait("recovery on the node left", lambda: set(nodes()) == {a})
    seen.touch()
    short = [ray.get(scheduler.submit.remote(argv(tmp_path / f"h{i}", tmp_path / f"e{i}", sleep=0.1, **SHORT), 2,
                                             1, 2, f"short{i}", ENV, "cifar10")) for i in (1, 2)]
    deadline = time.monotonic() + START_S
    while True:
        jobs = {j["id"]: j for j in ray.get(scheduler.status.remote())}
        if all(j["state"] not in LIVE for j in jobs.values()):
            break
        if time.monotonic() > deadline:
            pytest.fail(f"jobs still queued or running: {[(j['id'], j['state'], j['live']) for j in jobs.values()]}\n"
                        f"{log[-5:]}\n{logs()}")
        time.sleep(0.5)
    assert [jobs[i]["state"] for i in [long_job, *short]] == ["finished"] * 3, log
    events = sorted({tuple(map(int, line.split()[1:3])) for line in (tmp_path / "e0").read_text().splitlines()})
    assert (1, 2) in events and (2, 1) in events, f"the long job's scale events (old, new): {events}"
    assert (tmp_path / "h0").read_text() == reference(**LONG)
    assert [(tmp_path / f"h{i}").read_text() for i in (1, 2)] == [reference(**SHORT)] * 2
    result = ray.get(scheduler.report.remote())
    assert sorted(r["name"] for r in result.jobs) == sorted([long_job, *short])
    assert max(result.timeline["gpus"]) <= 4
    ray.kill(scheduler)
