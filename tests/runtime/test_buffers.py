"""broadcast_buffers observed on every process, against torch DDP's same rank (N = 2, where torch DDP's sum
is the canonical tree's one addition)."""
import pytest

from support.jobs import buffer_hashes

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def ddp():
    return {b: buffer_hashes("ddp", 2, n=2, broadcast_buffers=b) for b in (0, 1)}


@pytest.mark.parametrize("procs", [1, 2])
def test_without_broadcast_every_process_holds_its_first_workers_buffers_as_ddp_ranks_do(ddp, procs):
    assert buffer_hashes("easyscale", procs, n=2, broadcast_buffers=0) == ddp[0][:procs]


def test_with_broadcast_every_process_holds_virtual_rank_0s_buffers(ddp):
    # Every forward starts from rank 0's buffers in both. After the step, torch DDP's rank 1 holds its own
    # forward's update of them; EasyScaleDDP broadcasts virtual rank 0's at the step's end, so every process
    # holds those (the same state on every process, whatever the placement).
    assert buffer_hashes("easyscale", 2, n=2, broadcast_buffers=1) == [ddp[1][0]] * 2


def test_broadcast_buffers_changes_what_the_processes_hold(ddp):
    # The control: ignoring the setting would fail one of the two tests above.
    assert ddp[0][0] == ddp[1][0] and ddp[0][1] != ddp[1][1] != ddp[1][0]
