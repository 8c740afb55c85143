"""The cluster's scheduler: a long-lived Ray actor that runs rounds of the simulator's policy objects on the
live jobs and carries each decision out in place through the jobs' supervisors.

A round: the supervisors say which jobs ended and how far the others are; each job's model (the one a
simulation would use, sched.live) follows its real job; the policy (the object `easyscale simulate` runs, held to
each job's limits: policies.limits) gets the queued and running jobs with their allocations, as indices of the
nodes' available slots, and returns new ones; a job that gets slots for the first time starts on them, a running
job whose slots change moves there in place (supervisor.place), and a running job the policy stops is suspended:
it saves a checkpoint at its next step boundary, leaves its slots and waits in the queue to resume wherever it
gets slots (with `preempt=False`, `cluster start --no-preempt`, a running job keeps at least one slot instead).
Slots are Ray resources, so a slot is never held by two processes, whatever the timing of decisions, releases,
reservations and failures. The node list is read every round: a node lost takes its slots out of the next
decision, and its jobs, recovered in place on their other slots, keep those.
"""
import logging
import os
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple, Union

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .. import determinism
from ..sched import live
from ..sched.lifecycle import HOLDING, LIVE, WAITING, JobState
from ..sched.models.application import EPOCHS, GPU_TYPES, Applications
from ..sched.models.cluster import Cluster, placement_of
from ..sched.models.traces import data_dir
from ..sched.policies import POLICIES
from ..sched.policies.base import Policy
from ..sched.policies.limits import Limits
from . import NAMESPACE, SLOT, TYPED, reserve
from .jobtable import JobTable, no_such_job
from .supervisor import JobSupervisor

log = logging.getLogger(__name__)


HEAD = "node:__internal_head__"  # the resource Ray gives its head node only
ROUNDS_KEPT = 10_000  # the latest rounds' durations (round_seconds): a week of minute rounds, at most 80 kB


def launch(state_dir: str, policy: Union[str, Policy] = "fifo", round_s: float = 60.0, slot_type: str = "t4",
           preempt: bool = True, **options):
    """Start the scheduler on the head node, where nodes that come and go cannot take it (or the supervisors
    beside it) down; `options` are Ray's actor options (a name, a lifetime, `max_restarts=-1` to have Ray start it
    again if it dies: it takes its jobs back from the job table). `policy`: a name of sched.policies.POLICIES, or
    a policy object of one's own (a sched.policies.base.Policy)."""
    return Scheduler.options(resources={HEAD: 0.001}, **options).remote(state_dir, policy, round_s, slot_type,
                                                                        preempt=preempt)


def slot_nodes() -> Dict[str, int]:
    """Slots per alive node that offers them, by node id."""
    return {n["NodeID"]: int(n["Resources"][SLOT]) for n in ray.nodes()
            if n["Alive"] and n["Resources"].get(SLOT)}


def slot_types(default: str) -> Dict[str, str]:
    """The type of each alive node's slots, by node id: the T of its `easyscale_slot_T` resource, else `default`."""
    return {n["NodeID"]: next((r[len(TYPED):] for r in n["Resources"] if r.startswith(TYPED)), default)
            for n in ray.nodes() if n["Alive"] and n["Resources"].get(SLOT)}


def policy_view(capacity: Dict[str, int], types: Dict[str, str]) -> Tuple[List[str], Cluster]:
    """The nodes with free slots (`capacity`, by node id) in the order the policy sees them, and that view. By type,
    then id: the view is the simulation's of `--cluster` with the types in name order (policies break ties by
    node order, so Ray's random ids alone would make a run and its simulation part ways)."""
    node_ids = sorted((n for n in capacity if capacity[n] > 0), key=lambda n: (types[n], n))
    return node_ids, Cluster(",".join(f"1x{capacity[n]}:{types[n]}" for n in node_ids),
                             tuple(capacity[n] for n in node_ids), tuple(types[n] for n in node_ids))


