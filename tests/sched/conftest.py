"""The simulator's tests read the traces in ../shared/data; without them they skip, saying so."""
import pytest

from easyscale_ext.sched.application import Applications
from easyscale_ext.sched.data import data_dir


@pytest.fixture(scope="session")
def data():
    try:
        return data_dir()
    except FileNotFoundError as e:
        pytest.skip(f"scheduling traces not found: {e}")


@pytest.fixture(scope="session")
def apps(data):
    return Applications(data)
