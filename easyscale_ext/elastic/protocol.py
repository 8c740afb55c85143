"""What is in a job's store: every key, who writes it and who reads it, behind typed calls. No other module names
a key.

The store is a torch TCPStore hosted by the job's host (`easyscale run`'s launcher, a cluster job's supervisor),
every key under the job's secret (`hosted`). docs/ARCHITECTURE.md, "The job store", tables every key family:
who writes it and who reads it.
"""
import hashlib
import json
from typing import Dict, List, Optional, Sequence

import torch.distributed as dist

KEYED = "keyed"  # the one key outside the secret: that the job's keys are under one, and which one (a digest of it)


def fingerprint(secret: str) -> str:
    """What the store says of its secret: enough to tell a client its secret is another job's, nothing to derive
    it from."""
    return hashlib.sha256(secret.encode()).hexdigest()[:16]


def hosted(server: dist.Store, secret: str) -> "JobStore":
    """The job's view of the store its host serves: every key under `secret`, which the store says it has."""
    server.set(KEYED, fingerprint(secret))
    return JobStore(dist.PrefixStore(secret, server))


def reached(store: dist.Store, secret: Optional[str]) -> Optional["JobStore"]:
    """A client's view under `secret`, or without one where the store keeps no secret; None where this client
    lacks the secret the store keeps its job's keys under. A secret of another job (a stale file of a job killed
    before it removed it, whose port this store reuses) is told apart: under it every wait would hang and every
    request go unread."""
    if not store.check([KEYED]):
        return JobStore(store)
    return JobStore(dist.PrefixStore(secret, store)) if secret and \
        store.get(KEYED).decode() == fingerprint(secret) else None


