"""easyscale_ext: elastic data-parallel training whose result does not depend on
the hardware it ran on. See README.md and docs/ARCHITECTURE.md."""
import torch  # noqa: F401  (loads libtorch before the extension)

from . import _C
from ._C import ContextStore, ContextStoreFullError, FoldStack, UnknownContextError, local_roots
from .ops import canonical_sum, canonical_sum_lists, fold_, group_norms
from .data import VirtualDataLoader
from .ddp import EasyScaleDDP  # eagerly: it imports torch.distributed.nn before any process group exists

__version__ = "0.1.0"


def cuda_built() -> bool:
    """Whether the CUDA kernels are compiled into this build."""
    return bool(_C.cuda_built())


__all__ = [
    "EasyScaleDDP", "VirtualDataLoader", "ContextStore", "ContextStoreFullError", "FoldStack", "UnknownContextError", "local_roots",
    "canonical_sum", "canonical_sum_lists", "fold_", "group_norms", "cuda_built", "__version__",
]
