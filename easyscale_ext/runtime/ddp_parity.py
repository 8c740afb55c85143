"""What EasyScaleDDP shares with torch's DistributedDataParallel beyond the step itself.

- DDP's checks of the wrapped module (`check_module`): they raise before any collective, as DDP's do.
- Pickling (`torch.save(model)`) and `copy.deepcopy(model)` (EMA, best-model snapshots), as DDP: the
  state leaves out the process group and the native objects (context store, reduction plan); the copy
  takes the default process group, without collectives, and rebuilds them (`DDPParity.__setstate__`).
  The local virtual workers' contexts (RNG streams, unbroadcast buffers) travel as bytes, so a copy on the
  same rank goes on with the same bits; gradients do not, as they do not with DDP (nor those kept under
  `no_sync()`).
- DDP's logging interface (`_get_ddp_logging_data`, `_set_ddp_runtime_logging_sample_rate`): the
  construction data of c10d's Logger, and its runtime statistics sampled as c10d samples them (the
  first 10 synced steps, then every `sample_rate`-th), measured on the host clock.

The step's state machine stays in ddp.py; `DDPParity` is its mixin.
"""
import os
import time
from typing import Dict, List, Optional

import torch
import torch.distributed as dist
from torch import nn

from .. import determinism

# c10d's Reducer: kDDPRuntimeLoggingSampleRate, and the number of first iterations always sampled.
DEFAULT_SAMPLE_RATE = 100
_ALWAYS_SAMPLED = 10

# c10d's Logger names dtypes by caffe2's TypeMeta.
_DTYPE_NAMES = {torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half",
                torch.bfloat16: "c10::BFloat16", torch.complex64: "c10::complex<float>",
                torch.complex128: "c10::complex<double>"}

# Attributes rebuilt on unpickling rather than pickled: the process group (held weakly), the native
# objects and what is keyed by the originals' ids, the elastic replication hook, the logging state.
_REBUILT = ("_group", "store", "reducer", "_param_names", "_reduced_by_layer", "on_step_contexts",
            "_log", "_backend_info")

_PICKLE_GROUP = ("DDP Pickling/Unpickling are only supported when using DDP with the default process group. "
                 "That is, when you have called init_process_group and have not passed process_group argument "
                 "to DDP constructor")


def check_module(module: nn.Module) -> None:
    """DistributedDataParallel's checks of the module it wraps (run before any collective)."""
    params = list(module.parameters())
    if not any(p.requires_grad for p in params):
        raise RuntimeError("EasyScaleDDP, like DistributedDataParallel, is not needed when a module doesn't have "
                           "any parameter that requires a gradient.")
    if any(isinstance(p, nn.parameter.UninitializedParameter) for p in params):
        raise RuntimeError("Modules with uninitialized parameters can't be used with `EasyScaleDDP` (nor "
                           "`DistributedDataParallel`). Run a dummy forward pass to correctly initialize the modules")


def backend_info(group) -> Dict[str, object]:
    """The process group's part of DDP's logging data, taken while the group is alive (held weakly)."""
    if group is None:
        return {"backend_name": "none"}
    out: Dict[str, object] = {"backend_name": dist.get_backend(group)}
    if out["backend_name"] == "gloo":
        try:
            out["gloo_num_threads"] = int(group._get_backend(torch.device("cpu")).options._threads)
        except (AttributeError, RuntimeError, TypeError):
            pass
    return out


def _env(name: str) -> str:
    return os.environ.get(name, "N/A")


def _environment(backend: str) -> Dict[str, str]:
    """The environment variables c10d's Logger records, read at construction as it reads them."""
    out = {"master_port": _env("MASTER_PORT"), "master_addr": _env("MASTER_ADDR"),
           "torch_distributed_debug": _env("TORCH_DISTRIBUTED_DEBUG"),
           "cuda_visible_devices": _env("CUDA_VISIBLE_DEVICES")}
    if backend == "gloo":
        out.update(gloo_socket_ifname=_env("GLOO_SOCKET_IFNAME"), gloo_device_transport=_env("GLOO_DEVICE_TRANSPORT"))
    if backend == "nccl":
        out.update(nccl_socket_ifname=_env("NCCL_SOCKET_IFNAME"), nccl_blocking_wait=_env("TORCH_NCCL_BLOCKING_WAIT"),
                   nccl_async_error_handling=_env("TORCH_NCCL_ASYNC_ERROR_HANDLING"), nccl_debug=_env("NCCL_DEBUG"),
                   nccl_nthreads=_env("NCCL_NTHREADS"), nccl_ib_timeout=_env("NCCL_IB_TIMEOUT"))
    return out


