"""A job of bench_cluster.py: a real EasyScaleDDP job (a small CNN on random data, 4 virtual workers) in which
every process pads its step to the time its application's profile gives for its share of the virtual workers
on its slot's type ($EASYSCALE_SLOT_TYPE), the job holding the slots it holds (at D2, D2's cost included, as the
scheduler's model of a D2 job has it): this machine has no GPUs, so
device time is emulated (on several types the step lasts as long as the slowest process's, and the balancer
moves virtual workers by the measured times), times SCALE (default 1: profiled steps on fast types are shorter
than this CPU's own work for them). Rank 0 appends `step processes start end` per step to LOG, and prints the
SHA-256 of the final state. Every process prints when its start's phases ended (the script's first line, its
imports, its model and member built), to show where a start's seconds go; rank 0's first step is in LOG.

    cluster_job.py APP STEPS LOG [SCALE]
"""
import time

LAUNCHED = time.time()

import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import easyscale_ext as es
from easyscale_ext.cluster import NODE_ENV, TYPE_ENV
from easyscale_ext.determinism import ISA_ENV
from easyscale_ext.elastic.client import BALANCE_ENV
from easyscale_ext.sched.models.application import Applications
from easyscale_ext.sched.models.cluster import placement_of
from easyscale_ext.sched.models.virtual_workers import gpu_step
from easyscale_ext.sched.models.traces import data_dir

IMPORTED = time.time()

N, BATCH = 4, 16
app_name, steps, log_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
scale = float(sys.argv[4]) if len(sys.argv) > 4 else 1.0
slot_type = os.environ.get(TYPE_ENV, "t4")
app = Applications(data_dir())[app_name]
local_bsz = max(1, app.init_batch_size // N)  # the model's batch: what the scheduler's job model assumes

# A D2 job the cluster may spread over types balances by measured speed ($EASYSCALE_BALANCE): every 2 steps here,
# not every 10, since these jobs are that much shorter than real ones.
member = es.ElasticMember(balance=es.Balancer(interval=2, patience=1) if os.environ.get(BALANCE_ENV) == "1" else None)
torch.manual_seed(0)
data = TensorDataset(torch.randn(steps * BATCH * N, 1, 8, 8), torch.randint(0, 10, (steps * BATCH * N,)))
model = nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 10))
level = "D2" if ISA_ENV in os.environ else "D0"  # submitted at --level D2 (may span types): D2's floor is set
ddp = es.EasyScaleDDP(model, virtual_world_size=N, determinism_level=level)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
loader = ddp.data_loader(data, batch_size=BATCH, shuffle=True, seed=0)
profiled = {}  # (slots held, this process's virtual workers) -> seconds per step


def train_step(step):
    start = time.time()
    for x, y in ddp.workers(step.batches):
        F.cross_entropy(ddp(x), y).backward()
    slots = [None] * dist.get_world_size()
    dist.all_gather_object(slots, (slot_type, os.environ.get(NODE_ENV, "local")))
    lo, hi = ddp.ranges[dist.get_rank()]
    if (tuple(slots), hi - lo) not in profiled:
        groups = tuple((t, placement_of([n for tn, n in slots if tn == t])) for t in dict.fromkeys(t for t, _ in slots))
        profiled[tuple(slots), hi - lo] = scale * gpu_step(app, local_bsz, groups, slot_type, hi - lo, level == "D2")
    time.sleep(max(0.0, profiled[tuple(slots), hi - lo] - (time.time() - start)))
    if dist.get_rank() == 0:
        with open(log_path, "a") as log:
            log.write(f"{step.number} {len(slots)} {start:.4f} {time.time():.4f}\n")


print(f"start phases: launched {LAUNCHED:.3f} imported {IMPORTED:.3f} built {time.time():.3f}", flush=True)
final = member.run(train_step, ddp, optimizer, loader, epochs=1)
if final is not None and ddp.rank == 0:
    print(f"step {final.step}: sha256 {es.state_sha256(model, optimizer)}", flush=True)
member.close()
