"""The cluster's job table: one SQLite file in the cluster's state folder, so that a scheduler that
restarts (`cluster stop`/`start`, or its actor crashing) finds its jobs, their allocations over time and the
cluster's reserved slots again. The scheduler also keeps there what `easyscale status` shows (each running job's
last report from its supervisor, as it came; the nodes, as its last round saw them, and when the next looks), so
that `status` on the head reads one file instead of joining Ray (SQLite's WAL: a reader never blocks the
scheduler)."""
import json
import os
import socket
import sqlite3
import threading
import time
import uuid
from typing import List, Optional

from .lifecycle import ENDED, LIVE, IllegalMove, JobState, sources

_JSON = ("argv", "env", "nodes", "live", "history")
_COLUMNS = {"id": "TEXT PRIMARY KEY", "name": "TEXT", "argv": "TEXT", "env": "TEXT", "virtual_workers": "INTEGER",
            "min_procs": "INTEGER", "max_procs": "INTEGER", "state": "TEXT", "submitted": "REAL", "started": "REAL",
            "finished": "REAL", "exit_code": "INTEGER", "nodes": "TEXT", "log_dir": "TEXT", "application": "TEXT",
            "batch_size": "INTEGER", "note": "TEXT",  # note: why a job waits in the queue again (suspended, ...)
            "live": "TEXT", "step_s": "REAL",  # a running job's supervisor's last answer, and seconds per step
            "history": "TEXT"}  # its model's service so far (cluster.live.history): a restarted scheduler's goes on
_CLUSTER_COLUMNS = {"id": "INTEGER PRIMARY KEY CHECK (id = 0)", "time": "REAL", "nodes": "TEXT", "host": "TEXT",
                    "pid": "INTEGER", "next_s": "REAL"}
_SCHEMA = (f"CREATE TABLE IF NOT EXISTS jobs ({', '.join(f'{c} {t}' for c, t in _COLUMNS.items())})",
           # every change of a job's slots (nodes: a node id per slot, [] when it ends): the run's timeline
           "CREATE TABLE IF NOT EXISTS allocations (time REAL, job TEXT, nodes TEXT)",
           "CREATE TABLE IF NOT EXISTS reservations (id TEXT PRIMARY KEY, node TEXT)",
           # the nodes as the scheduler last saw them, when, which process it is, and within how many seconds it
           # looks again (its round): a reader knows how fresh the table is and whether its writer lives
           f"CREATE TABLE IF NOT EXISTS cluster ({', '.join(f'{c} {t}' for c, t in _CLUSTER_COLUMNS.items())})",
           # rounds and `status` read live jobs: an index keeps that quick however many jobs have ended
           "CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state, submitted)")


def no_such_job(job_id: str) -> str:
    """What the scheduler and `easyscale` say of a job id the table lacks."""
    return f"no job {job_id!r}: `easyscale status` lists the cluster's jobs"


