"""IceFrog's freezing timelines, frozen jobs and layer-aware allocation, on tiny cases checked by hand."""
from dataclasses import astuple, replace

import pytest

from easyscale_ext.sched.models.cluster import Cluster
from easyscale_ext.sched.models.freezing import MEASURED, Freezing, from_run
from easyscale_ext.sched.models.job import make_job
from easyscale_ext.sched.models.workload import JobSpec
from easyscale_ext.sched.policies import RUNNABLE
from easyscale_ext.sched.policies.fifo import FifoPolicy
from easyscale_ext.sched.policies.icefrog import IceFrogPolicy
from easyscale_ext.sched.simulator import SimConfig, simulate

FREE = SimConfig(round_s=60, restart_s=0, start_s=0)
ALWAYS = -1.0, 0.0  # (start, full): at the cap from the first step


def test_timeline_ramps_linearly_from_start_to_the_cap():
    f = Freezing(start=0.2, full=0.6, backward=0.75, exchanged=0.5, penalty=0.1)
    assert f.at(0.0) == f.at(0.2) == (1.0, 1.0, 1.0)
    # Half-way up the ramp: half the cap; backward is 2/3 of compute, so 3/8 of the backward is 1/4 of compute.
    assert f.at(0.4) == pytest.approx((0.75, 0.75, 0.95))
    assert f.at(0.6) == f.at(1.0) == pytest.approx((0.5, 0.5, 0.9))


def test_the_cap_reproduces_the_measured_run_averages():
    # A run of 10 steps freezing at its first step: the run averages are the cap's.
    assert astuple(from_run(10, 0, 0, backward=0.4, elements=0.7, worth=0.9)) == pytest.approx((0, 0, 0.6, 0.3, 0.1))
    # Our runtime's run: the mean frozen level over the run, times the cap, gives back x0.36, x0.57 and 0.70.
    mean_level = sum(MEASURED.level((i + 0.5) / 184_000) for i in range(184_000)) / 184_000
    assert 1 - MEASURED.backward * mean_level == pytest.approx(0.36, abs=1e-4)
    assert 1 - MEASURED.exchanged * mean_level == pytest.approx(0.57, abs=1e-4)
    assert 1 - MEASURED.penalty * mean_level == pytest.approx(0.70, abs=1e-4)
    assert (MEASURED.start, MEASURED.full) == pytest.approx((20 / 184, 44 / 184))


def run_alone(apps, freezing):
    """Completion time of one cifar10 job alone on 1 GPU, no restart cost, frozen as `freezing` says."""
    config = replace(FREE, freezing="on", timelines={"cifar10": freezing}) if freezing else FREE
    return simulate([JobSpec("a", 0, 1, "cifar10", 128, epochs=3)], FifoPolicy(), Cluster.parse("1x1"), apps,
                    config).jobs[0]["completion"]


def test_a_frozen_job_steps_faster_and_pays_its_penalty_in_progress(apps):
    unfrozen = run_alone(apps, None)
    # 3/4 of backward = 1/2 of compute, and half the exchange: every iteration takes half as long.
    halved = dict(backward=0.75, exchanged=0.5)
    assert run_alone(apps, Freezing(*ALWAYS, **halved, penalty=0.0)) == pytest.approx(unfrozen / 2)
    # A penalty of one half: each iteration makes half the progress, and the two cancel.
    assert run_alone(apps, Freezing(*ALWAYS, **halved, penalty=0.5)) == pytest.approx(unfrozen)


def test_a_job_that_does_not_freeze_runs_exactly_as_before(apps):
    assert run_alone(apps, None) == run_alone(apps, Freezing(0.5, 0.6, 0.0, 0.0, 0.0))  # nothing ever frozen


def test_the_spare_gpu_goes_to_the_frozen_job_that_gains_more_from_it(apps):
    # Two identical cifar10 jobs on 3 GPUs: one GPU each, then the third to the larger gain in effective speedup.
    # The frozen one (no backward, no exchange, no penalty) computes a third as long per step: an extra GPU
    # saves it three times the (unfrozen-normalised) speedup it saves the other.
    jobs = [make_job(JobSpec(n, 0, 1, "cifar10", 512), apps, 512) for n in ("plain", "frozen")]
    jobs[1].freezing = Freezing(*ALWAYS, backward=1.0, exchanged=1.0, penalty=0.0)
    alloc = IceFrogPolicy().optimize(60, jobs, Cluster.parse("1x3"), {})
    assert {n: len(a) for n, a in alloc.items()} == {"plain": 1, "frozen": 2}
    # With a penalty that takes more than the frozen job's speedup back, the plain job gets it instead.
    jobs[1].freezing = Freezing(*ALWAYS, backward=1.0, exchanged=1.0, penalty=0.9)
    alloc = IceFrogPolicy().optimize(60, jobs, Cluster.parse("1x3"), {})
    assert {n: len(a) for n, a in alloc.items()} == {"plain": 2, "frozen": 1}


def test_both_variants_are_registered_and_only_one_values_frozen_layers():
    assert RUNNABLE["icefrog"](0).layer_aware and not RUNNABLE["icefrog-nofreeze"](0).layer_aware
    assert isinstance(MEASURED, Freezing)
