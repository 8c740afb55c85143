"""Lightning settings EasyScaleStrategy cannot honour, one per run: `python lightning_misuse.py MODE`."""
import sys

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler

from easyscale_ext.lightning import EasyScaleStrategy


class Model(L.LightningModule):
    def __init__(self, manual=False):
        super().__init__()
        self.net = nn.Linear(4, 2)
        self.automatic_optimization = not manual

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


mode = sys.argv[1]
data = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
loader = DataLoader(data, batch_size=4, sampler=WeightedRandomSampler(torch.ones(32), 32)
                    if mode == "sampler" else None)
trainer = L.Trainer(strategy=EasyScaleStrategy(virtual_world_size=2, **({"ddp_comm_hook": print} if mode == "hook"
                                                                        else {})),
                    accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False,
                    sync_batchnorm=mode == "syncbn",
                    use_distributed_sampler=mode != "sampler")
trainer.fit(Model(manual=mode == "manual"), loader)
