"""LocalCluster's nodes, as the tests and the chaos benchmark add and remove them."""
import pytest

pytestmark = pytest.mark.multiprocess


def test_a_removed_node_is_no_longer_listed_and_those_after_it_move_up(cluster):
    _, b = cluster.node_ids()
    cluster.remove_node(0)
    assert cluster.node_ids() == [b]
