"""Fixtures for every test; the helpers the tests share are in tests/support."""
import pytest
import torch

from easyscale_ext.cluster.local import use_loopback

# Every Ray the tests start stays on loopback (../shared/RAY.md). Ray reads this when first imported, which
# any test module may do at collection: hence here, before them all.
use_loopback()


@pytest.fixture(autouse=True)
def _restore_num_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)
