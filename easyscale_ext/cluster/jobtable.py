"""The cluster's job table: one SQLite file in the cluster's state folder, so that a scheduler that
restarts (`cluster stop`/`start`, or its actor crashing) finds its jobs, their allocations over time and the
cluster's reserved slots again."""
import json
import os
import sqlite3
import threading
import time
import uuid
from typing import List, Optional

STATES = ("queued", "running", "finished", "failed", "cancelled")
_JSON = ("argv", "env", "nodes")
_COLUMNS = {"id": "TEXT PRIMARY KEY", "name": "TEXT", "argv": "TEXT", "env": "TEXT", "virtual_workers": "INTEGER",
            "min_procs": "INTEGER", "max_procs": "INTEGER", "state": "TEXT", "submitted": "REAL", "started": "REAL",
            "finished": "REAL", "exit_code": "INTEGER", "nodes": "TEXT", "log_dir": "TEXT", "application": "TEXT",
            "batch_size": "INTEGER", "note": "TEXT"}  # note: why a job waits in the queue again (suspended, ...)
_SCHEMA = (f"CREATE TABLE IF NOT EXISTS jobs ({', '.join(f'{c} {t}' for c, t in _COLUMNS.items())})",
           # every change of a job's slots (nodes: a node id per slot, [] when it ends): the run's timeline
           "CREATE TABLE IF NOT EXISTS allocations (time REAL, job TEXT, nodes TEXT)",
           "CREATE TABLE IF NOT EXISTS reservations (id TEXT PRIMARY KEY, node TEXT)",
           # rounds and `status` read live jobs: an index keeps that quick however many jobs have ended
           "CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state, submitted)")


class JobTable:
    def __init__(self, path: str):
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)  # autocommit
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")  # readers (status) never block the scheduler's writes
        for statement in _SCHEMA:
            self.db.execute(statement)
        have = {row["name"] for row in self.db.execute("PRAGMA table_info(jobs)")}
        for column in _COLUMNS.keys() - have:  # a table of an earlier version gains the new columns
            self.db.execute(f"ALTER TABLE jobs ADD COLUMN {column} {_COLUMNS[column]}")
        self.lock = threading.Lock()

    def add(self, name: str, argv: List[str], env: dict, virtual_workers: int, min_procs: int, max_procs: int,
            application: Optional[str] = None, batch_size: Optional[int] = None, logs: str = "") -> str:
        """A queued job; its id. Its log folder is `logs`/ID, in the same row (a round may read it at once)."""
        job_id = f"{name}-{uuid.uuid4().hex[:6]}"
        with self.lock:
            self.db.execute("INSERT INTO jobs (id, name, argv, env, virtual_workers, min_procs, max_procs, state, "
                            "submitted, nodes, application, batch_size, log_dir) "
                            "VALUES (?, ?, ?, ?, ?, ?, ?, 'queued', ?, '[]', ?, ?, ?)",
                            (job_id, name, json.dumps(argv), json.dumps(env), virtual_workers, min_procs,
                             max_procs, time.time(), application, batch_size, os.path.join(logs, job_id)))
        return job_id

    def update(self, job_id: str, **fields) -> None:
        values = [json.dumps(v) if k in _JSON else v for k, v in fields.items()]
        with self.lock:
            self.db.execute(f"UPDATE jobs SET {', '.join(f'{k} = ?' for k in fields)} WHERE id = ?",
                            values + [job_id])
            if "nodes" in fields:
                self.db.execute("INSERT INTO allocations VALUES (?, ?, ?)",
                                (time.time(), job_id, json.dumps(fields["nodes"])))

    def get(self, job_id: str) -> Optional[dict]:
        with self.lock:
            row = self.db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _decode(row) if row else None

    def list(self, states=STATES) -> List[dict]:
        with self.lock:
            rows = self.db.execute(f"SELECT * FROM jobs WHERE state IN ({', '.join('?' * len(states))}) "
                                   "ORDER BY submitted", tuple(states)).fetchall()
        return [_decode(r) for r in rows]

    def ended(self, limit: int) -> List[dict]:
        """The `limit` jobs that ended last (finished, failed or cancelled), in submission order."""
        with self.lock:
            rows = self.db.execute("SELECT * FROM (SELECT * FROM jobs WHERE state IN ('finished', 'failed', "
                                   "'cancelled') ORDER BY finished DESC LIMIT ?) ORDER BY submitted",
                                   (limit,)).fetchall()
        return [_decode(r) for r in rows]

    def allocations(self) -> List[tuple]:
        """(time, job, nodes) of every change of a job's slots, in time order."""
        with self.lock:
            rows = self.db.execute("SELECT * FROM allocations ORDER BY time").fetchall()
        return [(r["time"], r["job"], json.loads(r["nodes"])) for r in rows]

    def reserve(self, node: str) -> str:
        slot_id = uuid.uuid4().hex[:8]
        with self.lock:
            self.db.execute("INSERT INTO reservations VALUES (?, ?)", (slot_id, node))
        return slot_id

    def unreserve(self, slot_id: str) -> None:
        with self.lock:
            self.db.execute("DELETE FROM reservations WHERE id = ?", (slot_id,))

    def reservations(self) -> List[tuple]:
        """(id, node) of every reserved slot."""
        with self.lock:
            return [tuple(r) for r in self.db.execute("SELECT id, node FROM reservations ORDER BY id")]


def _decode(row) -> dict:
    job = dict(row)
    for k in _JSON:
        job[k] = json.loads(job[k]) if job[k] is not None else None
    return job
