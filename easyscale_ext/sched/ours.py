"""Ours: Sia's goodput-optimising integer program, with stop-free in-place scaling from the EasyScale runtime.

A running job changes its GPUs in place (contexts move between processes, nothing restarts), so a reallocation
costs the measured pause (SimConfig.in_place_s, 0.07 s) instead of a checkpoint-restart, and the program
discounts a change by that cost rather than a restart's: it can follow arrivals and completions round by round
at no loss. The rest is Sia's: per-type goodput estimates bootstrapped across GPU types, and jobs that tune
their batch for goodput (throughput times statistical efficiency), which the program values per configuration.
Not yet used: mixing GPU types within a job (virtual workers at D2) and layer freezing. It keeps the simulator's
policy interface, so a real scheduler can run it unchanged.
"""
from .sia import SiaPolicy
from .simulator import SimConfig


class OursPolicy(SiaPolicy):
    name = "ours"
    in_place = True

    def __init__(self, reallocation_s: float = SimConfig.in_place_s, **sia):
        super().__init__(restart_s=reallocation_s, **sia)
