"""EasyScale in PyTorch Lightning: `Trainer(strategy=EasyScaleStrategy(virtual_world_size=N), devices=P)`.

The strategy is Lightning's DDPStrategy (its launcher, process group, barriers and reductions) with EasyScaleDDP in
DDP's place, so an unchanged LightningModule trains with the same bits on any number of processes P <= N:
- the training DataLoader is rebuilt as EasyScaleDDP's loader (`VirtualDataLoader`): every step yields each of this
  process's virtual workers its DistributedSampler(num_replicas=N) share; the dataset, batch size, workers and
  collate function are the user's, shuffling and its seed those of the sampler Lightning's DDP would use;
- each training batch runs `training_step` once per local virtual worker, with that worker's context switched in
  (its RNG streams, its buffers), and its backward; the last worker's backward exchanges the canonical sum.
  Lightning's closure zeroes the gradients between `training_step` and its backward: the reduced gradients are
  held aside over that zeroing and handed back in `backward`, after which Lightning's own hooks, clipping and
  optimizer step run as under DDP;
- with `accumulate_grad_batches=G`, an optimizer step takes G batches: each virtual worker's loss is divided by G,
  as Lightning divides a DDP rank's, and its gradients accumulate in its own context (EasyScaleDDP.no_sync, which
  Lightning enters as DDP's) until the last batch exchanges the sum; so G x N micro-batches make one step on any
  number of processes;
- checkpoints carry every virtual worker's context (gathered on rank 0 under `"easyscale"`), checked on resume as
  EasyScale's own checkpoints are (same N, determinism level, buffers setting and model), so `trainer.fit(...,
  ckpt_path=...)` resumes on any P. Between steps a process is its first virtual worker, as a DDP rank is its own:
  `training_step`'s returned loss and the LightningModule's state are that worker's.
What it refuses, with the setting to change: more processes than virtual workers, manual optimization,
`sync_batchnorm`, DDP communication hooks, a training sampler other than Lightning's or torch's own.
"""
from collections.abc import Mapping
from contextlib import contextmanager
from datetime import timedelta
from typing import Optional

import torch
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import RunningStage, TrainerFn
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, SequentialSampler

from .elastic.checkpoint import check_header, gather_contexts, job_header
from .runtime.ddp import EasyScaleDDP, end_process_group_at_exit

CHECKPOINT_KEY = "easyscale"  # where a Lightning checkpoint keeps the virtual workers' contexts
# DataLoader settings the rebuilt training loader keeps (the sampler and batching are EasyScale's).
_KEPT = ("num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn", "multiprocessing_context",
         "prefetch_factor", "persistent_workers", "pin_memory_device", "in_order")


