"""The job model against the measured traces: step times, the fitted throughput model, gradient noise."""
import numpy as np
import pytest
from scipy.optimize import check_grad

from easyscale_ext.sched.models import throughput
from easyscale_ext.sched.models.application import EPOCHS
from easyscale_ext.sched.models.efficiency import gain
from easyscale_ext.sched.models.goodput import GoodputModel, split_batch
from easyscale_ext.sched.metrics import isolated_runtime
from easyscale_ext.sched.models.profile import canonical
from easyscale_ext.sched.models.traces import read_csv
from easyscale_ext.sched.models.workload import JobSpec


def test_canonical_placement_is_smallest_rotation():
    assert canonical((4, 0, 2, 1)) == (1, 4, 2)
    assert canonical((2, 2)) == (2, 2)


@pytest.mark.parametrize("name", sorted(EPOCHS))
def test_measured_placements_are_returned_exactly(apps, data, name):
    rows = read_csv(data / "pollux" / "traces" / name / "placements.csv")
    prof = apps[name].profile("t4")
    for i in range(0, len(rows["placement"]), 37):
        placement = tuple(int(c) for c in str(int(rows["placement"][i])))
        step, sync = prof.step_time(placement, rows["local_bsz"][i])
        assert step == pytest.approx(rows["step_time"][i]) and sync == pytest.approx(rows["sync_time"][i])


def test_unmeasured_placements_are_interpolated_between_measurements(apps):
    prof = apps["cifar10"].profile("t4")
    lo, hi = prof.step_time((4,) * 6, 64)[0], prof.step_time((4,) * 8, 64)[0]
    mid = prof.step_time((4,) * 7, 64)[0]  # 7 nodes x 4 was not measured
    assert (4, 4, 4, 4, 4, 4, 4) not in prof.exact
    assert min(lo, hi) <= mid <= max(lo, hi)


@pytest.mark.parametrize("name", sorted(EPOCHS))
def test_fitted_model_matches_trace_points(apps, name):
    nodes, reps, bsz, step, sync = apps[name].profile("t4").samples()
    params = throughput.fit_perf_params(nodes, reps, bsz, step, sync)
    rel = np.abs(throughput.step_time(params, nodes, reps, bsz) / step - 1)
    assert np.median(rel) < 0.10 and np.percentile(rel, 90) < 0.30, (np.median(rel), np.percentile(rel, 90))
    assert 1.0 <= params.gamma <= 10.0


def test_fit_recovers_a_known_model():
    truth = throughput.PerfParams(0.02, 0.001, 0.05, 0.004, 0.01, 0.001, 2.0)
    nodes = np.array([1, 1, 1, 2, 2, 4, 4, 1, 2])
    reps = np.array([1, 2, 4, 4, 8, 8, 16, 3, 6])
    bsz = np.array([32, 64, 128, 32, 64, 128, 256, 96, 48])
    step = throughput.step_time(truth, nodes, reps, bsz)
    sync = step - throughput.grad_time(truth, bsz)
    fit = throughput.fit_perf_params(nodes, reps, bsz, step, sync)
    assert np.allclose(throughput.step_time(fit, nodes, reps, bsz), step, rtol=0.02)


def test_the_fits_driver_finds_what_scipy_minimize_finds_to_the_bit(apps, monkeypatch):
    def minimize(fun_and_grad, x0, lo, hi, ftol, max_iterations):
        from scipy.optimize import Bounds, minimize
        return minimize(fun_and_grad, x0, jac=True, method="L-BFGS-B", bounds=Bounds(lo, hi, keep_feasible=True),
                        options={"ftol": ftol, "maxiter": max_iterations}).x

    measurements = []  # every application's profile, and its first few points (which pin parameters)
    for name in sorted(EPOCHS):
        samples = apps[name].profile("t4").samples()
        measurements += [samples] + [[a[:k] for a in samples] for k in (1, 2, 3, 5)]
    driven = [throughput.fit_perf_params(*m) for m in measurements]
    monkeypatch.setattr(throughput, "lbfgsb", minimize)
    assert np.array(driven).tobytes() == np.array([throughput.fit_perf_params(*m) for m in measurements]).tobytes()


