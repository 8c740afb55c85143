"""Pollux's throughput model (Qiao et al., OSDI'21, section 3.2), fitted to step-time measurements with SciPy.

  T_grad(m)  = alpha_c + beta_c * m                       compute time of one micro-batch of m samples per GPU
  T_sync     = alpha_r + beta_r * max(r - 2, 0)           all 2..r replicas on one node
             = alpha_n + beta_n * max(r - 2, 0)           replicas spread over several nodes
  T_iter     = s * T_grad + (T_grad^gamma + T_sync^gamma)^(1/gamma)   s extra accumulation steps; gamma in [1, 10]
               says how far compute and synchronisation overlap (1: not at all; 10: almost max()).
"""
from typing import NamedTuple

import numpy as np


class PerfParams(NamedTuple):
    alpha_c: float
    beta_c: float
    alpha_n: float
    beta_n: float
    alpha_r: float
    beta_r: float
    gamma: float


TINY = 1e-8  # the lower bound of every time parameter, and the "sync time" of a single replica


def grad_time(p: PerfParams, local_bsz):
    return p.alpha_c + p.beta_c * np.asarray(local_bsz, dtype=float)


def sync_time(p: PerfParams, num_nodes, num_replicas):
    extra = np.maximum(np.asarray(num_replicas, dtype=float) - 2, TINY)
    return np.where(np.asarray(num_nodes) > 1, p.alpha_n + p.beta_n * extra,
                    np.where(np.asarray(num_replicas) > 1, p.alpha_r + p.beta_r * extra, TINY))


def step_time(p: PerfParams, num_nodes, num_replicas, local_bsz):
    """Time of the synchronising step (no accumulation)."""
    g, s = grad_time(p, local_bsz), sync_time(p, num_nodes, num_replicas)
    return np.exp(np.logaddexp(p.gamma * np.log(g), p.gamma * np.log(s)) / p.gamma)


def iteration_time(p: PerfParams, num_nodes, num_replicas, local_bsz, accum_steps):
    return np.asarray(accum_steps) * grad_time(p, local_bsz) + step_time(p, num_nodes, num_replicas, local_bsz)


class _Loss:
    """The fit's objective on fixed measurements, called with the parameters: the RMS log error of the compute and
    step times plus Pollux's two priors (a small gamma; small retrogression terms, i.e. an optimistic model), and
    its gradient, for L-BFGS-B. What depends on the measurements only is computed once per fit; an evaluation makes
    its floating-point operations in one fixed order (a fit's bits are what the simulations are pinned to), each
    once, into arrays made once."""

    def __init__(self, nodes, reps, bsz, log_grad, log_step):
        self.inter, self.intra = nodes > 1, (nodes <= 1) & (reps > 1)
        self.extra = np.maximum(reps - 2, TINY)
        self.bsz, self.log_grad, self.log_step, self.n = bsz, log_grad, log_step, len(bsz)
        # Rows that go through the same operation are stacked, one call for both: numpy computes each element alone,
        # so the bits are those of a call per row.
        self.kinds = np.stack([self.inter, self.intra]).astype(float)  # dstep's rows 2 and 4 are share times these
        self.over = np.stack([np.ones(len(bsz)), bsz])  # dgrad's rows 0 and 1 are these over g
        self.times = np.empty((2, len(bsz)))  # g, s
        self.errors = np.empty((2, len(bsz)))  # e1, e2
        self.dgrad = np.zeros((7, len(bsz)))  # rows 2-6 stay 0: compute time depends on alpha_c, beta_c only

    def __call__(self, theta):
        ac, bc, an, bn, ar, br, gamma = theta
        inter, intra, extra, bsz = self.inter, self.intra, self.extra, self.bsz
        times, errors = self.times, self.errors
        g = np.add(ac, bc * bsz, out=times[0])
        times[1] = s = np.where(inter, an + bn * extra, np.where(intra, ar + br * extra, TINY))
        logs = np.log(times)
        lg, ls = logs
        scaled = gamma * logs
        lstep = np.logaddexp(scaled[0], scaled[1]) / gamma
        wg, ws = shares = np.exp(gamma * (logs - lstep))  # shares of g^gamma and s^gamma
        e1, e2 = np.subtract(lg, self.log_grad, out=errors[0]), np.subtract(lstep, self.log_step, out=errors[1])
        # RMS errors smoothed at 0 by 1e-3 (0.1 %), so that L-BFGS-B also converges when the data fit exactly.
        r1, r2 = np.sqrt(np.add.reduce(errors ** 2, axis=1) / self.n + 1e-6)
        # d(lstep)/d(theta), one row per parameter
        dstep = np.empty((7, self.n))
        np.divide(wg, g, out=dstep[0])
        np.divide(wg * bsz, g, out=dstep[1])
        share = ws / s
        np.multiply(share, self.kinds, out=dstep[2:5:2])
        np.multiply(dstep[2:5:2], extra, out=dstep[3:6:2])
        weighted = shares * logs
        np.divide(weighted[0] + weighted[1] - lstep, gamma, out=dstep[6])
        dgrad = self.dgrad
        np.divide(self.over, g, out=dgrad[:2])
        grad = dgrad @ e1 / self.n / r1 + dstep @ e2 / self.n / r2
        rn, rr = bn / an, br / ar
        loss = r1 + r2 + 1e-3 * (gamma - 1) ** 2 + 1e-2 * (rn ** 2 + rr ** 2)
        grad[6] += 2e-3 * (gamma - 1)
        grad[2:6] += 2e-2 * np.array([-rn ** 2 / an, rn / an, -rr ** 2 / ar, rr / ar])
        return loss, grad


