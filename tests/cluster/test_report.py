"""A cluster run's report, built from the job table alone (no Ray): times, GPU-seconds and restarts."""
from easyscale_ext.cluster.report import run_result
from easyscale_ext.sched import plots


def test_a_job_queued_again_counts_a_restart_and_a_change_in_place_does_not():
    jobs = [{"id": "a", "application": None, "submitted": 100.0, "finished": 130.0, "state": "finished",
             "max_procs": 2},
            {"id": "b", "application": None, "submitted": 101.0, "finished": None, "state": "queued", "max_procs": 1}]
    allocations = [(101.0, "a", ["n1", "n2"]),  # starts on two slots
                   (105.0, "a", ["n1"]),  # in place: one slot
                   (110.0, "a", []),  # its node went: queued again
                   (120.0, "a", ["n3"]),  # starts again from its checkpoint
                   (130.0, "a", [])]
    result = run_result(jobs, allocations, "fifo", "3 slots (t4)", 60.0)
    (record,) = result.jobs  # b never finished: no record
    assert record["restarts"] == 1
    assert (record["arrival"], record["start"], record["completion"], record["jct"]) == (0.0, 1.0, 30.0, 30.0)
    assert record["gpu_seconds"] == 4 * 2 + 5 * 1 + 10 * 1
    assert result.segments == [("a", 1.0, 5.0, 2), ("a", 5.0, 10.0, 1), ("a", 20.0, 30.0, 1)]


def test_a_job_that_failed_after_holding_slots_has_no_record_and_the_plots_draw(tmp_path):
    jobs = [{"id": "a", "application": None, "submitted": 0.0, "finished": 10.0, "state": "finished", "max_procs": 1},
            {"id": "b", "application": None, "submitted": 1.0, "finished": 3.0, "state": "failed", "max_procs": 1}]
    allocations = [(0.0, "a", ["n1"]), (1.0, "b", ["n2"]), (3.0, "b", []), (10.0, "a", [])]
    result = run_result(jobs, allocations, "fifo", "2 slots (t4)", 60.0)
    assert [r["name"] for r in result.jobs] == ["a"] and result.segments == [("a", 0.0, 10.0, 1)]
    plots.gantt(result, "2 slots (t4)", tmp_path / "gantt.png")
    assert (tmp_path / "gantt.png").stat().st_size > 0
