"""Fixtures for every test; the helpers the tests share are in tests/support."""
import pytest
import torch


@pytest.fixture(autouse=True)
def _restore_num_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)
