"""The ledger's account of a run's allocations: segments, starts, GPU-seconds, GPUs held."""
from easyscale_ext.sched.ledger import Ledger


def test_a_resume_is_a_start_a_change_in_place_is_not_and_an_instant_leaves_no_segment():
    ledger = Ledger()
    ledger.held(0.0, "a", 2)  # starts on two GPUs
    ledger.held(0.0, "b", 1)
    ledger.held(0.0, "b", 3)  # changed in the same instant: no segment of no length
    ledger.held(5.0, "a", 1)  # in place
    assert ledger.holding == 4
    ledger.held(10.0, "a", 0)  # suspended
    ledger.held(20.0, "a", 4)  # resumed from its checkpoint
    ledger.held(30.0, "a", 0)
    ledger.held(30.0, "b", 0)
    assert ledger.segments == [("a", 0.0, 5.0, 2), ("a", 5.0, 10.0, 1), ("a", 20.0, 30.0, 4), ("b", 0.0, 30.0, 3)]
    assert ledger.starts == {"a": 2, "b": 1}
    assert ledger.first_start == {"a": 0.0, "b": 0.0}
    assert ledger.attained == {"a": 2 * 5 + 1 * 5 + 4 * 10, "b": 3 * 30}
    assert ledger.holding == 0
