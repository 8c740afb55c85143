"""The cluster's job table: one SQLite file in the cluster's state folder, so that a scheduler that
restarts (`cluster stop`/`start`, or its actor crashing) finds its jobs again."""
import json
import sqlite3
import threading
import time
import uuid
from typing import List, Optional

STATES = ("queued", "running", "finished", "failed", "cancelled")
_JSON = ("argv", "env", "nodes")
_SCHEMA = """CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, name TEXT, argv TEXT, env TEXT, virtual_workers INTEGER, min_procs INTEGER,
    max_procs INTEGER, state TEXT, submitted REAL, started REAL, finished REAL, exit_code INTEGER,
    nodes TEXT, log_dir TEXT)"""


class JobTable:
    def __init__(self, path: str):
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)  # autocommit
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")  # readers (status) never block the scheduler's writes
        self.db.execute(_SCHEMA)
        self.lock = threading.Lock()

    def add(self, name: str, argv: List[str], env: dict, virtual_workers: int, min_procs: int, max_procs: int,
            log_dir: str) -> str:
        job_id = f"{name}-{uuid.uuid4().hex[:6]}"
        with self.lock:
            self.db.execute("INSERT INTO jobs (id, name, argv, env, virtual_workers, min_procs, max_procs, state, "
                            "submitted, nodes, log_dir) VALUES (?, ?, ?, ?, ?, ?, ?, 'queued', ?, '[]', ?)",
                            (job_id, name, json.dumps(argv), json.dumps(env), virtual_workers, min_procs,
                             max_procs, time.time(), log_dir))
        return job_id

    def update(self, job_id: str, **fields) -> None:
        values = [json.dumps(v) if k in _JSON else v for k, v in fields.items()]
        with self.lock:
            self.db.execute(f"UPDATE jobs SET {', '.join(f'{k} = ?' for k in fields)} WHERE id = ?",
                            values + [job_id])

    def get(self, job_id: str) -> Optional[dict]:
        with self.lock:
            row = self.db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _decode(row) if row else None

    def list(self, states=STATES) -> List[dict]:
        with self.lock:
            rows = self.db.execute(f"SELECT * FROM jobs WHERE state IN ({', '.join('?' * len(states))}) "
                                   "ORDER BY submitted", tuple(states)).fetchall()
        return [_decode(r) for r in rows]


def _decode(row) -> dict:
    job = dict(row)
    for k in _JSON:
        job[k] = json.loads(job[k]) if job[k] is not None else None
    return job
