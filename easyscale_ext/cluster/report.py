"""A cluster run as `easyscale simulate` reports a simulated one (sched.simulator.Result, the same JSON and
plots), built from the job table: so a real run and its simulation compare side by side."""
from typing import List

from ..sched.ledger import Ledger
from ..sched.simulator import Result
from .lifecycle import JobState


def run_result(jobs: List[dict], allocations: List[tuple], policy: str, cluster: str, round_s: float) -> Result:
    """`jobs`: the job table's rows; `allocations`: (time, job, nodes) of every change of a job's slots, in time
    order, entered into a ledger (sched/ledger.py) as a simulation's are. Times count from the first submission; only
    jobs that finished have a record (a JCT). A restart is a start after the job held no slot (queued again when its
    processes went with their nodes); a change in place is not."""
    t0 = min((j["submitted"] for j in jobs), default=0.0)
    ledger, times, gpus, active = Ledger(), [], [], []
    for t, job, nodes in allocations:
        ledger.held(t - t0, job, len(nodes))
        times.append(t - t0)
        gpus.append(ledger.holding)
        active.append(sum(j["submitted"] <= t and (j["finished"] is None or j["finished"] > t) for j in jobs))
    records = [{"name": j["id"], "app": j["application"], "arrival": j["submitted"] - t0,
                "start": ledger.first_start.get(j["id"]), "completion": j["finished"] - t0,
                "jct": j["finished"] - j["submitted"], "gpus_asked": j["max_procs"],
                "restarts": max(ledger.starts[j["id"]] - 1, 0), "gpu_seconds": ledger.attained[j["id"]]}
               for j in jobs if j["state"] == JobState.FINISHED]
    recorded = {r["name"] for r in records}  # a job that failed or was cancelled held slots, but has no JCT
    return Result(policy, cluster, {"driver": "cluster", "round_s": round_s}, records,
                  {"time": times, "gpus": gpus, "active": active}, [s for s in ledger.segments if s[0] in recorded])
