"""A job's supervisor: a Ray actor on the head node that hosts the job's store (so no worker's death takes
it down), starts the job's processes on the slots the scheduler gives it, and changes them in place.

The scheduler says which slots the job should hold (`place`); the supervisor gets there without a restart:
a slot it lacks gets a joiner (it prepares while the job trains, then joins at a step boundary), a slot it
should leave has its process released by name (it leaves at the next boundary; its virtual workers move),
and a move does both, the joiners first (as many as the job's virtual workers allow), so the job drops below its
size meanwhile only where it must. `split` asks for another division of the virtual workers. The supervisor
marks a process that exited with an error lost at once, as `easyscale run`'s launcher does, so the others
recover in place. A process that has exited, for any reason (released, moved, failed, cancelled), gives its
slot back at once: its actor is ended, its output kept in the log folder on the head. The job's run here and each
of its processes move only as lifecycle.py allows (Run, ProcessState); what the supervisor says of it is a Report.

The supervisor tells the scheduler what changed (`listener.news`): at once when the job's run, its members, its
processes or their exits change (the job ended, a member was lost or joined), and its progress at most every
PROGRESS_EVERY_S; the scheduler looks at no job between its rounds. `until_ended` answers when the run ends, and
fails when the supervisor dies: the one call the scheduler keeps waiting on each supervisor. The supervisor learns of
its processes' exits the same way, from each slot's `exited` call, in flight while its process runs.
"""
import logging
import os
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, replace
from typing import Dict, List, Optional

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .. import placement
from .. import determinism
from . import JOB_ENV, NAMESPACE, NODE_ENV, SLOT, TYPE_ENV
from .lifecycle import AFTER, PROCESS_MOVES, RUN_MOVES, ProcessState, Run, move
from .worker import END_WITHIN_S, SlotWorker, end_job, fork_server_name

log = logging.getLogger(__name__)

TICK_S = 0.2  # the supervisor looks at its processes this often: a job's end reaches the scheduler within it
PROGRESS_EVERY_S = 1.0  # a report that says only that the job stepped goes to the scheduler at most this often


@dataclass(frozen=True)
class Report:
    """What a supervisor says of its job (`status`): the scheduler acts on it, `easyscale status` shows it."""
    address: str  # the job's store
    members: List[str]  # the processes of its current group, by rank
    nodes: List[str]  # each member's node
    holding: List[str]  # the nodes of its processes that have not exited (members, joiners, leavers)
    progress: Optional[dict]  # rank 0's last report: step, total, time
    exited: Dict[str, int]  # the exit code of each process that has exited
    run: Run = Run.PLACING
    ended_at: Optional[float] = None  # when every process had exited (the run ended)
    exit_code: Optional[int] = None  # finished: 0; failed: the first failed process's
    step: Optional[int] = None  # suspended: the step it left at, saved
    why: Optional[str] = None  # orphaned: why it ended unfinished with no process to go on
    error: Optional[str] = None  # the first process that exited with an error: its name and last line of output

    @property
    def ended(self) -> bool:
        return self.run in AFTER

    def to_dict(self) -> dict:
        return asdict(self)

    def news_since(self, told: Optional["Report"]) -> bool:
        """Whether it says more than `told` beyond the job's progress: the scheduler hears of that at once."""
        return told is None or replace(self, progress=None) != replace(told, progress=None)


@dataclass
class Process:
    """One process of the job, on one slot of `node`, run by its slot's actor."""
    node: str
    actor: ray.actor.ActorHandle
    state: ProcessState  # changed by `move` only
    joiner: bool  # started to join, not with the job
    exit_code: Optional[int] = None
    withdrawn: bool = False  # told to leave before it was admitted, or lost so: its end is no failure of the script
    with_node: bool = False  # it went with its node
    retired: bool = False  # its slot's actor is ended (its slot free, its output kept on the head)
    pid: Optional[ray.ObjectRef] = None  # its pid on its node, once its actor says
    exit: Optional[ray.ObjectRef] = None  # its exit code, once it has exited (SlotWorker.exited, in flight till then)

    def move(self, to: ProcessState) -> None:
        self.state = move(PROCESS_MOVES, self.state, to, "a process")


