"""The training runtime: EasyScaleDDP runs N virtual workers on this process's share of them.

Owns the virtual-worker step (ddp), the canonical gradient reduction plan (reducer), data loading with
DistributedSampler semantics over virtual ranks (loader), a worker's RNG streams (rng) and layer freezing
(freeze). Imports torch, the kernels (`easyscale_ext.ops`, `easyscale_ext._C`), `easyscale_ext.placement` and
`easyscale_ext.determinism`; never elastic, cluster, sched or cli.
"""
import torch  # noqa: F401  (loads libtorch before the extension)

from .._C import ContextStore, ContextStoreFullError, FoldStack, UnknownContextError, cuda_built, local_roots
from ..ops import canonical_sum, canonical_sum_lists, fold_, group_norms
from .ddp import EasyScaleDDP  # eagerly: it imports torch.distributed.nn before any process group exists
from .digest import state_sha256
from .loader import SeededSamples, VirtualDataLoader

__all__ = ["EasyScaleDDP", "VirtualDataLoader", "SeededSamples", "ContextStore", "ContextStoreFullError",
           "FoldStack", "UnknownContextError", "local_roots", "canonical_sum", "canonical_sum_lists", "fold_",
           "group_norms", "cuda_built", "state_sha256"]