class EasyScaleStrategy(DDPStrategy):
    """Lightning's DDP strategy with EasyScaleDDP: `virtual_world_size` virtual workers on however many processes
    the Trainer's `devices` x `num_nodes` give (at most that many). Other keyword arguments go to EasyScaleDDP
    (`broadcast_buffers`, `find_unused_parameters`, `bucket_cap_mb`, `isa`, `num_threads`)."""

    strategy_name = "easyscale"

    def __init__(self, virtual_world_size: int, determinism_level: str = "D1", cluster_environment=None,
                 checkpoint_io=None, process_group_backend: Optional[str] = None,
                 timeout: Optional[timedelta] = timedelta(minutes=30), start_method: str = "popen", **ddp_kwargs):
        if virtual_world_size < 1:
            raise ValueError(f"EasyScaleStrategy(virtual_world_size={virtual_world_size}): give at least 1")
        hooks = [k for k in ("ddp_comm_state", "ddp_comm_hook", "ddp_comm_wrapper", "model_averaging_period")
                 if ddp_kwargs.get(k) is not None]
        if hooks:
            raise ValueError(f"EasyScaleStrategy does not take DDP communication hooks ({', '.join(hooks)}): its "
                             "reduction is the canonical tree that keeps the bits; remove them")
        super().__init__(cluster_environment=cluster_environment, checkpoint_io=checkpoint_io,
                         process_group_backend=process_group_backend, timeout=timeout, start_method=start_method,
                         **ddp_kwargs)
        self.virtual_world_size = virtual_world_size
        self.determinism_level = determinism_level
        self._reduced = []  # (parameter, reduced gradient) held over the closure's zero_grad
        self._blocked = False  # this batch accumulates (block_backward_sync)
        self._accumulating = False  # the last batch accumulated: the window's gradients are kept

    # -- setup -------------------------------------------------------------------------------------------------
    def setup(self, trainer) -> None:
        processes = self.num_nodes * self.num_processes
        if processes > self.virtual_world_size:
            raise ValueError(f"EasyScaleStrategy(virtual_world_size={self.virtual_world_size}) runs on at most "
                             f"{self.virtual_world_size} process{'es' if self.virtual_world_size > 1 else ''}; "
                             f"Trainer(devices={self.num_processes}, "
                             f"num_nodes={self.num_nodes}) starts {processes}: lower devices or raise "
                             "virtual_world_size")
        if trainer.state.fn == TrainerFn.FITTING:
            if not trainer.lightning_module.automatic_optimization:
                raise ValueError("EasyScaleStrategy runs automatic optimization only (it calls each virtual "
                                 "worker's backward itself): remove `automatic_optimization = False`")
            if self._layer_sync is not None:
                raise ValueError("Trainer(sync_batchnorm=True) is not supported by EasyScaleStrategy: SyncBatchNorm "
                                 "reduces over processes, not virtual workers; leave it off (each virtual worker "
                                 "keeps its own BatchNorm statistics, as a DDP rank does)")
        super().setup(trainer)

    def setup_distributed(self) -> None:
        super().setup_distributed()
        end_process_group_at_exit()  # Lightning ends it at exit for NCCL only

    def _setup_model(self, model) -> EasyScaleDDP:
        device_ids = None if self.root_device.type == "cpu" else [self.root_device.index]
        return EasyScaleDDP(model, device_ids=device_ids, virtual_world_size=self.virtual_world_size,
                            determinism_level=self.determinism_level, **self._ddp_kwargs)

    def _register_ddp_hooks(self) -> None:
        pass  # none are taken (__init__)

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        return True  # the contexts go into EasyScaleDDP, which setup builds

    # -- data --------------------------------------------------------------------------------------------------
    def process_dataloader(self, dataloader):
        if not isinstance(dataloader, DataLoader):
            return dataloader
        if self.lightning_module.trainer.state.stage == RunningStage.TRAINING:
            return StepLoader(self.model, dataloader)
        if dataloader.generator is None:
            # Every pass of a DataLoader without a generator draws its base seed from the process's RNG, which
            # between steps is its first virtual worker's stream: validation would shift that worker's dropout
            # on some placements and not others.
            dataloader.generator = torch.Generator().manual_seed(0)
        return dataloader

    # -- one training batch ------------------------------------------------------------------------------------
    @contextmanager
    def block_backward_sync(self):
        """A batch that accumulates: each virtual worker keeps its gradients for the window's last batch."""
        with self.model.no_sync():
            self._blocked = True
            try:
                yield
            finally:
                self._blocked = False

    def training_step(self, step_batches, *args, **kwargs):
        module, optimizer = self.lightning_module, (self.optimizers or [None])[0]
        if not self._accumulating:  # a window's first batch: the zero_grad Lightning runs only after this one
            for p in self.model.parameters():
                p.grad = None
        first = None
        for batch in self.model.workers(step_batches):
            output = super().training_step(batch, *args, **kwargs)
            loss = output.get("loss") if isinstance(output, Mapping) else output
            if not isinstance(loss, torch.Tensor):
                raise ValueError("under EasyScaleStrategy every virtual worker's training_step must return its loss "
                                 "(a tensor, or a dict with 'loss'); skipping a step is not supported")
            scaled = loss / module.trainer.accumulate_grad_batches  # as Lightning's closure divides it
            self.precision_plugin.backward(self.precision_plugin.pre_backward(scaled, module), module, optimizer)
            if first is None:
                first = {**output, "loss": loss.detach()} if isinstance(output, Mapping) else loss.detach()
        self._accumulating = self._blocked
        self._reduced = [(p, p.grad) for p in self.model.parameters()]
        for p, _ in self._reduced:
            p.grad = None  # over the closure's zero_grad
        return first

    def backward(self, closure_loss, optimizer, *args, **kwargs):
        """Hand back the reduced gradients the step computed; Lightning's after-backward hooks run on them."""
        for p, grad in self._reduced:
            p.grad = grad
        self._reduced = []
        return self.precision_plugin.post_backward(closure_loss, self.lightning_module)

    # -- checkpoints -------------------------------------------------------------------------------------------
    def save_checkpoint(self, checkpoint, filepath, storage_options=None) -> None:
        if isinstance(self.model, EasyScaleDDP):  # fitting: there are virtual workers
            contexts = gather_contexts(self.model)  # collective: Lightning saves on every rank
            if self.is_global_zero:
                checkpoint[CHECKPOINT_KEY] = {**job_header(self.model), "contexts": contexts}
        super().save_checkpoint(checkpoint, filepath, storage_options)

    def load_model_state_dict(self, checkpoint, strict: bool = True) -> None:
        super().load_model_state_dict(checkpoint, strict=strict)
        if not isinstance(self.model, EasyScaleDDP):
            return  # not fitting: no virtual workers to give contexts to
        saved = checkpoint.get(CHECKPOINT_KEY)
        if saved is None:
            raise ValueError("this checkpoint was not written under EasyScaleStrategy: it has no virtual workers' "
                             "contexts; start from it with load_state_dict instead of ckpt_path")
        check_header(saved, self.model, "the checkpoint")
        self.model.import_contexts({v: saved["contexts"][v] for v in self.model.local_ranks})


