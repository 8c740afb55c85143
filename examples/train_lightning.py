"""A LightningModule trained with EasyScaleStrategy: the same bits on any number of processes.

    python examples/train_lightning.py --devices 2                  # 4 virtual workers on 2 processes
    python examples/train_lightning.py --devices 1 --epochs 1 --ckpt-dir ckpt
    python examples/train_lightning.py --devices 4 --resume ckpt/last.ckpt
    python examples/train_lightning.py --devices 2 --accumulate 2   # an optimizer step every 2 batches

On rank 0 it prints the trained state's SHA-256 (parameters, buffers, optimizer state): the same for --devices
1, 2 or 4, and after a restart from a checkpoint on another number of processes (with --accumulate too).
"""
import argparse

import lightning as L
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import easyscale_ext as es
from easyscale_ext.lightning import EasyScaleStrategy


class DigitsClassifier(L.LightningModule):  # an ordinary LightningModule: nothing EasyScale in it
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.2),
                                 nn.Linear(64, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_accuracy", (self.net(x).argmax(1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--virtual-workers", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--ckpt-dir", default=None, help="save a checkpoint at each epoch's end here (last.ckpt)")
    parser.add_argument("--resume", default=None, help="a checkpoint to resume from, on any --devices")
    parser.add_argument("--accumulate", type=int, default=1,
                        help="batches per optimizer step (accumulate_grad_batches)")
    args = parser.parse_args()

    L.seed_everything(0)
    digits = load_digits()  # ships with scikit-learn: nothing is downloaded
    data = TensorDataset(torch.tensor(digits.data / 16, dtype=torch.float32), torch.tensor(digits.target))
    train, val = torch.utils.data.random_split(data, [1500, 297], generator=torch.Generator().manual_seed(0))
    callbacks = [L.pytorch.callbacks.ModelCheckpoint(dirpath=args.ckpt_dir, save_last=True)] if args.ckpt_dir else []
    trainer = L.Trainer(strategy=EasyScaleStrategy(virtual_world_size=args.virtual_workers), accelerator="cpu",
                        devices=args.devices, max_epochs=args.epochs, accumulate_grad_batches=args.accumulate,
                        callbacks=callbacks,
                        enable_checkpointing=bool(args.ckpt_dir), logger=False, enable_progress_bar=False,
                        enable_model_summary=False)
    model = DigitsClassifier()
    trainer.fit(model, DataLoader(train, batch_size=16, shuffle=True), DataLoader(val, batch_size=64),
                ckpt_path=args.resume)
    if trainer.is_global_zero:
        print(f"val_accuracy {trainer.callback_metrics['val_accuracy']:.3f}")
        print(f"state {es.state_sha256(model, trainer.optimizers[0])}")


if __name__ == "__main__":
    main()
