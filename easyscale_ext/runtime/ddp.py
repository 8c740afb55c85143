"""EasyScaleDDP: DistributedDataParallel over N virtual workers on P <= N processes.

One training step, for a process owning virtual ranks [lo, hi):

    for v, batch in step_batches:            # from VirtualDataLoader
        _switch_in(v)                         # its RNG streams and buffers; grads cleared
        loss(module(batch)).backward()
        _switch_out(v)                        # save its context; fold its grads (reducer)
    _finish_step()                            # canonical tree across processes -> param.grad;
                                              # virtual rank 0's buffers to every process
    optimizer.step()

`workers(step_batches)` runs that loop's bookkeeping around the user's code.
With one virtual worker per process, plain DDP loops work unchanged: an
autograd callback finishes the step after backward, as DDP's Reducer does.

One file of about 500 lines, as c10d's Reducer is one: the step is a single state machine (placement,
switching workers in and out, finishing the step, contexts for scale events) whose fields every part
reads; split, a reader would follow it across files. What DDP offers beyond the step (its module checks,
pickling and deepcopy, its logging data) is the mixin in ddp_parity.py.
"""
import atexit
import collections
import contextlib
import os
import statistics
import time
import weakref
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn

if dist.is_available() and not dist.is_initialized():
    # torch.distributed.nn binds `group=group.WORLD` defaults when first imported (torch.compile
    # and use_deterministic_algorithms import it): imported once a group exists, it would keep
    # that group alive into interpreter shutdown, which destroy_process_group() must prevent.
    import torch.distributed.nn  # noqa: F401

from .. import determinism
from . import rng
from .._C import ContextStore
from ..placement import even_ranges
from .loader import VirtualDataLoader
from .ddp_parity import DDPLogging, DDPParity, backend_info, check_module
from .freeze import Freezer
from .reducer import CanonicalReducer

_PROCESS = -1  # context-store worker id for process-level snapshots
_OPEN_STEP = ("the last step is still open: its `for batch in ddp.workers(...)` loop did not run to the end "
              "(a break, or zip() stopping early), so its gradients were never reduced; iterate it to completion")


def end_process_group_at_exit() -> None:
    """Destroy the default process group when the interpreter exits, if it is alive then. For the frameworks that
    create the group and leave it alive (Accelerate; Lightning unless the backend is NCCL): a gloo group that lives
    into interpreter shutdown can abort a finished run there (pytorch/pytorch#190489). Registered once, however
    often called; it runs before the handlers registered earlier, after those registered later."""
    atexit.unregister(_end_process_group)
    atexit.register(_end_process_group)


def _end_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


