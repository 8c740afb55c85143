"""The cluster's scheduler: a long-lived Ray actor whose verbs (submit, cancel, reserve, status, ...) front the
cluster's backend (backend.RayCluster), over which a thread runs the scheduling loop (sched/rounds.py), the same as
`easyscale simulate` runs over a simulated cluster, with the same policy objects.
"""
import logging
import os
import threading
from collections import Counter, deque
from typing import List, Optional, Union

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .. import determinism, spawn
from ..sched import rounds
from ..sched.models.application import EPOCHS, GPU_TYPES, Applications
from ..sched.models.traces import data_dir
from ..sched.policies import POLICIES
from ..sched.policies.base import Policy
from . import NAMESPACE, SLOT, TYPED, live, reserve
from .backend import RayCluster, slot_nodes
from .jobtable import JobTable, no_such_job
from .lifecycle import HOLDING, LIVE, JobState

log = logging.getLogger(__name__)


HEAD = "node:__internal_head__"  # the resource Ray gives its head node only


def launch(state_dir: str, policy: Union[str, Policy] = "fifo", round_s: float = 60.0, slot_type: str = "t4",
           preempt: bool = True, **options):
    """Start the scheduler on the head node, where nodes that come and go cannot take it (or the supervisors
    beside it) down; `options` are Ray's actor options (a name, a lifetime, `max_restarts=-1` to have Ray start it
    again if it dies: it takes its jobs back from the job table). `policy`: a name of sched.policies.POLICIES, or
    a policy object of one's own (a sched.policies.base.Policy)."""
    return Scheduler.options(resources={HEAD: 0.001}, **options).remote(state_dir, policy, round_s, slot_type,
                                                                        preempt=preempt)