def test_loss_gradient_is_exact(apps):
    nodes, reps, bsz, step, sync = apps["imagenet"].profile("t4").samples()
    loss = throughput._Loss(nodes, reps, bsz, np.log(step - sync), np.log(step))
    theta = np.array([0.1, 0.01, 0.2, 0.01, 0.05, 0.005, 2.0])
    err = check_grad(lambda x: loss(x)[0], lambda x: loss(x)[1], theta)
    assert err < 1e-3


def test_single_observation_is_fitted_exactly():
    fit = throughput.fit_perf_params([6], [14], [513], [0.40037732], [0.01820948])
    assert throughput.step_time(fit, 6, 14, 513) == pytest.approx(0.40037732, rel=1e-3)


def test_gain_is_between_one_and_the_scale():
    scale = np.array([1.0, 2.0, 8.0, 64.0])
    g = gain(1.0, 3.0, scale)
    assert g[0] == 1.0 and np.all(g >= 1.0) and np.all(g <= scale)
    assert gain(1.0, 0.0, 8.0) == 1.0  # no noise: a larger batch buys nothing


def test_gradient_statistics_are_the_trace_rows_and_linear_between(apps, data):
    noise = apps["cifar10"].noise
    rows = read_csv(data / "pollux" / "traces" / "cifar10" / "validation-512.csv")
    assert noise.grad_stats(512, 3) == (pytest.approx(rows["grad_sqr"][3]), pytest.approx(rows["grad_var"][3]))
    lo, hi = noise.grad_stats(256, 3)[1], noise.grad_stats(512, 3)[1]
    assert noise.grad_stats(384, 3)[1] == pytest.approx((lo + hi) / 2)
    # Progress is counted in steps at the initial batch: one epoch of cifar10 at M0 = 128 is ~391 steps.
    assert noise.init_batch_size == 128 and noise.progress_at(1) == pytest.approx(390.7, abs=1)


def test_batch_split_follows_the_artifact():
    assert split_batch(384, 8, 12, 12) == (12, 3)  # 48 per GPU, 12 at most: 4 micro-batches
    assert split_batch(256, 1, 1024, 128) == (128, 1)  # one GPU above M0: at least two micro-batches
    assert split_batch(128, 1, 1024, 128) == (128, 0)


def test_best_batch_beats_every_candidate(apps):
    app = apps["cifar10"]
    model = GoodputModel(throughput.PerfParams(0.02, 0.0007, 0.13, 0.003, 0.03, 0.002, 2.2), 1.0, 3.0, app)
    good, local, accum = model.best([1, 2], [4, 8])
    for i, (n, r) in enumerate([(1, 4), (2, 8)]):
        assert good[i] >= model.goodput(n, r, local[i], accum[i]) - 1e-12
        for m in range(app.min_local_bsz, app.max_local_bsz + 1, 16):
            if r * m >= app.init_batch_size:
                assert good[i] >= model.goodput(n, r, m, 0) * (1 - 1e-2)


def test_best_on_a_grid_is_each_pairs_best_to_the_bit(apps):
    """A grid of (nodes, replicas) pairs, as a Pollux speedup table asks, is computed once per distinct (replicas,
    several nodes): each entry must be the bits of that pair asked alone."""
    model = GoodputModel(throughput.PerfParams(0.02, 0.0007, 0.13, 0.003, 0.03, 0.002, 2.2), 1.0, 3.0,
                         apps["cifar10"])
    nodes, reps = (a.ravel() for a in np.meshgrid(np.arange(1, 7), np.arange(1, 17), indexing="ij"))
    nodes, reps = nodes[nodes <= reps], reps[nodes <= reps]
    grid = model.best(nodes, reps)
    alone = np.array([[v[0] for v in model.best(n, r)] for n, r in zip(nodes, reps)]).T
    assert len(nodes) > 32 and all(np.array_equal(g, a) for g, a in zip(grid, alone))


def test_job_finishes_after_its_epochs_and_more_gpus_help_cifar10(apps):
    spec = lambda g: JobSpec("c", 0.0, g, "cifar10", 512)  # noqa: E731
    one, four = isolated_runtime(spec(1), apps, 4, "t4"), isolated_runtime(spec(4), apps, 4, "t4")
    assert 2 * four < one
    # One GPU: 10615 steps at 512 by the end of epoch 99 (validation-512.csv), each two micro-batches of 256:
    # 2 x 0.186418 - 0.000532 = 0.372304 s (placements.csv, 256 between the measured 182 and 257): 3952 s.
    assert one == pytest.approx(3952, rel=0.01)
