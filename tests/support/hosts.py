"""Emulated hosts: several machines inside this one, for what crosses a network link.

Each host is a network namespace with its own loopback, one interface (a veth pair into a bridge of its own) and
an address of the benchmarking range 198.18.0.0/15, with no route out: its processes reach each other over that
link, and nothing else. The file system, /dev/shm and the process table stay shared. A host can be cut off with
nothing killed, as a link that drops: `cut` takes its link down (silence both ways: no reset, no error), `partition`
drops what two hosts send each other, in one direction or both, while each still reaches the rest (their frames go
to a hardware address nobody has), and `freeze` stops every process in it (SIGSTOP). `Hosts.close` kills whatever
ran in its namespaces and removes them and the bridge, also when a test fails or is interrupted. Needs root and
iproute2; `hosts` (the pytest fixture of the tests that use it) skips with the reason where either is missing.
"""
import os
import secrets
import shutil
import signal
import subprocess
import time
from typing import Dict, List, Optional

import pytest

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
    """`names` hosts on one bridge, the i-th at 198.18.0.(i + 1)."""

    def __init__(self, names: List[str]):
        tag = secrets.token_hex(2)  # names of their own: tests on two pytest workers run side by side
        self.bridge = f"esb{tag}"
        self.address: Dict[str, str] = {}
        self.namespace: Dict[str, str] = {}
        self.link: Dict[str, str] = {}  # host -> its veth end on the bridge (what `cut` takes down)
        self.processes: List[subprocess.Popen] = []
        try:
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
        """`argv` as run on `host`."""
        return ["ip", "netns", "exec", self.namespace[host], *argv]

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
        """Every process in `host`'s namespace (whatever started it there: daemons too)."""
        out = subprocess.run(["ip", "netns", "pids", self.namespace[host]], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    # -- faults -----------------------------------------------------------------------------------------------
    def cut(self, host: str) -> None:
        """`host`'s link goes down: what it sends and what is sent to it is lost, and nobody is told."""
        _ip("link", "set", self.link[host], "down")

    def heal(self, host: str) -> None:
        _ip("link", "set", self.link[host], "up")

    def partition(self, a: str, b: str, both: bool = True) -> None:
        """What `a` sends `b` is lost (and what `b` sends `a`, with `both`); each still reaches every other host."""
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
            try:
                os.kill(pid, sig)
            except ProcessLookupError:  # ended meanwhile
                pass

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
        for host, namespace in self.namespace.items():
            while self.pids(host) and time.monotonic() < deadline:
                self.kill(host)
                time.sleep(0.1)
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)  # its veth ends go with the hosts
        self.namespace.clear()


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")


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
