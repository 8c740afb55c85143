"""The cluster's backend of the scheduling loop (sched/rounds.py): real time, the jobs' own measurements, and the
decisions carried out on Ray through the jobs' supervisors.

Between rounds the scheduler looks at nothing: it wakes for a round when one is due, when a verb asks (a submission,
slots come free), or when the one call it keeps waiting on each supervisor (`until_ended`) returns, the job's run
over, or fails, the supervisor dead. Supervisors tell it what changed as it happens (supervisor.JobSupervisor._tell).
A round: those calls say which jobs ended, the news how far the others are, which goes into each job's model (the record
a simulation would keep of it, cluster.live); slots gone with their node or being reserved are cut from their jobs; the
policy (the object `easyscale simulate` runs, held to each job's limits by the round) sees the waiting and running jobs
with their allocations, as indices of the nodes' available slots. A job given slots for the first time, or again after a
suspension, gets a supervisor and starts on them; a running job whose slots change moves there in place
(supervisor.place); a running job the policy stops is suspended: it saves a checkpoint at its next step boundary, leaves
its slots and waits to resume wherever it gets slots (with `preempt=False`, `cluster start --no-preempt`, a running job
keeps at least one slot instead). Slots are Ray resources, so a slot is never held by two processes, whatever the timing
of decisions, releases, reservations and failures. The node list is read once a round: a node lost takes its slots out
of the next decision, and its jobs, recovered in place on their other slots, keep those. Every change of a job's slots
is a decision of the round (sched.rounds), carried out here. What a job's state may become is lifecycle.py's; the job
table enforces it.
"""
import logging
import threading
import time
import uuid
from collections import Counter, deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .. import determinism
from ..sched.models.cluster import Cluster, placement_of
from ..sched.rounds import Change, Cut, Decision, View
from . import NAMESPACE, SLOT, TYPED, live
from .jobtable import JobTable
from .lifecycle import AFTER, HOLDING, WAITING, JobState, Run
from .supervisor import JobSupervisor, Report, wait_until_gone
from .worker import end_job

log = logging.getLogger(__name__)

ROUNDS_KEPT = 10_000  # the latest rounds' durations (round_seconds): a week of minute rounds, at most 80 kB


def slot_nodes(default: str) -> Tuple[Dict[str, int], Dict[str, str]]:
    """Of each alive node that offers slots, by node id, from one look at Ray's node table: its slots, and their
    type (the T of its `easyscale_slot_T` resource, else `default`)."""
    offering = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get(SLOT)]
    return ({n["NodeID"]: int(n["Resources"][SLOT]) for n in offering},
            {n["NodeID"]: next((r[len(TYPED):] for r in n["Resources"] if r.startswith(TYPED)), default)
             for n in offering})


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
    model: object = None  # the policy's model of it (cluster.live), from the first round that sees it
    supervisor: Optional[ray.actor.ActorHandle] = None  # while it holds slots (running, suspending)
    token: Optional[str] = None  # what its supervisor's news carries: news from an earlier one is dropped
    watch: Optional[ray.ObjectRef] = None  # its supervisor's until_ended(): resolved when the run ended, or it died
    news: Optional[Report] = None  # its supervisor's last report, as pushed
    placing: Dict[ray.ObjectRef, tuple] = field(default_factory=dict)  # its supervisor's place() calls not known to
    # have succeeded yet -> (whether it was the job's first, the supervisor asked)
    followed: Optional[float] = None  # when its model last took its report
    last_step: Optional[tuple] = None  # (time, step, its members' nodes if its model's) of its last progress report

    def listen(self, supervisor: ray.actor.ActorHandle, token: str, wake: threading.Event) -> None:
        """Follow `supervisor`'s news from now on, which carries `token`; `wake` is set when its run ends or it
        dies."""
        self.supervisor, self.token, self.news = supervisor, token, None
        self.watch = supervisor.until_ended.remote()
        self.watch.future().add_done_callback(lambda _: wake.set())

    def leave_slots(self) -> None:
        """It holds no slot now: what its supervisor said goes; its model keeps its history (attained service,
        progress) for when it resumes."""
        self.supervisor, self.token, self.watch, self.news = None, None, None, None
        self.placing, self.followed, self.last_step = {}, None, None
        if self.model is not None:
            self.model.allocate({}, 0.0)


