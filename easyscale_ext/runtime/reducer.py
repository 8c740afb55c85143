"""Canonical gradient reduction over N virtual workers spread over P processes.

Within a process, each local virtual worker's gradients are folded, as soon
as its backward is done, into a few partial-sum slots (the canonical tree's
nodes inside the process's range; FoldStack plans it). Across processes the
partials are exchanged reduce-scatter style: each process sends chunk q of
each of its local roots to process q, point to point, straight from the
slots; each process finishes the tree for its chunk and sends that chunk to
every other process (an all_gather's bytes, with no send buffer packed), the
result landing in the parameters' .grad (a buffer only for those whose .grad
cannot take it). With one virtual worker per process (N = P) nothing is
folded first: the gradients are sent from .grad as they are, and the top
weighs each by 1/N as the fold would (the same roundings), a pass over the
gradients fewer. Where the tree's cross-process part is one
addition (two processes, each owning one subtree of the root: P = 2 with N
even, for one) and each process folds several workers, a plain all_reduce of
the local roots computes exactly that addition (a + b == b + a bitwise), with
the bytes of one all_reduce. A small
bucket (what a process receives of it at most WHOLE_BYTES) is sent whole:
every process receives every local root and finishes the whole tree itself
(4 processes on 2 CPU cores, 72 KB: 2.4 against 5.0 ms); the tree's additions
are elementwise, so the bits are the chunked exchange's. On nodes of several
processes (`node_size`) a chunked bucket goes through two levels: reduced
inside each node into the node's roots, then across nodes, so that a node's
link carries a ring's bytes (`_plan_nodes`). Every plan is fixed at
construction, like the c10d Reducer's buckets.

Overlap, as in DDP: buckets of at most `bucket_cap_mb`, in reverse registration
order, one dtype each. During the step's last local worker's backward, a bucket
whose gradients are all ready is folded at once and its exchange starts
(asynchronously), strictly in bucket order so that every process issues the
same operations in the same order; `finish` starts the rest, then completes
them. On two levels a bucket's phase across nodes starts during backward too,
as the next bucket is ready (its phase inside the node waited for there), so
that the node's link carries it while backward computes the rest. Splitting
the gradients into buckets changes no element's association.
"""
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from .. import _C
from ..ops import acc_dtype, fold_, fold_plan_, plan_of

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

    def pieces(self) -> List[List[Tuple[int, int, int, int]]]:
        """Per chunk: the parameters' parts in it, as (parameter index, start in its flattened gradient, length,
        start in the chunk); the padding is in none."""
        out: List[List[Tuple[int, int, int, int]]] = [[] for _ in range(self.padded // self.chunk)]
        at = 0
        for k, p in enumerate(self.params):
            lo, hi = at, at + p.numel()
            for q in range(lo // self.chunk, -(-hi // self.chunk)):
                a, b = max(lo, q * self.chunk), min(hi, (q + 1) * self.chunk)
                if b > a:
                    out[q].append((k, a - lo, b - a, a - q * self.chunk))
            at = hi
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
                 bucket_cap_mb: float = 25.0, node_size: int = 0):
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

        # Cross-process plan: every process's local roots, in rank order, finished in one pass (fold_plan_).
        self.roots_per_proc = [len(_C.local_roots(a, b, self.n)) for a, b in self.ranges]
        top = _C.FoldStack(self.n)
        self.top_plan = plan_of([top.push(r.lo, r.hi) for a, b in self.ranges for r in _C.local_roots(a, b, self.n)])
        self.top_result = top.slots()[0]
        # One virtual worker per process (N = P, torch DDP's case): a chunked bucket's gradients go out as they are,
        # not folded first; the top weighs each by 1/N (fold_plan_'s scale) as the fold would, bit for bit. At P = 2
        # that beats the one addition's all_reduce, which needs the folded root and its copy into .grad.
        single = all(b - a == 1 for a, b in self.ranges)
        self.one_addition = self.roots_per_proc == [1, 1] and not single
        # Per bucket, what each process finishes of the tree: one chunk, or all of a small bucket (`whole`).
        exchanged, roots = self.procs > 1 and not self.one_addition, sum(self.roots_per_proc)
        self.whole = [exchanged and b.padded * roots * b.acc_dtype.itemsize <= WHOLE_BYTES for b in self.buckets]
        self.part = [b.padded if whole else b.chunk for b, whole in zip(self.buckets, self.whole)]
        # Where finish() leaves each bucket's reduced gradient, the same tensor every step: the local root (one
        # process; one addition), or a flat buffer the top writes (whole) or writes its chunk of, this process's
        # chunk q of a chunked bucket written by process q.
        self.reduced = [b.flat() if exchanged else self.slots[self.root_slots[0]][i]
                        for i, b in enumerate(self.buckets)]
        # A chunked bucket's result goes straight into the parameters' .grad where they can take it (direct[i][k]),
        # into self.reduced elsewhere: the top and the gather work on parameters' parts (pieces), the same on every
        # process whatever each one's .grad, so that sends and receives pair up.
        self.pieces = [b.pieces() if exchanged and not whole else None for b, whole in zip(self.buckets, self.whole)]
        self.direct = [[False] * len(b.params) for b in self.buckets]
        self.raw = [single and pieces is not None for pieces in self.pieces]
        self._plan_nodes(node_size if exchanged and 1 < node_size < self.procs and self.procs % node_size == 0 else 0)
        self._raw: Dict[int, List[torch.Tensor]] = {}  # per raw bucket: this step's gradients, flat, as sent
        self._zeros: Dict[int, torch.Tensor] = {}
        self.unused: List[str] = []
        # Per bucket and parameter: whether any local worker of this step produced a gradient.
        self.used = [[False] * len(b.params) for b in self.buckets]
        self._overlap: Optional[Tuple[int, Dict[int, str]]] = None  # (last leaf, names) while it runs backward
        self._folded = [False] * len(self.buckets)
        self._waiting = [len(b.params) for b in self.buckets]  # gradients not yet ready, per bucket
        self._ready = set()  # parameters whose gradient the last worker's backward has readied
        self._exchanges: List[Optional[_Pending]] = []  # started exchanges, in bucket order
        self._group = None
        self._pushed: Dict[int, List[torch.Tensor]] = {}  # per bucket, what the top adds: every root's part

    def _plan_nodes(self, g: int) -> None:
        """Two levels, where nodes of g consecutive processes (g of 1 < g < P, dividing P) share a fast link: a
        chunked bucket is cut into g lanes of `nodes` chunks; each process gathers its lane of its node's local
        roots and folds them into the node's roots (the canonical tree's nodes over the node's virtual workers),
        exchanges those with the processes of its local rank on the other nodes, finishes the tree's top for
        one chunk, and the chunks go back the same two ways. Between nodes travel a ring's bytes, (nodes - 1) /
        nodes of the bucket a node each way, where the one-level exchange sends g times that; the tree is the
        same, so are the bits. Process (node j, local rank l) finishes chunk l * nodes + j."""
        self.node_size = g
        if not g:
            return
        self.nodes, (self.node, self.local) = self.procs // g, divmod(self.rank, g)
        node_ranges = [(self.ranges[x * g][0], self.ranges[x * g + g - 1][1]) for x in range(self.nodes)]
        stack = _C.FoldStack(self.n)
        self.node_plan = plan_of([stack.push(r.lo, r.hi) for a, b in self.ranges[self.node * g:(self.node + 1) * g]
                                  for r in _C.local_roots(a, b, self.n)])
        self.node_results = stack.slots()
        self.roots_per_node = [len(_C.local_roots(a, b, self.n)) for a, b in node_ranges]
        top = _C.FoldStack(self.n)
        self.across_plan = plan_of([top.push(r.lo, r.hi) for a, b in node_ranges for r in _C.local_roots(a, b, self.n)])
        self.across_result = top.slots()[0]
        # every bucket is folded first (one leaf's fold is its scaled gradient), so that a node's roots are slots
        self.raw = [False] * len(self.buckets)
        self._across: Dict[int, Tuple[List[torch.Tensor], List[torch.Tensor]]] = {}  # per bucket: roots, top's in
        self._across_started: Dict[int, _Pending] = {}  # phases across nodes started during backward, by bucket

    @property
    def exchanging(self) -> bool:
        """Whether this step's exchange has begun (a bucket's exchange started)."""
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
            if self.node_size:
                self._start_across_before(i)

    def _start_across_before(self, i: int) -> None:
        """Two levels, during backward, as bucket i is ready: the phase across nodes of each bucket before it,
        whose phase inside the node has had a bucket's backward to finish (waited for: gloo's point-to-point work
        says it is complete only then), so that the node's link carries them while backward computes the rest."""
        for j in range(min(i, len(self._exchanges))):
            if j not in self._across_started and not self.whole[j]:
                self._exchanges[j].wait()
                self._exchanges[j] = _Pending([])  # waited: a gloo receive waited for again waits for another
                self._across_started[j] = self._start_across(self._group, j)

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
        if self.raw[i]:
            self._raw[i] = [g.view(-1).to(self.buckets[i].acc_dtype) for g in grads]
            self._folded[i] = True
            return
        for op in self.leaf_plans[local_index]:
            if op.src == _C.PUSHED:
                fold_(self.slot_views[op.dst][i], grads, 1.0 / self.n, op.accumulate)
            else:
                fold_([self.slots[op.dst][i]], [self.slots[op.src][i]], 1.0, True)
        self._folded[i] = True

    def _start_exchange(self, i: int) -> None:
        """Start bucket i's exchange: each process receives its chunk (or all, `whole`) of every other process's
        local roots, sent straight from the root slots."""
        if self.procs == 1:
            self._exchanges.append(None)
            return
        if self.one_addition:
            root = self.slots[self.root_slots[0]][i]
            self._exchanges.append(_Pending([dist.all_reduce(root, group=self._group, async_op=True)]))
            return
        if self.raw[i]:
            self._start_raw_exchange(i)
            return
        if self.node_size and not self.whole[i]:
            self._start_node_exchange(i)
            return
        c, whole, local = self.part[i], self.whole[i], [self.slots[s][i] for s in self.root_slots]
        if i not in self._pushed:
            self._pushed[i] = self._pushed_parts(i, local)
        pushed, sends, receives, at = self._pushed[i], {}, {}, 0
        for q, roots in enumerate(self.roots_per_proc):
            if q != self.rank:
                sends[q] = [part if whole else part[q * c:(q + 1) * c] for part in local]
                receives[q] = pushed[at:at + roots]
            at += roots
        self._exchanges.append(self._point_to_point(self._group, sends, receives, tag=4 * i))

    def _start_raw_exchange(self, i: int) -> None:
        """Bucket i's exchange with one virtual worker per process: each process receives the others' gradients'
        parts in its chunk, sent from their .grad."""
        bucket, grads, mine = self.buckets[i], self._raw[i], self.pieces[i][self.rank]
        if i not in self._pushed:  # where each other process's parts of this process's chunk land (kept)
            self._pushed[i] = [None if q == self.rank else torch.empty(self.part[i], dtype=bucket.acc_dtype,
                                                                       device=bucket.device)
                               for q in range(self.procs)]
        peers = [q for q in range(self.procs) if q != self.rank]
        sends = {q: [grads[k][a:a + n] for k, a, n, _ in self.pieces[i][q]] for q in peers}
        receives = {q: [self._pushed[i][q][at:at + n] for _, _, n, at in mine] for q in peers}
        self._exchanges.append(self._point_to_point(self._group, sends, receives, tag=4 * i))

    def _start_node_exchange(self, i: int) -> None:
        """Bucket i's first phase on two levels: each process of the node receives its lane of every local root
        of the node's processes (its own where they are, the others' in buffers kept)."""
        g, lane, local = self.node_size, self.part[i] * self.nodes, [self.slots[s][i] for s in self.root_slots]
        procs = range(self.node * g, (self.node + 1) * g)
        if i not in self._pushed:
            self._pushed[i] = [x for q in procs for x in (
                [part[self.local * lane:(self.local + 1) * lane] for part in local] if q == self.rank else
                torch.empty(self.roots_per_proc[q] * lane, dtype=self.buckets[i].acc_dtype,
                            device=self.buckets[i].device).split(lane))]
        sends, receives, at = {}, {}, 0
        for q in procs:
            if q != self.rank:
                sends[q] = [part[(q % g) * lane:(q % g + 1) * lane] for part in local]
                receives[q] = self._pushed[i][at:at + self.roots_per_proc[q]]
            at += self.roots_per_proc[q]
        self._exchanges.append(self._point_to_point(self._group, sends, receives, tag=4 * i))

    def _pushed_parts(self, i: int, local: List[torch.Tensor]) -> List[torch.Tensor]:
        """What bucket i's top adds, every process's roots in rank order: this process's own chunk of its local
        roots where they are, the others' in buffers their sends land in (kept: fresh ones cost page faults)."""
        bucket, c, out = self.buckets[i], self.part[i], []
        for q, roots in enumerate(self.roots_per_proc):
            if q == self.rank:
                out += [part if self.whole[i] else part[q * c:(q + 1) * c] for part in local]
            else:
                out += list(torch.empty(roots * c, dtype=bucket.acc_dtype, device=bucket.device).split(c))
        return out

    @staticmethod
    def _point_to_point(group, sends: Dict[int, List[torch.Tensor]], receives: Dict[int, List[torch.Tensor]],
                        tag: int) -> "_Pending":
        """Send and receive tensors with each peer, all at once. Point to point rather than an all_to_all: the
        parts go out from where they lie, with nothing packed into a send buffer (the gather's all_to_all packed
        a whole bucket each step); on gloo the transfer costs about the same (84 MB over 4 idle processes: 54 ms
        a phase against 48, the same CPU). Each bucket and phase has its own tag, so that messages of two
        exchanges in flight cannot be taken for each other."""
        ops = [dist.P2POp(dist.isend, t, group=group, tag=tag, group_peer=q) for q, ts in sends.items() for t in ts]
        ops += [dist.P2POp(dist.irecv, t, group=group, tag=tag, group_peer=q) for q, ts in receives.items()
                for t in ts]
        return _Pending(dist.batch_isend_irecv(ops))

    def finish(self, group, gradient_as_bucket_view: bool) -> None:
        """Complete the tree across the processes of `group` and write each param.grad. The same operations in
        the same order on every process: the exchanges not started yet, the used flags, the gathers."""
        self._group = group
        while len(self._exchanges) < len(self.buckets):
            self._start_exchange(len(self._exchanges))
        used = self._used_by_any_worker(group) if self.find_unused else [[True] * len(b.params) for b in self.buckets]
        exchanges, self._exchanges, self._group = self._exchanges, [], None  # the group is held weakly (ddp.py)
        across: Dict[int, Tuple[List[List[torch.Tensor]], _Pending]] = {}  # two levels: parts, phase across nodes
        gathers = [None if self.procs == 1 else self._complete(group, i, exchanges[i], used[i],
                                                               gradient_as_bucket_view, across)
                   for i in range(len(self.buckets))]
        # Two levels: every bucket's phases across nodes are in flight before any is waited for, so that a node's
        # link is not idle while a bucket's top is added or the next bucket's phase inside the node completes.
        back = {i: self._top_across(group, i, parts, pending) for i, (parts, pending) in across.items()}
        for i, pending in back.items():
            pending.wait()
            gathers[i] = self._gather_inside(group, i, across[i][0])
        for i in range(len(self.buckets)):
            if gathers[i] is not None:
                gathers[i].wait()
            self._write_grads(i, used[i], gradient_as_bucket_view)

    def _write_grads(self, i: int, used: List[bool], gradient_as_bucket_view: bool) -> None:
        """Bucket i's reduced gradient into its parameters' .grad (None for those no worker used), but where the
        exchange wrote it there."""
        bucket, direct = self.buckets[i], self.direct[i]
        for k, (p, g) in enumerate(zip(bucket.params, bucket.views(self.reduced[i]))):
            if direct[k]:
                direct[k] = False
            elif not used[k]:
                p.grad = None
            elif gradient_as_bucket_view and p.dtype == g.dtype:
                p.grad = g
            elif p.grad is not None and p.grad.layout == torch.strided and p.grad.shape == g.shape:
                p.grad.copy_(g)  # into the backward's own tensor, as DDP does: a fresh one costs page faults
            else:
                p.grad = g.to(p.dtype, copy=True)

    def _complete(self, group, i: int, exchange: "_Pending", used: List[bool], gradient_as_bucket_view: bool,
                  across: Dict[int, Tuple[List[List[torch.Tensor]], "_Pending"]]) -> Optional["_Pending"]:
        """Wait for bucket i's exchange, finish the tree for this process's chunk, and start sending that chunk
        to every other process (and receiving theirs); returns the gather's handle (None where the result is
        there already: one addition, or `whole`; or, on two levels, not yet: the phase across nodes started
        goes to `across`). The chunked result lands in each parameter's .grad where it can (`direct`), else in
        self.reduced[i]."""
        exchange.wait()
        if self.one_addition:
            return None  # the root slot holds r0 + r1
        if self.whole[i]:
            fold_plan_(self.reduced[i], self._pushed[i], self.top_plan, self.top_result)
            return None
        parts = self._destinations(i, used, gradient_as_bucket_view)
        if self.node_size:
            started = self._across_started.pop(i, None)
            across[i] = parts, started if started is not None else self._start_across(group, i)
            return None
        own = self._raw.pop(i) if self.raw[i] else None  # this process's gradients (out may be one of them)
        for (k, a, n, at), out in zip(self.pieces[i][self.rank], parts[self.rank]):
            if own is None:
                fold_plan_(out, [pushed[at:at + n] for pushed in self._pushed[i]], self.top_plan, self.top_result)
            else:
                pushed = [own[k][a:a + n] if q == self.rank else x[at:at + n] for q, x in enumerate(self._pushed[i])]
                fold_plan_(out, pushed, self.top_plan, self.top_result, 1.0 / self.n)
        peers = [q for q in range(self.procs) if q != self.rank]
        return self._point_to_point(group, {q: parts[self.rank] for q in peers}, {q: parts[q] for q in peers},
                                    tag=4 * i + 1)

    def _destinations(self, i: int, used: List[bool], gradient_as_bucket_view: bool) -> List[List[torch.Tensor]]:
        """Per chunk of bucket i, where its parameters' parts go: each parameter's .grad where it can take the
        result (`direct`), else its view of self.reduced[i]."""
        bucket, direct = self.buckets[i], self.direct[i]
        into = []  # each parameter's destination, flat
        for k, (p, view) in enumerate(zip(bucket.params, bucket.views(self.reduced[i]))):
            g = p.grad
            direct[k] = (used[k] and not gradient_as_bucket_view and g is not None and g.layout == torch.strided
                         and g.dtype == bucket.acc_dtype and g.shape == p.shape and g.is_contiguous())
            into.append(g.view(-1) if direct[k] else view.view(-1))
        return [[into[k][a:a + n] for k, a, n, _ in chunk] for chunk in self.pieces[i]]

    def _start_across(self, group, i: int) -> "_Pending":
        """Bucket i on two levels, after the phase inside the node: fold the node's roots of this process's lane
        and start exchanging their chunks with this lane's process on every other node."""
        nodes, j, c, bucket = self.nodes, self.node, self.part[i], self.buckets[i]
        if i not in self._across:  # the node's roots (this lane), and what the top adds, node by node (kept)
            roots = [torch.empty(c * nodes, dtype=bucket.acc_dtype, device=bucket.device) for _ in self.node_results]
            adds = [x for node, count in enumerate(self.roots_per_node) for x in (
                [r[j * c:(j + 1) * c] for r in roots] if node == j else
                torch.empty(count * c, dtype=bucket.acc_dtype, device=bucket.device).split(c))]
            self._across[i] = roots, adds
        roots, adds = self._across[i]
        for out, slot in zip(roots, self.node_results):
            fold_plan_(out, self._pushed[i], self.node_plan, slot)
        peers, starts = self._across_peers(), [sum(self.roots_per_node[:node]) for node in range(nodes)]
        return self._point_to_point(group, {q: [r[node * c:(node + 1) * c] for r in roots] for node, q in peers},
                                    {q: adds[starts[node]:starts[node] + self.roots_per_node[node]]
                                     for node, q in peers}, tag=4 * i + 1)

    def _top_across(self, group, i: int, parts: List[List[torch.Tensor]], pending: "_Pending") -> "_Pending":
        """Once bucket i's roots of every node have come: the top of this process's chunk, then start sending it
        to this lane's process on every other node (and receiving theirs)."""
        pending.wait()
        mine = self.local * self.nodes + self.node
        for (k, a, n, at), out in zip(self.pieces[i][mine], parts[mine]):
            fold_plan_(out, [x[at:at + n] for x in self._across[i][1]], self.across_plan, self.across_result)
        peers = self._across_peers()
        return self._point_to_point(group, {q: parts[mine] for _, q in peers},
                                    {q: parts[self.local * self.nodes + node] for node, q in peers}, tag=4 * i + 2)

    def _across_peers(self) -> List[Tuple[int, int]]:
        """(node, rank) of this lane's process on every other node."""
        return [(node, node * self.node_size + self.local) for node in range(self.nodes) if node != self.node]

    def _gather_inside(self, group, i: int, parts: List[List[torch.Tensor]]) -> "_Pending":
        """Bucket i's lanes, each finished across nodes, go to every process of the node (the handle returned)."""
        g, nodes, j = self.node_size, self.nodes, self.node

        def lane(local: int) -> List[torch.Tensor]:
            return [t for node in range(nodes) for t in parts[local * nodes + node]]
        others = {j * g + local: local for local in range(g) if local != self.local}
        return self._point_to_point(group, {q: lane(self.local) for q in others},
                                    {q: lane(local) for q, local in others.items()}, tag=4 * i + 3)


class _Pending:
    """The handles of one bucket's collectives or sends and receives, waited for together."""

    def __init__(self, works):
        self.works = works

    def wait(self) -> None:
        for work in self.works:
            work.wait()
