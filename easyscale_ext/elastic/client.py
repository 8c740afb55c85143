"""The job store, as any client sees it: how a process of the job or a tool reaches it, and the requests
a tool may send a running job (`easyscale scale`, a scheduler).

Every request is checked against the job's state in the store before it is written: one that the job
cannot take raises ValueError and sends nothing.

A job's keys live under its secret (protocol.hosted): whoever reaches the store's port without the secret reads and
changes nothing of the job's, and a tool that tries is told so. The job's host (the launcher of `easyscale run`,
a cluster job's supervisor) makes the secret and hands it to the job's processes in their environment
($EASYSCALE_STORE_SECRET); `easyscale run` also leaves it, readable by its user only, where that user's
`easyscale scale` finds it ($EASYSCALE_HOME/stores).
"""
import os
import secrets
import socket
import time
from datetime import timedelta
from typing import List, Optional, Sequence

import torch.distributed as dist

from ..home import home
from ..placement import valid_split
from .protocol import JobStore, reached

STORE_ENV = "EASYSCALE_STORE"       # host:port of the job store
ID_ENV = "EASYSCALE_WORKER_ID"
JOIN_ENV = "EASYSCALE_JOIN"         # "1" for a process that joins a running job
BALANCE_ENV = "EASYSCALE_BALANCE"   # "1": rebalance virtual workers by measured speed
CHECKPOINT_ENV = "EASYSCALE_CHECKPOINT_DIR"  # member.run's checkpoint folder when the script gives none (cluster)
SECRET_ENV = "EASYSCALE_STORE_SECRET"  # the job's secret: its store's keys live under it


class StoreUnreachable(ConnectionError):
    """No job store answers at the address."""


class NotTheJobsSecret(PermissionError):
    """The store keeps its job's keys under a secret this process does not hold."""


def parse_address(address: str):
    """(host, port) of 'HOST:PORT', or a ValueError saying what is expected."""
    host, sep, port = (address or "").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected the job store's address as HOST:PORT (as `easyscale run` prints it), "
                         f"got {address!r}")
    return host, int(port)


def serve(host: str, port: int = 0, timeout_s: float = 300.0) -> dist.TCPStore:
    """The job store, listening on `host`'s address only. Given a host, torch's TCPStore still listens on every
    interface; so the listening socket is made here, bound to that address, and handed to it."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    listener = socket.socket(family, kind, proto)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(address)
        listener.listen(socket.SOMAXCONN)
    except OSError:
        listener.close()
        raise
    return dist.TCPStore(host, listener.getsockname()[1], is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=timeout_s), master_listen_fd=listener.detach())  # the store's now


def new_secret() -> str:
    return secrets.token_hex(16)


def secret_file(address: str) -> str:
    """Where `easyscale run` leaves its job's secret for its user's tools."""
    return os.path.join(home(), "stores", address.replace(":", "-"))


def save_secret(address: str, secret: str) -> str:
    """Write the job's secret where its user's tools find it, readable by that user only; its path."""
    path = secret_file(address)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(secret)
    return path


def _secret_for(address: str) -> Optional[str]:
    """This process's secret for the job at `address`: its environment's (a process of the job), else the one its
    user's `easyscale run` left."""
    if os.environ.get(SECRET_ENV):
        return os.environ[SECRET_ENV]
    try:
        with open(secret_file(address)) as f:
            return f.read().strip()
    except OSError:
        return None


