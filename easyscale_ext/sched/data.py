"""Where the measured traces live, and a small CSV reader for them.

The data is not shipped with the package (see ../shared/data/DATA.md beside the checkout). It is found, in
order, at the path given explicitly (`--data`), at $EASYSCALE_SCHED_DATA, or at <repo>/../shared/data.
"""
import csv
import os
from pathlib import Path

import numpy as np

ENV_VAR = "EASYSCALE_SCHED_DATA"
DEFAULT_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def data_dir(path=None) -> Path:
    """The data directory (the one holding pollux/, sia/, easyscale/), or a FileNotFoundError saying what to pass."""
    chosen = Path(path or os.environ.get(ENV_VAR) or DEFAULT_DIR)
    if not (chosen / "pollux" / "traces").is_dir():
        raise FileNotFoundError(
            f"no scheduling traces at {chosen} (expected {chosen}/pollux/traces/). Pass --data DIR or set "
            f"{ENV_VAR}=DIR, where DIR holds pollux/, sia/ and easyscale/ as described in shared/data/DATA.md.")
    return chosen


def read_csv(path) -> dict:
    """Columns of a CSV file by name: numeric columns as float arrays, the others as arrays of str."""
    with open(path, newline="") as f:
        rows = [row for row in csv.reader(f) if row]
    columns = {}
    for name, values in zip(rows[0], zip(*rows[1:])):
        try:
            columns[name] = np.array(values, dtype=float)
        except ValueError:
            columns[name] = np.array(values)
    return columns
