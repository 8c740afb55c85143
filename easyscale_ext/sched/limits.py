"""Every policy's decision held to what a cluster carries out: each job's limits and, where the cluster may not
preempt, running jobs kept running. The round (rounds.py) applies it to every decision, simulated or real.

`hold` repairs the policy's decision:
- each job holds between its minimum and maximum GPUs (its spec's `min_gpus` and `max_gpus`: a cluster job's
  `--min-procs`/`--max-procs`, a workload's optional columns; default 1 and unbounded, which repairs nothing); an
  allocation above the maximum keeps its first GPUs; one below the minimum is topped up to it from the GPUs left
  free by the round's other decisions, its own nodes first, then others of its types (of any type where the policy
  may span the job), so that a policy that starts jobs small (EasyScale's, on one GPU) starts a job that needs
  more; where too few are free it is no allocation (for a running job, a preemption: it is suspended to a
  checkpoint, and resumes wherever it gets GPUs later);
- with `preempt=False` (`cluster start --no-preempt`), a running job the policy would stop keeps its current GPUs
  instead; where that over-fills a node, the decisions on it are undone, one at a time until every node fits: new
  starts first (the latest arrival first), then changed allocations of running jobs (back to what they hold).
What is never undone is the round before's allocations, which fitted (the caller keeps them within the
cluster's GPUs): the repair always ends with every node within its capacity.
"""
from typing import Dict


def hold(policy, now, jobs, cluster, allocations: Dict[str, tuple], preempt: bool = True) -> Dict[str, tuple]:
    """`policy`'s decision for `jobs` on `cluster` (job -> node indices; no empty ones), repaired; in the policy's
    order."""
    jobs = list(jobs)
    decided = policy.optimize(now, jobs, cluster, dict(allocations))
    limits = {job.name: (job.spec.min_gpus, job.spec.max_gpus) for job in jobs}
    result, short = {}, {}
    for name, alloc in decided.items():
        low, high = limits.get(name, (1, None))
        alloc = alloc[:high]
        if len(alloc) >= low:
            result[name] = alloc
        elif alloc:
            result[name] = ()  # its place in the order, until topped up
            short[name] = (alloc, low)
    if short:
        free = cluster.free({name: alloc for name, alloc in result.items() if alloc})
        for job in (j for j in jobs if j.name in short):  # in arrival order
            alloc, low = short[job.name]
            result[job.name] = _top_up(policy.spans_types(job), alloc, low, cluster, free)
    result = {name: alloc for name, alloc in result.items() if alloc}
    if preempt:  # every allocation is within the policy's or the free GPUs, which fits
        return result
    for job in jobs:
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


def _top_up(spans: bool, alloc, low, cluster, free) -> tuple:
    """`low` GPUs for a job the policy gave `alloc`, fewer: its own nodes first, then the emptiest of its types,
    then, where the policy may span the job (`spans`), of other types; taken from `free` (GPUs free per node). ()
    where too few are free."""
    types = {cluster.types[n] for n in alloc}
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
