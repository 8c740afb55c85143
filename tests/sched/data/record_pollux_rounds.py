"""How pollux_rounds.npz was made: the inputs of Pollux's search (PolluxPolicy._Search) in two rounds of the Pollux
artifact's workload-2 (16 x 4 T4), the first with at least 8 active jobs and the first with at least 20, the
simulation run with the elitist search. tests/sched/test_pollux_nsga2.py runs pymoo's NSGA-II and the port's on them.

    python tests/sched/data/record_pollux_rounds.py
"""
import os

import numpy as np

from easyscale_ext.sched.models.application import Applications
from easyscale_ext.sched.models.cluster import Cluster
from easyscale_ext.sched.models.traces import data_dir
from easyscale_ext.sched.models.workload import load_workload
from easyscale_ext.sched.policies import pollux
from easyscale_ext.sched.simulator import simulate

WANT = (8, 20)
ARGS = ("base", "capacity", "max_gpus", "speedup", "factor", "p", "scale")


class Recorded(Exception):
    pass


def main():
    rounds, original = {}, pollux._Search.__init__

    def record(search, base, capacity, max_gpus, speedup, factor, p, scale, rng):
        for want in WANT:
            if want not in rounds and len(base) >= want:
                rounds[want] = dict(zip(ARGS, (base, capacity, max_gpus, speedup, factor, p, scale)))
        if len(rounds) == len(WANT):
            raise Recorded
        original(search, base, capacity, max_gpus, speedup, factor, p, scale, rng)

    pollux._Search.__init__ = record
    data = data_dir()
    try:
        simulate(load_workload(data / "pollux" / "workloads" / "workload-2.csv"),
                 pollux.PolluxPolicy(seed=0, search="elitist"), Cluster.parse("16x4:t4"), Applications(data))
    except Recorded:
        pass
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pollux_rounds.npz")
    np.savez_compressed(out, **{f"{k}{want}": v for want, r in rounds.items() for k, v in r.items()})
    print(out, {want: r["base"].shape for want, r in rounds.items()})


if __name__ == "__main__":
    main()
