"""Canonical gradient reduction over N virtual workers spread over P processes.

Within a process, each local virtual worker's gradients are folded, as soon
as its backward is done, into a few partial-sum slots (the canonical tree's
nodes inside the process's range; FoldStack plans it). Across processes the
partials are exchanged reduce-scatter style (all_to_all: each process gets
one chunk of every partial), each process finishes the tree for its chunk,
and all_gather assembles the result: about the bytes of the backend's own
ring all_reduce when each process holds one partial. Every plan is fixed at
construction, like the c10d Reducer's buckets.
"""
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from . import _C
from .ops import fold_


# torch 2.14 deprecates all_gather_into_tensor for all_gather_single; older releases lack the latter.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


class _Bucket:
    """The parameters of one dtype, laid out in one flat buffer per slot."""

    def __init__(self, params: List[torch.nn.Parameter], world: int):
        self.params = params
        self.numel = sum(p.numel() for p in params)
        self.chunk = -(-self.numel // world)  # every process finishes one chunk
        self.padded = self.chunk * world
        self.acc_dtype = _acc_dtype(params[0].dtype)
        self.device = params[0].device

    def flat(self) -> torch.Tensor:
        return torch.zeros(self.padded, dtype=self.acc_dtype, device=self.device)

    def views(self, flat: torch.Tensor) -> List[torch.Tensor]:
        out, at = [], 0
        for p in self.params:
            out.append(flat[at:at + p.numel()].view_as(p))
            at += p.numel()
        return out


class CanonicalReducer:
    def __init__(self, params: Sequence[torch.nn.Parameter], world_size: int,
                 ranges: Sequence[Tuple[int, int]], rank: int, find_unused_parameters: bool):
        self.n = world_size
        self.ranges = [tuple(r) for r in ranges]
        self.rank = rank
        self.procs = len(self.ranges)
        self.find_unused = find_unused_parameters
        by_dtype: Dict[torch.dtype, List[torch.nn.Parameter]] = {}
        for p in params:
            by_dtype.setdefault(p.dtype, []).append(p)
        self.buckets = [_Bucket(ps, self.procs) for ps in by_dtype.values()]

        # Local plan: ops per local leaf; slots hold the partial sums.
        lo, hi = self.ranges[rank]
        stack = _C.FoldStack(self.n)
        self.leaf_plans = [stack.push(v, v + 1) for v in range(lo, hi)]
        self.root_slots = stack.slots()
        self.slots = [[b.flat() for b in self.buckets] for _ in range(stack.max_slots)]
        self.slot_views = [[b.views(f) for b, f in zip(self.buckets, s)] for s in self.slots]

        # Cross-process plan: every process's local roots, in rank order.
        self.roots_per_proc = [len(_C.local_roots(a, b, self.n)) for a, b in self.ranges]
        top = _C.FoldStack(self.n)
        self.top_plans = [top.push(r.lo, r.hi) for a, b in self.ranges for r in _C.local_roots(a, b, self.n)]
        self.top_result = top.slots()[0]
        self.top_slots = [[torch.empty(b.chunk, dtype=b.acc_dtype, device=b.device) for b in self.buckets]
                          for _ in range(top.max_slots)]
        self._zeros: Dict[int, torch.Tensor] = {}
        self.unused: List[str] = []
        # Per bucket and parameter: whether any local worker of this step produced a gradient.
        self.used = [[False] * len(b.params) for b in self.buckets]

    def _grads(self, i: int, names: Dict[int, str]) -> List[torch.Tensor]:
        out = []
        for k, p in enumerate(self.buckets[i].params):
            if p.grad is None:
                if not self.find_unused:
                    self.unused.append(names.get(id(p), "?"))
                z = self._zeros.get(id(p))
                if z is None:
                    z = self._zeros[id(p)] = torch.zeros_like(p)
                out.append(z)
            else:
                self.used[i][k] = True
                out.append(p.grad.contiguous())
        return out

    def _used_by_any_worker(self, group) -> List[List[bool]]:
        """Which parameters some virtual worker of the step used, agreed across processes (DDP's
        globally-unused check): a parameter no worker used keeps grad None, so optimizers skip it."""
        flags = torch.tensor([u for per_bucket in self.used for u in per_bucket], dtype=torch.int32,
                             device=self.buckets[0].device)
        if self.procs > 1:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group)
        flags = iter(flags.tolist())
        self.used = [[False] * len(b.params) for b in self.buckets]
        return [[bool(next(flags)) for _ in b.params] for b in self.buckets]

    def fold_worker(self, local_index: int, names: Dict[int, str]) -> None:
        """Fold the gradients now in param.grad as leaf `local_index` of this process."""
        grads = [self._grads(i, names) for i, _ in enumerate(self.buckets)]
        if self.unused:
            unused, self.unused = self.unused, []
            raise RuntimeError(f"parameters {unused[:5]} received no gradient in this virtual worker's backward; "
                               "pass find_unused_parameters=True to EasyScaleDDP if parts of the model are unused")
        for op in self.leaf_plans[local_index]:
            for i, _ in enumerate(self.buckets):
                if op.src == _C.PUSHED:
                    fold_(self.slot_views[op.dst][i], grads[i], 1.0 / self.n, op.accumulate)
                else:
                    fold_([self.slots[op.dst][i]], [self.slots[op.src][i]], 1.0, True)

    def finish(self, group, gradient_as_bucket_view: bool) -> None:
        """Complete the tree across the processes of `group` and write each param.grad."""
        used = self._used_by_any_worker(group) if self.find_unused else None
        for i, bucket in enumerate(self.buckets):
            local = [self.slots[s][i] for s in self.root_slots]
            if self.procs == 1:
                reduced = local[0]
            else:
                reduced = self._exchange(group, i, bucket, local)
            views = bucket.views(reduced)
            for k, (p, g) in enumerate(zip(bucket.params, views)):
                if used is not None and not used[i][k]:
                    p.grad = None
                else:
                    p.grad = g if (gradient_as_bucket_view and p.dtype == g.dtype) else g.to(p.dtype, copy=True)

    def _exchange(self, group, i: int, bucket: _Bucket, local: List[torch.Tensor]) -> torch.Tensor:
        c = bucket.chunk
        send = torch.cat([part[q * c:(q + 1) * c] for q in range(self.procs) for part in local])
        recv = torch.empty(c * sum(self.roots_per_proc), dtype=bucket.acc_dtype, device=bucket.device)
        dist.all_to_all_single(recv, send, [c * r for r in self.roots_per_proc],
                               [c * len(local)] * self.procs, group=group)
        for k, plan in enumerate(self.top_plans):
            pushed = recv[k * c:(k + 1) * c]
            for op in plan:
                src = pushed if op.src == _C.PUSHED else self.top_slots[op.src][i]
                fold_([self.top_slots[op.dst][i]], [src], 1.0, op.accumulate)
        out = torch.empty(bucket.padded, dtype=bucket.acc_dtype, device=bucket.device)
        _all_gather(out, self.top_slots[self.top_result][i], group=group)
        return out
