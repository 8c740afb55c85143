"""Optimus (Peng et al., EuroSys'18) with an oracle, as configured in the Pollux artifact: every job keeps its
user's batch size; each round every job (in arrival order, while GPUs last) gets one GPU, and the rest go one
at a time to the job whose remaining time drops most, (T_iter(r) - T_iter(r + 1)) x remaining iterations,
with the true (measured) iteration time of r GPUs packed on full nodes. Jobs whose GPU count is unchanged stay
where they are; the others are placed, fewest GPUs first, on the emptiest nodes."""
from ..models import goodput
from .base import Policy, grant_by_marginal_gain, place_counts


class OptimusPolicy(Policy):
    name = "optimus"
    profiled = True
    one_gpu_type = True

    def optimize(self, now, jobs, cluster, allocations):
        per_node, gpu_type = max(cluster.gpus), cluster.types[0]
        room = cluster.total_gpus
        count, times = {}, {}
        for job in jobs:
            times[job.name] = self._times(job, per_node, gpu_type, cluster.total_gpus)
            count[job.name] = 1 if room >= 1 else 0
            room -= count[job.name]
        remaining = {j.name: _remaining_iterations(j) for j in jobs}

        def marginal(name):
            t, r = times[name], count[name]
            return (t[r] - t[r + 1]) * remaining[name] if 0 < r < len(t) - 1 else 0.0

        grant_by_marginal_gain(count, room, marginal)
        return place_counts(count, allocations, cluster, gpu_type)

    @staticmethod
    def _times(job, per_node, gpu_type, total_gpus):
        """The true iteration time of the job's batch on 0..max GPUs packed on full nodes."""
        return goodput.iteration_times(job.app, job.batch_size, per_node, gpu_type, total_gpus)


def _remaining_iterations(job) -> float:
    """Iterations left at the job's batch size, counted to the end of its current epoch, as the artifact does."""
    noise, last = job.app.noise, job.app.epochs - 1
    return max(noise.iterations(job.batch_size, last) - noise.iterations(job.batch_size, job.epoch), 1.0)
