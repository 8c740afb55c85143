"""An elastic job: `easyscale run --procs 2 -- examples/train_elastic.py [CHECKPOINT_FOLDER]`.

While it trains, change its processes with `easyscale scale --store HOST:PORT --procs 3` (the launcher
prints HOST:PORT), send one of them SIGTERM, or kill -9 one: the job goes on in place, and the SHA-256 of
the final state it prints is the same on every schedule, as on a fixed number of processes.
"""
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import easyscale_ext as es

member = es.ElasticMember()  # this process's part in the job `easyscale run` started
torch.manual_seed(0)
data = TensorDataset(torch.randn(1024, 1, 8, 8), torch.randint(0, 10, (1024,)))
model = nn.Sequential(nn.Conv2d(1, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.1),
                      nn.Flatten(), nn.Linear(8 * 6 * 6, 10))
ddp = es.EasyScaleDDP(model, virtual_world_size=4, determinism_level="D1")
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
loader = ddp.data_loader(data, batch_size=16, shuffle=True, seed=0)
checkpointer = es.Checkpointer(sys.argv[1], ddp, optimizer) if len(sys.argv) > 1 else None


def train_step(step):  # forward and backward of every local virtual worker's micro-batch
    for x, y in ddp.workers(step.batches):
        F.cross_entropy(ddp(x), y).backward()


final = member.run(train_step, ddp, optimizer, loader, epochs=3, checkpointer=checkpointer, checkpoint_every=10)
if final is not None and ddp.rank == 0:
    print(f"step {final.step}: sha256 {es.state_sha256(model, optimizer)}", flush=True)
member.close()
