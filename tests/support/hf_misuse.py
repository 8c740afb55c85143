"""Trainer settings EasyScaleTrainer cannot honour, one per run: `python hf_misuse.py MODE OUT`; mode `exit` (under
torchrun) only prints whether the process group is gone when the interpreter exits."""
import atexit
import sys

import torch
import torch.distributed as dist
from transformers import BertConfig, BertForSequenceClassification, TrainingArguments

from easyscale_ext.hf import EasyScaleTrainer


class Sequences(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        ids = torch.arange(8) % 5 + i % 3
        return {"input_ids": ids, "labels": torch.tensor(i % 2)}


mode, out = sys.argv[1:]
# Registered first, so run last: after EasyScaleTrainer's own handler.
atexit.register(lambda: print(f"group at exit: {'alive' if dist.is_initialized() else 'ended'}", flush=True))
model = BertForSequenceClassification(BertConfig(vocab_size=16, hidden_size=8, num_hidden_layers=1,
                                                 num_attention_heads=1, intermediate_size=8,
                                                 max_position_embeddings=16))
args = TrainingArguments(output_dir=out, per_device_train_batch_size=4, num_train_epochs=1, use_cpu=True,
                         report_to=[], disable_tqdm=True, logging_strategy="no",
                         save_strategy="steps" if mode == "mid-epoch" else "no", save_steps=3)
trainer = EasyScaleTrainer(model=model, args=args, train_dataset=Sequences(), virtual_world_size=2)
if mode == "exit":
    # A run's first collective, which this one has not otherwise: gloo forms a group without a barrier, so a rank
    # that ended at once could close its sockets while its peer still connects ("Connection closed by peer").
    dist.barrier()
else:
    trainer.train()
if mode == "mid-epoch":
    trainer.train(resume_from_checkpoint=f"{out}/checkpoint-3")
