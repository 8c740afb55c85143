"""Cluster mode across machines, on hosts emulated inside this one (tests/support/hosts.py): the README's
across-machines commands as written, run on a head host and two worker hosts, with Ray's token authentication on;
every job's gloo groups and store on the hosts' own addresses; and a worker host cut off mid-step, nothing killed."""
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

import pytest

from support.jobs import JOB, START_S, reference
from support.sockets import listening_of

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "train_elastic.py")
SLOTS = 2  # per worker host


def readme_block() -> list:
    """The README's across-machines commands: (where, command) with where "head" or "training"."""
    readme = open(os.path.join(ROOT, "README.md")).read()
    block = re.search(r"\*\*Across machines\*\*, start Ray yourself and point the scheduler at it:\n\n```sh\n(.*?)```",
                      readme, re.S).group(1)
    where, commands = None, []
    for line in block.splitlines():
        if line.startswith("# on "):
            where = "training" if "training" in line else "head"
        elif line.strip():
            commands.append((where, line))
    return commands


class Cluster:
    """The README's cluster on emulated hosts `head`, `a` and `b` (worker hosts of `types`), started by its own
    commands; `easyscale(...)` runs a command on the head, as its user would."""

    def __init__(self, hosts, types, tmp):
        self.hosts, self.types = hosts(["head", "a", "b"]), dict(zip("ab", types))
        self.head = self.hosts.address["head"]
        home = tmp / "home"  # Ray's cloud probe stays off where it finds this file (../shared/RAY.md)
        home.mkdir()
        (home / "ray_bootstrap_config.yaml").write_text("{}\n")
        token = tmp / "ray_auth_token"
        token.write_text("5e" * 32)
        self.env = {k: v for k, v in os.environ.items() if k not in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER",
                                                                       "GLOO_SOCKET_IFNAME")}  # loopback's only
        self.env.update(HOME=str(home), RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token",
                        RAY_AUTH_TOKEN_PATH=str(token), EASYSCALE_HOME=str(tmp / "easyscale"), OMP_NUM_THREADS="1",
                        PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
        self.temp = tempfile.mkdtemp(prefix="esray")  # each host's Ray files (short: Unix socket paths)

    def start(self, policy: str, *options: str) -> None:
        """The README's commands up to `cluster start` (under `policy`, with `options`), on the hosts they name."""
        for where, line in readme_block():
            line = line.replace("HEAD", self.head)
            if line.startswith("ray start") and where == "head":
                self.hosts.run("head", shlex.split(line) + ["--node-ip-address", self.head, "--temp-dir",
                                                            os.path.join(self.temp, "head")], env=self.env)
            elif line.startswith("ray start"):
                for host in "ab":
                    self.start_ray(host)
            elif line.startswith("easyscale cluster start"):
                self.easyscale(*shlex.split(line)[1:-1], policy, *options)

    def easyscale(self, *args, check=True, timeout=300) -> subprocess.CompletedProcess:
        return self.hosts.run("head", ["easyscale", *args], env=self.env, check=check, timeout=timeout)

    def submit(self, *args) -> str:
        return self.easyscale("submit", *args).stdout.strip()

    def wait(self, job: str) -> dict:
        """Until `job` has ended; its row of the job table."""
        deadline = time.monotonic() + START_S + 300
        while (row := self.row(job))["state"] not in ("finished", "failed", "cancelled"):
            assert time.monotonic() < deadline, row
            time.sleep(1)
        return row

    def row(self, job: str) -> dict:
        out = self.hosts.run("head", [sys.executable, "-c", READ_ROW, job], env=self.env)
        return json.loads(out.stdout)

    def holders(self, job: str) -> set:
        """The worker hosts on which the job's processes have held slots."""
        out = self.hosts.run("head", [sys.executable, "-c", READ_ALLOCATIONS, job], env=self.env)
        host = {address: name for name, address in self.hosts.address.items()}
        return {host[self.node_address[n]] for nodes in json.loads(out.stdout) for n in nodes}

    @property
    def node_address(self) -> dict:
        """Each Ray node's address, by node id."""
        return {node: address for node, (address, _) in self.nodes().items()}

    def nodes(self) -> dict:
        """Each Ray node's (address, alive), by node id, as Ray's head sees them."""
        out = self.hosts.run("head", [sys.executable, "-c", READ_NODES, f"{self.head}:6379"], env=self.env)
        return json.loads(out.stdout)

    def start_ray(self, host: str) -> None:
        """The README's command for a training machine, on `host` (again, as a machine's service manager would)."""
        (line,) = [line for where, line in readme_block() if where == "training"]
        line = line.replace("HEAD", self.head).replace('"easyscale_slot": 4, "easyscale_slot_a100": 4',
                                                        f'"easyscale_slot": {SLOTS}, '
                                                        f'"easyscale_slot_{self.types[host]}": {SLOTS}')
        # Emulation only: one file system for three machines, and no default route, from which Ray reads a
        # machine's address.
        self.hosts.run(host, shlex.split(line) + ["--node-ip-address", self.hosts.address[host], "--temp-dir",
                                                  os.path.join(self.temp, host)], env=self.env)


STATE = "os.path.join(os.environ['EASYSCALE_HOME'], 'state', 'jobs.sqlite')"
READ_ROW = ("import json, os, sys; from easyscale_ext.cluster.jobtable import JobTable; "
            f"print(json.dumps(JobTable({STATE}).get(sys.argv[1]), default=str))")
READ_NODES = ("import json, sys, ray; ray.init(address=sys.argv[1], logging_level='ERROR'); "
              "print(json.dumps({n['NodeID']: (n['NodeManagerAddress'], n['Alive']) for n in ray.nodes()}))")
READ_ALLOCATIONS = ("import json, os, sys; from easyscale_ext.cluster.jobtable import JobTable; "
                    f"print(json.dumps([n for _, j, n in JobTable({STATE}).allocations() if j == sys.argv[1]]))")


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
    cluster = Cluster(hosts, ["a100", "a100"], tmp_path)
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
    for host in ("head", "a", "b"):  # the store's listening socket, and every job process's (gloo's), on its host's
        found = [(command, address, port) for _, command, address, port in listening_of(cluster.hosts.pids(host))
                 if command == "python" or port == store]  # (Ray's own listen on every interface: Ray's default)
        assert found and all(address == cluster.hosts.address[host] for _, address, _ in found), (host, found)
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
    for line in times.read_text().splitlines() if times.exists() else []:
        worker, step = line.split()[:2]
        logged.setdefault(worker, []).append(int(step))
    return logged


def test_a_worker_host_cut_off_mid_step_the_job_goes_on_in_place_and_its_processes_end_when_it_heals(
        hosts, tmp_path):
    """A D2 job spans both device types (a t4 and an a100 host) under a policy that mixes them, growing to two
    processes on each; then host b's link goes down mid-step: nothing is killed, nobody gets a reset. The processes
    on a stop hearing b's, cut their group at the liveness bound and go on in place; the job is never suspended.
    Once Ray has taken b for dead, b's link comes back: its processes, never killed, log no step more and end; Ray
    started again on b, as a machine's service manager would, offers b's slots again. The job ends with its
    fixed-size bits."""
    cluster = Cluster(hosts, ["t4", "a100"], tmp_path)
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