class EasyScaleDDP(DDPParity, nn.Module):
    """DistributedDataParallel over `virtual_world_size` (N) virtual workers on P <= N processes, whose trained
    model is bitwise the same for every P.

    It takes DDP's constructor arguments (`mixed_precision` and `device_mesh` are refused; `device_ids` names one
    device). Each process runs a contiguous range of virtual ranks (`virtual_ranks=(lo, hi)`, default an even
    split), one after another in every step, each with its own data, RNG streams and buffers; their gradients are
    summed in one canonical order. `determinism_level`: "D0" (consistent data, RNG and reduction), "D1" (plus
    deterministic kernels and `num_threads` intra-op threads) or "D2" (plus the instruction-set floor `isa`, so
    that processes on different machines agree). `freezer`: a layer-freezing policy (Freezer). `node_size`:
    processes a node, ranks consecutive (default $LOCAL_WORLD_SIZE, which torchrun sets): where it divides P
    into several nodes, gradients are reduced inside each node first and between nodes travel a ring
    all-reduce's bytes, not node_size times more; the bits are the same.

    A step runs every local virtual worker's micro-batch inside :meth:`workers`; with one virtual worker per
    process a plain DDP loop works unchanged. Saved as `train.py`, `torchrun --nproc-per-node 1 train.py` (N = 4
    on P = 1), `--nproc-per-node 2` and `--nproc-per-node 4` print the same SHA-256:

    .. code-block:: python

        import torch
        import torch.distributed as dist
        import torch.nn.functional as F
        from torch import nn
        from torch.utils.data import TensorDataset

        import easyscale_ext as es

        dist.init_process_group("gloo")
        torch.manual_seed(0)
        data = TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
        model = es.EasyScaleDDP(nn.Linear(8, 2), virtual_world_size=4)
        loader = model.data_loader(data, batch_size=16, shuffle=True, seed=0)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step_batches in loader:
            for x, y in model.workers(step_batches):
                F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        if dist.get_rank() == 0:
            print(es.state_sha256(model, opt))
        dist.destroy_process_group()
    """

    def __init__(self, module: nn.Module, device_ids=None, output_device=None, dim: int = 0,
                 broadcast_buffers: bool = True, init_sync: bool = True, process_group=None,
                 bucket_cap_mb: Optional[float] = None, find_unused_parameters: bool = False,
                 check_reduction: bool = False, gradient_as_bucket_view: bool = False, static_graph: bool = False,
                 delay_all_reduce_named_params=None, param_to_hook_all_reduce=None, mixed_precision=None,
                 device_mesh=None, *, virtual_world_size: Optional[int] = None,
                 virtual_ranks: Optional[Tuple[int, int]] = None, determinism_level="D0", isa: Optional[str] = None,
                 num_threads: int = 1, context_capacity_bytes: int = 8 << 30, freezer: Optional[Freezer] = None,
                 node_size: Optional[int] = None):
        super().__init__()
        for name, value in (("delay_all_reduce_named_params", delay_all_reduce_named_params),
                            ("param_to_hook_all_reduce", param_to_hook_all_reduce),
                            ("mixed_precision", mixed_precision), ("device_mesh", device_mesh)):
            if value is not None:
                raise ValueError(f"EasyScaleDDP does not support {name}; leave it unset")
        if device_ids is not None and len(device_ids) != 1:
            raise ValueError("device_ids must list exactly one device (one process per device), as in DDP")
        check_module(module)  # DDP's checks, before any collective
        self.module = module
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        # Accepted for DDP compatibility, no effect here: output_device and dim (no
        # scatter: one device per process), check_reduction (deprecated in DDP),
        # static_graph (every plan is fixed at construction). bucket_cap_mb (default
        # 25) sizes the buckets exchanged during the last worker's backward, as in DDP.
        self.bucket_cap_mb = 25.0 if bucket_cap_mb is None else float(bucket_cap_mb)
        if node_size is None:
            node_size = int(os.environ.get("LOCAL_WORLD_SIZE") or 0)
        if node_size < 0:
            raise ValueError(f"node_size must be >= 0 (0: one level), got {node_size}")
        self.node_size = node_size
        self.determinism_level = determinism.parse(determinism_level)
        self.isa = determinism.job_isa(self.determinism_level, isa)

        distributed = dist.is_available() and dist.is_initialized()
        if virtual_world_size is None:
            virtual_world_size = dist.get_world_size(process_group) if distributed else 1
        if virtual_world_size < 1:
            raise ValueError(f"virtual_world_size must be >= 1, got {virtual_world_size}")
        self.world_size = virtual_world_size
        self.num_threads = num_threads
        self._context_capacity_bytes = context_capacity_bytes
        self._trainable = [p for p in module.parameters() if p.requires_grad]
        self._param_names = {id(p): n for n, p in module.named_parameters()}
        self.freezer = freezer
        self._layer_of = freezer.bind(module, self._trainable) if freezer is not None else [-1] * len(self._trainable)
        self._place((process_group or dist.group.WORLD) if distributed else None, virtual_ranks)
        self._buffer_list = list(module.buffers())  # fixed at construction, like DDP's
        self.device = next(module.parameters()).device
        self._cuda = self.device.type == "cuda"
        self._rng_device = self.device if self._cuda else None  # whose CUDA generator a worker's context holds
        determinism.apply(self.determinism_level, num_threads, self._cuda, self.isa)
        if distributed and init_sync:
            self.broadcast_state(src=0)
        self._location = "pinned" if self._cuda else "host"
        self._open_store(None)
        # Local workers with gradients kept under no_sync(): in their contexts, or in p.grad for a process's
        # only worker (as a DDP rank keeps them; its exported context carries them too).
        self._accumulating = set()
        self._in_step = False
        self._implicit = False  # a plain DDP loop's step, finished by the autograd callback
        self.require_backward_grad_sync = True  # DDP's: False under no_sync(), whose steps accumulate
        self._current: Optional[int] = None
        self._callback_queued = False
        self._worker_seconds = collections.deque(maxlen=16)  # forward + backward per worker, recent steps
        self._warmed_up = False  # the first step pays one-off costs (allocations, oneDNN primitives): not a speed
        # Called with every local worker's context once a synced step's backward is over and before its
        # exchange can complete anywhere (ElasticMember replicates them there to survive a dead process).
        self.on_step_contexts: Optional[Callable[[Dict[int, bytes]], None]] = None
        self.synced_steps = 0  # steps whose reduced gradients this process has handed to the caller
        self._log = DDPLogging(self, self._trainable, self._backend_info)
        for p in self._trainable:
            p.register_post_accumulate_grad_hook(self._on_grad_ready)

    def _open_store(self, contexts: Optional[Dict[int, bytes]]) -> None:
        """A context store holding the given contexts of local workers (an unpickled copy's), or fresh
        ones: every virtual worker starts from the process's RNG, as every DDP rank starts from one seed."""
        self.store = ContextStore(self._context_capacity_bytes, torch.get_num_threads())
        self._resident = self.local_ranks[0]
        if contexts is not None:
            for data in contexts.values():
                self.store.deserialize(data, self.device.index if self._cuda else -1)
            return
        for v in self.local_ranks[1:]:
            self._save(v, "rng", rng.capture(self._rng_device))
            if not self.broadcast_buffers and self._module_buffers():
                self._save(v, "buffers", self._module_buffers())

    # -- setup -----------------------------------------------------------------
    @property
    def process_group(self):
        """The process group of the job's processes; None when it runs in one process.

        Held weakly, so that dist.destroy_process_group() ends the group at once, as
        with DDP: a gloo group that lives on into interpreter shutdown can abort the
        process there (a worker thread still releasing a finished collective cannot
        take the GIL; pytorch/pytorch#190489).
        """
        if self._group is None:
            return None
        group = self._group()
        if group is None:
            raise RuntimeError("this EasyScaleDDP's process group was destroyed (it is held weakly: keep a "
                               "reference to a group you built outside torch.distributed's registry); to go "
                               "on training, create a new one and call reconfigure() with it")
        return group

    @process_group.setter
    def process_group(self, group) -> None:
        self._group = weakref.ref(group) if group is not None else None

    def _place(self, process_group, virtual_ranks) -> None:
        """Fix the process group and this process's virtual ranks, checked with every other process,
        and plan the gradient reduction for that placement."""
        self.process_group = process_group
        procs = dist.get_world_size(process_group) if process_group is not None else 1
        self.rank = dist.get_rank(process_group) if process_group is not None else 0
        if self.world_size < procs:
            raise ValueError(f"virtual_world_size={self.world_size} is smaller than the {procs} processes; "
                             "every process needs at least one virtual worker: raise virtual_world_size or "
                             "start fewer processes")
        mine = tuple(virtual_ranks) if virtual_ranks is not None else even_ranges(self.world_size, procs)[self.rank]
        freezing = (type(self.freezer).__name__, self.freezer.frozen) if self.freezer is not None else None
        setting = (self.world_size, self.determinism_level, self.isa, self.num_threads, self.broadcast_buffers,
                   freezing, [(n, tuple(p.shape), str(p.dtype)) for n, p in self.module.named_parameters()],
                   self.node_size)
        self.ranges = self._agree(setting, mine, procs)
        self.local_ranks = list(range(*self.ranges[self.rank]))
        self._backend_info = backend_info(process_group)
        if len(self.local_ranks) > 1 and any(isinstance(m, nn.SyncBatchNorm) for m in self.module.modules()):
            raise ValueError("SyncBatchNorm cannot run several virtual workers in one process (its statistics "
                             "would mix workers): use plain BatchNorm layers, or one virtual worker per process")
        self._plan()

    def _plan(self, params: Optional[List[nn.Parameter]] = None) -> None:
        """Plan the gradient reduction for this placement, over the parameters the freezer has not
        frozen (or `params`). A frozen parameter gets no gradient (backward stops before the frozen prefix),
        is not exchanged, and keeps grad None so optimizers skip it; every process freezes at the same step."""
        self.params = self._active_params() if params is None else params
        kept = {id(p) for p in self.params}
        for p in self._trainable:
            if id(p) not in kept:
                p.requires_grad_(False)
                p.grad = None
        self.reducer = CanonicalReducer(self.params, self.world_size, self.ranges, self.rank,
                                        self.find_unused_parameters, self.bucket_cap_mb, self.node_size)
        self._freeze_pending = False
        # The freezer's input, fixed with the plan: views of the reduced buckets and their layers, per dtype
        # (an unused parameter's reduced gradient is zeros: it adds nothing to its layer's norm).
        layer = {id(p): i for p, i in zip(self._trainable, self._layer_of)}
        by_dtype: Dict[torch.dtype, Tuple[list, list]] = {}
        for bucket, flat in zip(self.reducer.buckets, self.reducer.reduced):
            grads, layers = by_dtype.setdefault(flat.dtype, ([], []))
            grads += bucket.views(flat)
            layers += [layer[id(p)] for p in bucket.params]
        self._reduced_by_layer = ([g for g, _ in by_dtype.values()], [lay for _, lay in by_dtype.values()])

    def reconfigure(self, process_group, contexts: Dict[int, bytes], virtual_ranks=None) -> None:
        """Move to a new process group between steps (a scale event): every member calls it.

        `contexts` must hold the context of every virtual worker this process
        owns afterwards; the reduction plan is rebuilt for the new placement.
        """
        if self._in_step:
            raise RuntimeError("reconfigure between steps only")
        self._place(process_group, virtual_ranks)
        for v in list(self.store.workers()):
            if v >= 0 and v not in self.local_ranks:
                self.store.erase(v)
        self.import_contexts(contexts)

    def _agree(self, setting, mine, procs) -> List[Tuple[int, int]]:
        if procs == 1:
            if mine != (0, self.world_size):
                raise ValueError(f"a single process must own all virtual ranks (0, {self.world_size}), got {mine}")
            return [mine]
        gathered = [None] * procs
        dist.all_gather_object(gathered, (setting, mine), group=self.process_group)
        for r, (theirs, _) in enumerate(gathered):
            if theirs[0] != setting[0]:
                raise ValueError(f"virtual_world_size differs between processes: {setting[0]} here, {theirs[0]} "
                                 f"on rank {r}; every process must pass the same N")
            if theirs != setting:
                raise ValueError(f"process {r} runs a different job setting than process {self.rank} "
                                 "(determinism level, D2's isa, num_threads, broadcast_buffers, freezer, model "
                                 "parameters or node_size, by default $LOCAL_WORLD_SIZE); start every process with "
                                 "the same arguments")
        ranges = [tuple(m) for _, m in gathered]
        at = 0
        for r, (lo, hi) in enumerate(ranges):
            if lo != at or hi <= lo:
                raise ValueError(f"virtual ranks must be contiguous, non-empty and in process order; got {ranges}")
            at = hi
        if at != self.world_size:
            raise ValueError(f"virtual ranks {ranges} do not cover 0..{self.world_size - 1}")
        return ranges

    def broadcast_state(self, src: int = 0) -> None:
        """Every process takes process `src`'s parameters and buffers (construction, scale events)."""
        self._broadcast(list(self.module.parameters()) + list(self.module.buffers()), src)

    def _broadcast(self, tensors: List[torch.Tensor], src: int) -> None:
        if tensors:
            tensors = [t.detach() for t in tensors]
            dist._broadcast_coalesced(self.process_group, tensors, 250 * 1024 * 1024, src)

    def _module_buffers(self) -> List[torch.Tensor]:
        return self._buffer_list

    def _become(self, v: int) -> None:
        """Make the process virtual worker v: its RNG streams and, unless broadcast, its buffers.

        Between steps the process is its first virtual worker, as a DDP rank is its own: what
        state_dict(), evaluation, checkpoints and randomness drawn outside the step see.
        """
        rng.restore(self.store.load(v, "rng"), self._rng_device)
        if self._module_buffers() and not self.broadcast_buffers:
            self.store.restore(v, "buffers", self._module_buffers())
        self._resident = v

    def _save(self, worker: int, name: str, tensors: List[torch.Tensor]) -> None:
        self.store.save(worker, name, tensors, self._location if any(t.is_cuda for t in tensors) else "host")

    def _keep_grads(self, v: int) -> None:
        """p.grad into worker v's context ("grads"), with which parameters have one."""
        grads = [p.grad.detach().contiguous() if p.grad is not None else torch.zeros_like(p) for p in self.params]
        present = torch.tensor([p.grad is not None for p in self.params], device=self.device)
        self._save(v, "grads", [present] + grads)
        # A CUDA save copies on the store's side stream: freed now, these tensors' memory must not be reused
        # by the current stream's next kernels before the copy has read it.
        self.store.order_after_saves(grads)

    def _take_kept_grads(self, v: int) -> None:
        present, *grads = self.store.load(v, "grads")
        for p, g, has in zip(self.params, grads, present.tolist()):
            p.grad = g if has else None
        self.store.erase(v, "grads")

    # -- the step ---------------------------------------------------------------
    def _begin_step(self) -> None:
        if self._in_step and not self._implicit:
            raise RuntimeError(_OPEN_STEP)
        self._in_step = True
        self._folded = 0
        self._log.step_begins(self)
        if self._freeze_pending:
            self._plan()
        if len(self.local_ranks) > 1 and self.broadcast_buffers and self._module_buffers():
            self._save(_PROCESS, "step_buffers", self._module_buffers())
            # The first worker's forward updates these buffers in place: not before the copy is done.
            self.store.order_after_saves(self._module_buffers())

    def _switch_in(self, v: int) -> None:
        if v != self.local_ranks[self._folded]:
            raise RuntimeError(f"virtual worker {v} out of order: this step expects {self.local_ranks[self._folded]}")
        if self._resident != v:  # not the step's first worker: that one is resident between steps
            self._become(v)
            if self._module_buffers() and self.broadcast_buffers:
                self.store.restore(_PROCESS, "step_buffers", self._module_buffers())
        if len(self.local_ranks) > 1:  # alone in its process a worker accumulates like a DDP rank
            for p in self.params:
                p.grad = None
            if v in self._accumulating:  # its gradients from steps run under no_sync()
                self._take_kept_grads(v)
                self._accumulating.discard(v)
        if self.require_backward_grad_sync and v == self.local_ranks[-1]:  # exchange buckets during its backward
            self.reducer.overlap_next_backward(self._folded, self._param_names, self.process_group)
        self._current = v
        self._log.worker_begins()

    def _switch_out(self, v: int) -> None:
        self._log.backward_ends()
        many = len(self.local_ranks) > 1
        if many:
            self._save(v, "rng", rng.capture(self._rng_device))
            buffers = self._module_buffers()
            if buffers and (not self.broadcast_buffers or v == 0):
                self._save(v, "buffers", buffers)
        if self.require_backward_grad_sync:
            self.reducer.fold_worker(self._folded, self._param_names)
            self._accumulating.discard(v)
        else:  # under no_sync(): keep this worker's gradients until a synced step
            if many:
                self._keep_grads(v)
            self._accumulating.add(v)
        self._folded += 1
        self._current = None

    def _finish_step(self) -> None:
        if self.require_backward_grad_sync:
            if self.on_step_contexts is not None:
                self.on_step_contexts(self._contexts())
            self._log.exchange_begins()
            self.reducer.finish(self.process_group, self.gradient_as_bucket_view)
            self._log.exchange_ends(self)
            if self.freezer is not None:
                self._freeze_pending = self.freezer.after_step(*self._reduced_by_layer)
        buffers = self._module_buffers()
        first = self.local_ranks[0]
        if self._resident != first:
            if buffers and self.broadcast_buffers and first == 0:
                self.store.restore(0, "buffers", buffers)  # rank 0 sends virtual rank 0's
            self._become(first)
        self.broadcast_buffers_from_rank0()  # every process continues from virtual rank 0's buffers
        self._in_step = False
        if self.require_backward_grad_sync:
            self.synced_steps += 1

    def abandon_step(self) -> None:
        """Drop the step in progress after a failed collective: gradients, the reducer's exchange state and
        the open step; the contexts must then be replaced (reconfigure)."""
        self._in_step = self._implicit = self._callback_queued = False
        self._current = None
        self._folded = 0
        for p in self._trainable:
            p.grad = None
        self._plan()

    # -- layer freezing ------------------------------------------------------------------------
    def _active_params(self) -> List[nn.Parameter]:
        frozen = self.freezer.frozen if self.freezer is not None else 0
        return [p for p, layer in zip(self._trainable, self._layer_of) if not 0 <= layer < frozen]

    def freezer_state(self) -> Optional[dict]:
        return self.freezer.state_dict() if self.freezer is not None else None

    def load_freezer_state(self, state: Optional[dict]) -> None:
        """Adopt a freezer state (checkpoint, scale event) and freeze its prefix at once."""
        if (state is None) != (self.freezer is None):
            raise ValueError("the saved job " + ("froze layers but this one has no freezer" if state is not None
                                                 else "had no freezer but this one has") +
                             ": build EasyScaleDDP with the same freezer= as the job that saved it")
        if state is not None:
            self.freezer.load_state_dict(state)
            self._plan()

    # -- contexts leaving and entering the process (checkpoints, scaling) ---------------
    def fingerprint(self) -> list:
        """What a checkpoint must match: parameter and buffer names, shapes and dtypes."""
        return [[n, list(t.shape), str(t.dtype)] for n, t in self.module.state_dict().items()]

    def export_contexts(self) -> Dict[int, bytes]:
        """Every local virtual worker's context as bytes (RNG streams, and buffers unless broadcast)."""
        if self._in_step:
            raise RuntimeError(_OPEN_STEP)
        return self._contexts()

    def _contexts(self) -> Dict[int, bytes]:
        # the resident worker's state lives in the process; virtual rank 0's buffers are the job's when broadcast
        self._save(self._resident, "rng", rng.capture(self._rng_device))
        if self._module_buffers() and (not self.broadcast_buffers or self._resident == 0):
            self._save(self._resident, "buffers", self._module_buffers())
        # A process's only worker keeps its gradients in p.grad: into its context for the bytes only.
        carry_grads = len(self.local_ranks) == 1 and self._resident in self._accumulating
        if carry_grads:
            self._keep_grads(self._resident)
        contexts = {v: self.store.serialize(v) for v in self.local_ranks}
        if carry_grads:
            self.store.erase(self._resident, "grads")
        return contexts

    def import_contexts(self, contexts: Dict[int, bytes]) -> None:
        """Adopt contexts for this process's virtual workers; the next switch restores them."""
        for v in self.local_ranks:
            if v not in contexts:
                raise ValueError(f"no context given for local virtual worker {v}")
            self.store.erase(v)
            if self.store.deserialize(contexts[v], self.device.index if self._cuda else -1) != v:
                raise ValueError(f"the context given for virtual worker {v} belongs to another worker")
        self._accumulating = {v for v in self.local_ranks if self.store.contains(v, "grads")}
        for p in self.params:  # gradients kept from before belong to the old placement
            p.grad = None
        if len(self.local_ranks) == 1 and self._accumulating:
            self._take_kept_grads(self.local_ranks[0])
        if self.broadcast_buffers and self.local_ranks[0] == 0 and self.store.contains(0, "buffers"):
            self.store.restore(0, "buffers", self._module_buffers())  # the buffers every process continues from
        self._become(self.local_ranks[0])

    def broadcast_buffers_from_rank0(self) -> None:
        """With broadcast_buffers, every process takes process 0's (virtual rank 0's) buffers."""
        if self.broadcast_buffers and self._module_buffers() and self.process_group is not None:
            self._broadcast(self._module_buffers(), src=0)

    # -- user-facing ---------------------------------------------------------------
    def workers(self, step_batches: Iterable[Tuple[int, object]]) -> Iterator[object]:
        """Run one step's virtual workers: yields each local worker's batch with its context switched in.

        The caller runs forward and backward on each yielded batch; after the
        last one, param.grad holds the reduced gradient, ready for optimizer.step().
        """
        batches = list(step_batches)
        ranks = [v for v, _ in batches]
        if ranks != self.local_ranks:
            raise ValueError(f"this process runs virtual ranks {self.local_ranks}, got batches for {ranks}; "
                             "build the loader with ddp.data_loader(...)")
        self._begin_step()
        spans = []
        for v, batch in batches:
            self._switch_in(v)
            start = self._clock()
            yield batch
            spans.append((start, self._clock()))
            self._switch_out(v)
        self._finish_step()
        if self._warmed_up:
            if self._cuda:
                spans[-1][1].synchronize()
                compute = sum(start.elapsed_time(end) for start, end in spans) / 1e3
            else:
                compute = sum(end - start for start, end in spans)
            self._worker_seconds.append(compute / len(batches))
        self._warmed_up = True

    def _clock(self):
        """Now, for a worker's compute time: on CUDA an event on the current stream (the worker's kernels, not
        their launches; no wait for other streams, such as the exchange's), else the host clock."""
        if not self._cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def seconds_per_worker(self) -> Optional[float]:
        """Median forward + backward time of one local virtual worker over recent steps (None before
        the second step): the speed a Balancer sizes this process's share of the virtual workers by."""
        return statistics.median(self._worker_seconds) if self._worker_seconds else None

    def forward(self, *inputs, **kwargs):
        if self._current is None and torch.is_grad_enabled() and self.module.training:
            if len(self.local_ranks) > 1:
                raise RuntimeError(f"this process runs {len(self.local_ranks)} virtual workers: run each "
                                   "micro-batch inside `for batch in ddp.workers(step_batches)`")
            # One virtual worker per process: a plain DDP loop; the autograd
            # callback finishes the step after backward.
            self._begin_step()
            self._switch_in(self.local_ranks[0])
            self._implicit = True
        timed = self._log.sampled and self._current is not None
        if timed:
            self._log.forward_begins()
        out = self.module(*inputs, **kwargs)
        if timed:
            self._log.forward_ends()
        return out

    def _on_grad_ready(self, param) -> None:
        self.reducer.grad_ready(param)
        if self._log.sampled:
            self._log.grad_ready(param, self.reducer.exchanging)
        if self._implicit and not self._callback_queued:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_implicit)

    def _finish_implicit(self) -> None:
        self._callback_queued = False
        self._implicit = False
        self._switch_out(self.local_ranks[0])
        self._finish_step()

    @contextlib.contextmanager
    def no_sync(self):
        """Skip the gradient reduction, as DDP's: each virtual worker's gradients accumulate (kept in its
        context while other workers run) until the next step outside no_sync() reduces them."""
        old, self.require_backward_grad_sync = self.require_backward_grad_sync, False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def data_loader(self, dataset, batch_size: int, shuffle: bool = True, seed: int = 0, drop_last: bool = False,
                    **kwargs) -> VirtualDataLoader:
        """A loader giving each of this process's virtual workers its DistributedSampler share.

        Without a `generator`, a DataLoader draws its base seed from the global RNG at every pass
        over the data: each virtual worker draws it from its own stream, as each DDP rank does.
        """
        draws = "generator" not in kwargs
        return VirtualDataLoader(dataset, batch_size, self.world_size, self.local_ranks, shuffle=shuffle,
                                 seed=seed, drop_last=drop_last,
                                 on_epoch_start=self._draw_base_seeds if draws else None, **kwargs)

    def _draw_base_seeds(self) -> None:
        """torch.utils.data.DataLoader's base-seed draw, on every local virtual worker's CPU stream."""
        for v in self.local_ranks:
            if v == self._resident:
                torch.empty((), dtype=torch.int64).random_()
                continue
            states = self.store.load(v, "rng")
            stream = torch.Generator()
            stream.set_state(states[0])
            torch.empty((), dtype=torch.int64).random_(generator=stream)
            states[0] = stream.get_state()
            self._save(v, "rng", states)