@ray.remote(num_cpus=0)
class Scheduler:
    def __init__(self, state_dir: str, policy: Union[str, Policy] = "fifo", round_s: float = 60.0,
                 slot_type: str = "t4", data: Optional[str] = None, preempt: bool = True):
        if isinstance(policy, str) and policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}: choose one of {', '.join(POLICIES)}")
        if slot_type not in GPU_TYPES:
            raise ValueError(f"unknown slot type {slot_type!r}: the profiles know {', '.join(GPU_TYPES)}")
        slots, types = slot_nodes(slot_type)
        if not slots:
            raise ValueError(f"no node of this Ray cluster offers the {SLOT!r} resource: start nodes with "
                             f"--resources '{{\"{SLOT}\": K}}' (easyscale cluster start does)")
        unknown = sorted(set(types.values()) - set(GPU_TYPES))
        if unknown:
            raise ValueError(f"nodes declare slots of unknown types {unknown} ({TYPED}T resources): the profiles "
                             f"know {', '.join(GPU_TYPES)}")
        os.makedirs(state_dir, exist_ok=True)
        self.state_dir, self.round_s, self.slot_type = state_dir, round_s, slot_type
        self.preempt = preempt  # the policy and reservations may suspend a job
        self.table = JobTable(os.path.join(state_dir, "jobs.sqlite"))
        self.policy = POLICIES[policy](0) if isinstance(policy, str) else policy
        self.policy_name = self.policy.name
        self.apps = Applications(data_dir(data))
        self.cluster = RayCluster(self.table, self.policy, self.apps, slot_type, round_s)
        threading.Thread(target=rounds.run, args=(self.cluster, self.policy, preempt), daemon=True,
                         name="easyscale-scheduler").start()

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
        spawn.fork_server_on(env)  # a ValueError names the choices, before any node tries to start the job
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
        slots, types = slot_nodes(self.slot_type)
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
        self.cluster.wake.set()  # decide now, not at the next round
        return job_id

    def _one_type_only(self, d2: bool) -> str:
        """Why a job may use one type of the cluster's only."""
        if not d2:
            return " of one type (a job spans types only at --level D2, under a policy that mixes them)"
        if not self.policy.mixes_types:
            return f" of one type ({self.policy_name} keeps every job on one type; policies that mix types, " \
                   "easyscale-heter and elastic-goodput, may span them)"
        return f" of one type ({self.policy_name} keeps this job's application on one type)"

    def cancel(self, job_id: str) -> None:
        self._job(job_id)  # raises: no such job
        with self.cluster.lock:
            if self._job(job_id)["state"] in LIVE:
                self.cluster.cancel(job_id)
        self.cluster.wake.set()

    def reserve(self, count: int, node: Optional[str] = None) -> List[str]:
        """Take `count` slots (on `node`, or anywhere) back from training; returns their nodes. Jobs on them
        leave those slots at their next step boundary, in place."""
        if count < 1:
            raise ValueError(f"reserve at least one slot, not {count}")
        with self.cluster.lock:
            running = {j["id"]: j for j in self.table.list((JobState.RUNNING,))}  # a suspending job is leaving
            holdings = {i: self.cluster.reserved_cuts.get(i, j["nodes"]) for i, j in running.items()}
            taken, cut = reserve.take(count, node, self.cluster.capacity(slot_nodes(self.slot_type)[0]), holdings,
                                      {i: j["min_procs"] for i, j in running.items()}, suspend=self.preempt)
            self.cluster.reserve_from(cut)  # the jobs leave them in the round this starts
            for n in taken:
                slot_id = self.table.reserve(n)
                reserve.ReservedSlot.options(
                    name=f"reserved/{slot_id}", namespace=NAMESPACE, lifetime="detached", resources={SLOT: 1},
                    scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote()
        return taken

    def unreserve(self, count: Optional[int] = None, node: Optional[str] = None) -> int:
        """Give reserved slots (`count` of them, on `node`; default all) back to training; returns how many."""
        with self.cluster.lock:
            slots = [(i, n) for i, n in self.table.reservations() if node is None or n == node][:count]
            for slot_id, _ in slots:
                self.cluster.drop_reservation(slot_id)
        self.cluster.wake.set()
        return len(slots)

    def status(self, job_id: Optional[str] = None, ended: Optional[int] = None) -> List[dict]:
        """The job `job_id`, or the live jobs and the `ended` that ended last (None: every job)."""
        jobs = self.table.shown(job_id, ended)
        if job_id and not jobs:
            self._job(job_id)  # raises: no such job
        for job in jobs:
            if job["state"] not in HOLDING:  # its supervisor's last report is history
                job["live"] = None
        return jobs

    def news(self, job_id: str, token: str, report) -> None:
        """A supervisor's report of what changed in its job (supervisor.Report); supervisors call it, not users."""
        self.cluster.news(job_id, token, report)

    def nodes(self) -> List[dict]:
        """Per node offering slots: its id, its slots' type, slots, slots reserved and slots held by jobs."""
        return self.cluster.nodes()

    def log(self, job_id: str, worker: Optional[str] = None, offset: int = 0) -> bytes:
        """A process's output from `offset`: through its slot's actor while the job runs, else from the log
        folder (on the node that ran it; here, where the scheduler's state folder is)."""
        job = self._job(job_id)
        supervisor = self.cluster.supervisor(job_id)
        if supervisor is not None:
            try:
                return ray.get(supervisor.log.remote(worker or ray.get(supervisor.names.remote())[0], offset))
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

        slots, types = slot_nodes(self.slot_type)
        return run_result(self.table.list(), self.table.allocations(), self.policy_name,
                          ", ".join(f"{sum(slots[n] for n in slots if types[n] == t)} slots ({t})"
                                    for t in sorted(set(types.values()))), self.round_s)

    def round_seconds(self) -> List[float]:
        return list(self.cluster.round_seconds)

    def footprint(self) -> dict:
        """What the scheduler holds in memory: its resident set (bytes), and the length of every container its
        backend, its policy and the application models keep, by `owner.attribute`. None of these may grow with the
        number of jobs that have come and gone (bench/bench_memory.py)."""
        import psutil  # Ray's own dependency

        owners = {"cluster": self.cluster, "policy": self.policy,
                  **{f"apps.{name}": app for name, app in self.apps.items()}}
        sizes = {f"{owner}.{attr}": len(value) for owner, obj in owners.items() for attr, value in vars(obj).items()
                 if isinstance(value, (dict, list, set, deque))}
        return {"rss": psutil.Process().memory_info().rss, "sizes": sizes}

    def _job(self, job_id: str) -> dict:
        job = self.table.get(job_id)
        if job is None:
            raise ValueError(no_such_job(job_id))
        return job
