"""Statistical efficiency from the gradient-noise statistics of validation-<batch>.csv (Pollux, section 3.1).

With gradient square norm |g|^2 (grad_sqr) and variance tr(Sigma) (grad_var) measured at the initial batch M0,
one step at batch M = s * M0 makes as much progress as

  gain(s) = (var + sqr) / (var / s + sqr)

steps at M0 (between 1 and s); efficiency = gain / s. Progress is therefore counted in steps at M0, which is how
the traces' `progress` column counts it too, and an epoch ends when progress reaches that column's value.
"""
from pathlib import Path

import numpy as np

from .traces import read_csv


def gain(grad_sqr, grad_var, scale):
    denom = grad_var / scale + grad_sqr
    return np.where(denom > 0, (grad_var + grad_sqr) / np.where(denom > 0, denom, 1.0), 1.0)


def efficiency(grad_sqr, grad_var, scale):
    return gain(grad_sqr, grad_var, scale) / scale


class GradientNoise:
    """The validation traces of one application: gradient statistics per validated batch size and epoch."""

    def __init__(self, trace_dir):
        files = {int(p.stem.split("-")[-1]): read_csv(p) for p in Path(trace_dir).glob("validation-*.csv")}
        self.batch_sizes = np.array(sorted(files), dtype=float)
        epochs = min(len(f["progress"]) for f in files.values())
        stack = lambda col: np.stack([files[b][col][:epochs] for b in sorted(files)])  # noqa: E731
        self.grad_sqr, self.grad_var = stack("grad_sqr"), stack("grad_var")
        self.iteration = stack("iteration")
        # Progress at the end of each epoch: the least over the traces, so every batch size finishes the epoch.
        self.epoch_end = stack("progress").min(axis=0)
        self.init_batch_size = int(self.batch_sizes[0])
        self.max_batch_size = int(self.batch_sizes[-1])

    def progress_at(self, epochs: int) -> float:
        """Progress (steps at M0) at the end of `epochs` epochs."""
        return 0.0 if epochs == 0 else float(self.epoch_end[epochs - 1])

    def grad_stats(self, batch_size, epoch):
        """(grad_sqr, grad_var) during `epoch`, linear in the batch size between the validated ones."""
        return (float(np.interp(batch_size, self.batch_sizes, self.grad_sqr[:, epoch])),
                float(np.interp(batch_size, self.batch_sizes, self.grad_var[:, epoch])))

    def iterations(self, batch_size, epoch) -> float:
        """Iterations at `batch_size` by the end of epoch `epoch` (0-based), linear between validated batches."""
        return float(np.interp(batch_size, self.batch_sizes, self.iteration[:, epoch]))