class JobStore:
    """A job's store, as the job's processes, its host and tools read and write it."""

    def __init__(self, store: dist.Store):
        self.store = store

    # -- requests: size, split, departures --------------------------------------------------------------
    def target(self) -> Optional[int]:
        return int(self.store.get("target")) if self.store.check(["target"]) else None

    def set_target(self, procs: int) -> None:
        self.store.set("target", str(procs))

    def request_split(self, sizes: Sequence[int]) -> None:
        self.store.set("split", json.dumps(list(sizes)))

    def take_split(self) -> Optional[List[int]]:
        """The split requested since the last take, if any (taken: it acts once)."""
        if not self.store.check(["split"]):
            return None
        sizes = json.loads(self.store.get("split"))
        self.store.delete_key("split")
        return sizes

    def release(self, worker: str) -> None:
        self.store.append("releases", worker + "\n")  # one atomic write: a death mid-request leaves no gap

    def releases(self) -> List[str]:
        """Every departure asked for so far, in order."""
        return self.store.get("releases").decode().split() if self.store.check(["releases"]) else []

    # -- joiners ------------------------------------------------------------------------------------------------
    def register_ready(self, worker: str) -> None:
        self.store.set(f"ready/{worker}", "1")

    def registered(self, worker: str) -> bool:
        return self.store.check([f"ready/{worker}"])

    def announce_ready(self, worker: str) -> None:
        self.store.append("ready", worker + "\n")  # one atomic write: a death mid-registration leaves no gap

    def ready(self) -> List[str]:
        """Joiners that said they are prepared, in order, once each."""
        return list(dict.fromkeys(self.store.get("ready").decode().split())) if self.store.check(["ready"]) else []

    def admit(self, worker: str, generation: int) -> None:
        self.store.set(f"admit/{worker}", str(generation))

    def admitted(self, worker: str) -> bool:
        return self.store.check([f"admit/{worker}"])

    def admission(self, worker: str) -> int:
        """The generation `worker` was admitted to."""
        return int(self.store.get(f"admit/{worker}"))

    def unadmit(self, worker: str) -> None:
        self.store.delete_key(f"admit/{worker}")

    # -- losses and failures ------------------------------------------------------------------------------------
    def mark_lost(self, worker: str, why: str) -> None:
        self.store.set(f"lost/{worker}", why)
        self.store.add("losses", 1)  # after the mark: whoever sees the count move finds it

    def losses(self) -> int:
        """How many losses were marked so far: one read tells a watcher whether to look at anyone's mark."""
        return int(self.store.add("losses", 0))

    def is_lost(self, worker: str) -> bool:
        return self.store.check([f"lost/{worker}"])

    def report_failure(self, worker: str, text: str) -> None:
        self.store.set(f"failed/{worker}", text)

    def failure(self, worker: str) -> Optional[str]:
        return self.store.get(f"failed/{worker}").decode() if self.store.check([f"failed/{worker}"]) else None

    def beat(self, worker: str, count: int = 1) -> int:
        """Add `count` to `worker`'s heartbeat counter (0: read it)."""
        return int(self.store.add(f"beat/{worker}", count))

    # -- what the job says of itself ----------------------------------------------------------------------------
    def publish_job_state(self, kind: dict) -> None:
        self.store.set("job_state", json.dumps(kind))

    def job_state(self) -> Optional[dict]:
        return json.loads(self.store.get("job_state")) if self.store.check(["job_state"]) else None

    def set_progress(self, progress: dict) -> None:
        self.store.set("progress", json.dumps(progress))

    def progress(self) -> Optional[dict]:
        return json.loads(self.store.get("progress")) if self.store.check(["progress"]) else None

    def set_stopped(self, step: int) -> None:
        self.store.set("stopped", str(step))

    def stopped(self) -> Optional[int]:
        return int(self.store.get("stopped")) if self.store.check(["stopped"]) else None

    # -- generations ----------------------------------------------------------------------------------------------
    def set_members(self, generation: int, members: List[str]) -> None:
        self.store.set(f"gen/{generation}/members", json.dumps(members))

    def propose_members(self, generation: int, members: List[str]) -> List[str]:
        """`members` as `generation`'s unless another proposal came first; the members it has."""
        return json.loads(self.store.compare_set(f"gen/{generation}/members", "", json.dumps(members)))

    def has_generation(self, generation: int) -> bool:
        return self.store.check([f"gen/{generation}/members"])

    def members(self, generation: int) -> List[str]:
        """`generation`'s members (waiting for them to be published)."""
        return json.loads(self.store.get(f"gen/{generation}/members"))

    def current_generation(self, since: int = 0) -> int:
        """The newest generation published (generations are numbered in turn: looking from `since` suffices)."""
        g = since
        while self.has_generation(g + 1):
            g += 1
        return g

    def set_position(self, generation: int, position: Sequence) -> None:
        self.store.set(f"gen/{generation}/position", json.dumps(list(position)))

    def position(self, generation: int) -> list:
        return json.loads(self.store.get(f"gen/{generation}/position"))

    def set_ranges(self, generation: int, ranges: Sequence) -> None:
        self.store.set(f"gen/{generation}/ranges", json.dumps([list(r) for r in ranges]))

    def ranges(self, generation: int) -> list:
        return json.loads(self.store.get(f"gen/{generation}/ranges"))

    def set_context(self, generation: int, v: int, context: bytes) -> None:
        self.store.set(f"gen/{generation}/ctx/{v}", context)

    def context(self, generation: int, v: int) -> bytes:
        return self.store.get(f"gen/{generation}/ctx/{v}")

    def drop_context(self, generation: int, v: int) -> None:
        self.store.delete_key(f"gen/{generation}/ctx/{v}")

    def set_holds(self, generation: int, worker: str, position: Optional[Sequence]) -> None:
        """What `worker` holds as `generation` recovers: its step's position, or None (no state)."""
        self.store.set(f"gen/{generation}/holds/{worker}", json.dumps(None if position is None else list(position)))

    def said_holds(self, generation: int, worker: str) -> bool:
        return self.store.check([f"gen/{generation}/holds/{worker}"])

    def holds(self, generation: int, worker: str) -> Optional[list]:
        return json.loads(self.store.get(f"gen/{generation}/holds/{worker}"))

    def propose_recovery(self, generation: int, decision: dict) -> None:
        """`decision` as `generation`'s recovery, unless one was made first."""
        self.store.compare_set(f"gen/{generation}/recovery", "", json.dumps(decision))

    def recovery(self, generation: int) -> Optional[dict]:
        key = f"gen/{generation}/recovery"
        return json.loads(self.store.get(key)) if self.store.check([key]) else None

    def arrive(self, generation: int, worker: str) -> None:
        self.store.set(f"gen/{generation}/arrived/{worker}", "1")

    def arrived(self, generation: int, workers: Sequence[str]) -> bool:
        """Whether every one of `workers` entered `generation` (one request, however many)."""
        return self.store.check([f"gen/{generation}/arrived/{w}" for w in workers])

    def group_store(self, generation: int) -> dist.Store:
        """Where torch's process group of `generation` rendezvouses."""
        return dist.PrefixStore(f"gen{generation}", self.store)

    # -- replicated contexts ------------------------------------------------------------------------------------
    def replicate(self, slot: int, tag: bytes, contexts: Dict[int, bytes]) -> None:
        """Write the contexts, and return once the store holds them. TCPStore's sets are not answered: one to a
        store that cannot be reached (a link partitioned) lands in the socket's buffer and returns, and the
        step would complete unreplicated. A query on the same connection is answered after the sets before it."""
        keys = [f"live/{slot}/ctx/{v}" for v in contexts]
        self.store.multi_set(keys, [tag + ctx for ctx in contexts.values()])
        self.store.check(keys[-1:])

    def replica(self, slot: int, v: int) -> Optional[bytes]:
        key = f"live/{slot}/ctx/{v}"
        return self.store.get(key) if self.store.check([key]) else None

