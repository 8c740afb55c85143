"""Every policy's simulated runs, pinned to the bit: a reduced set of each shipped workload family (its first jobs)
under each setting the project reports (the published calibrations, and cluster mode's measured costs), hashed
over every job's record, the timeline and the Gantt segments. A change to the simulator's loop, the job models or
the policies that moves any figure fails here; a change meant to move them records them again:

    .venv/bin/python tests/sched/test_pinned.py   # records this CPU's runs in tests/sched/data/pinned.json

NumPy and OpenBLAS pick their kernels by the CPU (AVX-512 or AVX2), whose last bits differ and can tip a policy's
tie, so runs are pinned per instruction set; on an AVX-512 CPU, recording pins AVX2's runs too, with those kernels
held to AVX2 (AVX2_ONLY: they give an AVX2 CPU's bits). On a CPU of another set, the test skips.
"""
import hashlib
import json
import os
import time

import pytest

from easyscale_ext.determinism import cpu_isa
from easyscale_ext.sched.costs import RuntimeCosts
from easyscale_ext.sched.models import workload
from easyscale_ext.sched.models.application import STAND_INS, Applications
from easyscale_ext.sched.models.cluster import EASYSCALE as EASYSCALE_CLUSTER
from easyscale_ext.sched.models.cluster import Cluster
from easyscale_ext.sched.models.traces import data_dir
from easyscale_ext.sched.policies import RUNNABLE
from easyscale_ext.sched.simulator import EASYSCALE, SIA, SimConfig, simulate

PINNED = os.path.join(os.path.dirname(__file__), "data", "pinned.json")
JOBS = 8
# cluster mode's costs on this runtime, the kinds bench/bench_cluster.py measures (values of one of its runs), in
# minute rounds (its own are 2 s, on jobs of seconds)
CLUSTER_MODE = RuntimeCosts(exit_s=0.8, exit_weight=0.3, join_s=3.0, parallel_starts=1.6, start_weight=0.7,
                            training_weight=0.2, suspend_s=2.5, rounds_at_arrivals=True, completion_poll_s=20.0,
                            arrival_lag_s=0.05)
SIA_CLUSTER = "6x4:t4,2x8:a100,3x8:2080ti"  # Sia's
SETTINGS = {  # name -> (workload, cluster, config, costs)
    "pollux": ("pollux/workloads/workload-6.csv", "4x4:t4", SimConfig(), RuntimeCosts()),
    "sia": ("sia/workloads/philly/workload-1.csv", SIA_CLUSTER, SIA, RuntimeCosts()),
    "easyscale": ("easyscale/workloads/test.csv", EASYSCALE_CLUSTER, EASYSCALE, RuntimeCosts()),
    "cluster-mode": ("sia/workloads/philly/workload-2.csv", SIA_CLUSTER, SimConfig(start_s=6.0, restart_s=6.0),
                     CLUSTER_MODE),
}


def runs(data, verbose=False):
    """(setting, policy) -> the run's digest and average JCT, for every policy that can run the setting."""
    apps, pinned = Applications(data), {}
    for setting, (path, cluster, config, costs) in SETTINGS.items():
        specs = workload.with_stand_ins(workload.load_workload(data / path, JOBS), STAND_INS)[0]
        specs = (workload.last_per_name(specs) if config.job_model == "easyscale" else
                 workload.unique_names(specs))[0]
        for name, make in RUNNABLE.items():
            begin = time.perf_counter()
            try:
                result = simulate(specs, make(0), Cluster.parse(cluster), apps, config, costs=costs)
            except ValueError:  # the policy cannot run this setting (one GPU type, EasyScale's job model, ...)
                continue
            record = json.dumps([result.jobs, result.timeline, result.segments], sort_keys=True)
            pinned[f"{setting} {name}"] = {"sha256": hashlib.sha256(record.encode()).hexdigest(),
                                           "avg_jct": sum(j["jct"] for j in result.jobs) / len(result.jobs)}
            if verbose:
                print(f"{setting} {name}: {time.perf_counter() - begin:.1f} s", flush=True)
    return pinned


def isa() -> str:
    return (cpu_isa() or "unknown").lower()


def recorded() -> dict:
    try:
        with open(PINNED) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


@pytest.mark.slow
def test_every_policys_simulated_runs_are_unchanged(data):
    pinned = recorded().get(isa())
    if pinned is None:
        pytest.skip(f"no runs pinned on a CPU with {isa()}: record them with `python {__file__}`")
    now = runs(data)
    assert now.keys() == pinned.keys()
    moved = {k: (pinned[k]["avg_jct"], now[k]["avg_jct"]) for k in pinned if now[k] != pinned[k]}
    assert not moved, f"runs moved (pinned average JCT, now): {moved}"


AVX2_ONLY = {"NPY_DISABLE_CPU_FEATURES": "X86_V4", "OPENBLAS_CORETYPE": "Haswell"}


if __name__ == "__main__":
    import subprocess
    import sys

    mine = "avx2" if sys.argv[1:] == ["--avx2"] else isa()  # --avx2: run with AVX2_ONLY, by the line below
    pinned = dict(recorded(), **{mine: runs(data_dir(), verbose=True)})
    with open(PINNED, "w") as f:
        json.dump(pinned, f, indent=1, sort_keys=True)
    print(f"{len(pinned[mine])} runs pinned for {mine} in {PINNED}")
    if mine == "avx512":
        subprocess.run([sys.executable, __file__, "--avx2"], env=dict(os.environ, **AVX2_ONLY), check=True)
