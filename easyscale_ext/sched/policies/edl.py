"""Elastic-Tiresias of EDL (Wu et al., TPDS'22): Tiresias's 2D-LAS order, with elastic jobs.

Each round, in 2D-LAS order (attained GPU-seconds, two queues, demotion after 16 GPU-hours), every job is first
admitted at its minimum of one GPU while GPUs last, so waiting jobs are admitted by shrinking the running ones
rather than queueing behind them. What is left then restores jobs toward the GPUs they asked for, in the same
order, and the rest goes one GPU at a time to the job whose speedup grows most, with its user's batch and the
true (measured) iteration times that Optimus+Oracle uses. EDL's point is that this rescaling is cheap when
scaling is stop-free: run it with `--restart` ~0 (in-place scaling) against the default 30 s stop-and-restart.
"""
from ..models import goodput
from .base import grant_by_marginal_gain, place_counts
from .tiresias import TiresiasPolicy


class EdlPolicy(TiresiasPolicy):
    name = "edl"
    profiled = True
    one_gpu_type = True

    @staticmethod
    def service(job) -> float:
        return job.attained  # an elastic job's GPU count changes: count what it actually held

    def optimize(self, now, jobs, cluster, allocations):
        by_name = {j.name: j for j in jobs}
        order = self.priority(by_name)
        per_node, gpu_type, total = max(cluster.gpus), cluster.types[0], cluster.total_gpus
        times = {n: goodput.iteration_times(by_name[n].app, by_name[n].batch_size, per_node, gpu_type, total)
                 for n in order[:total]}
        count = {n: 1 for n in times}
        room = total - len(count)
        for name in count:  # back toward the request, in priority order
            grow = min(room, min(by_name[name].spec.num_gpus, len(times[name]) - 1) - 1)
            if grow > 0:
                count[name] += grow
                room -= grow

        def marginal(name):  # speedup over one GPU gained by one more GPU
            t, r = times[name], count[name]
            return t[1] / t[r + 1] - t[1] / t[r] if r + 1 < len(t) else 0.0

        grant_by_marginal_gain(count, room, marginal)
        return place_counts(count, allocations, cluster, gpu_type)
