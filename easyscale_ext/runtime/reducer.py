"""Canonical gradient reduction over N virtual workers spread over P processes.

Within a process, each local virtual worker's gradients are folded, as soon
as its backward is done, into a few partial-sum slots (the canonical tree's
nodes inside the process's range; FoldStack plans it). Across processes the
partials are exchanged reduce-scatter style (all_to_all: each process gets
one chunk of every partial), each process finishes the tree for its chunk,
and a second all_to_all, of each process's chunk to every process, assembles
the result: an all_gather's bytes, which gloo moves faster this way than by
its all_gather (31 against 71 ms for 84 MB on 2 processes). Where the
tree's cross-process part is one addition (two processes, each owning one
subtree of the root: P = 2 with N even, for one), a plain all_reduce of the
local roots computes exactly that addition (a + b == b + a bitwise), with the
bytes of one all_reduce instead of an all_to_all and an all_reduce. A small
bucket (what a process receives of it at most WHOLE_BYTES) takes one collective
instead of two: every process receives every local root whole and finishes the
whole tree itself (4 processes on 2 CPU cores, 72 KB: 2.4 against 5.0 ms); the
tree's additions are elementwise, so the bits are the chunked exchange's. Every
plan is fixed at construction, like the c10d Reducer's buckets.

Overlap, as in DDP: buckets of at most `bucket_cap_mb`, in reverse registration
order, one dtype each. During the step's last local worker's backward, a bucket
whose gradients are all ready is folded at once and its all_to_all starts
(asynchronously), strictly in bucket order so that every process issues the
same collectives in the same order; `finish` starts the rest, then completes
them. Splitting the gradients into buckets changes no element's association.
"""
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from .. import _C
from ..ops import acc_dtype, fold_

WHOLE_BYTES = 1 << 20  # below this, collectives cost their latency (gloo, 4 processes: equal at about 3 MB)


