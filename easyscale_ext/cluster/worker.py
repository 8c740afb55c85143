"""One process of a job on one slot: a Ray actor that runs the training script as a process of its own, so that
the script runs unchanged (as under `easyscale run`) and its death is the process's, never the actor's. The
process dies with the actor (a node lost, the actor killed): no training process outlives its slot.

The process is forked by its node's fork server (`NodeForkServer`: `easyscale_ext.spawn` in a Ray actor, one per
node), which has imported torch once for every process the node starts, where its environment allows; else it is
the actor's child, a fresh interpreter. Every process carries its job's incarnation in its environment (JOB_ENV):
when a job ends, each of its nodes' fork servers ends what is left of it, however it was started (end_job)."""
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from typing import Dict, Iterable, List, Optional, Sequence

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .. import spawn
from . import JOB_ENV, NAMESPACE

# Run before the script, in its process: the kernel sends it SIGKILL when the actor's process ends (Linux's
# PR_SET_PDEATHSIG, kept across exec). Not a preexec_fn: Python code between fork and exec can deadlock in
# a process with threads, as Ray's workers are.
DIE_WITH_PARENT = ("import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGKILL); "
                   "os.execvp(sys.argv[1], sys.argv[1:])")
GPUS_ENV = "CUDA_VISIBLE_DEVICES"  # a slot's own (Ray sets it per actor): read when the process first uses CUDA
GLOO_ENV = "GLOO_SOCKET_IFNAME"  # the interface gloo binds to; unset, it takes the address the hostname resolves to
END_WITHIN_S = 30  # what NodeForkServer.end waits for a killed process to end (the supervisor, a little longer)
ENDED_KEPT = 1024  # incarnations a fork server refuses to start again: a slot's late start comes within seconds


@ray.remote(num_cpus=0)
class NodeForkServer:
    """Forks the node's job processes from a fork server (started under the first one's environment) and keeps
    each one's exit code until its slot has read it: only the process that forked a child can."""

    def __init__(self):
        self.children: Dict[int, tuple] = {}  # pid -> (its spawn.Forked, its slot actor's pid, its argv, its env)
        self.ended = deque(maxlen=ENDED_KEPT)  # the job incarnations (JOB_ENV) whose end was asked: none starts again

    def start(self, argv: List[str], env: Dict[str, str], per_process: Sequence[str], log_path: str,
              slot_pid: int) -> Optional[int]:
        """The pid of `argv` forked with this node's environment and `env`, dying with process `slot_pid`; None
        where its environment differs from the fork server's in more than `per_process` (its slot starts it)."""
        env = dict(os.environ, **env)
        if env.get(JOB_ENV) in self.ended:  # its slot's actor was on its way when the job ended
            raise RuntimeError(f"job incarnation {env[JOB_ENV]} has ended: no process of it starts")
        if not spawn.forkable(argv, env, per_process):
            return None
        self._forget_orphans()
        child = spawn.start(argv, env, per_process, log_path, die_with=slot_pid, append=True)  # a resumed job's too
        self.children[child.pid] = (child, slot_pid, argv, env)
        return child.pid

    def poll(self, pid: int, wait: bool = False) -> Optional[int]:
        """Child `pid`'s exit code (after waiting for it, with `wait`), None while it runs; forgotten once given."""
        child = self.children[pid][0]
        code = child.wait() if wait else child.poll()
        if code is not None:
            del self.children[pid]
        return code

    def end(self, pid: int) -> None:
        """Kill process `pid` of this node, with what it started, and wait until it is gone: a slot's process whose
        actor Ray took for dead lives on until the actor's process has ended, seconds later under load."""
        self._end([pid])

    def end_job(self, job: str, incarnation: Optional[str] = None) -> List[int]:
        """End every process of job `job` on this node (forked here, or started fresh by a slot's actor: found by
        the JOB_ENV in its environment) and wait until they are gone; with `incarnation`, start no process of it
        again. A job is done only then: a slot's actor that did not answer its kill (stopped, or still starting)
        may have a process running, or one on its way. Returns the pids it ended."""
        if incarnation is not None:
            self.ended.append(incarnation)
        mine = lambda value: (value or "").startswith(f"{job}:")  # noqa: E731
        pids = [pid for pid, (child, _, _, env) in self.children.items()
                if child.poll() is None and mine(env.get(JOB_ENV))]
        pids += [pid for pid in _started_fresh(JOB_ENV, mine) if pid not in pids]
        self._end(pids)
        return pids

    def _end(self, pids: Iterable[int]) -> None:
        """SIGKILL each process's session (what it started ends with it), then wait for each end."""
        pids, ends = list(pids), {}
        for pid in pids:
            try:
                ends[pid] = os.pidfd_open(pid)
            except ProcessLookupError:
                continue
            kill_session(pid)
        try:
            deadline = time.monotonic() + END_WITHIN_S
            for pid, ended in ends.items():
                if not select.select([ended], [], [], max(deadline - time.monotonic(), 0))[0]:  # in an
                    # uninterruptible wait (a hung disk): say so, and stay usable
                    raise TimeoutError(f"process {pid} has not ended {END_WITHIN_S} s after SIGKILL")
        finally:
            for ended in ends.values():
                os.close(ended)
        for pid in pids:
            if pid in self.children:  # this server's child: its exit code read, its record dropped
                self.children.pop(pid)[0].wait()

    def running(self, variables: Sequence[str]) -> Dict[int, tuple]:
        """{pid: (argv, {name: value} of `variables` in its environment)} of each child still running: what /proc
        shows of a fresh interpreter (a forked child's /proc shows the fork server's command and environment)."""
        return {pid: (argv, {k: env[k] for k in variables if k in env})
                for pid, (child, _, argv, env) in self.children.items() if child.poll() is None}

    def _forget_orphans(self) -> None:
        """The children that ended after their slot's actor, which never asks for their code."""
        for pid, (child, slot_pid, _, _) in list(self.children.items()):
            if child.poll() is not None and not _alive(slot_pid):
                del self.children[pid]


