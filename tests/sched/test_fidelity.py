"""Published figures the simulator must reproduce: the fast baselines on a Pollux workload, in the artifact's setting
(16 nodes x 4 T4, 60 s rounds, 30 s per reallocation). The figures: data/DATA.md; the tolerance: BENCHMARKS.md's
fidelity table (Tiresias +0.6 %, Optimus+Oracle -0.4 % on workload-6)."""
import numpy as np
import pytest

from easyscale_ext.sched.models.cluster import Cluster
from easyscale_ext.sched.models.workload import load_workload
from easyscale_ext.sched.policies import POLICIES
from easyscale_ext.sched.simulator import simulate


@pytest.mark.parametrize("policy, published", [("tiresias", 3470), ("optimus", 5302)])
def test_average_jct_on_workload_6_within_1_percent_of_the_artifacts(data, apps, policy, published):
    specs = load_workload(data / "pollux" / "workloads" / "workload-6.csv")
    result = simulate(specs, POLICIES[policy](0), Cluster.parse("16x4:t4"), apps)
    assert np.mean([j["jct"] for j in result.jobs]) == pytest.approx(published, rel=0.01)
