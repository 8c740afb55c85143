"""The move tables of cluster mode's states: every state reachable from the first, every end leading the job
somewhere, anything else refused."""
import pytest

from easyscale_ext.cluster.lifecycle import (AFTER, MOVES, PROCESS_MOVES, RUN_MOVES, IllegalMove, JobState,
                                             ProcessState, Run, move)


def reachable(moves, first):
    seen, todo = {first}, [first]
    while todo:
        for to in moves.get(todo.pop(), ()):
            if to not in seen:
                seen.add(to)
                todo.append(to)
    return seen


@pytest.mark.parametrize("moves, states, first", [(MOVES, JobState, JobState.QUEUED), (RUN_MOVES, Run, Run.PLACING),
                                                  (PROCESS_MOVES, ProcessState, ProcessState.STARTING)])
def test_every_state_is_reachable_and_only_the_ends_have_no_move(moves, states, first):
    starts = {first, ProcessState.JOINING} if states is ProcessState else {first}  # a joiner starts joining
    assert set().union(*(reachable(moves, s) for s in starts)) == set(states)
    ends = {s for s in states if not moves.get(s)}
    assert ends == ({JobState.FINISHED, JobState.FAILED, JobState.CANCELLED} if states is JobState else
                    set(AFTER) if states is Run else {ProcessState.GONE})


def test_each_end_of_a_run_leads_its_job_to_a_state_a_holding_job_may_take():
    for run, state in AFTER.items():
        assert state in MOVES[JobState.RUNNING] and state in MOVES[JobState.SUSPENDING], (run, state)


def test_a_move_the_table_lacks_is_refused_naming_what_moved():
    assert move(PROCESS_MOVES, ProcessState.JOINING, ProcessState.LEAVING, "w1") == ProcessState.LEAVING
    with pytest.raises(IllegalMove, match="w1 cannot move to training: it is gone"):
        move(PROCESS_MOVES, ProcessState.GONE, ProcessState.TRAINING, "w1")
    with pytest.raises(IllegalMove, match="cannot move to running: it is suspended"):
        move(RUN_MOVES, Run.SUSPENDED, Run.RUNNING, "job j")
    with pytest.raises(IllegalMove):
        move(RUN_MOVES, Run.PLACING, Run.SUSPENDING, "job j")  # nothing to leave: it ends orphaned instead
