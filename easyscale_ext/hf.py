"""EasyScale in the Hugging Face Trainer: `EasyScaleTrainer(..., virtual_world_size=N)` in `Trainer`'s place.

The Trainer's own loop runs as it is (its optimizer, scheduler, clipping, logging and checkpoints); three of its
steps are EasyScale's:
- the model is wrapped in EasyScaleDDP instead of DDP (so Accelerate prepares only the optimizer, as the Trainer
  does for any model it finds wrapped);
- the training loader is EasyScaleDDP's: every step yields each of this process's virtual workers its
  DistributedSampler(num_replicas=N) share of `train_dataset`, batched by `per_device_train_batch_size` (per
  virtual worker) through the Trainer's data collator, shuffled with `args.data_seed` (else `args.seed`);
- `training_step` runs the Trainer's own step (forward, loss, backward) once per local virtual worker, with that
  worker's context switched in; the last backward exchanges the canonical sum, and the step's loss is the mean of
  this process's workers' losses. With `gradient_accumulation_steps=G`, the Trainer divides each worker's loss by
  G and each worker's gradients accumulate in its own context (EasyScaleDDP.no_sync) until the G-th batch
  exchanges the sum: G x N micro-batches make one optimizer step on any number of processes.
Checkpoints carry every virtual worker's context (`easyscale_contexts.pt` beside the Trainer's files), so
`trainer.train(resume_from_checkpoint=...)` resumes on any number of processes with an uninterrupted run's bits;
the Trainer's per-process RNG files are not restored (the contexts hold every worker's streams). Refused, naming
the setting: more processes than virtual workers, and a resume from a checkpoint written inside an epoch (use
`save_strategy="epoch"`).
"""
import contextlib
import math
import os

import torch
import torch.distributed as dist
from transformers import Trainer, TrainerState
from transformers.utils import is_datasets_available
from transformers.trainer import OPTIMIZER_NAME, SCHEDULER_NAME, TRAINER_STATE_NAME

from .elastic.checkpoint import (check_header, context_bytes, context_tensors, gather_contexts, job_header,
                                 read_verified, write_verified)
from .placement import even_ranges
from .runtime.ddp import EasyScaleDDP, end_process_group_at_exit
from .runtime.loader import VirtualDataLoader

if is_datasets_available():
    import datasets

CONTEXTS_FILE = "easyscale_contexts.pt"


