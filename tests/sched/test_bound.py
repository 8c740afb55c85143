"""The lower limit on JCT (sched.bound): no policy's job beats it, a job alone reaches it, and it falls with GPUs."""
from dataclasses import replace

import numpy as np
import pytest

from easyscale_ext.sched.bound import job_lower_bounds
from easyscale_ext.sched.costs import RuntimeCosts
from easyscale_ext.sched.models.application import STAND_INS, Applications
from easyscale_ext.sched.models.cluster import Cluster
from easyscale_ext.sched.models.workload import JobSpec, load_workload, unique_names, with_stand_ins
from easyscale_ext.sched.policies import POLICIES
from easyscale_ext.sched.simulator import SimConfig, simulate

CLUSTER = "6x4:t4,2x8:a100,3x8:2080ti"  # Sia's


def first_jobs(data, path, limit):
    specs, _ = with_stand_ins(load_workload(data / path, limit=limit), STAND_INS)
    return unique_names(specs)[0]


@pytest.fixture(scope="module")
def specs(data):
    return first_jobs(data, "sia/workloads/philly/workload-1.csv", 20)


@pytest.mark.parametrize("policy", ["sia", "elastic-goodput", "easyscale-heter", "tiresias"])
def test_no_job_of_any_policy_finishes_below_its_limit(data, specs, policy):
    assert_within_limits(data, specs, policy, CLUSTER)


def test_a_virtual_worker_job_without_accumulation_is_within_its_limit(data):
    # Pollux's jobs as EasyScale runs them: one GPU, one virtual worker of the whole batch (above the initial one),
    # without the extra accumulation step Pollux's agent takes there
    assert_within_limits(data, first_jobs(data, "pollux/workloads/workload-1.csv", 40), "easyscale-homo", "16x4:t4")


def assert_within_limits(data, specs, policy, cluster_spec):
    config, cluster = SimConfig(), Cluster.parse(cluster_spec)
    limits = dict(zip((s.name for s in specs), job_lower_bounds(specs, cluster, Applications(data), config)))
    result = simulate(specs, POLICIES[policy](0), cluster, Applications(data), config)
    assert min(j["jct"] / limits[j["name"]] for j in result.jobs) >= 1 - 1e-9


def test_a_job_alone_on_the_gpus_it_asks_for_reaches_its_limit(data):
    config, costs = SimConfig(start_s=20.0), RuntimeCosts(exit_s=1.5, rounds_at_arrivals=True)
    job = JobSpec("alone", 0.0, 2, duration=600.0)
    limit, = job_lower_bounds([job], Cluster.parse("1x2"), Applications(data), config, costs)
    result = simulate([job], POLICIES["fifo"](0), Cluster.parse("1x2"), Applications(data), config, costs=costs)
    assert limit == 621.5 and result.jobs[0]["jct"] == pytest.approx(limit)


def test_an_application_job_alone_comes_close_to_its_limit(data, specs):
    job = replace(next(s for s in specs if s.app == "deepspeech2"), arrival=0.0)
    config, cluster = SimConfig(), Cluster.parse(CLUSTER)
    limit, = job_lower_bounds([job], cluster, Applications(data), config)
    result = simulate([job], POLICIES["elastic-goodput"](0), cluster, Applications(data), config)
    assert 1 <= result.jobs[0]["jct"] / limit < 1.15  # its first minute's round, then its model learns its speed


def test_more_gpus_never_raise_a_limit(data, specs):
    apps, config = Applications(data), SimConfig()
    small = job_lower_bounds(specs, Cluster.parse("6x4:t4,1x8:a100,3x8:2080ti"), apps, config)
    large = job_lower_bounds(specs, Cluster.parse(CLUSTER), apps, config)
    assert np.all(large <= small) and np.any(large < small)


def test_a_workload_that_freezes_layers_is_refused(data, specs):
    with pytest.raises(ValueError, match="freezing off"):
        job_lower_bounds(specs, Cluster.parse(CLUSTER), Applications(data), SimConfig(freezing="on"))
