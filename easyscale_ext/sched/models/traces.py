"""Where the measured traces live, and a small CSV reader for them.

The package ships a copy (easyscale_ext/sched/data/, its README.md says what and from where), so an installed
`easyscale simulate` runs without a checkout. The data is found, in order, at the path given explicitly
(`--data`), at $EASYSCALE_SCHED_DATA, or in the package.
"""
import csv
import gzip
import os
from importlib.resources import files
from pathlib import Path

import numpy as np

ENV_VAR = "EASYSCALE_SCHED_DATA"
PACKAGED = Path(str(files("easyscale_ext.sched") / "data"))


def data_dir(path=None) -> Path:
    """The data directory (the one holding pollux/, sia/, easyscale/), or a FileNotFoundError saying what to pass."""
    chosen = Path(path or os.environ.get(ENV_VAR) or PACKAGED)
    if not (chosen / "pollux" / "traces").is_dir():
        raise FileNotFoundError(
            f"no scheduling traces at {chosen} (expected {chosen}/pollux/traces/). Pass --data DIR or set "
            f"{ENV_VAR}=DIR, where DIR holds pollux/, sia/ and easyscale/ as described in {PACKAGED}/DATA.md.")
    return chosen


def read_csv(path) -> dict:
    """Columns of a CSV file by name: numeric columns as float arrays, the others as arrays of str. Reads
    `path`.gz instead where only that exists (large traces are shipped compressed). Values beyond the named
    columns are ignored (EasyScale's workloads end their header with an unnamed column)."""
    path, opener = Path(path), open
    if not path.exists() and path.with_name(path.name + ".gz").exists():
        path, opener = path.with_name(path.name + ".gz"), gzip.open
    with opener(path, "rt", newline="") as f:
        header, *rows = [row for row in csv.reader(f) if row] or [[]]
    while header and not header[-1]:
        header.pop()
    short = next((i for i, row in enumerate(rows, 2) if len(row) < len(header)), None)
    if short is not None:
        raise ValueError(f"{path}, line {short}: fewer values than the header's {len(header)} columns "
                         f"({','.join(header)})")
    columns = {}
    for name, values in zip(header, zip(*rows) if rows else [()] * len(header)):
        try:
            columns[name] = np.array(values, dtype=float)
        except ValueError:
            columns[name] = np.array(values)
    return columns
