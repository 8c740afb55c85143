"""Launches an elastic job on this machine (`easyscale run`): hosts the job
store, starts the first processes, and starts joining processes whenever a
scale request asks for more than are running. Processes leave by themselves
(see member.py)."""
import logging
import os
import time
from typing import Dict, Optional, Sequence

from .. import spawn
from .client import ID_ENV, JOIN_ENV, SECRET_ENV, STORE_ENV, new_secret, serve
from .protocol import hosted

logger = logging.getLogger(__name__)


class ElasticLauncher:
    def __init__(self, argv: Sequence[str], procs: int, host: str = "127.0.0.1", port: int = 0,
                 env: Optional[Dict[str, str]] = None, log_dir: Optional[str] = None,
                 cpus: Optional[Sequence[int]] = None, env_per_process: Optional[Sequence[Dict[str, str]]] = None):
        """`cpus`: the i-th process started (joiners included) runs on core cpus[i % len(cpus)]; listing
        a core twice makes processes share it (heterogeneous speeds on one machine). `env_per_process`:
        variables added for the i-th process likewise (e.g. an older machine's instruction-set caps)."""
        if procs < 1:
            raise ValueError(f"procs must be >= 1, got {procs}")
        self.argv, self.procs, self.env, self.log_dir = list(argv), procs, dict(env or os.environ), log_dir
        spawn.fork_server_on(self.env)  # a bad setting fails here, before the job starts
        self.server = serve(host, port)
        self.address = f"{host}:{self.server.port}"
        self.secret = new_secret()
        self.store = hosted(self.server, self.secret)
        self.cpus = list(cpus or [])
        self.env_per_process = list(env_per_process or [{}])
        self.children: Dict[str, object] = {}  # worker -> its process (spawn.start: a Popen, or as one)
        self.spawned = 0

    def _spawn(self, joining: bool) -> str:
        worker = f"w{self.spawned}"
        self.spawned += 1
        env = dict(self.env, **self.env_per_process[(self.spawned - 1) % len(self.env_per_process)])
        env.update({STORE_ENV: self.address, SECRET_ENV: self.secret, ID_ENV: worker,
                    JOIN_ENV: "1" if joining else "0"})
        self.children[worker] = spawn.start(
            self.argv, env, per_process=(STORE_ENV, SECRET_ENV, ID_ENV, JOIN_ENV),
            log_path=os.path.join(self.log_dir, f"{worker}.log") if self.log_dir else None,
            cpu=self.cpus[(self.spawned - 1) % len(self.cpus)] if self.cpus else None)
        return worker

    def run(self, timeout_s: float = 3600.0) -> int:
        """Run until every process has exited; returns the first non-zero exit code, else 0."""
        first = [f"w{i}" for i in range(self.procs)]
        self.store.set_members(0, first)
        self.store.set_target(self.procs)
        for _ in first:
            self._spawn(joining=False)
        deadline = time.monotonic() + timeout_s
        killed, failed_joiners = set(), set()
        # What the store said when last read: the generation and its members, the losses marked and whose. A poll
        # reads the store a few times however many processes run; the marks only after a new loss.
        generation, members, losses, lost = -1, [], -1, set()
        while any(c.poll() is None for c in self.children.values()):
            if time.monotonic() > deadline:
                for c in self.children.values():
                    c.kill()
                    c.wait()
                raise TimeoutError(f"elastic job still running after {timeout_s} s")
            newest = self.store.current_generation(since=max(generation, 0))
            if newest != generation:
                generation, members = newest, self.store.members(newest)
            marked = self.store.losses()  # read before the marks: one marked meanwhile moves it again
            if marked != losses:
                losses, lost = marked, {w for w in self.children if self.store.is_lost(w)}
            waiting = [w for w, c in self.children.items()
                       if w not in members and c.poll() is None and not self.store.admitted(w)]
            if all(self.children[m].poll() is not None for m in members):
                for w in waiting:  # the job is over: nobody will admit them
                    self.children[w].kill()
                    self.children[w].wait()
                    killed.add(w)
                break
            for w, c in self.children.items():
                if c.poll() is None and w in lost:
                    c.kill()  # the job went on without it (it hung, or stopped): it must not come back
                    c.wait()
                if c.returncode in (None, 0) or w in lost:
                    continue
                if c.returncode < 0 or w in first or self.store.admitted(w):
                    # Killed, or a member that died: the others go on without it at once (member.py's
                    # recover; a heartbeat would tell them after liveness_s), a joiner is replaced below.
                    self.store.mark_lost(w, "exited")
                elif w not in failed_joiners:
                    # Another joiner started the same way would fail the same way.
                    failed_joiners.add(w)
                    self.store.set_target(len(members))
                    log = f"; see {os.path.join(self.log_dir, w + '.log')}" if self.log_dir else ""
                    logger.warning("joining process %s failed (exit code %d) before it was admitted; the job stays "
                                   "on %d processes%s", w, c.returncode, len(members), log)
            for _ in range(self.store.target() - len(members) - len(waiting)):
                self._spawn(joining=True)
            time.sleep(0.05)
        # A process killed by a signal that the job went on without (member.py's recover) does not fail the job;
        # one that left may still be exiting.
        codes = {w: c.wait() for w, c in self.children.items() if w not in killed}
        return next((code for w, code in codes.items()
                     if code != 0 and not (code < 0 and self.store.is_lost(w))), 0)

