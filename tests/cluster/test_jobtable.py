"""The job table stays quick to read however many jobs have ended, survives its writer killed mid-write, moves a job
only along its lifecycle, and takes over a table of an earlier version."""
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter

import pytest

from easyscale_ext.cluster.jobtable import JobTable
from easyscale_ext.cluster.lifecycle import ENDED, LIVE, MOVES, IllegalMove, JobState

WRITER = """
import sys
from easyscale_ext.cluster.jobtable import JobTable
table = JobTable(sys.argv[1])
print("writing", flush=True)
while True:
    job = table.add("w", ["train.py"], {}, 4, 1, 4)
    table.move(job, "running", nodes=["a", "b"])
    table.move(job, "finished", exit_code=0, finished=1.0, nodes=[])
"""


def test_live_jobs_and_the_last_ended_are_read_through_an_index(tmp_path):
    table = JobTable(str(tmp_path / "jobs.sqlite"))
    with table.db:  # 10,000 ended jobs in one transaction
        table.db.executemany("INSERT INTO jobs (id, state, submitted, finished, argv, env, nodes) "
                             "VALUES (?, 'finished', ?, ?, '[]', '{}', '[]')",
                             [(f"old{i}", i, i) for i in range(10000)])
    live = [table.add(f"live{i}", ["train.py"], {}, 4, 1, 4) for i in range(2)]
    assert [j["id"] for j in table.list(LIVE)] == live
    assert [j["id"] for j in table.ended(10)] == [f"old{i}" for i in range(9990, 10000)]
    plan = " ".join(str(tuple(r)) for r in table.db.execute(
        "EXPLAIN QUERY PLAN SELECT * FROM jobs WHERE state IN ('queued', 'running') ORDER BY submitted"))
    assert "jobs_by_state" in plan, plan


def test_the_table_survives_its_writer_killed_mid_write(tmp_path):
    path = str(tmp_path / "jobs.sqlite")
    for _ in range(3):
        writer = subprocess.Popen([sys.executable, "-c", WRITER, path], stdout=subprocess.PIPE, text=True)
        assert writer.stdout.readline() == "writing\n"
        time.sleep(0.5)
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    assert sqlite3.connect(path).execute("PRAGMA integrity_check").fetchone() == ("ok",)
    table = JobTable(path)
    jobs = table.list()
    assert len(jobs) > 3 and all(j["state"] in ("queued", "running", "finished") for j in jobs)
    entries = Counter(job for _, job, _ in table.allocations())
    # a job's slots and their entry in the timeline are one write: a kill between them leaves neither
    assert all(entries[j["id"]] == {"queued": 0, "running": 1, "finished": 2}[j["state"]] for j in jobs)


def test_a_job_moves_only_along_its_lifecycle(tmp_path):
    table = JobTable(str(tmp_path / "jobs.sqlite"))
    job = table.add("j", ["train.py"], {}, 4, 1, 4)
    for state, nodes in (("running", ["a"]), ("suspending", ["a"]), ("suspended", []), ("running", ["b"])):
        table.move(job, state, nodes=nodes)
    table.move(job, "finished", exit_code=0, nodes=[])
    timeline = [nodes for _, _, nodes in table.allocations()]
    for illegal in ("running", "queued", "cancelled", "suspended"):  # an ended job stays ended
        with pytest.raises(IllegalMove, match=f"cannot move to {illegal}: it is finished"):
            table.move(job, illegal, nodes=["c"])
    assert table.get(job)["state"] == JobState.FINISHED and table.get(job)["exit_code"] == 0
    assert [nodes for _, _, nodes in table.allocations()] == timeline == [["a"], ["a"], [], ["b"], []]
    with pytest.raises(ValueError, match="JobTable.move"):
        table.update(job, state="queued")
    queued = table.add("q", ["train.py"], {}, 4, 1, 4)
    with pytest.raises(IllegalMove, match="it is queued"):  # never ran: nothing to suspend
        table.move(queued, "suspending")
    assert set(MOVES) == set(LIVE) and not set(MOVES) & set(ENDED)  # no move out of an end


def test_a_table_of_an_earlier_version_gains_the_new_columns_and_keeps_its_jobs(tmp_path):
    """A scheduler started on the state folder of an earlier one: its jobs table lacked `history`, its cluster table
    `next_s` (when the scheduler describes the nodes again). Both are added; the job and the description stay."""
    path = tmp_path / "jobs.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE jobs (id TEXT PRIMARY KEY, name TEXT, argv TEXT, env TEXT, virtual_workers INTEGER, "
               "min_procs INTEGER, max_procs INTEGER, state TEXT, submitted REAL, started REAL, finished REAL, "
               "exit_code INTEGER, nodes TEXT, log_dir TEXT, application TEXT, batch_size INTEGER, note TEXT, "
               "live TEXT, step_s REAL)")
    db.execute("INSERT INTO jobs (id, name, argv, env, virtual_workers, min_procs, max_procs, state, submitted, "
               "nodes) VALUES ('old-1', 'old', '[\"train.py\"]', '{}', 4, 1, 4, 'queued', 1.0, '[]')")
    db.execute("CREATE TABLE cluster (id INTEGER PRIMARY KEY CHECK (id = 0), time REAL, nodes TEXT, host TEXT, "
               "pid INTEGER)")
    db.execute("INSERT INTO cluster VALUES (0, 1.0, '[]', 'h', 1)")
    db.commit()
    db.close()
    table = JobTable(str(path))
    assert table.get("old-1")["state"] == JobState.QUEUED and table.get("old-1")["history"] is None
    assert table.described()["next_s"] is None  # described by the earlier scheduler: no promise of when again
    table.describe([{"node": "n"}], 60.0)
    assert JobTable(str(path), read_only=True).described()["next_s"] == 60.0
