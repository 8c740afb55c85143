"""Slots taken back from training (`easyscale cluster reserve`): the serving side of EasyScale's opportunistic use
of idle serving GPUs.

A reserved slot is a Ray actor holding the slot's resource on its node, so Ray itself keeps every job's
process off it; it starts as soon as the training process that held the slot has left (at its next step
boundary, in place). `take` decides which slots: free ones first, then slots of the jobs with the most
processes above their minimum on the node; only then, where the cluster may preempt, whole jobs are suspended
(they save a checkpoint, go back to the queue and resume on other slots).
"""
from collections import Counter
from typing import Dict, List, Optional, Tuple

import ray


@ray.remote(num_cpus=0)
class ReservedSlot:
    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()


def take(count: int, node: Optional[str], capacity: Dict[str, int], holdings: Dict[str, List[str]],
         minimum: Dict[str, int], suspend: bool = False) -> Tuple[List[str], Dict[str, List[str]]]:
    """The nodes of `count` slots to reserve (on `node`, or anywhere), and the jobs' holdings after giving up
    theirs ([] for a job to suspend). `capacity`: slots per node not reserved yet; `holdings`: job -> its nodes,
    one entry per slot, in submission order; `minimum`: job -> the fewest slots it runs on. With `suspend`, when
    the slots above the jobs' minimums are not enough, the latest jobs on the node are suspended (they leave
    every slot, saving a checkpoint). A ValueError says how many could be taken."""
    held = Counter(n for nodes in holdings.values() for n in nodes)
    nodes = [node] if node is not None else sorted(capacity, key=lambda n: held[n] - capacity[n])
    if node is not None and node not in capacity:
        raise ValueError(f"no node {node!r} offers slots: `easyscale status` lists them")
    taken, after = [], {job: list(n) for job, n in holdings.items()}
    for n in nodes:  # free slots first
        free = capacity[n] - held[n]
        taken += [n] * min(max(free, 0), count - len(taken))
    for n in nodes:  # then slots of jobs above their minimum
        while len(taken) < count:
            spare = [j for j, ns in after.items() if n in ns and len(ns) > minimum.get(j, 1)]
            if not spare:
                break
            job = max(spare, key=lambda j: (len(after[j]), j))
            after[job].remove(n)
            taken.append(n)
    for n in nodes if suspend else ():  # then whole jobs, the latest first
        while len(taken) < count:
            there = [j for j, ns in after.items() if n in ns]
            if not there:
                break
            job = there[-1]
            taken += [n] * min(after[job].count(n), count - len(taken))
            after[job] = []
    if len(taken) < count:
        where = f"on node {node}" if node else "in the cluster"
        if suspend:
            raise ValueError(f"only {len(taken)} of {count} slots can be reserved {where} (reserved slots are "
                             "taken already): ask for fewer, or unreserve some first")
        raise ValueError(f"only {len(taken)} of {count} slots can be reserved {where} without stopping a job "
                         "(each keeps its minimum): ask for fewer, or cancel a job first")
    return taken, {job: ns for job, ns in after.items() if ns != holdings[job]}
