"""Ours: Sia's goodput-optimising integer program, with the levers the EasyScale runtime adds.

- Stop-free scaling: a running job changes its GPUs in place (contexts move, nothing restarts), so a
  reallocation costs the measured pause (SimConfig.in_place_s, 0.07 s) instead of a checkpoint-restart, and the
  program discounts a change by that cost, not by a restart's: it can follow the cluster round by round.
- Batch size within the accuracy-neutral range: jobs that let the scheduler choose tune their batch for
  goodput (as Pollux's agents), which the program values per configuration.
- Virtual workers: a job that fixes its batch as D virtual workers (EasyScale's workloads) keeps it on any
  number of GPUs up to D, valued by its step time with the workers spread by speed (job.virtual_worker_step);
  without D2 it stays on its preferred GPU type, whose bits it was promised.
- Heterogeneous GPU types: Sia's per-type goodput estimates and its bootstrapping across types.
It keeps the simulator's policy interface, so a real scheduler can run it unchanged.
"""
from .goodput import packed
from .job import VirtualWorkerJob, virtual_worker_step
from .sia import SiaPolicy
from .simulator import SimConfig


class OursPolicy(SiaPolicy):
    name = "ours"
    in_place = True

    def __init__(self, reallocation_s: float = SimConfig.in_place_s, **sia):
        super().__init__(restart_s=reallocation_s, **sia)

    def _values(self, job, types, counts, per_node) -> dict:
        if job.spec.preferred_gpu and not job.spec.heterogeneous:
            types = [job.spec.preferred_gpu]
        if not isinstance(job, VirtualWorkerJob):
            return super()._values(job, types, counts, per_node)
        d, spec = job.spec.virtual_workers, job.spec
        rate = {(t, g): 1 / virtual_worker_step(job.app, d, spec.batch_size // d, ((t, packed(g, per_node[t])),))[0]
                for t in types for g in counts[t] if g <= d}
        least = min(rate.values())
        return {c: r / least for c, r in rate.items()}
