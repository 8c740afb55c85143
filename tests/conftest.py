"""Fixtures for every test; the helpers the tests share are in tests/support."""
import sys

import pytest

from easyscale_ext.cluster.local import use_loopback

# Every Ray the tests start stays on loopback: by default Ray takes the machine's interface address for its nodes
# and asks a cloud metadata address which cloud it is on, and gloo binds to the hostname's address; `use_loopback`
# sets the environment that keeps all three on this machine, for every process group a test starts too. Ray reads
# it when first imported, which any test module may do at collection: hence here, before them all.
use_loopback()


@pytest.fixture(autouse=True)
def _restore_num_threads():
    """A test leaves torch's intra-op threads as it found them; the torch-free ones (the simulator's) never load it."""
    torch = sys.modules.get("torch")
    n = torch.get_num_threads() if torch else None
    yield
    if n is not None:
        torch.set_num_threads(n)


# The tests that start Ray (a cluster per module, or `easyscale cluster start`) run one after another on one xdist
# worker (`make test` runs two): two Rays side by side would share this machine's few cores and its memory for at
# most 8 busy slots. Every other test spreads over both workers; much of a Ray test is waiting. (xdist's own
# xdist_group marks no longer group anything under pytest 9, whose node ids xdist cannot rename.)
RAY_TESTS = ("tests/cluster/", "tests/cli/test_cluster_cli.py", "tests/cli/test_listening.py")


@pytest.hookimpl(optionalhook=True)  # a run without xdist (-p no:xdist) has no such hook
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class RayTestsTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return "ray" if nodeid.startswith(RAY_TESTS) else nodeid

    return RayTestsTogether(config, log)


def pytest_collection_modifyitems(config, items):
    """The longest tests first (those marked slow, then those that start processes), the Ray tests' order kept:
    under xdist the last tests to start are then short ones, and both workers end together (a minute-long test
    collected last kept one worker busy while the other stood idle)."""
    def rank(item):
        if item.nodeid.startswith(RAY_TESTS):
            return 0  # one unit of work, in their order (module fixtures)
        return 1 if item.get_closest_marker("slow") else 2 if item.get_closest_marker("multiprocess") else 3

    items.sort(key=rank)  # stable: collection order within each rank
