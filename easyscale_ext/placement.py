"""Placement of virtual ranks on processes: the one home of every split.

A job's N virtual workers go to its P processes as contiguous ranges, in rank order. The runtime splits
evenly (`even_ranges`), the Balancer and a scheduler that knows the devices' speeds split by speed
(`optimal_split`), and the simulator predicts a mixed allocation's step with the same two functions. Pure
Python: the simulator and the cluster scheduler import it without loading torch.
"""
import heapq
from typing import List, Sequence, Tuple


def even_sizes(world_size: int, procs: int) -> List[int]:
    """Range sizes of an even split, the first world_size % procs one longer."""
    if not 1 <= procs <= world_size:
        raise ValueError(f"need 1 <= processes <= virtual workers, got {procs} processes for {world_size}")
    base, extra = divmod(world_size, procs)
    return [base + (1 if p < extra else 0) for p in range(procs)]


def ranges_of(sizes: Sequence[int]) -> List[Tuple[int, int]]:
    """Contiguous virtual-rank ranges [lo, hi) of the given sizes, in rank order."""
    out, at = [], 0
    for k in sizes:
        out.append((at, at + k))
        at += k
    return out


def even_ranges(world_size: int, procs: int) -> List[Tuple[int, int]]:
    """Contiguous virtual-rank ranges of an even split."""
    return ranges_of(even_sizes(world_size, procs))


def optimal_split(n: int, speeds: Sequence[float]) -> List[int]:
    """Contiguous range sizes k_i >= 1 summing to n that minimise max_i k_i / speeds_i.

    Process i finishes its j-th worker at j / s_i. Every split holds each process's first worker
    plus n - P further "finish times" taken from each process in order, so its step time is at least
    the largest of: the slowest first worker, and the (n - P)-th smallest finish time over all j >= 2.
    Handing out workers one at a time to the process that would finish its next one soonest attains
    exactly that bound, hence is optimal (ties go to the lower rank, so the split is reproducible).
    The exchange adds the same time to every split and does not change the choice.
    """
    procs = len(speeds)
    if not 1 <= procs <= n:
        raise ValueError(f"need 1 <= processes <= n, got {procs} processes for n={n}")
    if any(s <= 0 for s in speeds):
        raise ValueError(f"speeds must be positive, got {list(speeds)}")
    sizes = [1] * procs
    heap = [(2 / s, i) for i, s in enumerate(speeds)]
    heapq.heapify(heap)
    for _ in range(n - procs):
        _, i = heapq.heappop(heap)
        sizes[i] += 1
        heapq.heappush(heap, ((sizes[i] + 1) / speeds[i], i))
    return sizes


def step_time(sizes: Sequence[int], speeds: Sequence[float]) -> float:
    """Predicted compute time of a step: the slowest process's."""
    return max(k / s for k, s in zip(sizes, speeds))


def waste(sizes: Sequence[int], speeds: Sequence[float]) -> float:
    """EasyScale's waste: device time idle per step while the slowest process finishes."""
    t = step_time(sizes, speeds)
    return sum(t - k / s for k, s in zip(sizes, speeds))


def valid_split(sizes: Sequence[int], world_size: int, procs: int) -> bool:
    """Whether `sizes` gives each of `procs` processes at least one of `world_size` virtual workers."""
    return len(sizes) == procs and min(sizes, default=0) >= 1 and sum(sizes) == world_size