def _bucket_bytes(ddp) -> List[int]:
    return [sum(p.numel() * p.element_size() for p in b.params) for b in ddp.reducer.buckets]


class DDPLogging:
    """c10d's Logger for EasyScaleDDP: construction data, and runtime statistics of sampled synced steps.

    As in c10d, step s (counting synced steps from 1) is timed when s <= 10 or s % sample_rate == 0, and its
    times are published when step s + 1 begins, under "iteration" s. Times are the host's nanoseconds
    (perf_counter_ns; timestamps on the epoch, as c10d's): on a GPU they measure launches, not kernels (no
    synchronisation is added). With several virtual workers in the process, forward and backward times are
    summed over the local workers; the timestamps are the step's first forward, the last worker's backward
    (start, end) and the exchange (from its first bucket's start; the overlap is 0 when none started during
    the backward).
    """

    def __init__(self, ddp, parameters: List[nn.Parameter], backend_info: Dict[str, object]):
        """`parameters`: DDP's, in its index order (the trainable ones); `backend_info`: the process group's."""
        self.sample_rate = DEFAULT_SAMPLE_RATE
        self.iterations = 0  # synced steps begun (c10d's num_iterations_)
        self.sampled = False  # whether the current step is timed
        self.recorded = 0
        self.error: Optional[str] = None
        self.runtime: Dict[str, object] = {}
        self.times: Dict[str, int] = {}
        self.grad_order: List[int] = []
        self._forward_start: Optional[int] = None
        self._epoch = time.time_ns() - time.perf_counter_ns()  # perf_counter_ns() + _epoch: since the epoch
        self._index = {id(p): i for i, p in enumerate(parameters)}  # DDP's parameter indices
        self._bucket_sizes = ", ".join(str(b) for b in _bucket_bytes(ddp))
        self._backend_info = backend_info
        self._environment = _environment(backend_info["backend_name"])

    def _collects(self, step: int) -> bool:
        return step > 0 and (step <= _ALWAYS_SAMPLED or step % self.sample_rate == 0)

    # -- called by the step (cheap unless the step is sampled) --------------------------
    def step_begins(self, ddp) -> None:
        if not ddp.require_backward_grad_sync:  # as DDP's forward under no_sync(): not an iteration
            self.sampled = False
            return
        if self._collects(self.iterations):
            self._publish(ddp)
        self.iterations += 1
        self.sampled = self._collects(self.iterations)
        if self.sampled:
            self.times = {"forward": 0, "backward": 0}
            self.grad_order = []
            self._forward_start = None

    def worker_begins(self) -> None:
        if self.sampled:
            self.grad_order = []  # the order of the step's last local worker is the one kept

    def forward_begins(self) -> None:
        if self.sampled:
            self._forward_start = time.perf_counter_ns()
            self.times.setdefault("forward_start", self._forward_start)

    def forward_ends(self) -> None:
        if self.sampled and self._forward_start is not None:
            now = time.perf_counter_ns()
            self.times["forward"] += now - self._forward_start
            self.times["backward_start"] = now
            self._forward_start = None

    def grad_ready(self, param, exchanging: bool) -> None:
        self.grad_order.append(self._index[id(param)])
        if exchanging:
            self.times.setdefault("comm_start", time.perf_counter_ns())

    def backward_ends(self) -> None:
        if self.sampled and "backward_start" in self.times:
            now = time.perf_counter_ns()
            self.times["backward"] += now - self.times["backward_start"]
            self.times["backward_end"] = now

    def exchange_begins(self) -> None:
        if self.sampled:
            self.times.setdefault("comm_start", time.perf_counter_ns())

    def exchange_ends(self, ddp) -> None:
        if self.sampled:
            self.times["comm_end"] = time.perf_counter_ns()
            self.times["unused"] = sum(p.numel() * p.element_size() for p in ddp.params if p.grad is None)

    # -- published data ----------------------------------------------------------------
    def _publish(self, ddp) -> None:
        """c10d's Logger::set_runtime_stats_and_log: the last timed step's statistics."""
        r, t = self.runtime, self.times
        self.recorded += 1
        r["iteration"] = self.iterations
        r["unused_parameter_size"] = t.get("unused", 0)
        # The buckets are planned at construction (and when layers freeze), never from a first step's order.
        r["has_rebuilt_buckets"] = 1
        r["rebuilt_bucket_sizes"] = ", ".join(str(b) for b in _bucket_bytes(ddp))
        r["rebuilt_per_bucket_param_indices"] = ", ".join(" ".join(str(self._index[id(p)]) for p in b.params)
                                                          for b in ddp.reducer.buckets)
        if self.grad_order:
            r["prev_iteration_grad_ready_order_indices"] = ", ".join(str(i) for i in self.grad_order)
        if not {"forward_start", "backward_start", "backward_end", "comm_start", "comm_end"} <= t.keys():
            return
        spans = {"forward_compute_time": t["forward"], "backward_compute_time": t["backward"],
                 "backward_comm_time": t["comm_end"] - t["comm_start"],
                 "backward_compute_comm_overlap_time": max(0, t["backward_end"] - t["comm_start"])}
        for key, value in spans.items():
            r[key] = value
            avg = "avg_" + key
            r[avg] = (r.get(avg, 0) * (self.recorded - 1) + value) // self.recorded
        e = self._epoch
        r.update(forward_compute_time_start=t["forward_start"] + e, backward_compute_time_start=t["backward_start"] + e,
                 backward_compute_time_end=t["backward_end"] + e, backward_comm_time_start=t["comm_start"] + e,
                 backward_comm_time_end=t["comm_end"] + e)

    def data(self, ddp) -> Dict[str, object]:
        params = ddp.params
        dtypes = sorted({_DTYPE_NAMES.get(p.dtype, str(p.dtype).replace("torch.", "")) for p in params})
        out: Dict[str, object] = {
            "module_name": type(ddp.module).__name__,
            "device_ids": str(ddp.device.index) if ddp.device.type == "cuda" else "",
            "output_device": ddp.device.index if ddp.device.type == "cuda" else -1,
            "broadcast_buffers": int(ddp.broadcast_buffers),
            "has_sync_bn": int(any(isinstance(m, nn.SyncBatchNorm) for m in ddp.module.modules())),
            "bucket_cap_bytes": int(ddp.bucket_cap_mb * 1024 * 1024),
            "find_unused_parameters": int(ddp.find_unused_parameters),
            "gradient_as_bucket_view": int(ddp.gradient_as_bucket_view),
            "static_graph": 0,
            "is_multi_device_module": 0,
            "num_parameter_tensors": len(params),
            "total_parameter_size_bytes": sum(p.numel() * p.element_size() for p in params),
            "dtypes": ", ".join(dtypes),
            "bucket_sizes": self._bucket_sizes,
            "rank": ddp.rank,
            "world_size": len(ddp.ranges),
            "has_rebuilt_buckets": 0,
            # EasyScale's own
            "virtual_world_size": ddp.world_size,
            "virtual_ranks": f"{ddp.local_ranks[0]}, {ddp.local_ranks[-1] + 1}",
            "determinism_level": ddp.determinism_level,
        }
        out.update(self._backend_info)
        out.update(self._environment)
        out.update(self.runtime)
        if self.error is not None:
            out.update(has_error=1, error=self.error)
        return out