@ray.remote(num_cpus=0, concurrency_groups={"watch": 1})  # exited() waits beside the other calls
class SlotWorker:
    def __init__(self, argv: List[str], env: Dict[str, str], log_path: str, per_process: Sequence[str] = ()):
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        self.log_path, self.code = log_path, None
        self.reading = threading.Lock()  # the exit code is read once (a fork server forgets it once given)
        if GPUS_ENV in os.environ:
            env = dict(env, **{GPUS_ENV: os.environ[GPUS_ENV]})
        # The job's gloo groups go over the interface of the node's Ray address, the one its peers reach it at: what
        # the hostname resolves to may be loopback (127.0.1.1) or another network. A job's own setting stands.
        interface = interface_of(ray.util.get_node_ip_address())
        if interface and GLOO_ENV not in env:
            env = dict(env, **{GLOO_ENV: interface})
        self.server = fork_server(ray.get_runtime_context().get_node_id())
        self.process_pid = ray.get(self.server.start.remote(argv, env, [*per_process, GPUS_ENV], log_path, os.getpid()))
        self.child = None
        if self.process_pid is None:
            with open(log_path, "ab") as log:
                self.child = subprocess.Popen([sys.executable, "-c", DIE_WITH_PARENT, *argv],
                                              env=dict(os.environ, **env), stdout=log, stderr=subprocess.STDOUT,
                                              start_new_session=True)
            self.process_pid = self.child.pid
        self.ended = os.pidfd_open(self.process_pid)  # readable once the process has ended, whoever its parent

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def pid(self) -> int:
        """The process's id on this slot's node (e.g. to signal it from outside, as a fault would)."""
        return self.process_pid

    def poll(self) -> Optional[int]:
        """The process's exit code, None while it runs."""
        return self._code(wait=False)

    @ray.method(concurrency_group="watch")
    def exited(self) -> int:
        """The process's exit code, once it has exited: a call that stays in flight while the process runs, which its
        supervisor waits on, asking nothing (it fails if this actor dies, with its node or killed)."""
        if self.child is not None:
            self.child.wait()
        else:
            select.select([self.ended], [], [])  # not the fork server's wait: that would hold its node's server
        return self._code(wait=True)

    def terminate(self) -> None:
        """SIGTERM: the process leaves the job at its next step boundary, in place (a preemption)."""
        if self._code(wait=False) is None:
            os.kill(self.process_pid, signal.SIGTERM)

    def kill(self) -> Optional[int]:
        """Kill the process and whatever it started (DataLoader workers); returns its exit code."""
        if self._code(wait=False) is None:
            kill_session(self.process_pid)
        return self._code(wait=True)

    def log(self, offset: int = 0, limit: int = 1 << 20) -> bytes:
        """Bytes of the process's output from `offset` (logs travel through Ray: no shared file system needed)."""
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            return f.read(limit)

    def _code(self, wait: bool) -> Optional[int]:
        with self.reading:
            return self._read_code(wait)

    def _read_code(self, wait: bool) -> Optional[int]:
        if self.code is None:
            if self.child is not None:
                self.code = self.child.wait() if wait else self.child.poll()
            elif wait or select.select([self.ended], [], [], 0)[0]:
                try:
                    self.code = ray.get(self.server.poll.remote(self.process_pid, wait=True), timeout=60)
                except ray.exceptions.RayError:  # its fork server went (with its node): it was killed
                    self.code = -signal.SIGKILL
        return self.code


def fork_server_name(node: str) -> str:
    """The Ray name (in NAMESPACE) of node `node`'s fork server."""
    return f"forkserver/{node}"


def fork_server(node: str) -> ray.actor.ActorHandle:
    """Node `node`'s fork server, started there if it has none yet."""
    return NodeForkServer.options(
        name=fork_server_name(node), namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()


def end_job(job: str, nodes: Iterable[str], incarnation: Optional[str] = None) -> None:
    """End every process of job `job` on each of `nodes` (NodeForkServer.end_job), and wait until they are gone (a
    node that goes meanwhile takes its processes with it)."""
    ends = [fork_server(node).end_job.remote(job, incarnation) for node in set(nodes)]
    if not ends:
        return
    for ref in ray.wait(ends, num_returns=len(ends), timeout=END_WITHIN_S + 5)[0]:
        try:
            ray.get(ref)
        except ray.exceptions.RayActorError:  # gone with its node
            pass


def kill_session(pid: int) -> None:
    """SIGKILL process `pid` with whatever it started: a job process leads a session of its own from its first line
    (its children are in it). Until then a forked one is still in its fork server's process group, which holds the
    fork server itself: only the process is killed (it has started nothing yet)."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:  # ended meanwhile
        pass


def _started_fresh(variable: str, match) -> List[int]:
    """The processes of this machine whose environment's `variable` satisfies `match`: job processes started as fresh
    interpreters (a forked one's environment, as /proc shows it, is its fork server's)."""
    import psutil  # Ray's own dependency

    found = []
    for process in psutil.process_iter():
        try:
            if match(process.environ().get(variable)):
                found.append(process.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):  # ended, or not ours
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def interface_of(address: str) -> Optional[str]:
    """The name of this machine's network interface that holds `address`; None if none does."""
    import psutil  # Ray's own dependency

    return next((name for name, addresses in psutil.net_if_addrs().items()
                 if any(a.address == address for a in addresses)), None)
