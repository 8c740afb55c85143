"""The cluster's scheduler: a long-lived Ray actor that runs rounds of the simulator's policy objects on the
live jobs and carries each decision out in place through the jobs' supervisors.

A round: the supervisors say which jobs ended; the policy (the same object `easyscale simulate` runs) gets
the queued and running jobs with their current allocations, as node indices of the cluster's slot nodes,
and returns new ones; a job that gets slots for the first time is started on them, a running job whose
slots change is moved there in place (supervisor.place). Slots are Ray resources, so a slot is never held
by two processes, whatever the timing of decisions and releases.
"""
import logging
import os
import threading
import time
from typing import Dict, List, Optional

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ..sched.models.cluster import Cluster
from ..sched.models.job import TraceJob
from ..sched.models.workload import JobSpec
from ..sched.policies import POLICIES
from . import NAMESPACE, SLOT
from .jobtable import JobTable
from .supervisor import JobSupervisor

log = logging.getLogger(__name__)

# Policies whose decisions this scheduler carries out: they never take all slots from a running job (a
# preemption to zero is a checkpoint-restart, which cluster mode does not run yet).
RUNNABLE = ("fifo", "fifo-serial")


def slot_nodes() -> List[dict]:
    """The alive nodes that offer slots, in a fixed order (node id)."""
    return sorted((n for n in ray.nodes() if n["Alive"] and n["Resources"].get(SLOT)), key=lambda n: n["NodeID"])


