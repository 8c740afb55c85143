"""Emulated hosts: several machines inside this one, for what crosses a network link.

Each host is a network namespace with its own loopback, one interface (a veth pair into a bridge of its own) and
an address of the benchmarking range 198.18.0.0/15, with no route out: its processes reach each other over that
link, and nothing else. The file system, /dev/shm and the process table stay shared. A host can be cut off with
nothing killed, as a link that drops: `cut` takes its link down (silence both ways: no reset, no error), `partition`
drops what two hosts send each other, in one direction or both, while each still reaches the rest (their frames go
to a hardware address nobody has), and `freeze` stops every process in it (SIGSTOP). `Hosts(names, loopback=True)`
puts the hosts on one machine's loopback instead (127.0.0.(i + 1), one namespace of their own), where every local
cluster runs: faults there are kills and freezes only. `Hosts.close` kills whatever ran in its namespaces and
removes them and the bridge, also when a test fails or is interrupted. Needs root and
iproute2; `hosts` (the pytest fixture of the tests that use it) skips with the reason where either is missing.
`RayOnHosts` starts the README's across-machines cluster on such hosts, with its own commands.
"""
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SLOTS = 2  # per training host of RayOnHosts
HOST_VARIABLE = "EASYSCALE_EMULATED_HOST"  # marks the processes of each host, for those sharing a namespace
NOBODY = "02:00:00:00:00:00"  # a locally administered hardware address no interface here has: frames to it vanish


def unavailable() -> Optional[str]:
    """Why hosts cannot be emulated here, or None."""
    if os.geteuid() != 0:
        return "emulated hosts need root (network namespaces)"
    if shutil.which("ip") is None:
        return "emulated hosts need iproute2's `ip`"
    probe = f"es-probe-{secrets.token_hex(3)}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None if made.returncode == 0 else f"cannot make a network namespace: {made.stderr.strip()}"


