"""easyscale_ext: elastic data-parallel training whose result does not depend on the hardware it ran on.
See README.md and docs/ARCHITECTURE.md.

The training runtime (torch and the compiled extension) loads on first use of its names, so the
scheduling simulator (`easyscale_ext.sched`) runs without it.
"""
import importlib

__version__ = "0.1.0"

# name -> module that defines it
_RUNTIME = {
    "EasyScaleDDP": ".ddp", "VirtualDataLoader": ".data",
    "canonical_sum": ".ops", "canonical_sum_lists": ".ops", "fold_": ".ops", "group_norms": ".ops",
    "ContextStore": "._C", "ContextStoreFullError": "._C", "FoldStack": "._C", "UnknownContextError": "._C",
    "local_roots": "._C",
}


def __getattr__(name):
    if name not in _RUNTIME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import torch  # noqa: F401  (loads libtorch before the extension)

    value = getattr(importlib.import_module(_RUNTIME[name], __name__), name)
    globals()[name] = value
    return value


def cuda_built() -> bool:
    """Whether the CUDA kernels are compiled into this build."""
    import torch  # noqa: F401

    from . import _C
    return bool(_C.cuda_built())


__all__ = sorted(_RUNTIME) + ["cuda_built", "__version__"]
