"""Elastic jobs: a job's processes change while it trains, and not a bit of its result does.

Owns what survives a process: the job's state (state), checkpoints (checkpoint), membership and liveness
(membership), scaling decisions (scaling), replication and recovery (recovery), SIGTERM (signals), the
training loop that ties them together (loop, member), the requests a tool sends a running job (client),
the local launcher (launcher), speed balancing (balance) and torchrun restarts (torchrun). Imports the
runtime, `easyscale_ext.placement` and torch; never cluster, sched or cli.
"""
from .. import runtime  # noqa: F401  (before any process group: runtime/ddp.py says why)
from .balance import Balancer
from .checkpoint import CheckpointError, Checkpointer
from .client import (BALANCE_ENV, ID_ENV, JOIN_ENV, STORE_ENV, StoreUnreachable, connect, current_members,
                     request_release, request_scale, request_split)
from .member import ElasticMember, ScaleEvent
from .membership import MemberLost
from .recovery import TrainingError
from .state import Position
from .torchrun import init_process_group

__all__ = ["Balancer", "CheckpointError", "Checkpointer", "ElasticMember", "ScaleEvent", "MemberLost",
           "TrainingError", "Position", "StoreUnreachable", "connect", "current_members", "request_release",
           "request_scale", "request_split", "init_process_group", "STORE_ENV", "ID_ENV", "JOIN_ENV",
           "BALANCE_ENV"]
