"""Layer freezing as a job model: which jobs freeze, and on what timeline.

A job freezes only if it opts in (JobSpec.freeze, a workload's `freeze` column) or a run turns freezing on for
every job (SimConfig.freezing "on"), and only where its model family has a timeline taken from what is published
or measured for it (TIMELINES). Elsewhere it trains every layer. Off in the headline tables: no policy is given
freezing that another is not.

Timeline. A job's frozen share of the model rises with its share of training done: nothing before `start`, then
linearly to the cap at `full`, the cap after that (front layers first, as AutoFreeze/Egeria and our runtime's
prefix-only GradientNormFreezer freeze). At the cap a share `backward` of the backward pass and `exchanged` of the
gradient elements are frozen. Backward is taken as 2/3 of a step's compute (twice the forward's FLOPs; our CNN
measured 0.59), so compute time shrinks by (2/3) x backward x level and sync time by exchanged x level, level
being the share of the cap reached. Frozen penalty: an iteration makes (1 - penalty x level) of its progress.
The share of training done is the simulator's ground truth of when layers converge; policies never read a job's
length, only its frozen level (job.freezing_factors), which the runtime knows.
"""
from dataclasses import dataclass

import numpy as np

BACKWARD_SHARE = 2 / 3


@dataclass(frozen=True)
class Freezing:
    start: float  # share of training done before anything freezes
    full: float  # share of training done by which the frozen prefix reaches its cap
    backward: float  # share of the backward pass frozen at the cap
    exchanged: float  # share of the gradient elements frozen at the cap
    penalty: float  # share of an iteration's progress lost at the cap

    def level(self, share) -> float:
        """How much of the cap is frozen after `share` of the training."""
        if share >= self.full:
            return 1.0
        return float(np.clip((share - self.start) / (self.full - self.start), 0.0, 1.0))

    def at(self, share) -> tuple:
        """Factors on compute time, sync time and progress per iteration after `share` of the training."""
        x = self.level(share)
        return 1 - BACKWARD_SHARE * self.backward * x, 1 - self.exchanged * x, 1 - self.penalty * x


def from_run(steps, first, capped, backward, elements, worth) -> Freezing:
    """The timeline of a measured run of `steps` steps: first freeze at step `first`, cap at `capped`; run-average
    factors on backward time and exchanged elements; `worth` = its progress relative to an unfrozen run's."""
    start, full = first / steps, capped / steps
    weight = (full - start) / 2 + (1 - full)  # the cap's weight in a run average
    return Freezing(start, full, (1 - backward) / weight, (1 - elements) / weight, (1 - worth) / weight)


def from_speedup(saving, start, full) -> Freezing:
    """A timeline that saves `saving` of a compute-bound run's time with no loss of accuracy (penalty 0), the
    frozen prefix ramping from `start` to `full` of the training: backward and exchanged shares at the cap f with
    (2/3) f x (the cap's weight in a run average) = saving."""
    weight = (full - start) / 2 + (1 - full)
    share = saving / (BACKWARD_SHARE * weight)
    return Freezing(start, full, share, share, 0.0)


# Our runtime's measured run (BENCHMARKS.md, "Layer freezing", threshold 0.10, 184 steps of a 6-block CNN on
# digits): first layer frozen at step 20, the prefix at its 80 % cap at step 44; over the run backward time x0.36,
# exchanged elements x0.57, accuracy 0.6 points lower. Penalty: a run ending 0.6 points short is taken as worth the
# progress at which an unfrozen run first comes within 0.6 points of its final accuracy, about 0.70 of its training
# in the Pollux validation traces of cifar10 and imagenet (an assumption: nothing measures extra iterations).
# IceFrog's own experiments use it; it is one small model and no application's timeline.
MEASURED = from_run(steps=184, first=20, capped=44, backward=0.36, elements=0.57, worth=0.70)

# Per model family, the published whole-run savings at no loss of accuracy, the low end of what is reported for
# that family; the ramp's shape (first freeze at 11 % of training, cap at 24 %) is our measured run's. Families
# with no published figure (YOLOv3, DeepSpeech2, NCF) have no timeline: their jobs never freeze.
# - ResNets on CIFAR (cifar10): FreezeOut (Brock et al., 2017, arXiv:1706.04983) reports up to 20 % wall-clock
#   savings for ResNets on CIFAR without loss of accuracy: 0.20.
# - ResNet-50 on ImageNet (imagenet) and BERT fine-tuning (bert): Egeria (Wang et al., EuroSys'23,
#   arXiv:2201.06227) reports 19-43 % training speedup on vision and language models without losing accuracy:
#   the low end, 0.19 (AutoFreeze, Liu et al., 2021, arXiv:2102.01386, reports up to 2.55x for BERT fine-tuning,
#   but with caching of the frozen layers' activations, which our runtime does not do).
RAMP = (20 / 184, 44 / 184)
TIMELINES = {
    "cifar10": from_speedup(0.20, *RAMP),
    "imagenet": from_speedup(0.19, *RAMP),
    "bert": from_speedup(0.19, *RAMP),
}
FREEZING_MODES = ("job", "on", "off")  # per job's opt-in (default); every job that has a timeline; none


def timeline_for(spec, config):
    """The timeline `spec`'s job trains with under `config` (SimConfig), or None: every layer trains."""
    mode = getattr(config, "freezing", "job")
    if mode not in FREEZING_MODES:
        raise ValueError(f"freezing {mode!r}: expected one of {', '.join(FREEZING_MODES)}")
    if mode == "off" or mode == "job" and not spec.freeze:
        return None
    timelines = getattr(config, "timelines", None) or TIMELINES
    return timelines.get(spec.app)