class Hosts:
    """`names` hosts on one bridge, the i-th at 198.18.0.(i + 1); with `loopback`, at 127.0.0.(i + 1) on one
    machine's loopback."""

    def __init__(self, names: List[str], loopback: bool = False):
        tag = secrets.token_hex(2)  # names of their own: tests on two pytest workers run side by side
        self.bridge = f"esb{tag}"
        self.loopback = loopback
        self.address: Dict[str, str] = {}
        self.namespace: Dict[str, str] = {}
        self.link: Dict[str, str] = {}  # host -> its veth end on the bridge (what `cut` takes down)
        self.processes: List[subprocess.Popen] = []
        try:
            if loopback:
                _ip("netns", "add", f"es{tag}-lo")
                _ip("-n", f"es{tag}-lo", "link", "set", "lo", "up")
                for i, name in enumerate(names):
                    self.namespace[name], self.address[name] = f"es{tag}-lo", f"127.0.0.{i + 1}"
                    if i:  # held by lo, as a machine's address is by its interface (gloo binds to that)
                        _ip("-n", f"es{tag}-lo", "addr", "add", f"127.0.0.{i + 1}/32", "dev", "lo")
                return
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("link", "set", self.bridge, "up")
            for i, name in enumerate(names):
                self._add(name, f"es{tag}{i}", f"198.18.0.{i + 1}")
        except BaseException:
            self.close()
            raise

    def _add(self, name: str, prefix: str, address: str) -> None:
        namespace, outside = f"{prefix}-{name}", f"{prefix}b"
        _ip("netns", "add", namespace)
        self.namespace[name] = namespace
        _ip("link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", namespace)
        self.link[name] = outside
        _ip("link", "set", outside, "master", self.bridge)
        _ip("link", "set", outside, "up")
        for command in (["link", "set", "lo", "up"], ["addr", "add", f"{address}/24", "dev", "eth0"],
                        ["link", "set", "eth0", "up"]):
            _ip("-n", namespace, *command)
        self.address[name] = address

    # -- running things there ---------------------------------------------------------------------------------
    def argv(self, host: str, argv: List[str]) -> List[str]:
        """`argv` as run on `host`, marked as its in an environment variable every process it starts inherits."""
        return ["ip", "netns", "exec", self.namespace[host], "env", f"{HOST_VARIABLE}={host}", *argv]

    def run(self, host: str, argv: List[str], env: Optional[dict] = None, timeout: float = 300,
            check: bool = True) -> subprocess.CompletedProcess:
        """Run `argv` on `host` to its end; with `check`, a non-zero exit fails with its output."""
        out = subprocess.run(self.argv(host, argv), env=env, capture_output=True, text=True, timeout=timeout)
        if check and out.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} on {host} exited {out.returncode}:\n{out.stdout[-3000:]}\n"
                                 f"{out.stderr[-3000:]}")
        return out

    def start(self, host: str, argv: List[str], env: Optional[dict] = None, **popen) -> subprocess.Popen:
        """Start `argv` on `host`, left running (ended by close)."""
        proc = subprocess.Popen(self.argv(host, argv), env=env, **popen)
        self.processes.append(proc)
        return proc

    def pids(self, host: str) -> List[int]:
        """Every process on `host` (whatever started it there: daemons too): in its namespace, and on a loopback
        with its mark."""
        pids = _namespace_pids(self.namespace[host])
        return [pid for pid in pids if _host_of(pid) == host] if self.loopback else pids

    def shape(self, host: str, mbit: float) -> None:
        """`host`'s link carries at most `mbit` megabits a second each way, as a NIC's line rate does: a token bucket
        (tc's tbf, 10 ms of the rate deep) where the host sends and where the bridge sends to it."""
        self._link(host)
        for where, device in ((["-n", self.namespace[host]], "eth0"), ([], self.link[host])):
            subprocess.run(["tc", *where, "qdisc", "replace", "dev", device, "root", "tbf", "rate", f"{mbit}mbit",
                            "burst", str(max(int(mbit * 1e6 / 8 / 100), 65536)), "latency", "100ms"],
                           check=True, capture_output=True)

    # -- faults -----------------------------------------------------------------------------------------------
    def cut(self, host: str) -> None:
        """`host`'s link goes down: what it sends and what is sent to it is lost, and nobody is told."""
        _ip("link", "set", self._link(host), "down")

    def heal(self, host: str) -> None:
        _ip("link", "set", self._link(host), "up")

    def _link(self, host: str) -> str:
        if self.loopback:
            raise ValueError("hosts on one loopback have no link of their own to cut or partition: kill or freeze")
        return self.link[host]

    def partition(self, a: str, b: str, both: bool = True) -> None:
        """What `a` sends `b` is lost (and what `b` sends `a`, with `both`); each still reaches every other host."""
        self._link(a)
        for src, dst in [(a, b), (b, a)][:2 if both else 1]:
            _ip("-n", self.namespace[src], "neigh", "replace", self.address[dst], "lladdr", NOBODY, "dev", "eth0",
                "nud", "permanent")

    def mend(self, a: str, b: str) -> None:
        """Undo `partition(a, b)`, both ways."""
        for src, dst in ((a, b), (b, a)):
            subprocess.run(["ip", "-n", self.namespace[src], "neigh", "del", self.address[dst], "dev", "eth0"],
                           capture_output=True)

    def freeze(self, host: str) -> None:
        """Stop every process on `host` (a hung machine: its connections stay open, nothing answers)."""
        self._signal(host, signal.SIGSTOP)

    def thaw(self, host: str) -> None:
        self._signal(host, signal.SIGCONT)

    def kill(self, host: str) -> None:
        """Kill every process on `host` (a machine that crashed: its link stays up, its peers get resets)."""
        self._signal(host, signal.SIGKILL)

    def _signal(self, host: str, sig: int) -> None:
        for pid in self.pids(host):
            _signal(pid, sig)

    def close(self) -> None:
        """Kill everything that ran on the hosts, and remove them and the bridge."""
        for host in self.namespace:
            self.thaw(host)  # a stopped process ignores SIGKILL until it runs
            self.kill(host)
        for proc in self.processes:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:  # not in a namespace any more? then it is ours to kill
                proc.kill()
        deadline = time.monotonic() + 30
        for namespace in set(self.namespace.values()):
            while (pids := _namespace_pids(namespace)) and time.monotonic() < deadline:
                for pid in pids:
                    _signal(pid, signal.SIGKILL)
                time.sleep(0.1)
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)  # its veth ends go with the hosts
        self.namespace.clear()


