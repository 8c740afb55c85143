"""Lightning settings EasyScaleStrategy cannot honour: `python lightning_misuse.py OUT MODE...` runs each MODE's
Trainer in a process of its own, forked after the imports (Lightning's take 15 s of CPU), and writes its exit code
and stderr to OUT/MODE.code and OUT/MODE.err."""
import os
import sys
import traceback

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


def fit(mode):
    data = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
    loader = DataLoader(data, batch_size=4, sampler=WeightedRandomSampler(torch.ones(32), 32)
                        if mode == "sampler" else None)
    strategy = EasyScaleStrategy(virtual_world_size=2, **({"ddp_comm_hook": print} if mode == "hook" else {}))
    trainer = L.Trainer(strategy=strategy, accelerator="cpu", devices=1, max_epochs=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        sync_batchnorm=mode == "syncbn", use_distributed_sampler=mode != "sampler")
    trainer.fit(Model(manual=mode == "manual"), loader)


out, modes = sys.argv[1], sys.argv[2:]
for mode in modes:
    sys.stdout.flush(), sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: this mode's run, its stderr to OUT/MODE.err, as a process of its own would end
        err = os.open(os.path.join(out, f"{mode}.err"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(err, 2)
        try:
            fit(mode)
            code = 0
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stderr.flush()
        os._exit(code)
    with open(os.path.join(out, f"{mode}.code"), "w") as f:
        f.write(str(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])))
