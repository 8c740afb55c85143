"""Measured step times of one application on one GPU type: the simulator's ground truth for throughput.

A placement is a tuple of GPUs per node, e.g. (4, 2) = 4 GPUs on one node and 2 on another. A placement that
was measured is looked up exactly (linear in the per-GPU batch between measured batches); any other is
interpolated linearly in (nodes, replicas, per-GPU batch) over all measurements, as the Pollux artifact does;
outside their convex hull, the nearest measurement stands in.
"""
import numpy as np

from .traces import read_csv

MAX_NODES = 16  # the largest node count measured (scalability.csv); larger spreads are looked up as 16 nodes


def canonical(placement) -> tuple:
    """Drop empty nodes and take the lexicographically smallest rotation: the measured traces name placements
    that way (the ring all-reduce is the same whichever node starts it)."""
    p = tuple(int(g) for g in placement if g)
    return min(p[i:] + p[:i] for i in range(len(p)))


class StepTimeProfile:
    def __init__(self, placements: dict, scalability: dict):
        """From the columns of placements.csv and scalability.csv."""
        pl, sc = placements, scalability
        self._columns = (pl, sc)
        names = [str(int(p)) for p in pl["placement"]]
        self.exact = {}  # canonical placement -> (per-GPU batches, step times, sync times), sorted by batch
        for name in dict.fromkeys(names):
            rows = np.array([i for i, n in enumerate(names) if n == name])
            rows = rows[np.argsort(pl["local_bsz"][rows], kind="stable")]
            self.exact[canonical(map(int, name))] = tuple(pl[c][rows] for c in ("local_bsz", "step_time", "sync_time"))
        # Interpolation points: each measured (nodes, replicas, batch) once (placements averaged), plus scalability.
        pl_nodes = np.array([len(n) for n in names], dtype=float)
        pl_reps = np.array([sum(map(int, n)) for n in names], dtype=float)
        keys, inverse = np.unique(np.stack([pl_nodes, pl_reps, pl["local_bsz"]], 1), axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        counts = np.bincount(inverse)
        mean = lambda v: np.bincount(inverse, weights=v) / counts  # noqa: E731
        x = np.concatenate([keys, np.stack([sc["num_nodes"], sc["num_replicas"], sc["local_bsz"]], 1)])
        y = np.concatenate([np.stack([mean(pl["step_time"]), mean(pl["sync_time"])], 1),
                            np.stack([sc["step_time"], sc["sync_time"]], 1)])
        # here, not at the top: the CLI's parsers import this module (`status` stays quick)
        from scipy.interpolate import LinearNDInterpolator, NearestNDInterpolator

        self._points = (x, y)
        self._interp = LinearNDInterpolator(x, y)
        self._nearest = NearestNDInterpolator(x, y)  # outside the measurements' hull
        self._memo = {}
        self.min_local_bsz = int(min(pl["local_bsz"].min(), sc["local_bsz"].min()))
        self.max_local_bsz = int(max(pl["local_bsz"].max(), sc["local_bsz"].max()))

    @classmethod
    def from_csv(cls, placements_csv, scalability_csv) -> "StepTimeProfile":
        return cls(read_csv(placements_csv), read_csv(scalability_csv))

    def scaled(self, compute_factor: float) -> "StepTimeProfile":
        """The profile of a GPU whose compute takes `compute_factor` times as long, with the same
        synchronisation times (the network, not the GPU, bounds those)."""
        def scale(cols):
            compute = (cols["step_time"] - cols["sync_time"]) * compute_factor
            return {**cols, "step_time": cols["sync_time"] + compute}
        return StepTimeProfile(*map(scale, self._columns))

    def step_time(self, placement, local_bsz) -> tuple:
        """(step time, sync time) in seconds of one step at `local_bsz` samples per GPU."""
        key = (canonical(placement), float(local_bsz))
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = self._lookup(*key)
        return hit

    def _lookup(self, placement, local_bsz):
        measured = self.exact.get(placement)
        if measured is not None and measured[0][0] <= local_bsz <= measured[0][-1]:
            bsz, step, sync = measured
            return float(np.interp(local_bsz, bsz, step)), float(np.interp(local_bsz, bsz, sync))
        point = [min(len(placement), MAX_NODES), sum(placement), local_bsz]
        step, sync = self._interp(point)[0]
        if not np.isfinite(step):  # e.g. a batch measured on one node only: the nearest measurement
            step, sync = self._nearest(point)[0]
        return float(step), float(sync)

    def samples(self):
        """All measurements as arrays (nodes, replicas, per-GPU batch, step time, sync time): the fit's data."""
        x, y = self._points
        return x[:, 0], x[:, 1], x[:, 2], y[:, 0], y[:, 1]
