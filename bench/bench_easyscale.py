"""EasyScale's own setting reproduced: its test.csv on its 32 V100 + 16 P100 + 16 T4 cluster under
its artifact's job model (`easyscale simulate --calibration easyscale`), against its published figures, for each
source of the micro-batches' compute times the artifact does not ship (models/easyscale.py SPEED_SOURCES); and the
same workload under the project's own job model, where only the ordering is comparable. Markdown for BENCHMARKS.md.

    python bench/bench_easyscale.py        # ~15 s on one core
"""
import argparse
import time
from dataclasses import replace

import numpy as np

from easyscale_ext.sched.models.application import STAND_INS, Applications
from easyscale_ext.sched.models.cluster import EASYSCALE as CLUSTER
from easyscale_ext.sched.models.cluster import Cluster
from easyscale_ext.sched.models.easyscale import SPEED_SOURCES
from easyscale_ext.sched.models.traces import data_dir
from easyscale_ext.sched.models.workload import last_per_name, load_workload, unique_names, with_stand_ins
from easyscale_ext.sched.policies import RUNNABLE
from easyscale_ext.sched.simulator import EASYSCALE, SimConfig, simulate

POLICY_NAMES = ("easyscale-heter", "easyscale-homo", "yarn-cs")
PUBLISHED = {"easyscale-heter": (677, 6000), "easyscale-homo": (1071, 6720), "yarn-cs": (8905, 16560)}  # avg, makespan


def figures(specs, config, data):
    """Per policy: (average JCT, makespan from time 0 as the artifact counts it, CPU seconds)."""
    out = {}
    for name in POLICY_NAMES:
        begin = time.process_time()
        jobs = simulate(specs, RUNNABLE[name](0), Cluster.parse(CLUSTER), Applications(data), config).jobs
        end = max(j["completion"] for j in jobs)
        out[name] = (float(np.mean([j["jct"] for j in jobs])), end, time.process_time() - begin)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=None)
    args = parser.parse_args()
    data = data_dir(args.data)
    specs = with_stand_ins(load_workload(data / "easyscale/workloads/test.csv"), STAND_INS)[0]
    kept = last_per_name(specs)[0]
    print(f"test.csv: {len(specs)} rows, {len(kept)} jobs (a repeated name keeps its last row); cluster {CLUSTER}\n")
    print("| job model | compute times | " + " | ".join(f"{p} avg / makespan (s)" for p in POLICY_NAMES) + " |")
    print("|---|---|" + "---:|" * len(POLICY_NAMES))
    print("| published | | " + " | ".join(f"{a} / {m}" for a, m in PUBLISHED.values()) + " |")
    for source in SPEED_SOURCES:
        got = figures(kept, replace(EASYSCALE, easyscale_speed=source), data)
        print(f"| EasyScale's | {source} | " + " | ".join(
            f"{got[p][0]:.0f} / {got[p][1]:.0f} ({got[p][0] / PUBLISHED[p][0] - 1:+.1%} / "
            f"{got[p][1] / PUBLISHED[p][1] - 1:+.1%})" for p in POLICY_NAMES) + " |", flush=True)
    got = figures(unique_names(specs)[0], SimConfig(start_s=20.0, restart_s=0.0), data)
    print("| the project's (68 jobs, 20 s start) | profiles, D2's cost per model | "
          + " | ".join(f"{got[p][0]:.0f} / {got[p][1]:.0f}" for p in POLICY_NAMES) + " |")


if __name__ == "__main__":
    main()