def _namespace_pids(namespace: str) -> List[int]:
    out = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def _host_of(pid: int) -> Optional[str]:
    """The host a process was started on, from the mark in its environment (None: ended, or unmarked)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            variables = f.read().split(b"\0")
    except OSError:
        return None
    mark = f"{HOST_VARIABLE}=".encode()
    return next((v[len(mark):].decode() for v in variables if v.startswith(mark)), None)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:  # ended meanwhile
        pass


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")


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


class RayOnHosts:
    """The README's cluster on emulated hosts `head`, `a` and `b` (`hosts`; worker hosts of `types`), started by its
    own commands in `tmp` (a pathlib folder); `easyscale(...)` runs a command on the head, as its user would."""

    def __init__(self, hosts: Hosts, types, tmp):
        self.hosts, self.types = hosts, dict(zip("ab", types))
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

    def wait(self, job: str, timeout_s: float = 600) -> dict:
        """Until `job` has ended; its row of the job table."""
        deadline = time.monotonic() + timeout_s
        while (row := self.row(job))["state"] not in ("finished", "failed", "cancelled"):
            assert time.monotonic() < deadline, row
            time.sleep(1)
        return row

    def row(self, job: str) -> dict:
        out = self.hosts.run("head", [sys.executable, "-c", READ_ROW, job], env=self.env)
        return printed(out.stdout)

    def holders(self, job: str) -> set:
        """The worker hosts on which the job's processes have held slots."""
        out = self.hosts.run("head", [sys.executable, "-c", READ_ALLOCATIONS, job], env=self.env)
        host = {address: name for name, address in self.hosts.address.items()}
        return {host[self.node_address[n]] for nodes in printed(out.stdout) for n in nodes}

    @property
    def node_address(self) -> dict:
        """Each Ray node's address, by node id."""
        return {node: address for node, (address, _) in self.nodes().items()}

    def nodes(self) -> dict:
        """Each Ray node's (address, alive), by node id, as Ray's head sees them."""
        out = self.hosts.run("head", [sys.executable, "-c", READ_NODES, f"{self.head}:6379"], env=self.env)
        return printed(out.stdout)

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


def printed(stdout: str):
    """What a READ_* program printed: its one line that starts with OUT (Ray may print lines of its own)."""
    return json.loads(next(line for line in reversed(stdout.splitlines()) if line.startswith(OUT))[len(OUT):])


OUT = "json: "
STATE = "os.path.join(os.environ['EASYSCALE_HOME'], 'state', 'jobs.sqlite')"
READ_ROW = ("import json, os, sys; from easyscale_ext.cluster.jobtable import JobTable; "
            f"print('{OUT}' + json.dumps(JobTable({STATE}).get(sys.argv[1]), default=str))")
READ_NODES = ("import json, sys, ray; ray.init(address=sys.argv[1], logging_level='ERROR'); "
              f"print('{OUT}' + json.dumps({{n['NodeID']: (n['NodeManagerAddress'], n['Alive']) "
              "for n in ray.nodes()}))")
READ_ALLOCATIONS = ("import json, os, sys; from easyscale_ext.cluster.jobtable import JobTable; "
                    f"print('{OUT}' + json.dumps([n for _, j, n in JobTable({STATE}).allocations() "
                    "if j == sys.argv[1]]))")


@pytest.fixture
def hosts():
    """A factory of emulated hosts (`hosts(["head", "a", "b"])`), every one removed after the test."""
    why = unavailable()
    if why:
        pytest.skip(why)
    made: List[Hosts] = []

    def make(names: List[str]) -> Hosts:
        made.append(Hosts(names))
        return made[-1]

    try:
        yield make
    finally:
        for h in made:
            h.close()
