"""The seeds' policies (EDL's Elastic-Tiresias, Saxena et al.) on tiny cases that can be checked by hand."""
import itertools

import numpy as np
import pytest

from easyscale_ext.sched.models.cluster import Cluster
from easyscale_ext.sched.models.job import make_job
from easyscale_ext.sched.models.workload import JobSpec
from easyscale_ext.sched.policies.edl import EdlPolicy
from easyscale_ext.sched.policies.saxena import SaxenaPolicy, allocate, neutral_batches, useful_throughputs


def brute_force(values, gpus):
    best = max((c for c in itertools.product(*(range(len(v)) for v in values)) if sum(c) <= gpus),
               key=lambda c: sum(v[k] for v, k in zip(values, c)))
    return sum(v[k] for v, k in zip(values, best))


def test_dp_matches_brute_force_on_small_cases():
    rng = np.random.default_rng(0)
    for _ in range(200):
        jobs, gpus = rng.integers(1, 5), int(rng.integers(0, 7))
        values = [np.concatenate([[0.0], np.cumsum(rng.random(rng.integers(1, 6)))]) for _ in range(jobs)]
        counts = allocate(values, gpus)
        assert sum(counts) <= gpus and all(c < len(v) for c, v in zip(counts, values))
        assert sum(v[c] for v, c in zip(values, counts)) == pytest.approx(brute_force(values, gpus))


def every_row(values, gpus):
    """The knapsack without allocate's shortcuts: every count of every job on every row."""
    best, picks, c = np.zeros(gpus + 1), [], np.arange(gpus + 1)[:, None]
    for v in values:
        k = np.arange(min(len(v), gpus + 1))
        total = np.where(c >= k, best[np.maximum(c - k, 0)] + np.asarray(v, dtype=float)[k], -np.inf)
        picks.append(np.argmax(total, axis=1))
        best = total[c[:, 0], picks[-1]]
    counts, left = [], gpus
    for pick in reversed(picks):
        counts.append(int(pick[left]))
        left -= counts[-1]
    return counts[::-1]


def test_dp_shortcuts_change_no_pick_even_among_ties():
    """Values with flat and falling tails and many equal totals (small integers), on clusters smaller and larger
    than the jobs can use: the same counts as the full table."""
    rng = np.random.default_rng(1)
    for _ in range(500):
        jobs, gpus = int(rng.integers(1, 8)), int(rng.integers(0, 40))
        values = [np.concatenate([[0.0], rng.integers(0, 4, rng.integers(1, 12)).astype(float)])
                  for _ in range(jobs)]
        assert allocate(values, gpus) == every_row(values, gpus), (values, gpus)


def test_dp_by_hand():
    # b does not scale beyond 1 GPU, a's 4th GPU adds less (0.4) than b's first (1): a gets 3, b 1.
    assert allocate([[0, 1, 1.8, 2.4, 2.8], [0, 1, 1, 1, 1]], 4) == [3, 1]
    # Non-concave values: a's second GPU is worth nothing, its third a lot; greedy by marginal gain would miss it.
    assert allocate([[0, 1, 1, 3], [0, 1.5, 1.6, 1.7]], 3) == [3, 0]


def test_dp_refuses_what_it_cannot_rank():
    with pytest.raises(ValueError, match="finite"):
        allocate([[0.0, float("nan")]], 1)
    with pytest.raises(ValueError, match="worth on 0 GPUs"):
        allocate([[]], 1)
    with pytest.raises(ValueError, match="non-negative"):
        allocate([[0.0, 1.0]], -1)


def test_neutral_range_excludes_inefficient_batches(apps):
    # cifar10's progress-weighted mean efficiency: 0.93 at 512, 0.89 at 1024 (validation profiles).
    assert neutral_batches(apps["cifar10"]) == (128, 256, 512)
    assert neutral_batches(apps["bert"]) == (12, 24, 48, 96, 192, 384)  # every bert batch is ~97 % efficient


def test_useful_throughput_picks_the_best_batch_per_gpu_count(apps):
    app = apps["cifar10"]
    both = useful_throughputs(app, 50, (128, 512), 4, "t4", 8)
    alone = [useful_throughputs(app, 50, (b,), 4, "t4", 8) for b in (128, 512)]
    assert len(both) == 9 and len(alone[0]) == 5  # 128 / 32 (smallest micro-batch) = 4 GPUs at most
    assert np.allclose(both, np.maximum(np.pad(alone[0], (0, 4)), alone[1]))


def test_saxena_moves_only_on_arrivals_and_completions(apps):
    policy, cluster = SaxenaPolicy(), Cluster.parse("1x4")
    live = [make_job(JobSpec(n, 0, 1, "cifar10", 2048), apps, None) for n in "ab"]
    first = policy.optimize(60, live, cluster, {})
    assert sorted(map(len, first.values())) == [2, 2]  # identical jobs, concave speedups: an even split
    assert policy.optimize(120, live, cluster, {"a": (0,)}) == {"a": (0,)}  # nothing arrived or left
    assert sum(map(len, policy.optimize(180, live[:1], cluster, first).values())) == 4  # b left: a takes all


def test_saxena_fixed_runs_the_user_batch(apps):
    assert SaxenaPolicy(adaptive_batch=False).batch_size(JobSpec("a", 0, 1, "cifar10", 2048), apps["cifar10"]) == 2048
    assert SaxenaPolicy().batch_size(JobSpec("a", 0, 1, "cifar10", 2048), apps["cifar10"]) is None


def test_edl_shrinks_to_admit_waiting_jobs_and_restores_requests(apps):
    cluster = Cluster.parse("1x4")
    policy = EdlPolicy()
    a = make_job(JobSpec("a", 0, 4, "cifar10", 2048), apps, 2048)
    assert len(policy.optimize(60, [a], cluster, {})["a"]) == 4  # alone: what it asked for
    b, c, d = (make_job(JobSpec(n, 60, 2, "cifar10", 2048), apps, 2048) for n in "bcd")
    alloc = policy.optimize(120, [a, b, c, d], cluster, {"a": (0,) * 4})
    assert {n: len(g) for n, g in alloc.items()} == {"a": 1, "b": 1, "c": 1, "d": 1}  # all at their minimum
    alloc = policy.optimize(180, [a, b], cluster, alloc)
    # c and d left: 1 GPU each, then the 2 spare restore a (first in order) toward its 4; none left for b.
    assert {n: len(g) for n, g in alloc.items()} == {"a": 3, "b": 1}


def test_edl_hands_spare_gpus_by_marginal_speedup(apps):
    cluster, policy = Cluster.parse("1x4"), EdlPolicy()
    live = [make_job(JobSpec(n, 0, 1, "cifar10", 2048), apps, 2048) for n in "ab"]
    counts = {n: len(g) for n, g in policy.optimize(60, live, cluster, {}).items()}
    # By hand: each asked for 1; the 2 spare GPUs go one at a time to the larger gain in speedup t(1) / t(r).
    # cifar10's placements.csv (T4) at batch 2048 on one node: t(1) = 2 x 0.702093 - 0.000547 = 1.403638 s (two
    # micro-batches of 1024), t(2) = 0.837972 s (1024 each), t(3) = 0.546091 s (683 each, between 513 and 725).
    # The third GPU: a tie, 1.403638 / 0.837972 - 1 = 0.675, to a (first in order); the fourth: a's
    # 1.403638 / 0.546091 - 1.675 = 0.895 beats b's 0.675.
    assert counts == {"a": 3, "b": 1}
