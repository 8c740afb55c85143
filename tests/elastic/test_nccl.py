"""An NCCL group cut as the heartbeat cuts it: its communicators aborted, its collectives failing with a DistError
(into recover()) rather than ending the process, and the process forming the next generation's group in place.

One GPU allows a group of one process (NCCL refuses two ranks on one GPU). What needs two GPUs is untested: a
survivor waiting in a collective on a member that stopped, when the heartbeat thread aborts the group. Under
TORCH_NCCL_BLOCKING_WAIT (set by Membership), ProcessGroupNCCL's wait polls the communicator's error state, so it
should raise once the communicator is aborted.
"""
import os
import subprocess
import sys

import pytest
import torch

SCRIPT = r"""
import json, threading, time
import torch, torch.distributed as dist
from easyscale_ext.elastic.client import serve
from easyscale_ext.elastic.membership import Membership

store = serve("127.0.0.1")
for generation in (0, 1):
    store.set(f"gen/{generation}/members", json.dumps(["w0"]))
torch.cuda.set_device(0)
member = Membership(f"127.0.0.1:{store.port}", "w0", "nccl", timeout_s=60, liveness_s=5)
member.enter(0)
x = torch.ones(1 << 20, device="cuda")
dist.all_reduce(x)
torch.cuda.synchronize()
cutter = threading.Thread(target=member.cut)  # from another thread, as the heartbeat does
start = time.monotonic()
cutter.start()
cutter.join(30)
print("cut\t" + ("hung" if cutter.is_alive() else f"{time.monotonic() - start:.3f}"))
try:
    dist.all_reduce(x)
    torch.cuda.synchronize()
    print("after\tno error")
except Exception as error:
    print(f"after\t{isinstance(error, dist.DistError)} {type(error).__name__}: {str(error).splitlines()[0]}")
member.enter(1)
x = torch.full((1 << 20,), 3.0, device="cuda")
dist.all_reduce(x)
print(f"next\t{x.sum().item() / x.numel()} {dist.get_world_size()}")
member.close()
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_an_nccl_group_cut_fails_its_collectives_and_the_next_generation_forms_in_the_process():
    # NCCL's bootstrap on loopback, as every test's traffic (it would take the first other interface)
    env = dict(os.environ, NCCL_SOCKET_IFNAME="lo")
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=180, env=env)
    print(out.stdout, out.stderr[-3000:])
    assert out.returncode == 0, out.stderr
    found = dict(line.split("\t", 1) for line in out.stdout.splitlines() if "\t" in line)
    assert found["cut"] != "hung" and float(found["cut"]) < 10
    assert found["after"].startswith("True "), found["after"]  # a DistError: recover() takes it for a lost peer
    assert found["next"] == "3.0 1"