class StepLoader:
    """The training loader as EasyScale runs it: per step, this process's virtual workers' (rank, batch) pairs.
    Lightning sets its epoch through `sampler.set_epoch`, as it does a DistributedSampler's."""

    def __init__(self, ddp: EasyScaleDDP, dataloader: DataLoader):
        sampler = dataloader.sampler
        if isinstance(sampler, DistributedSampler):  # Lightning's DDP sampler: its shuffle, seed and drop_last
            shuffle, seed, drop_last = sampler.shuffle, sampler.seed, sampler.drop_last
        elif isinstance(sampler, (RandomSampler, SequentialSampler)):
            shuffle, seed, drop_last = isinstance(sampler, RandomSampler), 0, False
        else:
            raise ValueError(f"EasyScaleStrategy gives each virtual worker its share of the data itself; the "
                             f"training DataLoader's {type(sampler).__name__} cannot be kept: use shuffle=True or "
                             "False instead of a sampler")
        if dataloader.batch_size is None:
            raise ValueError("EasyScaleStrategy needs the training DataLoader's batch_size (per virtual worker); "
                             "a batch_sampler cannot be kept")
        kept = {k: getattr(dataloader, k) for k in _KEPT if hasattr(dataloader, k)}
        if kept.get("num_workers", 0) == 0:  # these need worker processes
            kept = {k: v for k, v in kept.items() if k not in ("prefetch_factor", "persistent_workers")}
        # A fixed generator: a pass over the data draws no base seed from the workers' RNG streams, so the steps'
        # randomness does not depend on how often Lightning starts a pass (samples are seeded per index anyway).
        self.loader = ddp.data_loader(dataloader.dataset, dataloader.batch_size, shuffle=shuffle, seed=seed,
                                      drop_last=drop_last, drop_last_batch=dataloader.drop_last,
                                      generator=torch.Generator().manual_seed(seed), **kept)
        self.sampler = self  # where Lightning looks for set_epoch
        self.worker_init_fn = kept.get("worker_init_fn")

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        return iter(self.loader)
