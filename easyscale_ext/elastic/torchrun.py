"""Restart-based elasticity under torchrun: a process group that survives torchrun's restarts."""
import os
from datetime import timedelta

import torch.distributed as dist


def init_process_group(backend: str = "gloo", timeout_s: float = 300.0) -> None:
    """torch.distributed.init_process_group for a script under torchrun, robust to restarts.

    Each restart attempt rendezvouses under its own store prefix, so ranks of a
    new attempt never read the addresses a killed attempt left behind.
    """
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size=world,
                          is_master=(rank == 0 and not agent), timeout=timedelta(seconds=timeout_s))
    dist.init_process_group(backend, store=dist.PrefixStore(f"easyscale/attempt{attempt}", store), rank=rank,
                            world_size=world, timeout=timedelta(seconds=timeout_s))
