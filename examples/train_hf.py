"""A Hugging Face `Trainer` job with EasyScaleTrainer in Trainer's place: the same bits on any number of processes.

    torchrun --nproc-per-node 2 examples/train_hf.py              # 4 virtual workers on 2 processes
    python examples/train_hf.py --save --out run                  # 1 process; run/checkpoint-16 and -32
    torchrun --nproc-per-node 4 examples/train_hf.py --out run2 --resume run/checkpoint-16
    torchrun --nproc-per-node 2 examples/train_hf.py --accumulate 2   # an optimizer step every 2 batches

A small BERT built from its config (random weights, dropout and attention as in any BERT; nothing is downloaded)
classifies generated token sequences. Process 0 prints the trained state's SHA-256 (parameters, buffers,
optimizer state): the same on 1, 2 or 4 processes, and after a restart from a checkpoint on another number (with
--accumulate too).
"""
import argparse

import torch
from transformers import BertConfig, BertForSequenceClassification, TrainingArguments

import easyscale_ext as es
from easyscale_ext.hf import EasyScaleTrainer


class Sequences(torch.utils.data.Dataset):
    """Token sequences whose label says whether token 7 occurs in them."""

    def __init__(self, n=512, length=16, vocab=64, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, vocab, (n, length), generator=g)
        self.labels = (self.ids == 7).any(dim=1).long()

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": self.labels[i]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--virtual-workers", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", default="hf-run", help="the Trainer's output folder (its checkpoints, with --save)")
    parser.add_argument("--save", action="store_true", help="save a checkpoint at each epoch's end")
    parser.add_argument("--resume", default=None, help="a checkpoint folder to resume from, on any number of processes")
    parser.add_argument("--accumulate", type=int, default=1, help="batches per optimizer step "
                        "(gradient_accumulation_steps)")
    args = parser.parse_args()

    torch.manual_seed(0)
    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, num_labels=2)
    model = BertForSequenceClassification(config)
    training = TrainingArguments(output_dir=args.out, per_device_train_batch_size=8, num_train_epochs=args.epochs,
                                 gradient_accumulation_steps=args.accumulate,
                                 learning_rate=1e-3, seed=0, use_cpu=True, report_to=[],
                                 save_strategy="epoch" if args.save else "no", eval_strategy="epoch",
                                 logging_strategy="no", disable_tqdm=True)
    trainer = EasyScaleTrainer(model=model, args=training, train_dataset=Sequences(),
                               eval_dataset=Sequences(n=128, seed=1), virtual_world_size=args.virtual_workers)
    trainer.train(resume_from_checkpoint=args.resume)
    if trainer.args.process_index == 0:
        print(f"state {es.state_sha256(trainer.model, trainer.optimizer)}")


if __name__ == "__main__":
    main()
