"""Plain DDP training: run with `torchrun --nproc-per-node 2 examples/train_ddp.py`."""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
torch.manual_seed(0)
data = TensorDataset(torch.randn(512, 1, 8, 8), torch.randint(0, 10, (512,)))
model = nn.Sequential(nn.Conv2d(1, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.1),
                      nn.Flatten(), nn.Linear(8 * 6 * 6, 10))
model = nn.parallel.DistributedDataParallel(model)
sampler = DistributedSampler(data, shuffle=True, seed=0)
loader = DataLoader(data, batch_size=16, sampler=sampler)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

for epoch in range(2):
    sampler.set_epoch(epoch)
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    if dist.get_rank() == 0:  # the trained state, the same bits on any number of processes
        digest = hashlib.sha256(b"".join(t.numpy().tobytes() for t in model.state_dict().values()))
        print(f"epoch {epoch} state {digest.hexdigest()[:16]}")
dist.destroy_process_group()
# torch 2.14: DDP keeps its gloo group alive into interpreter shutdown, where a worker thread
# releasing a finished collective can abort the process (pytorch/pytorch#190489).
os._exit(0)
