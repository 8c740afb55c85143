"""A job of bench_cluster.py: a real EasyScaleDDP job (a small CNN on random data, 4 virtual workers) whose
every step is padded to the step time its application's profile gives for the slots it holds: this machine
has no GPUs, so device time is emulated. Rank 0 appends `step processes start end` per step to LOG, and
prints the SHA-256 of the final state.

    cluster_job.py APP STEPS LOG [SLOT_TYPE]
"""
import os
import sys
import time
from collections import Counter

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import easyscale_ext as es
from easyscale_ext.cluster import NODE_ENV
from easyscale_ext.sched.models.application import Applications
from easyscale_ext.sched.models.job import virtual_worker_step
from easyscale_ext.sched.models.traces import data_dir

N, BATCH = 4, 16
app_name, steps, log_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
slot_type = sys.argv[4] if len(sys.argv) > 4 else "t4"
app = Applications(data_dir())[app_name]
local_bsz = max(1, app.init_batch_size // N)  # the model's batch: what the scheduler's job model assumes

member = es.ElasticMember()
torch.manual_seed(0)
data = TensorDataset(torch.randn(steps * BATCH * N, 1, 8, 8), torch.randint(0, 10, (steps * BATCH * N,)))
model = nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 10))
ddp = es.EasyScaleDDP(model, virtual_world_size=N)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
loader = ddp.data_loader(data, batch_size=BATCH, shuffle=True, seed=0)
profiled = {}  # placement (processes per node) -> seconds per step


def train_step(step):
    start = time.time()
    for x, y in ddp.workers(step.batches):
        F.cross_entropy(ddp(x), y).backward()
    nodes = [None] * dist.get_world_size()
    dist.all_gather_object(nodes, os.environ.get(NODE_ENV, "local"))
    placement = tuple(sorted(Counter(nodes).values(), reverse=True))
    if placement not in profiled:
        profiled[placement] = virtual_worker_step(app, N, local_bsz, ((slot_type, placement),))[0]
    time.sleep(max(0.0, profiled[placement] - (time.time() - start)))
    if dist.get_rank() == 0:
        with open(log_path, "a") as log:
            log.write(f"{step.number} {len(nodes)} {start:.4f} {time.time():.4f}\n")


final = member.run(train_step, ddp, optimizer, loader, epochs=1)
if final is not None and ddp.rank == 0:
    print(f"step {final.step}: sha256 {es.state_sha256(model, optimizer)}", flush=True)
member.close()
