"""Workloads: the jobs to simulate, read from the Pollux artifact's workload files or from the Philly trace."""
from dataclasses import dataclass
from typing import Optional

from .data import read_csv


@dataclass(frozen=True)
class JobSpec:
    """One submitted job. `app` names a profiled application; trace jobs have none and instead a fixed
    `duration` (seconds on `num_gpus` GPUs), which is all the Philly trace records."""
    name: str
    arrival: float
    num_gpus: int
    app: Optional[str] = None
    batch_size: Optional[int] = None
    duration: Optional[float] = None


def load_workload(path, limit=None) -> list:
    """Jobs sorted by arrival (ties by name). Pollux workload files (name,time,application,num_replicas,batch_size)
    and the Philly trace (timestamp,duration,num_gpus,...) are recognised by their columns. `limit` keeps the
    first jobs to arrive."""
    cols = read_csv(path)
    if "application" in cols:
        specs = [JobSpec(str(n), float(t), int(g), str(a), int(b)) for n, t, a, g, b in
                 zip(cols["name"], cols["time"], cols["application"], cols["num_replicas"], cols["batch_size"])]
    elif "duration" in cols:
        stamps = cols["timestamp"].astype("datetime64[s]")
        arrival = (stamps - stamps.min()).astype(float)
        specs = [JobSpec(f"philly-{i}", float(t), int(g), duration=float(d))
                 for i, (t, g, d) in enumerate(zip(arrival, cols["num_gpus"], cols["duration"]))]
    else:
        raise ValueError(f"{path}: neither a Pollux workload (name,time,application,num_replicas,batch_size) "
                         f"nor a Philly trace (timestamp,duration,num_gpus)")
    order = sorted(range(len(specs)), key=lambda i: (specs[i].arrival, specs[i].name))
    specs = [specs[i] for i in order]
    return specs[:limit] if limit else specs
