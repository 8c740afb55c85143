"""EasyScale (Li et al., SC'23): elastic jobs of D virtual workers on GPUs of one or, with D2, several types.

Intra-job: a job's proposals are GPU counts per type (at most D GPUs in all), each valued by its step time with
the virtual workers spread by speed (the job model's step_on: virtual_workers.virtual_worker_step, or EasyScale's
own model) and kept only if EasyScale's waste (the GPUs' idle share while the slowest computes) is at most 30 %.
Jobs that do not allow D2, and every job in "homo" mode, propose only their preferred GPU type.
Inter-job, every round: running jobs keep their GPUs (EasyScale never shrinks a job); waiting jobs start, in
arrival order, on one GPU (of their preferred type, else, if they may mix types, of the fastest type for them
with a GPU free); then every running job proposes, per GPU type, the increment of that type with the largest
speedup per added GPU (at most doubling its GPUs), and increments are granted in that order, one per job per
round.
Jobs of other workloads run as EasyScale would run them (workload.as_virtual_workers: a job's GPUs become
its virtual workers, with no preferred type). Rescaling is in place (no restart cost); a job's first start
costs 20 s in EasyScale's setting (`easyscale simulate --start 20 --restart 0`).
"""
from ..models.goodput import packed
from .base import Policy, place

MAX_WASTE = 0.30


class EasyScalePolicy(Policy):
    profiled = True
    virtual_workers = True
    in_place = True

    def __init__(self, heterogeneous: bool = True, max_waste: float = MAX_WASTE):
        self.heterogeneous, self.max_waste = heterogeneous, max_waste
        self.mixes_types = heterogeneous
        self.name = "easyscale-heter" if heterogeneous else "easyscale-homo"

    def optimize(self, now, jobs, cluster, allocations):
        result = dict(allocations)
        free = cluster.free(result)
        room = cluster.room(free)
        self._per_node = {t: g for g, t in zip(cluster.gpus, cluster.types)}
        started = set()
        for job in jobs:
            if job.name in result:
                continue
            fits = [t for t in self.types(job, (), room) if room[t] >= 1]
            if fits:
                result[job.name] = place(free, 1, cluster.nodes_of(fits[0]))
                room[fits[0]] -= 1
                started.add(job.name)
        proposals = []  # (speedup per added GPU, arrival rank, job, GPU type, GPUs added)
        for rank, job in enumerate(jobs):
            if job.name in result and job.name not in started:
                proposals += self.increments(rank, job, cluster.groups(result[job.name]), room)
        grown = set()
        for _, _, job, gpu_type, add in sorted(proposals, key=lambda p: (-p[0], p[1])):
            if job.name in grown or room[gpu_type] < add:
                continue
            result[job.name] += place(free, add, cluster.nodes_of(gpu_type))
            room[gpu_type] -= add
            grown.add(job.name)
        return result

    def types(self, job, held, room) -> list:
        """GPU types the job may use, best first: its preferred type, else the one it holds, else the fastest
        for it with a GPU free; every type, if it may mix them, else that one only."""
        fastest = sorted(room, key=lambda t: self.step(job, {t: 1})[0])
        free = [t for t in fastest if room[t] > 0] or fastest
        first = job.spec.preferred_gpu or (held[0] if len(held) == 1 else free[0])
        if not self.spans_types(job):
            return [first]
        return [first] + [t for t in fastest if t != first]

    def step(self, job, counts) -> tuple:
        """(seconds per step, waste) of the job on `counts` GPUs per type, each type packed on full nodes."""
        return job.step_on(tuple((t, packed(c, self._per_node[t])) for t, c in counts.items() if c))

    def increments(self, rank, job, groups, room) -> list:
        """Per GPU type, the increment with the largest speedup per added GPU that is within the waste bound,
        at most doubles the job's GPUs and fits in the free GPUs."""
        counts = {t: sum(p) for t, p in groups.items()}
        total = sum(counts.values())
        now = self.step(job, counts)[0]
        out = []
        for gpu_type in self.types(job, list(groups), room):
            best = None
            for add in range(1, min(total, job.spec.virtual_workers - total, room[gpu_type]) + 1):
                new = dict(counts, **{gpu_type: counts.get(gpu_type, 0) + add})
                step, waste = self.step(job, new)
                if waste > self.max_waste + 1e-9 or step >= now:
                    continue
                per_gpu = (now / step - 1) / add
                if best is None or per_gpu > best[0]:
                    best = (per_gpu, rank, job, gpu_type, add)
            if best is not None:
                out.append(best)
        return out
