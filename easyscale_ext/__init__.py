"""easyscale_ext: elastic data-parallel training whose result does not depend on the hardware it ran on.

Layers, each importing only those below it (docs/ARCHITECTURE.md):

    lightning the PyTorch Lightning strategy (imports lightning; not loaded by the package)
    hf        the Hugging Face Trainer (imports transformers; not loaded by the package)
    cli       the `easyscale` command
    cluster   jobs on a Ray cluster, driven by the scheduler's policies
    elastic   job state, checkpoints, membership, scaling, recovery, launcher, balancing
    runtime   EasyScaleDDP, the reducer, data loading, RNG contexts, freezing
    ops, _C   the C++/CUDA kernels and the context store
    sched     the cluster-scheduling models, policies and simulator: no torch, no runtime
    _search   the policies' compiled searches (Pollux's, Saxena's knapsack), which sched uses: no torch
    placement which virtual ranks each process owns: no torch
    spawn     a job's process starts, forked from a server that has torch loaded: no torch itself
    determinism  D0/D1/D2 and the environment each needs: torch only where a process applies one
    home      where every command keeps a user's state ($EASYSCALE_HOME): no torch

The public names below load on first use, so that `import easyscale_ext.sched` (the simulator, the CLI's
help) never pays for torch. A training script has imported torch already: then the runtime loads with the
package, which keeps torch.distributed.nn imported before any process group exists (ddp.py says why).
"""
import importlib
import sys

__version__ = "0.1.0"

# public name -> the module that defines it (the extension's names through the runtime, which loads libtorch
# before the extension)
_PUBLIC = {
    "EasyScaleDDP": "runtime.ddp",
    "VirtualDataLoader": "runtime.loader",
    "SeededSamples": "runtime.loader",
    "state_sha256": "runtime.digest",
    "GradientNormFreezer": "runtime.freeze",
    "Freezer": "runtime.freeze",
    "ContextStore": "runtime",
    "ContextStoreFullError": "runtime",
    "FoldStack": "runtime",
    "UnknownContextError": "runtime",
    "local_roots": "runtime",
    "canonical_sum": "ops",
    "canonical_sum_lists": "ops",
    "fold_": "ops",
    "fold_plan_": "ops",
    "plan_of": "ops",
    "group_norms": "ops",
    "ElasticMember": "elastic.member",
    "Checkpointer": "elastic.checkpoint",
    "CheckpointError": "elastic.checkpoint",
    "Position": "elastic.state",
    "Balancer": "elastic.balance",
    "request_scale": "elastic.client",
    "request_split": "elastic.client",
    "request_release": "elastic.client",
}


def cuda_built() -> bool:
    """Whether the CUDA kernels are compiled into this build."""
    return bool(importlib.import_module(f"{__name__}.runtime").cuda_built())


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + list(_PUBLIC))


__all__ = sorted(_PUBLIC) + ["cuda_built", "__version__"]

if "torch" in sys.modules:
    from . import runtime  # noqa: F401,E402