class JobTable:
    def __init__(self, path: str, read_only: bool = False):
        """The table at `path`, created if need be; with `read_only`, an existing one, opened for reading only
        (`easyscale status`)."""
        if read_only:
            self.db = sqlite3.connect(f"file:{os.path.abspath(path)}?mode=ro", uri=True, check_same_thread=False)
            self.db.row_factory = sqlite3.Row
            self.lock = threading.Lock()
            return
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)  # autocommit
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")  # readers (status) never block the scheduler's writes
        for statement in _SCHEMA:
            self.db.execute(statement)
        for table, columns in (("jobs", _COLUMNS), ("cluster", _CLUSTER_COLUMNS)):
            have = {row["name"] for row in self.db.execute(f"PRAGMA table_info({table})")}
            for column in columns.keys() - have:  # a table of an earlier version gains the new columns
                self.db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {columns[column]}")
        self.lock = threading.Lock()

    def add(self, name: str, argv: List[str], env: dict, virtual_workers: int, min_procs: int, max_procs: int,
            application: Optional[str] = None, batch_size: Optional[int] = None, logs: str = "") -> str:
        """A queued job; its id. Its log folder is `logs`/ID, in the same row (a round may read it at once)."""
        job_id = f"{name}-{uuid.uuid4().hex[:6]}"
        with self.lock:
            self.db.execute("INSERT INTO jobs (id, name, argv, env, virtual_workers, min_procs, max_procs, state, "
                            "submitted, nodes, application, batch_size, log_dir) "
                            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, '[]', ?, ?, ?)",
                            (job_id, name, json.dumps(argv), json.dumps(env), virtual_workers, min_procs,
                             max_procs, str(JobState.QUEUED), time.time(), application, batch_size,
                             os.path.join(logs, job_id)))
        return job_id

    def update(self, job_id: str, **fields) -> None:
        """Set a job's `fields`; its state changes through `move` only."""
        if "state" in fields:
            raise ValueError("a job's state changes by JobTable.move, which checks the move is legal")
        self._set(job_id, None, fields)

    def move(self, job_id: str, to: JobState, **fields) -> None:
        """Move a job to state `to` (setting `fields` with it), if lifecycle.MOVES allows it from the state it is
        in; else IllegalMove, and nothing changes."""
        to = JobState(to)
        if not self._set(job_id, to, dict(fields, state=str(to))):
            job = self.get(job_id)
            raise IllegalMove(f"job {job_id!r} cannot move to {to.value}: it is "
                              f"{job['state'] if job else 'not in the table'}")

    def _set(self, job_id: str, to: Optional[JobState], fields: dict) -> bool:
        """Whether the job's row changed: only from a state `to` may be reached from, if `to`."""
        values = [json.dumps(v) if k in _JSON else v for k, v in fields.items()]
        where, args = "id = ?", [job_id]
        if to is not None:
            where += f" AND state IN ({', '.join('?' * len(sources(to)))})"
            args += list(map(str, sources(to)))
        with self.lock:
            self.db.execute("BEGIN")  # a job's slots and the timeline's entry for them: both or neither
            try:
                changed = self.db.execute(f"UPDATE jobs SET {', '.join(f'{k} = ?' for k in fields)} WHERE {where}",
                                          values + args).rowcount
                if changed and "nodes" in fields:
                    self.db.execute("INSERT INTO allocations VALUES (?, ?, ?)",
                                    (time.time(), job_id, json.dumps(fields["nodes"])))
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")
        return bool(changed)

    def get(self, job_id: str) -> Optional[dict]:
        with self.lock:
            row = self.db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _decode(row) if row else None

    def list(self, states=tuple(JobState)) -> List[dict]:
        with self.lock:
            rows = self.db.execute(f"SELECT * FROM jobs WHERE state IN ({', '.join('?' * len(states))}) "
                                   "ORDER BY submitted", tuple(map(str, states))).fetchall()
        return [_decode(r) for r in rows]

    def shown(self, job_id: Optional[str] = None, ended: Optional[int] = None) -> List[dict]:
        """What `status` shows: the job `job_id` (none if there is no such job), or the live jobs and the `ended`
        that ended last (None: every job), in submission order."""
        if job_id:
            job = self.get(job_id)
            return [job] if job else []
        if ended is None:
            return self.list()
        return sorted(self.list(LIVE) + self.ended(ended), key=lambda j: j["submitted"])

    def ended(self, limit: int) -> List[dict]:
        """The `limit` jobs that ended last (finished, failed or cancelled), in submission order."""
        with self.lock:
            rows = self.db.execute(f"SELECT * FROM (SELECT * FROM jobs WHERE state IN ({', '.join('?' * len(ENDED))})"
                                   " ORDER BY finished DESC LIMIT ?) ORDER BY submitted",
                                   tuple(map(str, ENDED)) + (limit,)).fetchall()
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

    def describe(self, nodes: List[dict], next_s: float) -> None:
        """The nodes as the scheduler (this process) sees them now (each: node, type, slots, reserved, held); it
        describes them again within `next_s` seconds."""
        with self.lock:
            self.db.execute("INSERT OR REPLACE INTO cluster (id, time, nodes, host, pid, next_s) "
                            "VALUES (0, ?, ?, ?, ?, ?)",
                            (time.time(), json.dumps(nodes), socket.gethostname(), os.getpid(), next_s))

    def described(self) -> Optional[dict]:
        """The scheduler's last `describe` (time, nodes, host, pid, next_s), or None if it never did."""
        with self.lock:
            row = self.db.execute("SELECT time, nodes, host, pid, next_s FROM cluster WHERE id = 0").fetchone()
        return dict(row, nodes=json.loads(row["nodes"])) if row else None


def _decode(row) -> dict:
    job = dict(row)
    for k in _JSON:
        job[k] = json.loads(job[k]) if job[k] is not None else None
    job["state"] = JobState(job["state"])
    return job
