"""The policy interface, and the placement every policy that does not search placements itself shares.

Each round the simulator calls `optimize(now, jobs, cluster, allocations)` with the jobs that have arrived and
not finished (an iterable, in arrival order) and their current allocations; the policy returns the new
allocations, a tuple of node indices per job (one entry per GPU), leaving out jobs that should hold none.
Policies read jobs and never change them. A policy with `batch_size(spec, app)` returning None lets its jobs
adapt their batch size.
"""
import numpy as np


class Policy:
    """A scheduling policy: each round, `optimize` says which GPUs every job holds. The class attributes below are
    flags the simulator and the cluster read (what the policy needs of jobs, how its jobs run); a subclass sets the
    ones that apply. The same object runs in `easyscale simulate` and in cluster mode (sched.rounds.run)."""

    name = ""
    profiled = False  # needs jobs of profiled applications (models their throughput), not bare trace jobs
    virtual_workers = False  # runs jobs as EasyScale's virtual workers (workload.as_virtual_workers)
    in_place = False  # its jobs run on this runtime and rescale in place (models/reallocation.py), unless a run
    # says otherwise (SimConfig.in_place)
    one_gpu_type = False  # models a cluster of one GPU type only
    mixes_types = False  # may run a job on several GPU types at once (virtual workers at D2: virtual_workers.py)
    per_type_models = False  # its jobs tune their batch with a model per GPU type (AppJob.per_type_fit)

    def spans_types(self, job) -> bool:
        """Whether it may give `job` (a job model) GPUs of several types at once: what a cluster admits the job
        by (a job that spans may ask for more slots than one type has)."""
        return self.mixes_types and job.spec.heterogeneous

    def batch_size(self, spec, app):
        """The global batch the job runs with: the user's, unless the policy tunes it (None)."""
        return spec.batch_size

    def optimize(self, now, jobs, cluster, allocations) -> dict:
        """The round's allocations: job name -> a tuple of node indices of `cluster` (models.cluster.Cluster), one
        entry per GPU; a job left out holds none. `jobs`: the jobs that have arrived and not finished (job models,
        in arrival order; read them, never change them); `allocations`: what each holds now; `now`: seconds since
        the run began."""
        raise NotImplementedError


def gpu_type_for(room: dict, num_gpus: int, prefer=None):
    """The GPU type a job of `num_gpus` GPUs runs on, given free GPUs per type: `prefer` (where it runs now) if
    it still has room, else the type with the most free GPUs; None if no type has room. A job never spans types."""
    if prefer is not None and room[prefer] >= num_gpus:
        return prefer
    fits = [t for t in room if room[t] >= num_gpus]
    return max(fits, key=lambda t: room[t]) if fits else None


def place(free: np.ndarray, num_gpus: int, nodes: np.ndarray, best_fit: bool = False) -> tuple:
    """Take `num_gpus` GPUs on `nodes` (a mask) from `free` (GPUs free per node, updated in place), emptiest
    node first, ties to the lowest index, as the artifact's baselines do. With `best_fit`, a job that fits on
    one node goes to the fullest node that can hold it instead, keeping whole nodes free for larger jobs."""
    avail = np.where(nodes, free, -1)
    if best_fit:
        fits = np.flatnonzero(avail >= num_gpus)
        if len(fits):
            node = int(fits[np.argmin(avail[fits])])
            free[node] -= num_gpus
            return (node,) * num_gpus
    alloc = []
    while len(alloc) < num_gpus:
        node = int(np.argmax(avail))
        take = min(int(avail[node]), num_gpus - len(alloc))
        if take <= 0:
            raise ValueError(f"cannot place {num_gpus} GPUs: only {len(alloc)} free")
        free[node] -= take
        avail[node] -= take
        alloc += [node] * take
    return tuple(alloc)


def grant_by_marginal_gain(count: dict, room: int, marginal) -> None:
    """Hand out `room` GPUs one at a time, each to the job whose marginal(name) (its gain from one
    more GPU, given count[name]) is largest, while some gain is positive. Updates `count`."""
    gain = {name: marginal(name) for name in count}
    while room > 0 and gain and max(gain.values()) > 0:
        name = max(gain, key=gain.get)
        count[name] += 1
        room -= 1
        gain[name] = marginal(name)


def place_counts(counts: dict, allocations: dict, cluster, gpu_type) -> dict:
    """Allocations giving each job `counts[job]` GPUs of `gpu_type`: a job whose count is unchanged keeps its
    GPUs; the others are placed, fewest GPUs first, on the emptiest nodes. Jobs with no GPUs are left out."""
    result = {n: a for n, a in allocations.items() if len(a) == counts.get(n)}
    free = cluster.free(result)
    for name in sorted(counts, key=counts.get):
        if counts[name] and name not in result:
            result[name] = place(free, counts[name], cluster.nodes_of(gpu_type))
    return result
