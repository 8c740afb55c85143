"""Optimus (Peng et al., EuroSys'18) with an oracle, as configured in the Pollux artifact: every job keeps its
user's batch size; each round every job (in arrival order, while GPUs last) gets one GPU, and the rest go one
at a time to the job whose remaining time drops most, (T_iter(r) - T_iter(r + 1)) x remaining iterations,
with the true (measured) iteration time of r GPUs packed on full nodes. Jobs whose GPU count is unchanged stay
where they are; the others are placed, fewest GPUs first, on the emptiest nodes."""
import numpy as np

from . import goodput
from .policy import Policy, place, require_homogeneous


class OptimusPolicy(Policy):
    name = "optimus"
    profiled = True

    def __init__(self):
        self._iter_time = {}  # (app, batch, cluster shape) -> iteration time by GPU count

    def optimize(self, now, jobs, cluster, allocations):
        require_homogeneous(cluster, self.name)
        per_node, gpu_type = max(cluster.gpus), cluster.types[0]
        room = cluster.total_gpus
        count, gain, times = {}, {}, {}
        for job in jobs:
            times[job.name] = self._times(job, per_node, gpu_type, cluster.total_gpus)
            count[job.name] = 1 if room >= 1 else 0
            room -= count[job.name]
        remaining = {j.name: _remaining_iterations(j) for j in jobs}

        def marginal(name):
            t, r = times[name], count[name]
            return (t[r] - t[r + 1]) * remaining[name] if 0 < r < len(t) - 1 else 0.0

        gain = {j.name: marginal(j.name) for j in jobs}
        while room > 0 and gain and max(gain.values()) > 0:
            name = max(gain, key=gain.get)
            count[name] += 1
            room -= 1
            gain[name] = marginal(name)
        result = {n: a for n, a in allocations.items() if len(a) == count.get(n)}
        free = cluster.free(result)
        for name in sorted(count, key=count.get):
            if count[name] and name not in result:
                result[name] = place(free, count[name], cluster.nodes_of(gpu_type))
        return result

    def _times(self, job, per_node, gpu_type, total_gpus):
        """Iteration time on 0..max GPUs (index = GPUs; entry 0 unused); the max as in the artifact: the user's
        batch over the smallest micro-batch (one GPU for single-GPU applications)."""
        app, batch = job.app, job.batch_size
        key = (app.name, batch, per_node, gpu_type, total_gpus)
        if key not in self._iter_time:
            max_gpus = 1 if app.single_gpu else min(batch // app.min_local_bsz, total_gpus)
            t = [np.inf]
            for r in range(1, max_gpus + 1):
                local, accum = goodput.fixed_batch_config(batch, r, app)
                accum = max(accum, 1) if r == 1 else accum
                local = goodput.cap_local_bsz(local, accum, r, app)
                full, rest = divmod(r, per_node)
                step, sync = app.profile(gpu_type).step_time((per_node,) * full + ((rest,) if rest else ()), local)
                t.append(step + accum * (step - sync))
            self._iter_time[key] = t
        return self._iter_time[key]


def _remaining_iterations(job) -> float:
    """Iterations left at the job's batch size, counted to the end of its current epoch, as the artifact does."""
    noise, last = job.app.noise, job.app.epochs - 1
    return max(noise.iterations(job.batch_size, last) - noise.iterations(job.batch_size, job.epoch), 1.0)
