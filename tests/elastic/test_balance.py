"""Heterogeneous processes: the optimal split, the rebalancing policy, and real runs on processes that
share cores, which rebalance in place and end bitwise equal to the fixed run."""
import itertools
import os
import random

import pytest

from easyscale_ext import determinism
from easyscale_ext.elastic import Balancer
from easyscale_ext.placement import optimal_split, step_time, waste
from support.jobs import OLDER, needs_older, run_elastic, run_job

pytestmark = pytest.mark.multiprocess  # each case starts real processes


def brute_force(n, speeds):
    splits = (c for c in itertools.product(range(1, n + 1), repeat=len(speeds)) if sum(c) == n)
    return min(step_time(c, speeds) for c in splits)


CASES = [(4, [1.0, 1.0]), (8, [1.0, 0.5, 0.5]), (12, [1.0, 0.5, 0.5]), (5, [3.0, 1.0]), (7, [1.0, 1.0, 1.0]),
         (6, [0.1, 10.0]), (3, [1.0, 2.0, 3.0])]


@pytest.mark.parametrize("n,speeds", CASES + [(random.Random(s).randint(3, 9),
                                               [random.Random(s + i).uniform(0.2, 3) for i in range(3)])
                                              for s in range(20)])
def test_split_is_optimal(n, speeds):
    sizes = optimal_split(n, speeds)
    assert sum(sizes) == n and min(sizes) >= 1
    assert step_time(sizes, speeds) == brute_force(n, speeds)


def test_split_and_waste_on_known_cases():
    assert optimal_split(8, [1.0, 0.5, 0.5]) == [4, 2, 2]
    assert optimal_split(12, [1.0, 0.5, 0.5]) == [6, 3, 3]
    assert optimal_split(4, [1.0, 1.0, 1.0]) == [2, 1, 1]  # ties go to the lower rank
    # even split 3,3,2 on speeds 1 : 1/2 : 1/2 -> step 6, idle 3 + 0 + 2; balanced 4,2,2 -> step 4, no idle
    assert (step_time([3, 3, 2], [1, .5, .5]), waste([3, 3, 2], [1, .5, .5])) == (6.0, 5.0)
    assert (step_time([4, 2, 2], [1, .5, .5]), waste([4, 2, 2], [1, .5, .5])) == (4.0, 0.0)
    with pytest.raises(ValueError, match="1 <= processes <= n"):
        optimal_split(2, [1.0, 1.0, 1.0])


def test_balancer_waits_out_noise_and_acts_on_a_lasting_gain():
    b = Balancer(interval=1, threshold=0.15, patience=2)
    rng = random.Random(0)
    for step in range(50):  # equal speeds with 10 % noise: the even split stays
        assert b.propose(step, [2, 2], [1 + 0.1 * rng.random(), 1 + 0.1 * rng.random()]) is None
    assert b.propose(50, [3, 3, 2], [1.0, 2.0, 2.0]) is None  # one evaluation is not enough
    assert b.propose(51, [3, 3, 2], [1.0, 2.0, 2.0]) == [4, 2, 2]
    assert (b.log[0].step, b.log[0].step_time_before, b.log[0].step_time_after) == (51, 6.0, 4.0)


def two_cores():
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip(f"needs two cores to give processes different speeds, this process may use {cores}")
    return cores[:2]


WORK = dict(n=12, steps=8, batch=128)  # workers long enough (ms) for time-sharing to show
JOB_THRESHOLD = 0.15  # tests/support/train_job.py's Balancer: the predicted gain it acts on