class EasyScaleTrainer(Trainer):
    """`transformers.Trainer` training `model` as `virtual_world_size` virtual workers on however many processes
    torchrun starts (at most that many). `easyscale` holds EasyScaleDDP's keyword arguments (`determinism_level`,
    D1 by default; `broadcast_buffers`, `find_unused_parameters`, `isa`, ...)."""

    def __init__(self, *args, virtual_world_size: int, easyscale=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.virtual_world_size = virtual_world_size
        self.easyscale = {"determinism_level": "D1", **(easyscale or {})}
        if self.args.world_size > virtual_world_size:
            raise ValueError(f"EasyScaleTrainer(virtual_world_size={virtual_world_size}) runs on at most "
                             f"{virtual_world_size} process{'es' if virtual_world_size > 1 else ''}; torchrun "
                             f"started {self.args.world_size}: start fewer or raise virtual_world_size")
        self._ddp = None
        if dist.is_initialized():
            end_process_group_at_exit()  # Accelerate leaves torchrun's group alive into interpreter shutdown

    def _wrap_model(self, model, training=True, dataloader=None):
        if not training:
            return model
        if self._ddp is None:
            device_ids = None if self.args.device.type == "cpu" else [self.args.device.index]
            self._ddp = EasyScaleDDP(model, device_ids=device_ids, virtual_world_size=self.virtual_world_size,
                                     **self.easyscale)
        return self._ddp

    def get_train_dataloader(self) -> VirtualDataLoader:
        """EasyScale's loader over `train_dataset` for this process's virtual workers (an even split, as
        EasyScaleDDP's; the Trainer asks for it before it wraps the model)."""
        args, dataset, collator = self.args, self.train_dataset, self.data_collator
        if is_datasets_available() and isinstance(dataset, datasets.Dataset):  # the columns the model takes, as
            dataset = self._remove_unused_columns(dataset, description="training")  # the Trainer's loaders keep
        else:
            collator = self._get_collator_with_removed_columns(collator, description="training")
        seed = args.data_seed if args.data_seed is not None else args.seed
        lo, hi = even_ranges(self.virtual_world_size, args.world_size)[args.process_index]
        extra = {"prefetch_factor": args.dataloader_prefetch_factor,
                 "persistent_workers": args.dataloader_persistent_workers} if args.dataloader_num_workers else {}
        # A fixed generator: a pass over the data draws no base seed from the workers' RNG streams (samples are
        # seeded per index anyway), so those streams hold only the training's own draws.
        return VirtualDataLoader(dataset, args.per_device_train_batch_size, self.virtual_world_size,
                                 range(lo, hi), shuffle=True, seed=seed, drop_last_batch=args.dataloader_drop_last,
                                 collate_fn=collator, num_workers=args.dataloader_num_workers,
                                 pin_memory=args.dataloader_pin_memory, generator=torch.Generator().manual_seed(seed),
                                 **extra)

    def _get_dataloader(self, dataset, description, batch_size, sampler_fn=None, is_training=False,
                        dataloader_key=None):
        loader = super()._get_dataloader(dataset, description, batch_size, sampler_fn, is_training, dataloader_key)
        base = getattr(loader, "base_dataloader", loader)  # the DataLoader inside Accelerate's
        if base.generator is None:
            # Every pass of a DataLoader without a generator draws its base seed from the process's RNG, which
            # between steps is its first virtual worker's stream: evaluation would shift that worker's dropout on
            # some placements and not others.
            base.generator = torch.Generator().manual_seed(0)
        return loader

    def training_step(self, model, inputs, num_items_in_batch=None):
        # A batch that accumulates keeps each worker's gradients, on one process too (where Accelerate's no_sync,
        # which the Trainer enters, does nothing).
        with contextlib.nullcontext() if self.accelerator.sync_gradients else model.no_sync():
            losses = [super(EasyScaleTrainer, self).training_step(model, batch, num_items_in_batch)
                      for batch in model.workers(inputs)]
        return torch.stack(losses).mean()

    def floating_point_ops(self, inputs) -> int:
        return sum(super(EasyScaleTrainer, self).floating_point_ops(batch) for _, batch in inputs)

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        contexts = gather_contexts(self._ddp)  # collective: the Trainer saves on every process
        if self.args.process_index == 0:
            folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
            write_verified(os.path.join(folder, CONTEXTS_FILE),
                           {**job_header(self._ddp), "contexts": context_tensors(contexts)})

    def _load_optimizer_and_scheduler(self, checkpoint):
        if checkpoint is None:
            return super()._load_optimizer_and_scheduler(checkpoint)
        if self.args.device.type == "cpu":
            # The Trainer maps the optimizer onto args.device (cpu:0) when several processes run, which torch 2.14's
            # loader refuses ("don't know how to restore data location"): onto "cpu", as it does for one process.
            self.optimizer.load_state_dict(torch.load(os.path.join(checkpoint, OPTIMIZER_NAME), map_location="cpu",
                                                      weights_only=True))
            self.lr_scheduler.load_state_dict(torch.load(os.path.join(checkpoint, SCHEDULER_NAME), weights_only=True))
        else:
            super()._load_optimizer_and_scheduler(checkpoint)
        # the Trainer calls this once the model is wrapped: the contexts can go in now
        path = os.path.join(checkpoint, CONTEXTS_FILE)
        if not os.path.exists(path):
            raise ValueError(f"{checkpoint} was not written by EasyScaleTrainer: it has no {CONTEXTS_FILE}; start "
                             "from its weights with from_pretrained instead of resume_from_checkpoint")
        saved = read_verified(path)
        check_header(saved, self._ddp, path)
        step = TrainerState.load_from_json(os.path.join(checkpoint, TRAINER_STATE_NAME)).global_step
        steps = math.ceil(len(self.get_train_dataloader()) / self.args.gradient_accumulation_steps)  # an epoch's
        if step % steps:
            raise ValueError(f"{checkpoint} was written inside an epoch (step {step}, {steps} steps an epoch): "
                             "EasyScaleTrainer resumes from epoch ends; save with save_strategy='epoch'")
        self._ddp.import_contexts(context_bytes(saved["contexts"], self._ddp.local_ranks))

    def _load_rng_state(self, checkpoint):
        pass  # every virtual worker's streams came back with its context
