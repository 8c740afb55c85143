"""Fixtures of the scheduling simulator's tests: the measured traces (the package's copy, or
$EASYSCALE_SCHED_DATA) and the applications profiled in them. Without the traces the tests that need them skip,
saying so."""
import pytest

from easyscale_ext.sched.models.application import Applications
from easyscale_ext.sched.models.traces import data_dir


@pytest.fixture(scope="session")
def data():
    try:
        return data_dir()
    except FileNotFoundError as e:
        pytest.skip(f"scheduling traces not found: {e}")


@pytest.fixture(scope="session")
def apps(data):
    return Applications(data)
