"""A real two-node Ray cluster on this machine (loopback only), shared by the cluster tests."""
import pytest

ray = pytest.importorskip("ray", reason="cluster mode needs Ray (pip install 'easyscale_ext[cluster]')")

from support.hosts import hosts  # noqa: E402,F401 (the fixture of the tests across emulated hosts)


@pytest.fixture(scope="module")
def cluster():
    from easyscale_ext.cluster.local import LocalCluster

    local = LocalCluster(nodes=2, slots=2)
    try:
        yield local
    finally:
        local.shutdown()
