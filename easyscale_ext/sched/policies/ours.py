"""Ours: Sia's goodput-optimising integer program, with the levers the EasyScale runtime adds to it.

- Stop-free scaling: a running job changes its GPUs in place (contexts move between processes, nothing
  restarts), so a reallocation costs the measured pause (models.job.IN_PLACE_S, 0.07 s) instead of a
  checkpoint-restart, and the program discounts a change by that cost rather than a restart's: it follows
  arrivals and completions round by round at no loss.
- Layer freezing: jobs freeze converged front layers as our runtime does (runtime/freeze.py), on the timeline and with
  the frozen penalty measured from it (icefrog.MEASURED): later steps skip most of the backward pass and of the
  exchange, at a cost in progress per step that the timeline charges.
- From Sia: per-type goodput estimates bootstrapped across GPU types, and jobs that tune their batch for goodput
  (throughput times statistical efficiency), which the program values per configuration.
Not used yet: mixing GPU types within a job (virtual workers at D2). It keeps the simulator's policy interface,
so a real scheduler can run it unchanged.
"""
from ..models.job import IN_PLACE_S
from .icefrog import MEASURED
from .sia import SiaPolicy


class OursPolicy(SiaPolicy):
    name = "ours"
    in_place = True

    def __init__(self, reallocation_s: float = IN_PLACE_S, **sia):
        super().__init__(restart_s=reallocation_s, **sia)

    def freezing(self, spec, app):
        return MEASURED
