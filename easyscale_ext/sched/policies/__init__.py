"""Scheduling policies, one module each, and the registry the command line and the benchmarks choose from.

Every policy implements base.Policy: each round `optimize(now, jobs, cluster, allocations)` returns the new
allocations. Policies read the job models (..models) and never the simulator, so a real scheduler can run them.

POLICIES maps the name of each policy a user may pick to a function of the seed (used by the randomised ones) that
makes it; EXPERIMENTS, the ablations that measure where a policy's gains come from, alike; RUNNABLE, both.
"""
from .easyscale import EasyScalePolicy
from .edl import EdlPolicy
from .fifo import FifoPolicy
from .icefrog import IceFrogPolicy
from .optimus import OptimusPolicy
from .elastic_goodput import REALLOCATION_S, ElasticGoodputPolicy
from .pollux import PolluxPolicy
from .saxena import SaxenaPolicy
from .sia import ARTIFACT_RESTARTS, SiaPolicy
from .tiresias import TiresiasPolicy

POLICIES = {  # what a user picks (`--policy`)
    "fifo": lambda seed: FifoPolicy(),
    "yarn-cs": lambda seed: FifoPolicy(exclusive=True),
    "tiresias": lambda seed: TiresiasPolicy(),
    "optimus": lambda seed: OptimusPolicy(),
    "pollux": lambda seed: PolluxPolicy(seed=seed),
    "edl": lambda seed: EdlPolicy(),
    "easyscale-heter": lambda seed: EasyScalePolicy(heterogeneous=True),
    "easyscale-homo": lambda seed: EasyScalePolicy(heterogeneous=False),
    "saxena": lambda seed: SaxenaPolicy(),
    "sia": lambda seed: SiaPolicy(),
    # Sia given this runtime's in-place scaling: a change costs about a second, not a restart
    "sia-inplace": lambda seed: SiaPolicy(restart_s=REALLOCATION_S, in_place=True, name="sia-inplace"),
    "icefrog": lambda seed: IceFrogPolicy(),
    "elastic-goodput": lambda seed: ElasticGoodputPolicy(),
}
EXPERIMENTS = {  # ablations, each a policy above with one idea taken out or added (BENCHMARKS.md's tables)
    "saxena-fixed": lambda seed: SaxenaPolicy(adaptive_batch=False),
    "elastic-goodput-pairs-only": lambda seed: ElasticGoodputPolicy(fast_growth=False, utility=False, remaining=False,
                                                                    in_place=False, name="elastic-goodput-pairs-only"),
    "elastic-goodput-no-mixed": lambda seed: ElasticGoodputPolicy(mixed=False),
    "elastic-goodput-no-fast-growth": lambda seed: ElasticGoodputPolicy(fast_growth=False),
    "elastic-goodput-sia-objective": lambda seed: ElasticGoodputPolicy(utility=False),
    "elastic-goodput-no-remaining": lambda seed: ElasticGoodputPolicy(remaining=False),
    "icefrog-nofreeze": lambda seed: IceFrogPolicy(freeze=False),
}
RUNNABLE = {**POLICIES, **EXPERIMENTS}  # every name `easyscale simulate --policy` and the benchmarks accept
RENAMED = {"sia-mixed": "elastic-goodput-pairs-only"}  # a former name -> the policy's: accepted with a warning
# Pollux and Sia as the Sia artifact's simulator runs them, in its setting (`easyscale simulate --calibration sia`):
# Pollux at that simulator's default p = 0.5 (multi_simulator_unaware.py; the one script it ships, for a family not
# in its paper's tables, passes -1), and Sia's restart factor charging each application's measured restart.
SIA_ARTIFACT = {"pollux": lambda seed: PolluxPolicy(seed=seed, p=0.5),
                "sia": lambda seed: SiaPolicy(restart_by_app=ARTIFACT_RESTARTS)}


def made(name: str, calibration: str = "none"):
    """The function of the seed that makes policy `name` as the simulator `calibration` stands for runs it."""
    return (SIA_ARTIFACT if calibration == "sia" else {}).get(name, RUNNABLE[name])
