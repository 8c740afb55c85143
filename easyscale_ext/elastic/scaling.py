"""Scaling decisions at a step boundary: rank 0 reads the job store (named departures, the target process
count, joiners that are ready, a requested split) and the Balancer's proposal, and says what the next
generation is. Every process learns the decision by broadcast (member.py)."""
import logging
import time
from typing import List, Optional

import torch.distributed as dist

from ..placement import valid_split
from .balance import Balancer
from .membership import Membership

log = logging.getLogger(__name__)


class ScalingDecisions:
    def __init__(self, membership: Membership, balancer: Optional[Balancer]):
        self.membership = membership
        self.store = membership.store
        self.balancer = balancer
        self._releases_seen = 0  # rank 0: departures requested so far that it has read

    def next_members(self, world_size: int, block: bool) -> Optional[List[str]]:
        """Rank 0: the members of the next generation, or None to keep the current one. Named departures
        come first (a scale request waits for the next boundary); a scale-out waits for its joiners to be
        prepared, unless `block` (then it waits here)."""
        members = self.membership.members
        leaving = self._departures()
        if leaving:
            staying = [m for m in members if m not in leaving]
            self.store.set_target(max(len(staying), 1))
            return staying
        decision = self._decide(world_size)
        while block and decision is None and self._pending():
            time.sleep(0.01)
            decision = self._decide(world_size)
        return decision

    def proposed_split(self, ddp, step: int) -> Optional[List[int]]:
        """New range sizes for rank 0 to decide on (None elsewhere, or to keep the split): a split
        requested through the store, else, every balancer interval, the Balancer's proposal from each
        process's measured seconds per virtual worker. Collective when a balancer is set."""
        m = self.membership
        proposal = None
        if self.balancer is not None and step % self.balancer.interval == 0:
            seconds = [None] * len(m.members)
            dist.all_gather_object(seconds, ddp.seconds_per_worker())
            if m.rank == 0 and None not in seconds:
                proposal = self.balancer.propose(step, [hi - lo for lo, hi in ddp.ranges], seconds)
        requested = self.store.take_split() if m.rank == 0 else None
        if requested is not None:
            if valid_split(requested, ddp.world_size, len(m.members)):
                return requested
            log.warning("ignoring the split %s: it needs %d sizes >= 1 summing to %d", requested,
                        len(m.members), ddp.world_size)
        return proposal

    def _departures(self) -> List[str]:
        """Members that asked to leave since rank 0 last looked (requests for former members are dropped)."""
        asked = self.store.releases()
        new, self._releases_seen = asked[self._releases_seen:], len(asked)
        return [m for m in self.membership.members if m in new]

    def _pending(self) -> bool:
        target = self.store.target()
        return target is not None and target != len(self.membership.members)

    def _decide(self, world_size: int) -> Optional[List[str]]:
        members = self.membership.members
        target = self.store.target()
        if target is None:
            return None
        if target > world_size:  # every process needs a virtual worker
            log.warning("%d processes requested but the job has %d virtual workers; scaling to %d",
                        target, world_size, world_size)
            target = world_size
            self.store.set_target(target)
        if target == len(members):
            return None
        if target < len(members):
            return members[:target]
        ready = self._ready_joiners()
        if len(ready) < target - len(members):
            return None  # keep training until enough joiners are prepared
        return members + ready[:target - len(members)]

    def _ready_joiners(self) -> List[str]:
        return [who for who in self.store.ready()
                if not self.store.admitted(who) and not self.store.is_lost(who)
                and not self.membership.liveness.stale(who)]
