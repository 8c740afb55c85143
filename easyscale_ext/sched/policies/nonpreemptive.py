"""Any policy, made to keep running jobs running: what a cluster that moves jobs only in place can carry out.

A real job here changes its slots in place (joiners, releases), which needs at least one of its processes
to stay: taking all of a running job's slots would be a checkpoint-restart. So `NonPreemptive(policy)`
repairs the wrapped policy's decision, and the cluster scheduler and the simulator (to compare a real run
with its simulation) run the same repaired decisions:
- each job holds between its minimum and maximum slots (`limits`, per job; default 1 and unbounded); an
  allocation above the maximum keeps its first slots, one below the minimum is no allocation;
- a running job the policy would stop keeps its current slots;
- where that over-fills a node, the decisions on it are undone, one at a time until every node fits: new
  starts first (the latest arrival first), then changed allocations of running jobs (back to what they hold).
What is never undone is the round before's allocations, which fitted (the caller keeps them within the
cluster's slots): the repair always ends with every node within its capacity.
"""
from .base import Policy


class NonPreemptive:
    def __init__(self, policy: Policy):
        self.policy = policy
        self.limits = {}  # job name -> (min GPUs, max GPUs)

    def __getattr__(self, name):  # the wrapped policy's flags and batch sizes, whatever they are
        return getattr(self.policy, name)

    def optimize(self, now, jobs, cluster, allocations):
        jobs = list(jobs)
        decided = self.policy.optimize(now, jobs, cluster, dict(allocations))
        result = {}
        for job in jobs:
            low, high = self.limits.get(job.name, (1, None))
            alloc = tuple(decided.get(job.name, ()))[:high]
            if len(alloc) >= low:
                result[job.name] = alloc
            if job.name in allocations and not result.get(job.name):
                result[job.name] = allocations[job.name]
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