def wait_until_gone(name: str) -> None:
    """Until a killed actor's name is free (for a job's next supervisor, or its slots' next actors)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            return
        time.sleep(0.05)


@ray.remote(num_cpus=0, concurrency_groups={"watch": 1})  # until_ended waits beside the other calls
class JobSupervisor:
    def __init__(self, job_id: str, argv: List[str], env: Dict[str, str], log_dir: str, virtual_workers: int,
                 listener: Optional[ray.actor.ActorHandle] = None, token: Optional[str] = None):
        """`listener`: the scheduler, told of changes as news(job_id, token, report)."""
        from ..elastic import client  # torch: here, not where the scheduler imports this module
        from ..elastic.protocol import hosted

        self.client = client
        self.job_id, self.argv, self.env, self.log_dir = job_id, list(argv), dict(env), log_dir
        # member.run's checkpoints when the script has no Checkpointer: beside the logs, in the state folder
        self.checkpoints = os.path.join(os.path.dirname(os.path.dirname(log_dir)), "checkpoints", job_id)
        self.virtual_workers = virtual_workers
        host = ray.util.get_node_ip_address()  # the cluster's private interface (loopback on one machine)
        self.server = client.serve(host)  # on that address only
        self.address = f"{host}:{self.server.port}"
        self.secret = client.new_secret()  # only the job's processes, given it, reach the job's keys
        self.incarnation = f"{job_id}:{uuid.uuid4().hex[:12]}"  # in its processes' environment (JOB_ENV)
        self.store = hosted(self.server, self.secret)
        self.processes: Dict[str, Process] = {}  # by name, in start order
        self.desired: List[str] = []  # node ids, one per process
        self.type_of: Dict[str, str] = {}  # node id -> its slots' type, as the scheduler says
        self.unreachable: set = set()  # nodes gone before a process could start there: no more tries
        self.run = Run.PLACING  # changed by `_move` only
        self.ending: dict = {}  # how it ended (Report's ended_at, exit_code, step, why), once it has
        self.joiner_lost = False  # a joiner went with its node: the job's target must drop back
        # what _start sets for each process (read once its script runs): the rest of a process's environment is
        # its node's fork server's, or the process is started fresh
        self.per_process = (client.STORE_ENV, client.SECRET_ENV, client.ID_ENV, client.JOIN_ENV, client.CHECKPOINT_ENV,
                            client.BALANCE_ENV, NODE_ENV, TYPE_ENV, JOB_ENV)
        self.spawned = 0
        self.error: Optional[str] = None  # Report.error
        self.listener, self.token = listener, token
        self.told: Optional[Report] = None  # the last report the listener was sent, and when
        self.told_at = 0.0
        self.ended = threading.Event()
        self.lock = threading.Lock()
        threading.Thread(target=self._supervise, daemon=True, name="easyscale-supervisor").start()

    # -- the scheduler's calls ----------------------------------------------------------------
    def place(self, nodes: List[str], types: Optional[List[str]] = None) -> None:
        """Hold one process on each of `nodes` (node ids, repeated for several slots of a node); `types`, the type
        of each node's slots, goes to its processes' environment."""
        if not nodes:
            raise ValueError("a running job holds at least one slot (to stop it, cancel it)")
        if len(nodes) > self.virtual_workers:
            raise ValueError(f"{len(nodes)} slots for a job of {self.virtual_workers} virtual workers")
        with self.lock:
            if self.run not in (Run.PLACING, Run.RUNNING):  # leaving, or ended: nothing to place
                return
            self.desired = list(nodes)
            self.type_of.update(zip(nodes, types or ()))
            if self.run == Run.PLACING:
                first = [self._spawn(node, joining=False, name_only=True) for node in nodes]
                self.store.set_members(0, first)
                self.store.set_target(len(first))
                for name, node in zip(first, nodes):
                    self._start(name, node, joining=False)
                self._move(Run.RUNNING)

    def suspend(self) -> None:
        """Every process leaves at its next step boundary, where the job saves a checkpoint (its script's
        Checkpointer, as every process asked to leave does) and ends suspended, to resume from it elsewhere."""
        with self.lock:
            if self.run == Run.PLACING:  # no process to leave (the job's place() may have died with a scheduler)
                self._move(Run.ORPHANED, why="suspended before its processes started")
            elif self.run == Run.RUNNING:
                self.desired = []  # the next tick withdraws the joiners and releases every member
                self._move(Run.SUSPENDING)

    def split(self, sizes: List[int]) -> None:
        members = self.client.current_members(self.store)
        if not placement.valid_split(sizes, self.virtual_workers, len(members)):
            raise ValueError(f"a split of {self.virtual_workers} virtual workers over {len(members)} processes "
                             f"needs {len(members)} sizes >= 1 summing to {self.virtual_workers}, got {sizes}")
        self.store.request_split(sizes)

    def cancel(self) -> None:
        """End every process of the job and give their slots back."""
        with self.lock:
            self._end_processes()

    def tell(self, listener: ray.actor.ActorHandle, token: str) -> None:
        """Send the news to `listener` from now on (a scheduler that took the job back), all of it again."""
        self.listener, self.token, self.told = listener, token, None

    @ray.method(concurrency_group="watch")
    def until_ended(self) -> Report:
        """The report of the ended run, once it has ended. A supervisor that dies fails this call, which is how its
        scheduler learns of it."""
        self.ended.wait()
        return self.status()

    # -- what the scheduler and `easyscale status` read ---------------------------------------------
    def status(self) -> Report:
        members = self.client.current_members(self.store) if self.processes else []  # none: never placed
        return Report(self.address, members, [self.processes[m].node for m in members],
                      sorted(p.node for p in self.processes.values() if p.state != ProcessState.GONE),
                      self.store.progress(),
                      {n: p.exit_code for n, p in self.processes.items() if p.state == ProcessState.GONE},
                      self.run, error=self.error, **self.ending)

    def log(self, worker: str, offset: int = 0) -> bytes:
        if self.processes[worker].retired:  # its actor is gone: the copy on the head
            try:
                with open(self._log_path(worker), "rb") as f:
                    f.seek(offset)
                    return f.read()
            except FileNotFoundError:  # it never started, or went with its node before a copy
                return b""
        return ray.get(self.processes[worker].actor.log.remote(offset))

    def names(self) -> List[str]:
        """The job's processes, in start order."""
        return list(self.processes)

    # -- inside -----------------------------------------------------------------------------------
    def _spawn(self, node: str, joining: bool, name_only: bool = False) -> str:
        name = f"w{self.spawned}"
        self.spawned += 1
        if not name_only:
            self._start(name, node, joining)
        return name

    def _log_path(self, name: str) -> str:
        return os.path.join(self.log_dir, f"{name}.log")

    def _retire(self, name: str, keep_log: bool = True) -> None:
        """End the actor of a process that has exited, so its slot is free for the next one; with `keep_log`
        (its actor answers), keep its output on the head first (its node may be another machine)."""
        process, output = self.processes[name], None
        if process.retired:
            return
        process.retired = True
        worker = process.actor
        if keep_log:
            try:
                output = ray.get(worker.log.remote(0, 1 << 62), timeout=10)
            except (ray.exceptions.RayError, FileNotFoundError):  # gone with its node: nothing to keep
                pass
        path = self._log_path(name)
        if output is not None and not (os.path.exists(path) and os.path.getsize(path) >= len(output)):
            os.makedirs(self.log_dir, exist_ok=True)
            with open(path, "wb") as f:  # not the same file (a node of another machine): keep a copy
                f.write(output)
        ray.kill(worker)

    def _end_orphan(self, process: Process) -> None:
        """A process whose actor is gone: where its node is up, it lives on until the actor's process has ended
        (seconds after Ray's verdict); its node's fork server ends it first, so that the job never runs twice."""
        if not any(n["NodeID"] == process.node and n["Alive"] for n in ray.nodes()):
            return  # gone with its node
        try:
            pid = ray.get(process.pid, timeout=0)
            server = ray.get_actor(fork_server_name(process.node), namespace=NAMESPACE)
            ray.get(server.end.remote(pid), timeout=END_WITHIN_S + 5)
        except (ray.exceptions.RayError, ValueError):  # never started (its actor died first), or its node went
            pass

    def _end_processes(self) -> None:
        """End every process of the job and wait for their ends, so that none outlives the job's end (a job resumed
        at once must never meet a process of its last incarnation); their slots come free. A slot's actor that does
        not answer its kill (stopped, or still starting) is killed, and its node's fork server ends what it may
        have started and starts nothing of this incarnation again."""
        kills = {p.actor.kill.remote(): name for name, p in self.processes.items() if not p.retired}
        answered, _ = ray.wait(list(kills), num_returns=len(kills), timeout=10)  # one never placed: no answer
        for ref, name in kills.items():
            try:
                code, started = (ray.get(ref), True) if ref in answered else (-9, False)
            except ray.exceptions.RayError:  # gone with its node
                code, started = -9, False
            self._exited(name, code)
            self._retire(name, keep_log=started)
        up = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        end_job(self.job_id, {p.node for p in self.processes.values()} & up, self.incarnation)

    def _start(self, name: str, node: str, joining: bool) -> None:
        env = dict(self.env)
        env.update({self.client.STORE_ENV: self.address, self.client.SECRET_ENV: self.secret, self.client.ID_ENV: name,
                    self.client.JOIN_ENV: "1" if joining else "0", NODE_ENV: node, JOB_ENV: self.incarnation})
        env.setdefault(self.client.CHECKPOINT_ENV, self.checkpoints)
        if determinism.ISA_ENV in env:  # D2: it may span device types, so it balances by measured speed (rank 0)
            env.setdefault(self.client.BALANCE_ENV, "1")
        if node in self.type_of:
            env[TYPE_ENV] = self.type_of[node]
        gpu_node = any(n["NodeID"] == node and n["Resources"].get("GPU") for n in ray.nodes())
        actor = SlotWorker.options(  # on a GPU node a slot is a GPU: Ray sets CUDA_VISIBLE_DEVICES
            resources={SLOT: 1}, num_gpus=1 if gpu_node else 0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            name=f"{self.job_id}/{name}", namespace=NAMESPACE, lifetime="detached").remote(
            [sys.executable] + self.argv, env, self._log_path(name), self.per_process)
        self.processes[name] = Process(node, actor, ProcessState.JOINING if joining else ProcessState.STARTING,
                                       joiner=joining, pid=actor.pid.remote(), exit=actor.exited.remote())

    def _move(self, to: Run, **ending) -> None:
        """The run moves to `to`; where that ends it, `ending` says how (Report's fields)."""
        self.run = move(RUN_MOVES, self.run, to, f"job {self.job_id}")
        if to in AFTER:
            self.ending = dict(ending, ended_at=time.time())

    def _supervise(self) -> None:
        while self.run not in AFTER:
            time.sleep(TICK_S)
            with self.lock:
                try:
                    if self.run != Run.PLACING:
                        self._tick()
                        self._tell()
                except Exception:  # logged; the next tick looks again (a dead monitor would hang the job)
                    log.exception("%s: supervising failed", self.job_id)
        self.ended.set()
        self._tell()

    def _tell(self) -> None:
        """The listener hears what changed: at once, or, where only the progress did, at most every
        PROGRESS_EVERY_S. Not awaited: a scheduler restarting misses it, and takes the job back with `tell`."""
        if self.listener is None:
            return
        report, now = self.status(), time.monotonic()
        if report.news_since(self.told) or (report.progress != self.told.progress
                                            and now - self.told_at >= PROGRESS_EVERY_S):
            self.listener.news.remote(self.job_id, self.token, report)
            self.told, self.told_at = report, now

    def _exited(self, name: str, code: int) -> None:
        process = self.processes[name]
        if process.exit_code is None:
            process.move(ProcessState.GONE)
            process.exit_code = code

    def _tick(self) -> None:
        store, processes = self.store, self.processes
        exits = {p.exit: name for name, p in processes.items() if p.state != ProcessState.GONE}
        answered, _ = ray.wait(list(exits), num_returns=len(exits), timeout=0)  # the processes that exited
        for ref in answered:
            name = exits[ref]
            process = processes[name]
            try:
                code = ray.get(ref)
            except ray.exceptions.ActorUnschedulableError:  # placed on a node as it went
                code, process.withdrawn = -9, True
                self.unreachable.add(process.node)
                self.joiner_lost = True
            except ray.exceptions.RayActorError:  # its node is gone, and the process with it, or its actor was killed
                code, process.withdrawn, process.with_node = -9, True, True  # a joiner lost so is no failure
                self.joiner_lost |= process.joiner and name not in self.client.current_members(store)
                self._end_orphan(process)
            self._exited(name, code)
            if code != 0 and not store.is_lost(name):
                store.mark_lost(name, "exited")  # the others recover at once, in place
            self._retire(name)
            if code > 0 and self.error is None:
                self.error = f"{name}: {last_line(self._log_path(name))}"
        failed = next((p.exit_code for p in processes.values() if not p.joiner and (p.exit_code or 0) > 0), None)
        if failed is not None and store.progress() is None:
            # One of the first processes failed before the job's first step: the others would wait for it in the
            # first group until its timeout, and the same script on slots of the same kind fails the same way.
            self._end_processes()
            self._move(Run.FAILED, exit_code=failed)
            return
        members = self.client.current_members(store)
        for m in members:
            if processes[m].state in (ProcessState.STARTING, ProcessState.JOINING):
                processes[m].move(ProcessState.TRAINING)
        alive = [w for w, p in processes.items() if p.state != ProcessState.GONE]
        if all(processes[m].state == ProcessState.GONE for m in members):
            self._end(members)
            return
        if any(processes[m].state == ProcessState.GONE for m in members):
            return  # ending, or recovering from a lost process: act on the generation that follows
        if any(p.joiner and w not in members and not p.withdrawn and p.exit_code is not None and p.exit_code > 0
               for w, p in processes.items()):  # a joiner failed (killed ones, by a signal, are replaced): another
            if store.target() != len(members):  # started the same way would too (its log says why); rank 0 must
                store.set_target(len(members))  # not wait for it
            return
        pending = [w for w in alive if processes[w].state == ProcessState.JOINING and not store.admitted(w)]
        holding = Counter(processes[m].node for m in members if processes[m].state == ProcessState.TRAINING)
        wanted = Counter(n for n in self.desired if n not in self.unreachable)  # the scheduler drops it next round
        withdrawn = False
        for node in {processes[w].node for w in pending}:  # joiners for slots the job no longer gets withdraw
            mine = [w for w in pending if processes[w].node == node]
            for w in mine[max(wanted[node] - holding[node], 0):]:
                store.mark_lost(w, "withdrawn")  # never admitted, even if it said it is ready
                processes[w].actor.terminate.remote()
                processes[w].move(ProcessState.LEAVING)
                processes[w].withdrawn = True
                pending.remove(w)
                withdrawn = True
        holding.update(processes[w].node for w in pending)
        # Grow first: a move never drops below the job's size. But a job has at most a process per virtual worker:
        # a move that would pass that grows to it, sheds the processes to leave, then grows the rest.
        growth = [node for node, count in (wanted - holding).items() for _ in range(count)]
        room = max(self.virtual_workers - len(members) - len(pending), 0)
        pending += [self._spawn(node, joining=True) for node in growth[:room]]
        if pending or withdrawn or self.joiner_lost:  # a joiner lost: rank 0 must not wait for it
            store.set_target(len(members) + len(pending))
            self.joiner_lost = False
        if pending:
            return
        for node, count in (holding - wanted).items():  # then shrink: release the processes on slots to leave
            leaving = [m for m in reversed(members) if processes[m].node == node
                       and processes[m].state == ProcessState.TRAINING]
            for m in leaving[:count]:
                processes[m].move(ProcessState.LEAVING)
                store.release(m)

    def _end(self, members: List[str]) -> None:
        """Every member has exited: the run ends, finished or not (suspended, orphaned, failed)."""
        processes = self.processes
        codes = [processes[m].exit_code for m in members] or [0]
        self._end_processes()  # joiners nobody will admit (one may wait for a slot that never comes: no call)
        stopped = self.store.stopped()  # the step at which every process left (suspend(), SIGTERM), saved
        killed = (-signal.SIGKILL, -signal.SIGTERM)  # from outside: an OOM kill, a drain before the script set its
        # handler; a script's own error exits otherwise
        if 0 in codes and stopped is None:  # a member that ends unasked ended the job's training
            self._move(Run.FINISHED, exit_code=0)
        elif stopped is not None and all(c == 0 for c in codes):  # not finished: it resumes from there
            self._move(Run.SUSPENDED, step=stopped)
        elif all(processes[m].with_node for m in members):
            self._move(Run.ORPHANED, why="its processes went with their nodes")
        elif all(processes[m].with_node or processes[m].exit_code in killed for m in members):
            self._move(Run.ORPHANED, why="its processes were killed")
        else:
            self._move(Run.FAILED, exit_code=next(c for c in codes if c != 0))


def last_line(path: str) -> str:
    """The last line a process wrote (a Python error's traceback ends with the error), '' if none."""
    try:
        with open(path, "rb") as f:
            f.seek(max(os.path.getsize(path) - 4096, 0))
            lines = f.read().decode(errors="replace").splitlines()
    except FileNotFoundError:  # it never started, or went with its node before a copy
        return ""
    return next((line.strip() for line in reversed(lines) if line.strip()), "")
