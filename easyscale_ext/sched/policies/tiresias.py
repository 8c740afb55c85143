"""Tiresias 2D-LAS (Gu et al., NSDI'19) as configured in the Pollux artifact: two queues, a job moving from the
first to the second once it has used 16 GPU-hours, never back. Jobs run on the GPUs they asked for, with their
own batch size. Each round the queues are walked in order (first queue first, each in order of entry) and every
job that still fits in the free GPU count runs; the others are preempted or wait. New runners take the
emptiest nodes first. On a mixed cluster a job counts against one GPU type: the one it runs on if it still
fits there, else the one with the most room."""
from .base import Policy, gpu_type_for, place

DEMOTE_GPU_S = 16 * 3600


class TiresiasPolicy(Policy):
    name = "tiresias"

    def __init__(self):
        self.queues = ([], [])  # job names, in order of entry

    def priority(self, by_name) -> list:
        """Job names in 2D-LAS order (first queue first, each in order of entry), demoting jobs as they pass
        the threshold of attained service."""
        high, low = (list(filter(by_name.__contains__, q)) for q in self.queues)
        known = set(high) | set(low)
        high += [name for name in by_name if name not in known]
        for name in [n for n in high if self.service(by_name[n]) >= DEMOTE_GPU_S]:
            high.remove(name)
            low.append(name)
        self.queues = (high, low)
        return high + low

    @staticmethod
    def service(job) -> float:
        """GPU-seconds attained, counted on the GPUs the job asked for (a rigid job holds exactly those)."""
        return job.run_s * job.spec.num_gpus

    def optimize(self, now, jobs, cluster, allocations):
        by_name = {j.name: j for j in jobs}
        room, admitted = cluster.room(cluster.gpus), {}
        for name in self.priority(by_name):
            now_on = cluster.types[allocations[name][0]] if name in allocations else None
            gpu_type = gpu_type_for(room, by_name[name].spec.num_gpus, prefer=now_on)
            if gpu_type is not None:
                admitted[name] = gpu_type
                room[gpu_type] -= by_name[name].spec.num_gpus
        result = {n: allocations[n] for n, t in admitted.items()
                  if n in allocations and cluster.types[allocations[n][0]] == t}
        free = cluster.free(result)
        for name, gpu_type in admitted.items():
            if name not in result:
                result[name] = place(free, by_name[name].spec.num_gpus, cluster.nodes_of(gpu_type))
        return result
