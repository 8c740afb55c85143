"""bench/bench_chaos.py's calls to the scheduler, against a stand-in for Ray and the scheduler's actor (the benchmark
itself runs a Ray cluster for minutes): a call that times out is waited for, not made again."""
import os
import sys
from types import SimpleNamespace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import bench_chaos  # noqa: E402


class GetTimeoutError(Exception):
    pass


class RayActorError(Exception):
    pass


class Scheduler:
    """The scheduler's actor as Ray fronts it: `reserve.remote` records the call; `get` first fails with `first`."""

    def __init__(self, first):
        self.reserves, self.first = [], first
        self.reserve = SimpleNamespace(remote=self.submit)

    def submit(self, count):
        self.reserves.append(count)
        return ["node-a"] * count

    def get(self, pending, timeout):
        first, self.first = self.first, None
        if first:
            raise first()
        return pending


def chaos_with(scheduler):
    chaos = bench_chaos.Chaos.__new__(bench_chaos.Chaos)  # without its cluster: only `call` runs
    chaos.scheduler = scheduler
    chaos.ray = SimpleNamespace(get=scheduler.get, exceptions=SimpleNamespace(GetTimeoutError=GetTimeoutError,
                                                                              RayActorError=RayActorError))
    return chaos


def test_a_reserve_that_timed_out_is_waited_for_not_made_twice():
    scheduler = Scheduler(first=GetTimeoutError)  # slow to answer: the reserve may still be carried out
    assert chaos_with(scheduler).call("reserve", 1) == ["node-a"]
    assert scheduler.reserves == [1]


def test_a_reserve_the_schedulers_death_failed_is_made_again():
    scheduler = Scheduler(first=RayActorError)  # killed (a fault) before it answered: Ray starts it again
    assert chaos_with(scheduler).call("reserve", 1) == ["node-a"]
    assert scheduler.reserves == [1, 1]