@ray.remote(num_cpus=0)
class Scheduler:
    def __init__(self, state_dir: str, policy: str = "fifo", round_s: float = 60.0, slot_type: str = "t4"):
        if policy not in RUNNABLE:
            raise ValueError(f"policy {policy!r} cannot run on a cluster yet: use one of {', '.join(RUNNABLE)}")
        os.makedirs(state_dir, exist_ok=True)
        self.state_dir, self.round_s = state_dir, round_s
        self.table = JobTable(os.path.join(state_dir, "jobs.sqlite"))
        self.policy = POLICIES[policy](0)
        nodes = slot_nodes()
        if not nodes:
            raise ValueError(f"no node of this Ray cluster offers the {SLOT!r} resource: start nodes with "
                             f"--resources '{{\"{SLOT}\": K}}' (easyscale cluster start does)")
        self.node_ids = [n["NodeID"] for n in nodes]
        gpus = tuple(int(n["Resources"][SLOT]) for n in nodes)
        self.cluster = Cluster(",".join(f"1x{g}:{slot_type}" for g in gpus), gpus, (slot_type,) * len(gpus))
        self.jobs: Dict[str, TraceJob] = {}  # the policy's view of each job
        self.supervisors: Dict[str, ray.actor.ActorHandle] = {}
        self.node = ray.get_runtime_context().get_node_id()  # the supervisors live beside the scheduler
        self.t0 = time.time()
        self.rounds: List[float] = []  # seconds each round took (decision and actuation)
        for job in self.table.list(("running",)):  # a restarted scheduler takes its running jobs back
            try:
                self.supervisors[job["id"]] = ray.get_actor(f"job/{job['id']}", namespace=NAMESPACE)
            except ValueError:  # its supervisor is gone with the cluster: the job's state is unknown
                self.table.update(job["id"], state="failed", finished=time.time())
        self.wake = threading.Event()
        threading.Thread(target=self._loop, daemon=True, name="easyscale-scheduler").start()

    # -- the verbs --------------------------------------------------------------------------------
    def submit(self, argv: List[str], virtual_workers: int, min_procs: int = 1, max_procs: Optional[int] = None,
               name: Optional[str] = None, env: Optional[dict] = None) -> str:
        script = argv[0] if argv else ""
        if not os.path.isfile(script):
            raise ValueError(f"no training script at {script!r}: give the path of a file every node can read")
        max_procs = max_procs or virtual_workers
        total = self.cluster.total_gpus
        if not 1 <= min_procs <= max_procs <= virtual_workers:
            raise ValueError(f"need 1 <= min procs ({min_procs}) <= max procs ({max_procs}) <= virtual workers "
                             f"({virtual_workers})")
        if min_procs > total:
            raise ValueError(f"the job needs at least {min_procs} slots and the cluster has {total}: "
                             "lower --min-procs or add nodes")
        name = name or os.path.splitext(os.path.basename(script))[0]
        job_id = self.table.add(name, list(argv), dict(env or {}), virtual_workers, min_procs, max_procs, "")
        self.table.update(job_id, log_dir=os.path.join(self.state_dir, "logs", job_id))
        self.wake.set()  # decide now, not at the next round
        return job_id

    def cancel(self, job_id: str) -> None:
        job = self._job(job_id)
        if job["state"] in ("queued", "running"):
            if job_id in self.supervisors:
                ray.get(self.supervisors[job_id].cancel.remote())
            self.table.update(job_id, state="cancelled", finished=time.time())
            self.wake.set()

    def status(self, job_id: Optional[str] = None) -> List[dict]:
        jobs = [self._job(job_id)] if job_id else self.table.list()
        for job in jobs:
            supervisor = self.supervisors.get(job["id"])
            job["live"] = ray.get(supervisor.status.remote()) if supervisor and job["state"] == "running" else None
        return jobs

    def log(self, job_id: str, worker: Optional[str] = None, offset: int = 0) -> bytes:
        """A process's output from `offset`: through its slot's actor while the job runs, else from the log
        folder (on the node that ran it; here, where the scheduler's state folder is)."""
        job = self._job(job_id)
        supervisor = self.supervisors.get(job_id)
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

    def round_seconds(self) -> List[float]:
        return list(self.rounds)

    # -- rounds -----------------------------------------------------------------------------------
    def _job(self, job_id: str) -> dict:
        job = self.table.get(job_id)
        if job is None:
            raise ValueError(f"no job {job_id!r}: `easyscale status` lists the cluster's jobs")
        return job

    def _loop(self) -> None:
        while True:
            self.wake.wait(self.round_s)
            self.wake.clear()
            start = time.perf_counter()
            try:
                self._round()
            except Exception:  # a round that failed is logged; the next one starts afresh
                log.exception("scheduling round failed")
            self.rounds.append(time.perf_counter() - start)

    def _round(self) -> None:
        for job_id, supervisor in list(self.supervisors.items()):
            done = ray.get(supervisor.status.remote())["done"]
            if done is not None:
                self.table.update(job_id, state="finished" if done == 0 else "failed", exit_code=done,
                                  finished=time.time())
                del self.supervisors[job_id]
                self.jobs.pop(job_id, None)
        active = self.table.list(("queued", "running"))
        for job in active:
            if job["id"] not in self.jobs:
                self.jobs[job["id"]] = TraceJob(JobSpec(job["id"], job["submitted"] - self.t0, job["max_procs"],
                                                        duration=float("inf")))
        index = {n: i for i, n in enumerate(self.node_ids)}
        allocations = {j["id"]: tuple(index[n] for n in j["nodes"]) for j in active if j["nodes"]}
        decided = self.policy.optimize(time.time() - self.t0, [self.jobs[j["id"]] for j in active], self.cluster,
                                       allocations)
        for job in active:
            new = tuple(decided.get(job["id"], ()))
            if new == allocations.get(job["id"], ()) or not new:
                continue
            nodes = [self.node_ids[i] for i in new]
            self.jobs[job["id"]].allocate(self.cluster.groups(new), 0.0)
            if job["id"] not in self.supervisors:
                self.supervisors[job["id"]] = JobSupervisor.options(
                    name=f"job/{job['id']}", namespace=NAMESPACE, lifetime="detached",
                    scheduling_strategy=NodeAffinitySchedulingStrategy(self.node, soft=False)).remote(
                    job["id"], job["argv"], job["env"], job["log_dir"], job["virtual_workers"])
                self.table.update(job["id"], state="running", started=time.time())
            ray.get(self.supervisors[job["id"]].place.remote(nodes))
            self.table.update(job["id"], nodes=nodes)
            log.info("%s: %d slots on %s", job["id"], len(nodes), ", ".join(sorted(set(nodes))))
