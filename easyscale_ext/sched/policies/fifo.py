"""FIFO / YARN-CS: jobs run on the GPUs they asked for, started in arrival order, never preempted or resized
(a job that lost GPUs under it, to a reservation or a node of a real cluster, gets them back before a new one starts).

The head of the queue blocks the jobs behind it (no backfilling), as in YARN's capacity scheduler. Jobs are
packed (best fit) on one GPU type: the job's preferred one where it names one with as many GPUs (EasyScale's
test.csv has a job of 32 workers that prefers the 16 P100s of its cluster). `exclusive` is YARN-CS as EasyScale's
artifact runs it (its other_policy.FifoPolicy): one job in the whole cluster at a time, the oldest.
"""
from .base import Policy, gpu_type_for, place


class FifoPolicy(Policy):
    def __init__(self, exclusive: bool = False):
        self.exclusive = exclusive
        self.name = "yarn-cs" if exclusive else "fifo"

    def optimize(self, now, jobs, cluster, allocations):
        result = dict(allocations)
        free = cluster.free(result)
        for job in jobs:  # a running job that lost GPUs (a real cluster's reservation or node) gets them back first
            held = result.get(job.name, ())
            if held and len(held) < job.spec.num_gpus:
                nodes = cluster.nodes_of(cluster.types[held[0]])
                more = min(job.spec.num_gpus - len(held), int(free[nodes].sum()))
                result[job.name] = held + (place(free, more, nodes) if more else ())
        if self.exclusive and result:
            return result
        room, size = cluster.room(free), cluster.room(cluster.gpus)
        for job in jobs:
            if job.name in result:
                continue
            preferred = job.spec.preferred_gpu  # a user who names a GPU type waits for it, if it has enough
            mine = {preferred: room[preferred]} if preferred and size[preferred] >= job.spec.num_gpus else room
            gpu_type = gpu_type_for(mine, job.spec.num_gpus)
            if gpu_type is None:
                break
            result[job.name] = place(free, job.spec.num_gpus, cluster.nodes_of(gpu_type), best_fit=True)
            room[gpu_type] -= job.spec.num_gpus
            if self.exclusive:
                break
        return result
