"""Cluster mode across machines, on hosts emulated inside this one (tests/support/hosts.py): the README's
across-machines commands as written, run on a head host and two worker hosts, with Ray's token authentication on;
every job's gloo groups and store on the hosts' own addresses; and a worker host cut off mid-step, nothing killed."""
import os
import re
import shlex
import subprocess
import sys
import time

import pytest

from support.hosts import SLOTS, RayOnHosts, readme_block
from support.jobs import JOB, START_S, logged_steps, reference
from support.sockets import listening_of

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "train_elastic.py")


def hash_job(out, n, level, steps=4, *more):
    """tests/support/train_job.py as an elastic job of `n` virtual workers at `level`: it writes its SHA-256 to
    `out`, which `reference` computes on one process."""
    return [JOB, "--mode", "easyscale", "--elastic", "1", "--out", str(out), "--virtual-workers", str(n),
            "--steps", str(steps), "--level", level, *more]


def test_the_readme_commands_across_three_hosts_train_over_their_links(hosts, tmp_path):
    """The README's commands as written (both worker hosts of its type, its policy); its job, and a D1 job of 8
    virtual workers on both worker hosts, end with their fixed-size bits; the job's store listens on the head's
    address, its gloo groups on each host's, never on every interface or on loopback; Ray refuses a client
    without the token."""
    cluster = RayOnHosts(hosts(["head", "a", "b"]), ["a100", "a100"], tmp_path)
    cluster.start("sia")
    stranger = cluster.hosts.run("head", [sys.executable, "-c", f"import ray; ray.init(address='{cluster.head}:6379')"],
                                 env={k: v for k, v in cluster.env.items() if not k.startswith("RAY_AUTH")},
                                 check=False, timeout=120)
    assert stranger.returncode != 0 and "InvalidAuthToken" in stranger.stderr, stranger.stderr[-2000:]
    (where, line), = [(w, c) for w, c in readme_block() if c.startswith("easyscale submit")]
    readme_job = cluster.submit(*shlex.split(line)[2:-1], EXAMPLE)
    d1 = cluster.submit("--virtual-workers", "8", "--min-procs", "4", "--level", "D1", "--application", "cifar10",
                        *hash_job(tmp_path / "d1", 8, "D1", 12, "--step-sleep", "0.5",
                                  "--log-times", str(tmp_path / "times")))
    deadline = time.monotonic() + START_S
    while not (tmp_path / "times").exists() or not (tmp_path / "times").read_text().strip():
        assert time.monotonic() < deadline, cluster.row(d1)
        time.sleep(0.5)
    store = int(cluster.row(d1)["live"]["address"].split(":")[1])
    # The store on the head and the job's processes on a worker host at least, each on its host's address, whenever
    # looked at; looked at until the processes are seen (a loaded machine starts the README's job later, and Sia may
    # start this one on one host and grow it, or suspend it a while for the other: then none listens).
    while True:
        listening = {}  # host -> the store's listening socket and every job process's (gloo's) there
        for host in ("head", "a", "b"):  # (Ray's own listen on every interface: Ray's default)
            listening[host] = [(command, address, port) for _, command, address, port
                               in listening_of(cluster.hosts.pids(host)) if command == "python" or port == store]
            assert all(address == cluster.hosts.address[host] for _, address, _ in listening[host]), (host, listening)
        if listening["head"] and (listening["a"] or listening["b"]):
            break
        assert time.monotonic() < deadline and cluster.row(d1)["state"] != "finished", listening
        time.sleep(0.5)
    assert cluster.wait(d1)["state"] == "finished"
    assert (tmp_path / "d1").read_text() == reference(n=8, steps=12, level="D1")
    assert cluster.holders(d1) == {"a", "b"}
    assert cluster.wait(readme_job)["state"] == "finished"
    printed = re.findall(r"sha256 ([0-9a-f]{64})", cluster.easyscale("logs", readme_job).stdout)
    local = subprocess.run([sys.executable, "-m", "easyscale_ext.cli", "run", "--procs", "1", "--", EXAMPLE],
                           capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert printed and printed == re.findall(r"sha256 ([0-9a-f]{64})", local.stdout), (printed, local.stdout)


def steps(times) -> dict:
    """The steps each process has logged (train_job's --log-times), by worker id."""
    logged = {}
    for worker, step, _, _ in logged_steps(times):
        logged.setdefault(worker, []).append(step)
    return logged


def test_a_worker_host_cut_off_mid_step_the_job_goes_on_in_place_and_its_processes_end_when_it_heals(
        hosts, tmp_path):
    """A D2 job spans both device types (a t4 and an a100 host) under a policy that mixes them, growing to two
    processes on each; then host b's link goes down mid-step: nothing is killed, nobody gets a reset. The processes
    on a stop hearing b's, cut their group at the liveness bound and go on in place; the job is never suspended.
    Once Ray has taken b for dead, b's link comes back: its processes, never killed, log no step more and end; Ray
    started again on b, as a machine's service manager would, offers b's slots again. The job ends with its
    fixed-size bits."""
    cluster = RayOnHosts(hosts(["head", "a", "b"]), ["t4", "a100"], tmp_path)
    cluster.start("easyscale-heter", "--round", "2")
    times, fast = tmp_path / "times", tmp_path / "fast"  # its steps take 0.5 s until `fast` exists
    job = cluster.submit("--virtual-workers", "4", "--min-procs", "2", "--level", "D2", "--application",
                         "deepspeech2", *hash_job(tmp_path / "hash", 4, "D2", 100, "--step-sleep", "0.5",
                                                  "--sleep-until", str(fast), "--log-times", str(times)))
    where = {address: host for host, address in cluster.hosts.address.items()}
    deadline = time.monotonic() + START_S
    while len((live := cluster.row(job)["live"] or {}).get("members", [])) < 4:  # grown onto both types
        assert time.monotonic() < deadline, (cluster.row(job), steps(times))
        time.sleep(0.5)
    on_b = {m for m, n in zip(live["members"], live["nodes"]) if where[cluster.node_address[n]] == "b"}
    assert len(on_b) == 2, live
    while not on_b <= set(steps(times)):  # b's processes have trained a step as members
        assert time.monotonic() < deadline, steps(times)
        time.sleep(0.5)
    cluster.hosts.cut("b")
    cut_at = max(max(s) for s in steps(times).values())
    # The processes on a train again, in place, without b's: three more steps each.
    while min(max(s) for w, s in steps(times).items() if w not in on_b) < cut_at + 3:
        row = cluster.row(job)
        assert time.monotonic() < deadline + 120 and row["state"] == "running", (row, steps(times))
        time.sleep(0.5)
    b_node = next(n for n, (address, _) in cluster.nodes().items() if address == cluster.hosts.address["b"])
    while cluster.nodes()[b_node][1]:  # Ray's health check takes b for dead
        assert time.monotonic() < deadline + 240, cluster.nodes()
        time.sleep(1)
    stale = {w: s for w, s in steps(times).items() if w in on_b}
    cluster.hosts.heal("b")
    jobs_on_b = lambda: [p for p, command, *_ in listening_of(cluster.hosts.pids("b")) if command == "python"]  # noqa
    while jobs_on_b():  # b's processes, never killed, end
        assert time.monotonic() < deadline + 360, jobs_on_b()
        time.sleep(1)
    assert {w: s for w, s in steps(times).items() if w in on_b} == stale
    cluster.start_ray("b")
    fast.touch()
    assert cluster.wait(job)["state"] == "finished"
    assert (tmp_path / "hash").read_text() == reference(n=4, steps=100, level="D2")
    assert {w: s for w, s in steps(times).items() if w in on_b} == stale  # nothing from b's old processes, ever
    status = cluster.easyscale("status").stdout
    assert re.search(rf"^\S+\s+a100\s+{SLOTS}\s+0\s+0$", status, re.M), status  # b's slots usable again