def connect(address: str, timeout_s: float = 300.0, connect_timeout_s: float = None) -> JobStore:
    """A client of the job store at `address`, under the job's secret where this process has it (else
    NotTheJobsSecret, for a store that keeps its keys under one). `connect_timeout_s` (default `timeout_s`) bounds
    the wait for the store to answer; `timeout_s` bounds every later wait on a key. Given `connect_timeout_s` (a
    tool asking a running job, whose store is up), a refused connection fails at once: TCPStore would retry it."""
    host, port = parse_address(address)
    wait_s = connect_timeout_s or timeout_s
    unreachable = f"no job store answers at {address} (within {wait_s:g} s): is the job running? `easyscale run` " \
                  "prints its store's address"
    start = time.monotonic()
    if connect_timeout_s is not None:
        try:
            socket.create_connection((host, port), timeout=wait_s).close()
        except ConnectionRefusedError:
            raise StoreUnreachable(unreachable.replace(f"(within {wait_s:g} s)", "(connection refused)")) from None
        except OSError as e:
            raise StoreUnreachable(unreachable) from e
    try:
        store = dist.TCPStore(host, port, is_master=False,
                              timeout=timedelta(seconds=max(wait_s - (time.monotonic() - start), 0.1)))
    except (RuntimeError, dist.DistError) as e:  # the C++ client's error text is a stack: say it in a line
        raise StoreUnreachable(unreachable) from e
    store.set_timeout(timedelta(seconds=timeout_s))
    secret = _secret_for(address)
    job = reached(store, secret)
    if job is None:
        held = "" if not secret else f" (the one it holds is another job's: ${SECRET_ENV} set for another job, or " \
            f"{secret_file(address)} left by a job at this address that was killed: delete it)"
        raise NotTheJobsSecret(f"the job at {address} answers only its own processes and its owner's tools: this "
                               f"process has not its secret (${SECRET_ENV}, or {secret_file(address)} as "
                               f"`easyscale run` leaves it for the user who ran it){held}")
    return job


def current_members(store: JobStore) -> List[str]:
    """The members of the job's latest generation, in rank order."""
    return store.members(store.current_generation())


def virtual_world_size(store: JobStore) -> int:
    """The job's N, once its rank 0 has published the job's kind (its first step boundary)."""
    kind = store.job_state()
    if kind is None:
        raise ValueError("the job has not reached its first step boundary yet; ask again in a moment")
    return kind["virtual_world_size"]


def request_scale(address: str, procs: int, connect_timeout_s: float = 5.0) -> None:
    """Ask a running job to run on `procs` processes (scale-out needs joiners started by the launcher)."""
    if procs < 1:
        raise ValueError(f"procs must be >= 1, got {procs}")
    store = connect(address, 30, connect_timeout_s)
    if store.job_state() and procs > virtual_world_size(store):  # before, the job itself caps it
        raise ValueError(f"the job has {virtual_world_size(store)} virtual workers: it runs on at most that many "
                         f"processes, not {procs}")
    store.set_target(procs)


def request_release(address: str, worker: str, connect_timeout_s: float = 5.0) -> None:
    """Ask the job's process `worker` to leave at the next step boundary, in place: its virtual workers move to
    the others (what SIGTERM to that process does)."""
    store = connect(address, 30, connect_timeout_s)
    members = current_members(store)
    if worker not in members:
        raise ValueError(f"the job has no process {worker!r}; its processes are {', '.join(members)}")
    if len(members) == 1:
        raise ValueError(f"{worker} is the job's last process: to stop the job, send it SIGTERM (it leaves "
                         "at the next step boundary after saving a checkpoint, if it has a Checkpointer)")
    store.release(worker)


def request_split(address: str, sizes: Sequence[int], connect_timeout_s: float = 5.0) -> None:
    """Ask a running job to give its processes, in rank order, these numbers of virtual workers (at the
    next step boundary, in place; e.g. from a scheduler that knows the devices' speeds)."""
    sizes = [int(k) for k in sizes]
    if not sizes or min(sizes) < 1:
        raise ValueError(f"every process needs at least one virtual worker, got {sizes}")
    store = connect(address, 30, connect_timeout_s)
    members, n = current_members(store), virtual_world_size(store)
    if not valid_split(sizes, n, len(members)):
        raise ValueError(f"the job runs {len(members)} processes and {n} virtual workers: a split needs "
                         f"{len(members)} sizes >= 1 summing to {n}, got {','.join(map(str, sizes))}")
    store.request_split(sizes)