class DDPParity:
    """DistributedDataParallel's interface beyond the step, for EasyScaleDDP (see the module docstring)."""

    def _log_and_throw(self, err_type, message: str):
        log = self.__dict__.get("_log")
        if log is not None:
            log.error = f"{err_type}: {message}"
            log.runtime["iteration"] = log.iterations
        raise err_type(message)

    # -- logging ------------------------------------------------------------------
    def _get_ddp_logging_data(self) -> Dict[str, object]:
        """DDP's logging data: construction arguments, the model's parameters and buckets, the process
        group and environment, and the runtime statistics of the last sampled step (see DDPLogging)."""
        return self._log.data(self)

    def _set_ddp_runtime_logging_sample_rate(self, sample_rate: int) -> None:
        """Time the first 10 synced steps, then every `sample_rate`-th (default 100), as DDP does."""
        if sample_rate < 1:
            self._log_and_throw(ValueError, "DDP runtime logging sample rate should be equal or greater than 1")
        self._log.sample_rate = int(sample_rate)

    # -- pickling and deepcopy -----------------------------------------------------
    def __getstate__(self):
        if self._in_step:
            self._log_and_throw(RuntimeError, "EasyScaleDDP can be pickled or deep-copied between steps only: "
                                              "finish the step (its backward) first")
        if self._group is not None:  # as DDP: only with the default group, which the copy takes
            try:
                default = dist.distributed_c10d._get_default_group()
            except (RuntimeError, ValueError):
                default = None
            if self._group() is None or self._group() is not default:
                self._log_and_throw(RuntimeError, _PICKLE_GROUP)
        state = super().__getstate__()
        for key in _REBUILT:
            state.pop(key, None)
        # The local workers' contexts in the store. Between steps the first worker lives in the process (its
        # RNG, the module's buffers), as a DDP rank does: what the store holds of it is read only after a
        # switch-out rewrote it.
        stored = set(self.store.workers())
        state["_pickled_contexts"] = {v: self.store.serialize(v) for v in self.local_ranks if v in stored}
        state["_pickled_placement"] = (self._group is not None, self.rank)
        return state

    def __setstate__(self, state):
        state = dict(state)
        contexts = state.pop("_pickled_contexts")
        grouped, rank = state.pop("_pickled_placement")
        super().__setstate__(state)
        procs = len(self.ranges)
        group = None
        if grouped:
            if not (dist.is_available() and dist.is_initialized()):
                raise RuntimeError(f"this EasyScaleDDP ran on {procs} processes: unpickle it in a process of a job "
                                   "whose default process group is initialized (or unpickle its .module)")
            group = dist.distributed_c10d._get_default_group()
            if dist.get_world_size(group) != procs:
                raise RuntimeError(f"this EasyScaleDDP ran on {procs} processes, the default process group has "
                                   f"{dist.get_world_size(group)}: unpickle it in a job of {procs} processes "
                                   "(or unpickle its .module)")
        # Rebuild what __getstate__ left out, without collectives. The plan covers the parameters active
        # when pickled (a freeze decided at the last step applies at the next, as in the original).
        self.process_group = group
        self.rank = dist.get_rank(group) if group is not None else 0
        self.local_ranks = list(range(*self.ranges[self.rank]))
        self._backend_info = backend_info(group)
        self._param_names = {id(p): n for n, p in self.module.named_parameters()}
        pending = self._freeze_pending
        self._plan(self.params)
        self._freeze_pending = pending
        determinism.apply(self.determinism_level, self.num_threads, self._cuda, self.isa)
        if self.rank != rank:  # another rank's copy: its workers start afresh, as at construction
            contexts = None
        self._open_store(contexts)
        # A copy has no gradients, as a DDP copy has none (Parameter's deepcopy and pickling leave .grad out):
        # neither those kept under no_sync(), so that it equals a DDP copy on every placement.
        for v in self.local_ranks:
            if self.store.contains(v, "grads"):
                self.store.erase(v, "grads")
        self._accumulating = set()
        self.on_step_contexts = None
        self._log = DDPLogging(self, self._trainable, self._backend_info)
        for p in self._trainable:
            if p.requires_grad:  # a frozen one gets no gradient (and can take no hook)
                p.register_post_accumulate_grad_hook(self._on_grad_ready)