def fit_perf_params(num_nodes, num_replicas, local_bsz, step, sync) -> PerfParams:
    """Fit the model to measured steps (compute time = step - sync). Parameters the data cannot identify are
    pinned as Pollux does: alpha_c to half the compute time when one batch size was seen; the inter-node
    (intra-node) terms to ~0 without inter-node (multi-GPU single-node) data; the retrogression terms to ~0
    without more than 2 replicas. Without inter-node data, inter-node sync is then assumed 10 % slower than
    intra-node sync, so a job that has never spanned nodes does not think spanning them free."""
    nodes, reps, bsz = (np.asarray(a, dtype=float) for a in (num_nodes, num_replicas, local_bsz))
    step, sync = np.asarray(step, dtype=float), np.asarray(sync, dtype=float)
    compute = step - sync
    x0 = np.array([1e-1, 1e-2] * 3 + [1.0 + 1e-3])
    lo = np.array([TINY] * 6 + [1.0])
    hi = np.array([1e3] * 6 + [10.0])  # no term of a step lasts 1000 s; keeps the search finite
    pinned = []
    if len(np.unique(bsz)) == 1:
        x0[0] = lo[0] = hi[0] = compute.mean() / 2
    if not np.any(nodes > 1):
        pinned += [2, 3]
    if not np.any((nodes == 1) & (reps > 1)):
        pinned += [4, 5]
    if not np.any(reps > 2):
        pinned += [3, 5]
    x0[pinned] = hi[pinned] = lo[pinned]
    # The time parameters span 1e-8..1 s: search their logarithms, which conditions the problem far better.
    to_x = lambda q: np.concatenate([np.log(q[:6]), q[6:]])  # noqa: E731
    to_p = lambda x: np.concatenate([np.exp(x[:6]), x[6:]])  # noqa: E731

    measured = _Loss(nodes, reps, bsz, np.log(compute), np.log(step))

    def loss(x):
        q = to_p(x)
        value, grad = measured(q)
        grad[:6] *= q[:6]  # the time parameters' chain rule (gamma's is 1)
        return value, grad

    p = to_p(lbfgsb(loss, to_x(x0), to_x(lo), to_x(hi), ftol=1e-6, max_iterations=100))  # 3 digits, not 9
    if not np.any(nodes > 1):
        p[2], p[3] = max(p[2], 1.1 * p[4]), max(p[3], 1.1 * p[5])
    return PerfParams(*map(float, p))


def lbfgsb(fun_and_grad, x0, lo, hi, ftol: float, max_iterations: int):
    """The minimum `scipy.optimize.minimize(fun_and_grad, x0, jac=True, method="L-BFGS-B", bounds=Bounds(lo, hi),
    options={"ftol": ftol, "maxiter": max_iterations})` finds, to the bit: SciPy's L-BFGS-B routine driven as
    `minimize` drives it, with its defaults, without the wrappers it puts around every evaluation, which cost a
    fit of the throughput model a third of its time (tests/sched/test_models.py holds the two equal)."""
    from scipy.optimize import _lbfgsb  # here, not at the top: the CLI's parsers import this module

    # minimize()'s defaults: corrections kept, line-search steps an iteration, projected-gradient tolerance
    m, max_line_search, gtol = 10, 20, 1e-5
    n = len(x0)
    x = np.clip(x0, lo, hi).astype(float)
    bounded = np.full(n, 2, np.int32)  # both bounds on every parameter
    f, g = np.array(0.0), np.zeros(n)
    work, iwork = np.zeros(2 * m * n + 5 * n + 11 * m * m + 8 * m), np.zeros(3 * n, np.int32)
    task, line_task = np.zeros(2, np.int32), np.zeros(2, np.int32)
    lsave, isave, dsave = np.zeros(4, np.int32), np.zeros(44, np.int32), np.zeros(29)
    factr, iterations = ftol / np.finfo(float).eps, 0
    while True:
        _lbfgsb.setulb(m, x, lo, hi, bounded, f, g, factr, gtol, work, iwork, task, lsave, isave, dsave,
                       max_line_search, line_task)
        if task[0] == 3:  # evaluate at x
            f, g = fun_and_grad(x)
        elif task[0] == 1:  # an iteration ended
            iterations += 1
            if iterations >= max_iterations:
                task[:] = 5, 504  # stop
        else:  # converged, or stopped
            return x