class RayCluster:
    def __init__(self, table: JobTable, policy, apps, slot_type: str, round_s: float):
        """`policy`: the round's (its decisions are held to the jobs' limits there). Takes back the jobs a scheduler
        before it left holding slots."""
        self.table, self.policy, self.apps, self.slot_type, self.round_s = table, policy, apps, slot_type, round_s
        self.types = slot_nodes(slot_type)[1]  # node id -> its slots' type, as last seen
        self.jobs: Dict[str, Tracked] = {}  # live job id -> its record
        self.fits = {}  # the throughput fits its job models share (AppJob._fit)
        self.node = ray.get_runtime_context().get_node_id()  # the supervisors live beside the scheduler
        self.me = ray.get_runtime_context().current_actor  # the scheduler, whom supervisors tell what changed
        self.t0 = time.time()
        self.round_seconds = deque(maxlen=ROUNDS_KEPT)  # seconds each round took (decision and actuation)
        self.lock = threading.Lock()  # a round and a verb that changes allocations never interleave
        self.wake, self.due = threading.Event(), time.monotonic()  # a round at once
        self.seen = {}  # the round's jobs the policy sees (id -> row)
        self.reserved_cuts: Dict[str, List[str]] = {}  # job -> the slots it keeps once those reserved are taken: the
        # next round's cuts
        self.look: Optional[tuple] = None  # (slots, types) of the nodes offering slots, as the last round saw them
        self._take_back()

    def _take_back(self) -> None:
        for job in self.table.list(HOLDING):  # a restarted scheduler takes back the jobs that hold slots
            try:
                supervisor = ray.get_actor(f"job/{job['id']}", namespace=NAMESPACE)
            except ValueError:  # its supervisor is gone (with the head node): it resumes from its checkpoint
                self._orphaned(job["id"])
                continue
            record, token = Tracked(), uuid.uuid4().hex
            self.jobs[job["id"]] = record
            record.listen(supervisor, token, self.wake)
            supervisor.tell.remote(self.me, token)
            if job["state"] == JobState.SUSPENDING:  # asked again: the dead scheduler's call may be lost with it
                supervisor.suspend.remote()
            elif job["nodes"]:  # the slots the table says it holds, again: a place() call the dead scheduler sent to
                # a supervisor still starting was lost with it, which left the job running with no process
                ref = supervisor.place.remote(job["nodes"], [self._type(n) for n in job["nodes"]])
                record.placing[ref] = (False, supervisor)
        for job in self.table.list(WAITING):  # a supervisor whose round died before the job was marked running has
            try:  # started no process (a round places a job after marking it): end it, its name is the job's
                ray.kill(ray.get_actor(f"job/{job['id']}", namespace=NAMESPACE))
                wait_until_gone(f"job/{job['id']}")
            except ValueError:
                pass

    # -- what the scheduler's verbs ask of it (under `lock`) ------------------------------------------
    def supervisor(self, job_id: str) -> Optional[ray.actor.ActorHandle]:
        """The job's supervisor, while it holds slots."""
        return self.jobs.get(job_id, Tracked()).supervisor

    def cancel(self, job_id: str) -> None:
        """End a live job's processes, give their slots back, and mark it cancelled."""
        supervisor = self.supervisor(job_id)
        if supervisor is not None:
            ray.get(supervisor.cancel.remote())
            ray.kill(supervisor)
        self.end(job_id, JobState.CANCELLED, finished=time.time(), nodes=[])

    def news(self, job_id: str, token: str, report: Report) -> None:
        """What a supervisor says changed (supervisor.JobSupervisor._tell): the job table has it at once (`easyscale
        status` shows it), and the next round reads it. Not under `lock`: a round reads each job's news once."""
        record = self.jobs.get(job_id)
        if record is not None and record.token == token:
            record.news = report
            self.table.update(job_id, live=report.to_dict())

    def nodes(self, look: Optional[tuple] = None) -> List[dict]:
        """Per node offering slots: its id, its slots' type, slots, slots reserved and slots held by jobs; from
        `look` ((slots, types), as slot_nodes gives them), else from Ray's node table now."""
        slots, types = look or slot_nodes(self.slot_type)
        reserved = Counter(n for _, n in self.table.reservations())
        held = Counter(n for j in self.table.list(HOLDING) for n in j["nodes"])
        return [{"node": n, "type": types[n], "slots": s, "reserved": reserved[n], "held": held[n]}
                for n, s in sorted(slots.items())]

    def capacity(self, slots: Dict[str, int]) -> Dict[str, int]:
        """Slots per alive node that are not reserved."""
        reserved = Counter(n for _, n in self.table.reservations())
        return {n: s - reserved[n] for n, s in slots.items()}

    def drop_reservation(self, slot_id: str) -> None:
        try:
            ray.kill(ray.get_actor(f"reserved/{slot_id}", namespace=NAMESPACE))
        except ValueError:  # gone with its node
            pass
        self.table.unreserve(slot_id)

    def reserve_from(self, cut: Dict[str, List[str]]) -> None:
        """Jobs leave slots being reserved (job -> the slots it keeps; none: it is suspended): in the round that
        follows at once, before the policy decides."""
        self.reserved_cuts.update(cut)
        self.wake.set()

    def place(self, job_id: str, nodes: List[str]) -> None:
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
        record = self.jobs[job["id"]]
        supervisor = JobSupervisor.options(
            name=f"job/{job['id']}", namespace=NAMESPACE, lifetime="detached",
            scheduling_strategy=NodeAffinitySchedulingStrategy(self.node, soft=False))
        token = uuid.uuid4().hex
        record.listen(supervisor.remote(job["id"], job["argv"], job["env"], job["log_dir"], job["virtual_workers"],
                                        self.me, token), token, self.wake)
        self.table.move(job["id"], JobState.RUNNING, started=time.time(), note=None)

    def suspend(self, job_id: str, why: str) -> None:
        """The job leaves every slot at its next step boundary, saving a checkpoint, and waits in the queue. Until
        it has left, the policy does not see it: its slots are the policy's to give (a job placed on them starts
        as they come free: they are Ray resources)."""
        self.table.move(job_id, JobState.SUSPENDING, note=why)
        record = self.jobs[job_id]
        record.supervisor.suspend.remote()
        if record.model is not None:
            record.model.allocate({}, 0.0)
        log.info("%s: suspending (%s)", job_id, why)

    def end(self, job_id: str, state: JobState, **fields) -> None:
        """The job ended (finished, failed, cancelled): its record goes whole."""
        self.table.move(job_id, state, **fields)
        self.jobs.pop(job_id, None)

    def _type(self, node: str) -> str:
        return self.types.get(node, self.slot_type)

    def _groups(self, nodes: List[str]) -> Dict[str, tuple]:
        """A job's slots as its model takes them: {type: slots per node}."""
        types = [self._type(n) for n in nodes]
        return {t: placement_of([n for n, nt in zip(nodes, types) if nt == t]) for t in dict.fromkeys(types)}

    def next_round(self) -> float:
        """When a round is due or asked for: a verb (a submission, slots come free), or a job's end or its
        supervisor's death (`Tracked.listen`), wakes the scheduler; nothing else does."""
        self.wake.wait(max(self.due - time.monotonic(), 0.0))
        self.wake.clear()
        return time.time() - self.t0

    @contextmanager
    def deciding(self):
        """A round holds the lock (a verb that changes allocations waits); one that failed is logged, and the next
        starts afresh."""
        start = time.perf_counter()
        try:
            with self.lock:
                yield
        except Exception:
            log.exception("scheduling round failed")
        self.round_seconds.append(time.perf_counter() - start)
        self.due = time.monotonic() + self.round_s
        if self.look is not None:
            self._describe(self.look)

    def view(self, now: float) -> View:
        """The jobs the policy sees (queued, suspended and running ones; a suspending one only once it has left), as
        their models, on the nodes' free slots, and the cuts that slots gone or reserved force; first the
        supervisors' news and the nodes' changes."""
        self._placed()
        self.look = slots, types = slot_nodes(self.slot_type)  # the round's one look at the nodes
        self.types.update(types)  # a node gone keeps its type: jobs' models may still name it
        for slot_id, node in self.table.reservations():
            if node not in slots:  # went with its node
                self.drop_reservation(slot_id)
        capacity = self.capacity(slots)
        self._follow(now + self.t0)
        cuts = self._cuts(self.table.list((JobState.RUNNING,)), capacity)
        seen = self.table.list(WAITING + (JobState.RUNNING,))
        node_ids, cluster = policy_view(capacity, {n: self._type(n) for n in capacity})
        for job in seen:
            record = self.jobs.setdefault(job["id"], Tracked())
            if record.model is None:
                app = self.apps[job["application"]] if job["application"] else None
                record.model = live.job_model(job["id"], job["submitted"] - self.t0, job["virtual_workers"],
                                              job["max_procs"], app, job["batch_size"], self.policy,
                                              d2=determinism.ISA_ENV in job["env"], min_procs=job["min_procs"])
                if app is not None:
                    record.model.fits = self.fits  # shared by this scheduler's jobs, as by a simulation's
                live.restore(record.model, job["history"])  # a job the scheduler before this one modelled
                if job["nodes"]:  # a job taken back after a restart
                    live.place(record.model, self._groups(job["nodes"]))
        self.seen = {j["id"]: j for j in seen}
        return View([self.jobs[j["id"]].model for j in seen], cluster,
                    {j["id"]: tuple(j["nodes"]) for j in seen if j["nodes"]}, tuple(node_ids), cuts)

    def has_run(self, job_id: str) -> bool:
        return self.seen[job_id]["state"] != JobState.QUEUED

    def carry_out(self, now: float, changes: List[Decision]) -> None:
        for change in changes:
            if change.change == Change.SUSPEND:  # a running job the policy stops (below its minimum, too), or a cut
                self.suspend(change.job, change.why)
                continue
            if self.seen[change.job]["state"] in WAITING:  # (a running job cut to no slot has its supervisor)
                self._start(self.seen[change.job])
            self.place(change.job, list(change.new))
            log.info("%s: %s (%s), %d slots on %s", change.job, change.change, change.why, len(change.new),
                     ", ".join(sorted(set(change.new))))

    def account(self, now: float, held: dict) -> None:
        pass  # the job table recorded every change as it was made

    def _describe(self, look: tuple) -> None:
        try:
            self.table.describe(self.nodes(look), self.round_s)  # `easyscale status` reads it, and when
        except Exception:  # logged, as a round's
            log.exception("describing the cluster failed")

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
                    self.end(job_id, JobState.FAILED, finished=time.time(), nodes=[])

    def _follow(self, now: float) -> None:
        """From the supervisors' news: jobs that ended leave (their slots are free for this round), and the others'
        models take what they measured (Job.report)."""
        watched = {r.watch: job_id for job_id, r in self.jobs.items() if r.watch is not None}
        resolved, _ = ray.wait(list(watched), num_returns=len(watched), timeout=0)
        ended = {watched[ref]: ref for ref in resolved}
        for job_id, record in list(self.jobs.items()):
            if record.supervisor is None:
                continue
            report = record.news
            if job_id in ended:  # the run's end, as until_ended() answered (its news may be on its way still)
                try:
                    report = ray.get(ended[job_id])
                except ray.exceptions.RayActorError:  # the supervisor died: the job resumes from its checkpoint
                    self._orphaned(job_id)
                    continue
            if report is None:  # its supervisor has said nothing yet (its processes start)
                continue
            if report.ended:
                ray.kill(record.supervisor)  # detached: it would outlive its job
                state = AFTER[report.run]
                if state == JobState.SUSPENDED:  # it starts again from its checkpoint
                    wait_until_gone(f"job/{job_id}")
                    job = self.table.get(job_id)
                    why = job["note"] if job["state"] == JobState.SUSPENDING else "every process left (SIGTERM)"
                    note = f"suspended at step {report.step}: {why}" if report.run == Run.SUSPENDED else report.why
                    self.table.move(job_id, state, nodes=[], note=note)
                    record.leave_slots()
                    log.warning("%s: %s; queued to start again", job_id, note)
                else:  # finished, or failed (`easyscale logs` has the whole output)
                    self.end(job_id, state, exit_code=report.exit_code, finished=report.ended_at, nodes=[],
                             **({"note": report.error} if state == JobState.FAILED else {}))
                continue
            progress, model = report.progress, record.model
            following = model is not None
            done = step_s = held = None
            if following and progress:
                done = progress["step"] / progress["total"] if progress.get("total") else None
                # A speed is the model's only if measured on the slots its model holds, all along: not while
                # joiners prepare for a move (the model holds the new slots already; a policy that read the old
                # slots' speed as the new ones' would move the job back), nor across a scale event.
                held = sorted(report.nodes) if sorted(report.nodes) == sorted(self.table.get(job_id)["nodes"]) \
                    else None
                last = record.last_step
                if held and last and last[2] == held and progress["step"] > last[1]:
                    step_s = (progress["time"] - last[0]) / (progress["step"] - last[1])
                record.last_step = (progress["time"], progress["step"], held)
            if following:
                model.report(now - (record.followed or now), done, step_s, runs=bool(held))
                record.followed = now
                self.table.update(job_id, step_s=model.step_s, history=live.history(model))  # status shows them

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
            wait_until_gone(name)
        end_job(job_id, slot_nodes(self.slot_type)[0])  # a process whose actor's end is still on its way: ended now
        note = "its supervisor was lost: it resumes from its newest checkpoint"
        self.table.move(job_id, JobState.SUSPENDED, nodes=[], note=note)
        if job_id in self.jobs:
            self.jobs[job_id].leave_slots()
        log.warning("%s: %s", job_id, note)

    def _cuts(self, running: List[dict], capacity: Dict[str, int]) -> List[Cut]:
        """The running jobs' slots cut to what the nodes have: first those being reserved (as `reserve_from` said),
        then a node lost (its processes are gone with it; the others recover in place) takes all of its slots; the
        earliest jobs keep theirs first. A suspending job keeps its slots until it has left them (its reserved ones
        too): the job table says what it holds."""
        reserved, self.reserved_cuts = self.reserved_cuts, {}
        held, cuts = Counter(), []
        for job in running:
            nodes = reserved.get(job["id"], job["nodes"])
            keep = []
            for n in nodes:
                if held[n] < capacity.get(n, 0):
                    keep.append(n)
                    held[n] += 1
            if keep != job["nodes"]:
                why = "its slots were reserved" if keep == nodes else \
                    f"{len(nodes) - len(keep)} of its slots went with their node"
                cuts.append(Cut(job["id"], tuple(keep), why))
        return cuts
