"""Job checkpoints: model, optimizer, LR scheduler, position in the data, and
every virtual worker's context, so a job resumes bitwise on any number of
processes.

A file is `MAGIC + sha256(payload) + payload`, the payload a torch.save of
plain containers and tensors, read back with weights_only=True (no pickled
code runs). Writes go to a temporary file in the same folder, are fsynced and
renamed into place: a kill at any instant leaves the previous checkpoints
intact, and a torn file is never taken for a checkpoint.
"""
import hashlib
import io
import logging
import os
import re
from dataclasses import astuple
from typing import Dict, List, Optional

import torch
import torch.distributed as dist

from ..placement import ranges_of
from .state import Position, load_training_state, training_state

log = logging.getLogger(__name__)

MAGIC = b"EASYSCALE-CKPT-1\n"
FORMAT = 2
_NAME = re.compile(r"^step-(\d{10})\.ckpt$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used here; the message says why and what to do."""


class UnreadableCheckpoint(CheckpointError):
    """A checkpoint file that cannot be read back (truncated, corrupted, not a checkpoint)."""


def write_atomic(path: str, data: bytes) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself survives a crash
    finally:
        os.close(fd)


def write_verified(path: str, payload: dict) -> None:
    """Write `payload` (plain containers and tensors) atomically, as MAGIC + its SHA-256 + its torch.save."""
    buf = io.BytesIO()
    torch.save(payload, buf)
    body = buf.getvalue()
    write_atomic(path, MAGIC + hashlib.sha256(body).digest() + body)


def read_verified(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as e:
        raise UnreadableCheckpoint(f"cannot read checkpoint {path}: {e}") from e
    head = len(MAGIC) + 32
    if len(blob) < head or not blob.startswith(MAGIC):
        raise UnreadableCheckpoint(f"{path} is not an easyscale checkpoint (or is truncated): delete it or pass "
                              "another file")
    if hashlib.sha256(blob[head:]).digest() != blob[len(MAGIC):head]:
        raise UnreadableCheckpoint(f"{path} is truncated or corrupted (checksum mismatch); resume from an older "
                              "checkpoint in the same folder")
    return torch.load(io.BytesIO(blob[head:]), weights_only=True)


class Checkpointer:
    """Saves and restores a job's checkpoints in `folder`, keeping the last `keep`.

    save() and resume() are collective: call them on every process.
    """

    def __init__(self, folder: str, ddp, optimizer, scheduler=None, keep: int = 3):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.folder, self.ddp, self.optimizer, self.scheduler, self.keep = folder, ddp, optimizer, scheduler, keep
        os.makedirs(folder, exist_ok=True)
        if not os.access(folder, os.W_OK):
            raise PermissionError(f"checkpoint folder {folder} is not writable: pick another with write access")

    def paths(self) -> List[str]:
        names = sorted(n for n in os.listdir(self.folder) if _NAME.match(n))
        return [os.path.join(self.folder, n) for n in names]

    def save(self, position: Position) -> Optional[str]:
        """Write a checkpoint at `position`; returns its path on rank 0."""
        merged = gather_contexts(self.ddp)
        group = self.ddp.process_group
        path = None
        if self.ddp.rank == 0:
            payload = {
                "format": FORMAT,
                **job_header(self.ddp),
                "model": self.ddp.module.state_dict(),
                **training_state(self.ddp, self.optimizer, self.scheduler),
                "position": list(astuple(position)),
                "split": [hi - lo for lo, hi in self.ddp.ranges],  # a balancer's or scheduler's decision
                "contexts": context_tensors(merged),
            }
            path = os.path.join(self.folder, f"step-{position.step:010d}.ckpt")
            write_verified(path, payload)
            for old in self.paths()[:-self.keep]:
                os.unlink(old)
        if group is not None:
            dist.barrier(group=group)
        return path

    def resume(self, path: Optional[str] = None) -> Position:
        """Load `path` (default: the newest readable checkpoint in the folder, if any) on every process.

        A newer file that cannot be read back (truncated by a full disk, corrupted) is passed over with a
        warning that names it; it is never deleted. On as many processes as wrote it, the job resumes with
        the virtual workers split as they were (uneven after a rebalance): call
        `loader.reassign(ddp.local_ranks)` after it.
        """
        if path is not None:
            state = read_verified(path)
        else:
            state, existing = None, self.paths()
            for path in reversed(existing):
                try:
                    state = read_verified(path)
                    break
                except UnreadableCheckpoint as e:
                    log.warning("skipping an unreadable checkpoint (kept for inspection): %s", e)
            if state is None and existing:
                raise UnreadableCheckpoint(f"none of the {len(existing)} checkpoints in {self.folder} can be read "
                                           "back (see the warnings above): restore one, or move them away to "
                                           "start afresh")
            if state is None:
                return Position()
        self._check(state, path)
        self.ddp.module.load_state_dict(state["model"])
        try:
            load_training_state(state, self.ddp, self.optimizer, self.scheduler)
        except ValueError as e:
            raise CheckpointError(f"{path}: {e}") from None
        split = state.get("split") or []
        if len(split) == len(self.ddp.ranges) and split != [hi - lo for lo, hi in self.ddp.ranges]:
            lo, hi = ranges_of(split)[self.ddp.rank]
            self.ddp.reconfigure(self.ddp.process_group, context_bytes(state["contexts"], range(lo, hi)),
                                 virtual_ranks=(lo, hi))
        else:
            self.ddp.import_contexts(context_bytes(state["contexts"], self.ddp.local_ranks))
        return Position(*state["position"])

    def _check(self, state: dict, path: str) -> None:
        if state.get("format") != FORMAT:
            raise CheckpointError(f"{path} has checkpoint format {state.get('format')}, this version reads {FORMAT}")
        check_header(state, self.ddp, path)


def context_tensors(contexts: Dict[int, bytes]) -> Dict[int, torch.Tensor]:
    """Contexts as uint8 tensors, which a weights_only load reads back."""
    return {v: torch.frombuffer(bytearray(c), dtype=torch.uint8) for v, c in contexts.items()}


def context_bytes(tensors: Dict[int, torch.Tensor], ranks) -> Dict[int, bytes]:
    """The contexts of virtual workers `ranks` from context_tensors' form."""
    return {v: tensors[v].numpy().tobytes() for v in ranks}


def gather_contexts(ddp) -> Optional[Dict[int, bytes]]:
    """Every virtual worker's context, gathered from every process on rank 0 (None elsewhere). Collective."""
    contexts = ddp.export_contexts()
    if ddp.process_group is None:
        return contexts
    gathered = [None] * dist.get_world_size(ddp.process_group) if ddp.rank == 0 else None
    dist.gather_object(contexts, gathered, dst=0, group=ddp.process_group)
    return {v: c for part in gathered for v, c in part.items()} if ddp.rank == 0 else None


def job_header(ddp) -> dict:
    """What a job that resumes from a checkpoint must share with the job that wrote it (check_header)."""
    return {"virtual_world_size": ddp.world_size, "determinism_level": ddp.determinism_level, "isa": ddp.isa,
            "broadcast_buffers": ddp.broadcast_buffers, "fingerprint": ddp.fingerprint()}


def check_header(state: dict, ddp, path: str) -> None:
    """A CheckpointError saying what to change if the job of `ddp` cannot resume from `state` (read from `path`)."""
    if state["virtual_world_size"] != ddp.world_size:
        raise CheckpointError(f"{path} was written by a job of {state['virtual_world_size']} virtual workers, "
                              f"this job has {ddp.world_size}: pass virtual_world_size="
                              f"{state['virtual_world_size']} to resume it")
    if state["determinism_level"] != ddp.determinism_level:
        raise CheckpointError(f"{path} was written at determinism {state['determinism_level']}, this job "
                              f"runs {ddp.determinism_level}: resume with the same level")
    if state["isa"] != ddp.isa:
        raise CheckpointError(f"{path} was written by a D2 job held to {state['isa']}, this job is held to "
                              f"{ddp.isa}: resume with isa={state['isa']!r} (easyscale run --isa)")
    if state["broadcast_buffers"] != ddp.broadcast_buffers:
        raise CheckpointError(f"{path} was written with broadcast_buffers={state['broadcast_buffers']}: "
                              "resume with the same setting")
    if state["fingerprint"] != ddp.fingerprint():
        theirs = {n for n, _, _ in state["fingerprint"]}
        mine = {n for n, _, _ in ddp.fingerprint()}
        diff = sorted(theirs ^ mine)[:5] or ["same names, other shapes or dtypes"]
        raise CheckpointError(f"{path} holds another model than this job's (differences: {diff}); "
                              "build the same model to resume it")
