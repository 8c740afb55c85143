"""The same job on N virtual workers (default 4), whatever the number of processes:
`torchrun --nproc-per-node 2 examples/train_easyscale.py [N]` (1 to N processes). With N = 2 it
prints the states examples/train_ddp.py prints on 2 processes."""
import hashlib
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import easyscale_ext as es

dist.init_process_group("gloo")
torch.manual_seed(0)
data = TensorDataset(torch.randn(512, 1, 8, 8), torch.randint(0, 10, (512,)))
model = nn.Sequential(nn.Conv2d(1, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.1),
                      nn.Flatten(), nn.Linear(8 * 6 * 6, 10))
model = es.EasyScaleDDP(model, virtual_world_size=int(sys.argv[1]) if len(sys.argv) > 1 else 4,
                         determinism_level="D1")
loader = model.data_loader(data, batch_size=16, shuffle=True, seed=0)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

for epoch in range(2):
    loader.set_epoch(epoch)
    for step_batches in loader:
        for x, y in model.workers(step_batches):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
        opt.step()
        opt.zero_grad()
    if dist.get_rank() == 0:  # the trained state, the same bits on any number of processes
        digest = hashlib.sha256(b"".join(t.numpy().tobytes() for t in model.state_dict().values()))
        print(f"epoch {epoch} state {digest.hexdigest()[:16]}")
dist.destroy_process_group()