@dataclass
class Tracked:
    """What the scheduler knows of a live job beyond its row of the job table: one record, dropped whole when the job
    ends (a restarted scheduler builds it again from the table)."""
    model: object = None  # the policy's model of it (sched.live), from the first round that sees it
    supervisor: Optional[ray.actor.ActorHandle] = None  # while it holds slots (running, suspending)
    placing: Dict[ray.ObjectRef, tuple] = field(default_factory=dict)  # its supervisor's place() calls not known to
    # have succeeded yet -> (whether it was the job's first, the supervisor asked)
    followed: Optional[float] = None  # when its model last followed it
    last_step: Optional[tuple] = None  # (time, step, its members' nodes if its model's) of its last progress report
    step_s: Optional[float] = None  # seconds per step measured over its last round
    answer: Optional[dict] = None  # its supervisor's last answer, as the job table has it

    def leave_slots(self) -> None:
        """It holds no slot now: what its supervisor said goes; its model keeps its history (attained service,
        progress) for when it resumes."""
        self.supervisor, self.placing, self.followed, self.last_step, self.step_s, self.answer = None, {}, None, \
            None, None, None
        if self.model is not None:
            self.model.allocate({}, 0.0)


@ray.remote(num_cpus=0)
class Scheduler:
    def __init__(self, state_dir: str, policy: Union[str, Policy] = "fifo", round_s: float = 60.0,
                 slot_type: str = "t4", data: Optional[str] = None, preempt: bool = True):
        if isinstance(policy, str) and policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}: choose one of {', '.join(POLICIES)}")
        if slot_type not in GPU_TYPES:
            raise ValueError(f"unknown slot type {slot_type!r}: the profiles know {', '.join(GPU_TYPES)}")
        if not slot_nodes():
            raise ValueError(f"no node of this Ray cluster offers the {SLOT!r} resource: start nodes with "
                             f"--resources '{{\"{SLOT}\": K}}' (easyscale cluster start does)")
        unknown = sorted(set(slot_types(slot_type).values()) - set(GPU_TYPES))
        if unknown:
            raise ValueError(f"nodes declare slots of unknown types {unknown} ({TYPED}T resources): the profiles "
                             f"know {', '.join(GPU_TYPES)}")
        os.makedirs(state_dir, exist_ok=True)
        self.state_dir, self.round_s, self.slot_type = state_dir, round_s, slot_type
        self.preempt = preempt  # the policy and reservations may suspend a job
        self.types = slot_types(slot_type)  # node id -> its slots' type, as last seen
        self.table = JobTable(os.path.join(state_dir, "jobs.sqlite"))
        self.policy = Limits(POLICIES[policy](0) if isinstance(policy, str) else policy, preempt)
        self.policy_name = self.policy.name
        self.apps = Applications(data_dir(data))
        self.jobs: Dict[str, Tracked] = {}  # live job id -> its record
        self.node = ray.get_runtime_context().get_node_id()  # the supervisors live beside the scheduler
        self.t0 = time.time()
        self.rounds = deque(maxlen=ROUNDS_KEPT)  # seconds each round took (decision and actuation), the latest
        self.lock = threading.Lock()  # a round and a verb that changes allocations never interleave
        for job in self.table.list(HOLDING):  # a restarted scheduler takes back the jobs that hold slots
            try:
                supervisor = ray.get_actor(f"job/{job['id']}", namespace=NAMESPACE)
            except ValueError:  # its supervisor is gone (with the head node): it resumes from its checkpoint
                self._orphaned(job["id"])
                continue
            record = self.jobs[job["id"]] = Tracked(supervisor=supervisor)
            if job["state"] == JobState.SUSPENDING:  # asked again: the dead scheduler's call may be lost with it
                supervisor.suspend.remote()
            elif job["nodes"]:  # the slots the table says it holds, again: a place() call the dead scheduler sent to
                # a supervisor still starting was lost with it, which left the job running with no process
                ref = supervisor.place.remote(job["nodes"], [self._type(n) for n in job["nodes"]])
                record.placing[ref] = (False, supervisor)
        for job in self.table.list(WAITING):  # a supervisor whose round died before the job was marked running has
            try:  # started no process (a round places a job after marking it): end it, its name is the job's
                ray.kill(ray.get_actor(f"job/{job['id']}", namespace=NAMESPACE))
                self._wait_until_gone(f"job/{job['id']}")
            except ValueError:
                pass
        self.wake = threading.Event()
        threading.Thread(target=self._loop, daemon=True, name="easyscale-scheduler").start()

    # -- the verbs --------------------------------------------------------------------------------
    def submit(self, argv: List[str], virtual_workers: int, min_procs: int = 1, max_procs: Optional[int] = None,
               name: Optional[str] = None, env: Optional[dict] = None, application: Optional[str] = None,
               batch_size: Optional[int] = None, level: str = "D0", isa: Optional[str] = None) -> str:
        """Queue a job; its id. `level` (and D2's floor `isa`): the determinism level whose environment its
        processes get (determinism.environment); a D2 job may span device types, balancing its virtual workers
        by measured speed."""
        script = argv[0] if argv else ""
        if not os.path.isfile(script):
            raise ValueError(f"no training script at {script!r}: give the path of a file every node can read")
        max_procs = max_procs or virtual_workers
        if not 1 <= min_procs <= max_procs <= virtual_workers:
            raise ValueError(f"need 1 <= min procs ({min_procs}) <= max procs ({max_procs}) <= virtual workers "
                             f"({virtual_workers})")
        env = dict(env or {}, **determinism.environment(level, isa))  # a ValueError names a bad level or isa
        if application is not None:
            try:
                app = self.apps[application]
            except KeyError:
                raise ValueError(f"no profiled application {application!r}: give one of "
                                 f"{', '.join(sorted(EPOCHS))}") from None
        elif self.policy.profiled:
            raise ValueError(f"the {self.policy_name} policy models each job by its application: submit with "
                             f"--application APP (one of {', '.join(sorted(EPOCHS))})")
        else:
            app = None
        slots, types = slot_nodes(), slot_types(self.slot_type)
        by_type = Counter()
        for n, count in slots.items():
            by_type[types[n]] += count
        # the job runs on one device type unless the policy may span it (a job at D2, under a policy that mixes
        # types): asked of the model the policy will see
        d2 = determinism.ISA_ENV in env
        spans = self.policy.spans_types(live.job_model("", 0.0, virtual_workers, max_procs, app, batch_size,
                                                       self.policy, d2))
        total = sum(by_type.values()) if spans else max(by_type.values())
        if min_procs > total:
            raise ValueError(f"the job needs at least {min_procs} slots and the cluster has {total}"
                             f"{'' if spans or len(by_type) == 1 else self._one_type_only(d2)}: lower --min-procs "
                             "or add nodes")
        max_procs = min(max_procs, total)  # a job asking for more than there is would wait forever, and all behind it
        name = name or os.path.splitext(os.path.basename(script))[0]
        job_id = self.table.add(name, list(argv), env, virtual_workers, min_procs, max_procs,
                                application, batch_size, logs=os.path.join(self.state_dir, "logs"))
        self.wake.set()  # decide now, not at the next round
        return job_id

    def _one_type_only(self, d2: bool) -> str:
        """Why a job may use one type of the cluster's only."""
        if not d2:
            return " of one type (a job spans types only at --level D2, under a policy that mixes them)"
        if not self.policy.mixes_types:
            return f" of one type ({self.policy_name} keeps every job on one type; policies that mix types, " \
                   "easyscale-heter and ours, may span them)"
        return f" of one type ({self.policy_name} keeps this job's application on one type)"

    def cancel(self, job_id: str) -> None:
        self._job(job_id)  # raises: no such job
        with self.lock:
            if self._job(job_id)["state"] in LIVE:
                supervisor = self.jobs.get(job_id, Tracked()).supervisor
                if supervisor is not None:
                    ray.get(supervisor.cancel.remote())
                    ray.kill(supervisor)
                self._end(job_id, JobState.CANCELLED, finished=time.time(), nodes=[])
        self.wake.set()

    def reserve(self, count: int, node: Optional[str] = None) -> List[str]:
        """Take `count` slots (on `node`, or anywhere) back from training; returns their nodes. Jobs on them
        leave those slots at their next step boundary, in place."""
        if count < 1:
            raise ValueError(f"reserve at least one slot, not {count}")
        with self.lock:
            running = {j["id"]: j for j in self.table.list((JobState.RUNNING,))}  # a suspending job is leaving
            taken, cut = reserve.take(count, node, self._capacity(slot_nodes()),
                                      {i: j["nodes"] for i, j in running.items()},
                                      {i: j["min_procs"] for i, j in running.items()}, suspend=self.preempt)
            for job_id, nodes in cut.items():
                if nodes:
                    self._place(job_id, nodes)
                else:
                    self._suspend(job_id, "its slots were reserved")
            for n in taken:
                slot_id = self.table.reserve(n)
                reserve.ReservedSlot.options(
                    name=f"reserved/{slot_id}", namespace=NAMESPACE, lifetime="detached", resources={SLOT: 1},
                    scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote()
        self.wake.set()
        return taken

    def unreserve(self, count: Optional[int] = None, node: Optional[str] = None) -> int:
        """Give reserved slots (`count` of them, on `node`; default all) back to training; returns how many."""
        with self.lock:
            slots = [(i, n) for i, n in self.table.reservations() if node is None or n == node][:count]
            for slot_id, _ in slots:
                self._drop_reservation(slot_id)
        self.wake.set()
        return len(slots)

    def status(self, job_id: Optional[str] = None, ended: Optional[int] = None) -> List[dict]:
        """The job `job_id`, or the live jobs and the `ended` that ended last (None: every job)."""
        jobs = self.table.shown(job_id, ended)
        if job_id and not jobs:
            self._job(job_id)  # raises: no such job
        for job in jobs:
            supervisor, job["live"] = self.jobs.get(job["id"], Tracked()).supervisor, None
            if supervisor and job["state"] in HOLDING:
                try:
                    job["live"] = ray.get(supervisor.status.remote())
                except ray.exceptions.RayActorError:  # the job ended in the meantime: the next call says so
                    pass
        return jobs

    def nodes(self) -> List[dict]:
        """Per node offering slots: its id, its slots' type, slots, slots reserved and slots held by jobs."""
        slots, types = slot_nodes(), slot_types(self.slot_type)
        reserved = Counter(n for _, n in self.table.reservations())
        held = Counter(n for j in self.table.list(HOLDING) for n in j["nodes"])
        return [{"node": n, "type": types[n], "slots": s, "reserved": reserved[n], "held": held[n]}
                for n, s in sorted(slots.items())]

    def log(self, job_id: str, worker: Optional[str] = None, offset: int = 0) -> bytes:
        """A process's output from `offset`: through its slot's actor while the job runs, else from the log
        folder (on the node that ran it; here, where the scheduler's state folder is)."""
        job = self._job(job_id)
        supervisor = self.jobs.get(job_id, Tracked()).supervisor
        if supervisor is not None:
            try:
                return ray.get(supervisor.log.remote(worker or ray.get(supervisor.processes.remote())[0], offset))
            except ray.exceptions.RayError:  # the job ended meanwhile: its slots' actors are gone
                pass
        path = os.path.join(job["log_dir"], f"{worker or 'w0'}.log")
        if not os.path.exists(path):
            return b""
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read()

    def report(self) -> dict:
        """The run so far, as `easyscale simulate` reports a simulated one (a sched.simulator.Result)."""
        from .report import run_result

        slots, types = slot_nodes(), slot_types(self.slot_type)
        return run_result(self.table.list(), self.table.allocations(), self.policy_name,
                          ", ".join(f"{sum(slots[n] for n in slots if types[n] == t)} slots ({t})"
                                    for t in sorted(set(types.values()))), self.round_s)

    def round_seconds(self) -> List[float]:
        return list(self.rounds)

    # -- rounds -----------------------------------------------------------------------------------
    def _job(self, job_id: str) -> dict:
        job = self.table.get(job_id)
        if job is None:
            raise ValueError(no_such_job(job_id))
        return job

    def _capacity(self, slots: Dict[str, int]) -> Dict[str, int]:
        """Slots per alive node that are not reserved."""
        reserved = Counter(n for _, n in self.table.reservations())
        return {n: s - reserved[n] for n, s in slots.items()}

    def _drop_reservation(self, slot_id: str) -> None:
        try:
            ray.kill(ray.get_actor(f"reserved/{slot_id}", namespace=NAMESPACE))
        except ValueError:  # gone with its node
            pass
        self.table.unreserve(slot_id)

    def _place(self, job_id: str, nodes: List[str]) -> None:
        """Have the job hold one slot on each of `nodes` (node ids), in place, and its model say so. The supervisor
        starts (it imports torch for the job's store) while the scheduler goes on."""
        first = not self.table.get(job_id)["nodes"]
        record = self.jobs[job_id]
        ref = record.supervisor.place.remote(nodes, [self._type(n) for n in nodes])  # not awaited
        record.placing[ref] = (first, record.supervisor)
        self.table.update(job_id, nodes=nodes)
        if record.model is not None:
            live.place(record.model, self._groups(nodes))

    def _start(self, job: dict) -> None:
        """A supervisor for a waiting job given slots: it hosts the job's store and will start its processes."""
        self.jobs[job["id"]].supervisor = JobSupervisor.options(
            name=f"job/{job['id']}", namespace=NAMESPACE, lifetime="detached",
            scheduling_strategy=NodeAffinitySchedulingStrategy(self.node, soft=False)).remote(
            job["id"], job["argv"], job["env"], job["log_dir"], job["virtual_workers"])
        self.table.move(job["id"], JobState.RUNNING, started=time.time(), note=None)

    def _suspend(self, job_id: str, why: str) -> None:
        """The job leaves every slot at its next step boundary, saving a checkpoint, and waits in the queue. Until
        it has left, the policy does not see it: its slots are the policy's to give (a job placed on them starts
        as they come free: they are Ray resources)."""
        self.table.move(job_id, JobState.SUSPENDING, note=why)
        record = self.jobs[job_id]
        record.supervisor.suspend.remote()
        if record.model is not None:
            record.model.allocate({}, 0.0)
        log.info("%s: suspending (%s)", job_id, why)

    def _end(self, job_id: str, state: JobState, **fields) -> None:
        """The job ended (finished, failed, cancelled): its record goes whole."""
        self.table.move(job_id, state, **fields)
        self.jobs.pop(job_id, None)

    def _type(self, node: str) -> str:
        return self.types.get(node, self.slot_type)

    def _groups(self, nodes: List[str]) -> Dict[str, tuple]:
        """A job's slots as its model takes them: {type: slots per node}."""
        types = [self._type(n) for n in nodes]
        return {t: placement_of([n for n, nt in zip(nodes, types) if nt == t]) for t in dict.fromkeys(types)}

    def _loop(self) -> None:
        next_round = time.monotonic()
        while True:  # a round when one is due or asked for; between rounds, each second, jobs that ended leave (and
            # their slots, come free, start a round: a job that finishes hands its slots on at once, not a round later)
            if self.wake.wait(min(max(next_round - time.monotonic(), 0.0), 1.0)) or time.monotonic() >= next_round:
                self.wake.clear()
                start = time.perf_counter()
                try:
                    with self.lock:
                        self._round()
                except Exception:  # a round that failed is logged; the next one starts afresh
                    log.exception("scheduling round failed")
                self.rounds.append(time.perf_counter() - start)
                next_round = time.monotonic() + self.round_s
            else:
                try:
                    with self.lock:
                        if self._follow(time.time(), models=False):
                            self.wake.set()  # slots came free: decide now, not at the next round
                except Exception:  # as a round's
                    log.exception("looking for jobs that ended failed")
            try:
                self.table.describe(self.nodes())  # `easyscale status` reads it, and when
            except Exception:  # a node list Ray could not give: the next second tries again
                log.exception("describing the cluster failed")

    def _round(self) -> None:
        self._placed()
        slots = slot_nodes()
        self.types.update(slot_types(self.slot_type))  # a node gone keeps its type: jobs' models may still name it
        for slot_id, node in self.table.reservations():
            if node not in slots:  # went with its node
                self._drop_reservation(slot_id)
        capacity = self._capacity(slots)
        now = time.time()
        self._follow(now)
        self._fit(self.table.list((JobState.RUNNING,)), capacity)
        seen = self.table.list(WAITING + (JobState.RUNNING,))  # a suspending job is out of sight until it has left
        node_ids, cluster = policy_view(capacity, {n: self._type(n) for n in capacity})
        index = {n: i for i, n in enumerate(node_ids)}
        for job in seen:
            record = self.jobs.setdefault(job["id"], Tracked())
            if record.model is None:
                app = self.apps[job["application"]] if job["application"] else None
                record.model = live.job_model(job["id"], job["submitted"] - self.t0, job["virtual_workers"],
                                              job["max_procs"], app, job["batch_size"], self.policy,
                                              d2=determinism.ISA_ENV in job["env"])
                if job["nodes"]:  # a job taken back after a restart
                    live.place(record.model, self._groups(job["nodes"]))
        self.policy.limits = {j["id"]: (j["min_procs"], j["max_procs"]) for j in seen}
        allocations = {j["id"]: tuple(index[n] for n in j["nodes"]) for j in seen if j["nodes"]}
        decided = self.policy.optimize(now - self.t0, [self.jobs[j["id"]].model for j in seen], cluster, allocations)
        for job in seen:
            new = tuple(decided.get(job["id"], ()))
            if new == allocations.get(job["id"], ()):
                continue
            if not new:  # a running job the policy stops (below its minimum, too)
                self._suspend(job["id"], f"preempted by {self.policy_name}")
                continue
            if job["state"] in WAITING:
                self._start(job)
            self._place(job["id"], [node_ids[i] for i in new])
            log.info("%s: %d slots on %s", job["id"], len(new), ", ".join(sorted({node_ids[i] for i in new})))

    def _placed(self) -> None:
        """The supervisors' place() calls that came back, and what their failures mean."""
        calls = {ref: (job_id, *call) for job_id, record in self.jobs.items() for ref, call in record.placing.items()}
        done, _ = ray.wait(list(calls), num_returns=len(calls), timeout=0)
        for ref in done:
            job_id, first, supervisor = calls[ref]
            record = self.jobs.get(job_id)
            if record is None or record.placing.pop(ref, None) is None:  # the job left its slots meanwhile
                continue
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError:  # its supervisor died before it placed the job (killed, or lost
                # with the head node), however far the job had come: it resumes from its checkpoint
                log.exception("%s: its supervisor died placing the job", job_id)
                if record.supervisor == supervisor:  # not already seen lost, and no newer one placing
                    self._orphaned(job_id)
            except ray.exceptions.RayError:  # place() raised: a job that never started fails rather than wait forever
                log.exception("%s: placing the job failed", job_id)
                if first and record.supervisor is not None:
                    try:
                        ray.get(record.supervisor.cancel.remote(), timeout=10)  # any process it did start
                    except ray.exceptions.RayError:
                        pass
                    ray.kill(record.supervisor)
                    self._end(job_id, JobState.FAILED, finished=time.time(), nodes=[])

    def _follow(self, now: float, models: bool = True) -> bool:
        """Jobs that ended leave (their slots are free for the next round); with `models`, the others' models
        follow what they measured. Returns whether a job left its slots."""
        left = False
        asked = {r.supervisor.status.remote(): job_id for job_id, r in self.jobs.items() if r.supervisor is not None}
        answered, _ = ray.wait(list(asked), num_returns=len(asked), timeout=0.2)  # one still starting: next round
        for ref in answered:
            job_id, record = asked[ref], self.jobs[asked[ref]]
            try:
                state = ray.get(ref)
            except ray.exceptions.RayActorError:  # the supervisor died: the job resumes from its checkpoint
                self._orphaned(job_id)
                left = True
                continue
            if state["done"] is not None:
                left = True
                ray.kill(record.supervisor)  # detached: it would outlive its job
                if state["orphaned"] or state["suspended"] is not None:  # it starts again from its checkpoint
                    self._wait_until_gone(f"job/{job_id}")
                    job = self.table.get(job_id)
                    why = job["note"] if job["state"] == JobState.SUSPENDING else "every process left (SIGTERM)"
                    note = f"suspended at step {state['suspended']}: {why}" if state["suspended"] is not None \
                        else state["orphaned"]
                    self.table.move(job_id, JobState.SUSPENDED, nodes=[], note=note)
                    record.leave_slots()
                    log.warning("%s: %s; queued to start again", job_id, note)
                else:
                    self._end(job_id, JobState.FINISHED if state["done"] == 0 else JobState.FAILED,
                              exit_code=state["done"], finished=state["done_at"] or time.time(), nodes=[])
                continue
            progress, model = state["progress"], record.model
            following = model is not None and models
            done = step_s = held = None
            if following and progress:
                done = progress["step"] / progress["total"] if progress.get("total") else None
                # A speed is the model's only if measured on the slots its model holds, all along: not while
                # joiners prepare for a move (the model holds the new slots already; a policy that read the old
                # slots' speed as the new ones' would move the job back), nor across a scale event.
                held = sorted(state["nodes"]) if sorted(state["nodes"]) == sorted(self.table.get(job_id)["nodes"]) \
                    else None
                last = record.last_step
                if held and last and last[2] == held and progress["step"] > last[1]:
                    step_s = record.step_s = (progress["time"] - last[0]) / (progress["step"] - last[1])
                record.last_step = (progress["time"], progress["step"], held)
            if state != record.answer:  # what `status` shows of it, in one write
                self.table.update(job_id, live=state, step_s=record.step_s)
                record.answer = state
            if not following:
                continue
            live.follow(model, now - self.t0, now - (record.followed or now), done, step_s, runs=bool(held))
            record.followed = now
        return left

    def _orphaned(self, job_id: str) -> None:
        """A job holding slots whose supervisor (the host of its store) is lost: its processes, which cannot go on
        without their store, are ended (the job never runs twice at once), and it waits to resume from its newest
        checkpoint."""
        mine = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                if a["namespace"] == NAMESPACE and a["name"].startswith(f"{job_id}/")]  # its slots' actors
        for name in mine:
            try:
                ray.kill(ray.get_actor(name, namespace=NAMESPACE))  # its process dies with it
            except ValueError:  # ended meanwhile
                pass
        for name in [f"job/{job_id}"] + mine:  # the next supervisor and its slots' actors take these names again
            self._wait_until_gone(name)
        note = "its supervisor was lost: it resumes from its newest checkpoint"
        self.table.move(job_id, JobState.SUSPENDED, nodes=[], note=note)
        if job_id in self.jobs:
            self.jobs[job_id].leave_slots()
        log.warning("%s: %s", job_id, note)

    @staticmethod
    def _wait_until_gone(name: str) -> None:
        """Until a killed actor's name is free (for the job's next supervisor, or its slots' next actors)."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                ray.get_actor(name, namespace=NAMESPACE)
            except ValueError:
                return
            time.sleep(0.05)

    def _fit(self, running: List[dict], capacity: Dict[str, int]) -> None:
        """Cut the running jobs' slots to what the nodes have: a node lost (its processes are gone with it; the
        others recover in place) takes all of its slots; the earliest jobs keep theirs first. A suspending job
        keeps its slots until it has left them (its reserved ones too): the job table says what it holds."""
        held = Counter()
        for job in running:
            keep = []
            for n in job["nodes"]:
                if held[n] < capacity.get(n, 0):
                    keep.append(n)
                    held[n] += 1
            if keep == job["nodes"]:
                continue
            log.warning("%s: %d of its slots are gone with their node", job["id"], len(job["nodes"]) - len(keep))
            if keep and self.jobs.get(job["id"], Tracked()).supervisor is not None:
                self._place(job["id"], keep)
            else:  # nothing left to run on: its supervisor reports how it ended
                self.table.update(job["id"], nodes=keep)
