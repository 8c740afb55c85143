"""Scheduling policies, one module each, and the registry the command line and the benchmarks choose from.

Every policy implements base.Policy: each round `optimize(now, jobs, cluster, allocations)` returns the new
allocations. Policies read the job models (..models) and never the simulator, so a real scheduler can run them.

POLICIES maps a policy's name to a function of the seed (used by the randomised ones) that makes it.
"""
from .easyscale import EasyScalePolicy
from .edl import EdlPolicy
from .fifo import FifoPolicy
from .icefrog import IceFrogPolicy
from .optimus import OptimusPolicy
from .ours import REALLOCATION_S, OursPolicy
from .pollux import PolluxPolicy
from .saxena import SaxenaPolicy
from .sia import SiaPolicy
from .tiresias import TiresiasPolicy

POLICIES = {
    "fifo": lambda seed: FifoPolicy(),
    "yarn-cs": lambda seed: FifoPolicy(exclusive=True),
    "tiresias": lambda seed: TiresiasPolicy(),
    "optimus": lambda seed: OptimusPolicy(),
    "pollux": lambda seed: PolluxPolicy(seed=seed),
    "edl": lambda seed: EdlPolicy(),
    "easyscale-heter": lambda seed: EasyScalePolicy(heterogeneous=True),
    "easyscale-homo": lambda seed: EasyScalePolicy(heterogeneous=False),
    "saxena": lambda seed: SaxenaPolicy(),
    "saxena-fixed": lambda seed: SaxenaPolicy(adaptive_batch=False),
    "sia": lambda seed: SiaPolicy(),
    "sia-inplace": lambda seed: SiaPolicy(restart_s=REALLOCATION_S, in_place=True),
    "sia-mixed": lambda seed: OursPolicy(fast_growth=False, utility=False, remaining=False, in_place=False,
                                          name="sia-mixed"),
    "ours": lambda seed: OursPolicy(),
    "ours-no-mixed": lambda seed: OursPolicy(mixed=False),
    "ours-no-fast-growth": lambda seed: OursPolicy(fast_growth=False),
    "ours-sia-objective": lambda seed: OursPolicy(utility=False),
    "ours-no-remaining": lambda seed: OursPolicy(remaining=False),
    "icefrog": lambda seed: IceFrogPolicy(),
    "icefrog-nofreeze": lambda seed: IceFrogPolicy(freeze=False),
}