@pytest.mark.serial  # pins processes to two cores and reads their speeds: nothing else may run there
def test_rebalancing_on_shared_cores_keeps_the_bits_and_the_data(tmp_path):
    alone, shared = two_cores()
    events, samples, fixed_samples = tmp_path / "events", tmp_path / "samples", tmp_path / "fixed"
    times = tmp_path / "times"
    # process 0 alone on a core, processes 1 and 2 sharing the other: speeds about 1 : 1/2 : 1/2
    digest = run_elastic(3, "", cpus=[alone, shared, shared], balance=1, log_events=events, log_samples=samples,
                         log_times=times, **WORK)
    assert digest == run_job("easyscale", procs=1, log_samples=fixed_samples, **WORK)
    lines = samples.read_text().splitlines()  # exactly-once data, across the rebalance if there was one
    assert len(lines) == len(set(lines)) and sorted(lines) == sorted(fixed_samples.read_text().splitlines())
    if not events.exists():  # a failure only where the measured speeds promised the job's Balancer its gain
        rows = [line.split() for line in times.read_text().splitlines()]
        last = {worker: float(seconds) for worker, step, _, _, seconds in rows if int(step) == WORK["steps"]}
        speeds = [1 / last[f"w{rank}"] for rank in range(3)]
        even = step_time([WORK["n"] // 3] * 3, speeds)
        if step_time(optimal_split(WORK["n"], speeds), speeds) >= (1 - JOB_THRESHOLD) * even:
            pytest.skip(f"this machine did not slow the processes sharing a core enough (seconds per worker: {last})")
        pytest.fail(f"no rebalance, though the processes' seconds per worker were {last}")
    sizes = list(map(int, events.read_text().splitlines()[0].split()))[3:]
    assert sizes[0] > 4 and sizes[1] + sizes[2] < 8, f"even 4,4,4 became {sizes}: not off the shared core"


@needs_older
def test_split_change_across_instruction_sets_under_d2_keeps_the_bits(tmp_path):
    # Process 0 on this CPU held to the floor, processes 1 and 2 emulating the older machine; a split
    # requested through the store (as a scheduler would) moves workers between them at step 4.
    d2 = determinism.environment("D2", isa=OLDER)
    older = dict(d2, **determinism.isa_caps(OLDER))
    events = tmp_path / "events"
    digest = run_elastic(3, "", env_per_process=[d2, older, older], split_at=4, split="6,4,2", level="D2",
                         log_events=events, **WORK)
    assert [line.split()[3:] for line in events.read_text().splitlines()] == [["6", "4", "2"]] * 3
    assert digest == run_job("reference", level="D2", env_per_rank=[d2], **WORK)
    assert digest != run_job("reference", level="D1", env_per_rank=[determinism.environment("D1")], **WORK)


@pytest.mark.serial  # pins processes to two cores and reads their speeds: nothing else may run there
def test_equal_speeds_rebalance_at_most_once(tmp_path):
    first, second = two_cores()
    events, balance = tmp_path / "events", tmp_path / "balance"
    run_elastic(2, "", cpus=[first, second], balance=1, log_events=events, log_balance=balance,
                **dict(WORK, n=4, batch=64))
    steps = {line.split()[0] for line in events.read_text().splitlines()} if events.exists() else set()
    assert len(steps) <= 1  # every process logs each event it lives through
    evaluations, rebalances = map(int, balance.read_text().split())
    assert evaluations >= 4 and rebalances == len(steps)  # it looked at every step, and acted at most once


def test_a_checkpoint_keeps_the_split_and_resumes_with_it_bitwise(tmp_path):
    ckpt, times = tmp_path / "ckpt", tmp_path / "times"
    # split 6,4,2 at step 2 (as a balancer or scheduler would), checkpoint at step 4, stop there
    run_elastic(3, "", split_at=2, split="6,4,2", ckpt_dir=ckpt, ckpt_every=4, stop_after=4, **WORK)
    resumed = run_job("easyscale", procs=3, ckpt_dir=ckpt, ckpt_every=100, resume=1, log_times=times, **WORK)
    after = {}
    for rank, step, _, workers, _ in map(str.split, times.read_text().splitlines()):
        after.setdefault(int(step), {})[int(rank)] = int(workers)
    assert all(after[s] == {0: 6, 1: 4, 2: 2} for s in after) and min(after) == 5  # resumed at step 4, as split
    assert resumed == run_job("easyscale", procs=1, **WORK)
