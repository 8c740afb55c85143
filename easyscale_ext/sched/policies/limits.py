"""Any policy, held to what a real cluster carries out: each job's limits, and, where the cluster may not preempt,
running jobs kept running.

`Limits(policy)` repairs the wrapped policy's decision; the cluster scheduler and the simulator (to compare a real
run with its simulation) run the same repaired decisions:
- each job keeps its own global batch (a policy that tunes batches, as Pollux and Sia do, cannot change a real
  job's: it models the job at its batch);
- each job holds between its minimum and maximum slots (`limits`, per job; default 1 and unbounded); an
  allocation above the maximum keeps its first slots; one below the minimum is topped up to it from the slots
  left free by the round's other decisions, its own first, then others of its types (of any type where the policy
  may span the job), so that a policy that starts jobs small (EasyScale's, on one GPU) starts a job that needs
  more; where too few are free it is no allocation (for a running job, a preemption: the cluster suspends it to a
  checkpoint, and it resumes wherever it gets slots later);
- with `preempt=False` (`cluster start --no-preempt`), a running job the policy would stop keeps its current slots
  instead; where that over-fills a node, the decisions on it are undone, one at a time until every node fits: new
  starts first (the latest arrival first), then changed allocations of running jobs (back to what they hold).
What is never undone is the round before's allocations, which fitted (the caller keeps them within the
cluster's slots): the repair always ends with every node within its capacity.
"""
from .base import Policy


class Limits:
    def __init__(self, policy: Policy, preempt: bool = True):
        self.policy, self.preempt = policy, preempt
        self.limits = {}  # job name -> (min GPUs, max GPUs)

    def __getattr__(self, name):  # the wrapped policy's flags, whatever they are
        return getattr(self.policy, name)

    def batch_size(self, spec, app):
        """The job's own: a real job keeps the global batch it was submitted with (its virtual workers and their
        micro-batches, which keep its bits), so a policy that would tune it models it at that batch."""
        return spec.batch_size

    def optimize(self, now, jobs, cluster, allocations):
        jobs = list(jobs)
        decided = self.policy.optimize(now, jobs, cluster, dict(allocations))
        result, short = {}, []
        for job in jobs:
            low, high = self.limits.get(job.name, (1, None))
            alloc = tuple(decided.get(job.name, ()))[:high]
            if len(alloc) >= low:
                result[job.name] = alloc
            elif alloc:
                short.append((job, alloc, low))
        free = cluster.free(result)
        for job, alloc, low in short:
            topped = self._top_up(job, alloc, low, cluster, free)
            if topped:
                result[job.name] = topped
        for job in jobs:
            if not self.preempt and job.name in allocations and not result.get(job.name):
                result[job.name] = allocations[job.name]
        if self.preempt:  # every allocation is within the policy's or the free GPUs, which fits
            return result
        undo = [j.name for j in reversed(jobs) if j.name in result and j.name not in allocations]
        undo += [j.name for j in reversed(jobs) if j.name in allocations and result[j.name] != allocations[j.name]]
        while True:  # a job put back may over-fill another node: look again after each undo
            over = set((cluster.used(result) > cluster.gpus).nonzero()[0].tolist())
            name = next((n for n in undo if over.intersection(result[n])), None)
            if name is None:
                return result
            undo.remove(name)
            if name in allocations:
                result[name] = allocations[name]
            else:
                del result[name]

    def _top_up(self, job, alloc, low, cluster, free) -> tuple:
        """`low` GPUs for a job the policy gave `alloc`, fewer: its own nodes first, then the emptiest of its types,
        then, where the policy may span the job, of other types; taken from `free` (GPUs free per node). () where
        too few are free."""
        types = {cluster.types[n] for n in alloc}
        spans = self.policy.spans_types(job)
        nodes = [n for n in range(cluster.num_nodes) if free[n] > 0 and (spans or cluster.types[n] in types)]
        nodes.sort(key=lambda n: (n not in alloc, cluster.types[n] not in types, -free[n], n))
        taken = []
        for n in nodes:
            taken += [n] * min(int(free[n]), low - len(taken))
        if len(taken) < low:
            return ()
        for n in taken:
            free[n] -= 1
        return tuple(sorted(taken))
