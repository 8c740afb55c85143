"""Which slots `easyscale cluster reserve` takes: free ones first, then jobs' slots above their minimum, and only
where the cluster may preempt, whole jobs, the latest first (suspended); what it cannot take is one clear error."""
import pytest

from easyscale_ext.cluster.reserve import take

CAPACITY = {"a": 2, "b": 2}


def test_free_slots_go_first_and_no_job_changes():
    taken, cut = take(1, "b", CAPACITY, {"j": ["a", "b"]}, {"j": 1})
    assert (taken, cut) == (["b"], {})


def test_then_the_job_with_most_slots_above_its_minimum_gives_one():
    holdings = {"big": ["a", "a", "b"], "small": ["b"]}
    taken, cut = take(1, "a", CAPACITY, holdings, {"big": 1, "small": 1})
    assert (taken, cut) == (["a"], {"big": ["a", "b"]})


def test_a_job_keeps_its_minimum_and_the_refusal_says_what_to_do():
    with pytest.raises(ValueError, match="only 1 of 2 slots can be reserved on node b without stopping a job"):
        take(2, "b", CAPACITY, {"j": ["a", "a", "b"]}, {"j": 3})
    with pytest.raises(ValueError, match="no node 'c' offers slots"):
        take(1, "c", CAPACITY, {}, {})


def test_anywhere_takes_the_emptiest_nodes_first():
    taken, cut = take(3, None, CAPACITY, {"j": ["a", "b"]}, {"j": 1})
    assert sorted(taken) == ["a", "a", "b"] or sorted(taken) == ["a", "b", "b"]
    assert list(cut.values()) in ([["a"]], [["b"]])


def test_where_the_cluster_may_preempt_the_latest_job_on_the_node_is_suspended():
    holdings = {"old": ["a"], "new": ["a", "b"]}  # in submission order
    assert take(1, "a", CAPACITY, holdings, {"old": 1, "new": 2}, suspend=True) == (["a"], {"new": []})
    assert take(2, "a", CAPACITY, holdings, {"old": 1, "new": 2}, suspend=True) == (["a", "a"], {"new": [], "old": []})
    with pytest.raises(ValueError, match="only 2 of 3 slots can be reserved on node a"):
        take(3, "a", CAPACITY, holdings, {"old": 1, "new": 2}, suspend=True)