class _Bucket:
    """The parameters of one dtype, laid out in one flat buffer per slot."""

    def __init__(self, params: List[torch.nn.Parameter], world: int):
        self.params = params
        self.numel = sum(p.numel() for p in params)
        self.chunk = -(-self.numel // world)  # every process finishes one chunk
        self.padded = self.chunk * world
        self.acc_dtype = acc_dtype(params[0].dtype)
        self.device = params[0].device

    def flat(self) -> torch.Tensor:
        return torch.zeros(self.padded, dtype=self.acc_dtype, device=self.device)

    def views(self, flat: torch.Tensor) -> List[torch.Tensor]:
        out, at = [], 0
        for p in self.params:
            out.append(flat[at:at + p.numel()].view_as(p))
            at += p.numel()
        return out


def _bucketed(params: Sequence[torch.nn.Parameter], cap_bytes: int) -> List[List[torch.nn.Parameter]]:
    """Parameters in reverse registration order (about the order backward readies them), cut into buckets of
    one dtype and at most `cap_bytes` (a larger parameter gets a bucket of its own)."""
    buckets: Dict[torch.dtype, List[List[torch.nn.Parameter]]] = {}
    filled: Dict[torch.dtype, int] = {}  # bytes in each dtype's open bucket
    for p in reversed(list(params)):
        mine, size = buckets.setdefault(p.dtype, [[]]), p.numel() * p.element_size()
        if mine[-1] and filled[p.dtype] + size > cap_bytes:
            mine.append([])
            filled[p.dtype] = 0
        mine[-1].append(p)
        filled[p.dtype] = filled.get(p.dtype, 0) + size
    return [b for per_dtype in buckets.values() for b in per_dtype]


class CanonicalReducer:
    def __init__(self, params: Sequence[torch.nn.Parameter], world_size: int,
                 ranges: Sequence[Tuple[int, int]], rank: int, find_unused_parameters: bool,
                 bucket_cap_mb: float = 25.0):
        self.n = world_size
        self.ranges = [tuple(r) for r in ranges]
        self.rank = rank
        self.procs = len(self.ranges)
        self.find_unused = find_unused_parameters
        self.buckets = [_Bucket(ps, self.procs) for ps in _bucketed(params, int(bucket_cap_mb * 2 ** 20))]
        self._bucket_of = {id(p): i for i, b in enumerate(self.buckets) for p in b.params}

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
        self.one_addition = self.roots_per_proc == [1, 1]
        # Per bucket, what each process finishes of the tree: one chunk, or all of a small bucket (`whole`).
        exchanged, roots = self.procs > 1 and not self.one_addition, sum(self.roots_per_proc)
        self.whole = [exchanged and b.padded * roots * b.acc_dtype.itemsize <= WHOLE_BYTES for b in self.buckets]
        self.part = [b.padded if whole else b.chunk for b, whole in zip(self.buckets, self.whole)]
        self.top_slots = [[torch.empty(c, dtype=b.acc_dtype, device=b.device) for b, c in zip(self.buckets, self.part)]
                          for _ in range(top.max_slots)]
        # Where finish() leaves each bucket's reduced gradient: the same tensor every step.
        self.reduced = [self.slots[self.root_slots[0]][i] if self.procs == 1 or self.one_addition else
                        self.top_slots[self.top_result][i] if self.whole[i] else b.flat()
                        for i, b in enumerate(self.buckets)]
        self._zeros: Dict[int, torch.Tensor] = {}
        self.unused: List[str] = []
        # Per bucket and parameter: whether any local worker of this step produced a gradient.
        self.used = [[False] * len(b.params) for b in self.buckets]
        self._overlap: Optional[Tuple[int, Dict[int, str]]] = None  # (last leaf, names) while it runs backward
        self._folded = [False] * len(self.buckets)
        self._waiting = [len(b.params) for b in self.buckets]  # gradients not yet ready, per bucket
        self._ready = set()  # parameters whose gradient the last worker's backward has readied
        self._exchanges: List[tuple] = []  # started all_to_alls, in bucket order: (work, received)
        self._group = None
        self._send: Dict[int, torch.Tensor] = {}
        self._recv: Dict[int, torch.Tensor] = {}
        self._gather: Dict[int, torch.Tensor] = {}  # this process's finished chunk, repeated for every process

    @property
    def exchanging(self) -> bool:
        """Whether this step's exchange has begun (a bucket's all_to_all started)."""
        return bool(self._exchanges)

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

    def overlap_next_backward(self, local_index: int, names: Dict[int, str], group) -> None:
        """The next backward is leaf `local_index`'s, this process's last of the step: fold and start
        exchanging each bucket over `group` as soon as its gradients are ready (grad_ready)."""
        self._overlap, self._group = (local_index, names), group

    def grad_ready(self, param: torch.nn.Parameter) -> None:
        """param.grad is final for this backward (a post-accumulate-grad hook)."""
        i = self._bucket_of.get(id(param))
        if self._overlap is None or i is None:
            return
        if id(param) in self._ready:  # DDP refuses this too: its bucket may be folded and on its way already
            raise RuntimeError(f"parameter {self._overlap[1].get(id(param), '?')} got a gradient twice in the "
                               "backward of this process's last virtual worker, whose buckets are exchanged "
                               "as their gradients become ready: run one backward per virtual worker (sum "
                               "the losses first)")
        self._ready.add(id(param))
        self._waiting[i] -= 1
        if self._waiting[i] == 0:
            self._fold_bucket(*self._overlap, i)
            # The last bucket waits for finish(), which runs after the step's contexts are replicated
            # (ddp.on_step_contexts): no process can then complete a step some process has not replicated.
            while len(self._exchanges) < len(self.buckets) - 1 and self._folded[len(self._exchanges)]:
                self._start_exchange(len(self._exchanges))

    def fold_worker(self, local_index: int, names: Dict[int, str]) -> None:
        """Fold the gradients now in param.grad as leaf `local_index` of this process (the buckets its
        backward has not folded already)."""
        for i, done in enumerate(self._folded):
            if not done:
                self._fold_bucket(local_index, names, i)
        self._overlap = None
        self._ready.clear()
        self._folded = [False] * len(self.buckets)
        self._waiting = [len(b.params) for b in self.buckets]

    def _fold_bucket(self, local_index: int, names: Dict[int, str], i: int) -> None:
        grads = self._grads(i, names)
        if self.unused:
            unused, self.unused = self.unused, []
            raise RuntimeError(f"parameters {unused[:5]} received no gradient in this virtual worker's backward; "
                               "pass find_unused_parameters=True to EasyScaleDDP if parts of the model are unused")
        for op in self.leaf_plans[local_index]:
            if op.src == _C.PUSHED:
                fold_(self.slot_views[op.dst][i], grads, 1.0 / self.n, op.accumulate)
            else:
                fold_([self.slots[op.dst][i]], [self.slots[op.src][i]], 1.0, True)
        self._folded[i] = True

    def _start_exchange(self, i: int) -> None:
        """Start bucket i's all_to_all: each process receives its chunk (or all, `whole`) of every process's
        local roots."""
        if self.procs == 1:
            self._exchanges.append(None)
            return
        if self.one_addition:
            root = self.slots[self.root_slots[0]][i]
            self._exchanges.append((dist.all_reduce(root, group=self._group, async_op=True), root))
            return
        bucket, c, whole = self.buckets[i], self.part[i], self.whole[i]
        local = [self.slots[s][i] for s in self.root_slots]
        if i not in self._recv:  # kept across steps: fresh buffers of this size cost page faults every step
            self._recv[i] = torch.empty(c * sum(self.roots_per_proc), dtype=bucket.acc_dtype, device=bucket.device)
            if len(local) > 1 or whole:
                self._send[i] = torch.empty(c * len(local) * self.procs, dtype=bucket.acc_dtype, device=bucket.device)
        recv = self._recv[i]
        if len(local) == 1 and not whole:
            send = local[0]  # one root: its chunks are in destination order already
        else:
            send = self._send[i]
            torch.cat([part if whole else part[q * c:(q + 1) * c] for q in range(self.procs) for part in local],
                      out=send)
        work = dist.all_to_all_single(recv, send, [c * r for r in self.roots_per_proc],
                                      [c * len(local)] * self.procs, group=self._group, async_op=True)
        self._exchanges.append((work, recv))

    def finish(self, group, gradient_as_bucket_view: bool) -> None:
        """Complete the tree across the processes of `group` and write each param.grad. Collectives in the
        same order on every process: the all_to_alls not started yet, the used flags, the gathers."""
        self._group = group
        while len(self._exchanges) < len(self.buckets):
            self._start_exchange(len(self._exchanges))
        used = self._used_by_any_worker(group) if self.find_unused else None
        exchanges, self._exchanges, self._group = self._exchanges, [], None  # the group is held weakly (ddp.py)
        gathers = [None if self.procs == 1 else self._complete(group, i, *exchanges[i])
                   for i in range(len(self.buckets))]
        for i, bucket in enumerate(self.buckets):
            if gathers[i] is not None:
                gathers[i].wait()
            views = bucket.views(self.reduced[i])
            for k, (p, g) in enumerate(zip(bucket.params, views)):
                if used is not None and not used[i][k]:
                    p.grad = None
                else:
                    p.grad = g if (gradient_as_bucket_view and p.dtype == g.dtype) else g.to(p.dtype, copy=True)

    def _complete(self, group, i: int, work, recv: torch.Tensor):
        """Wait for bucket i's exchange, finish the tree for this process's chunk, and start gathering every
        chunk into self.reduced[i] (an all_to_all of this chunk to every process: process q's lands at chunk
        q); returns the gather's work (None where the result is there already: one addition, or `whole`)."""
        work.wait()
        if self.one_addition:
            return None  # recv is the root slot, r0 + r1
        bucket, c = self.buckets[i], self.part[i]
        for k, plan in enumerate(self.top_plans):
            pushed = recv[k * c:(k + 1) * c]
            for op in plan:
                src = pushed if op.src == _C.PUSHED else self.top_slots[op.src][i]
                fold_([self.top_slots[op.dst][i]], [src], 1.0, op.accumulate)
        if self.whole[i]:
            return None  # the top result slot is self.reduced[i]
        if i not in self._gather:
            self._gather[i] = torch.empty(bucket.padded, dtype=bucket.acc_dtype, device=bucket.device)
        send = self._gather[i]
        send.view(self.procs, c).copy_(self.top_slots[self.top_result][i].expand(self.procs, c))
        return dist.all_to_all_single(self.reduced[i], send, group=group, async_op=True)
