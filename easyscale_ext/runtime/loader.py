"""Data for virtual workers: DistributedSampler semantics over N virtual
replicas, one loader feeding each local virtual worker its own micro-batch,
and per-sample seeding so random augmentation does not depend on which
process or DataLoader worker ran it."""
import hashlib
import math
import random
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


def virtual_indices(length: int, num_replicas: int, rank: int, epoch: int, seed: int, shuffle: bool,
                    drop_last: bool) -> List[int]:
    """The indices torch.utils.data.DistributedSampler gives replica `rank`, without a process group."""
    if drop_last and length % num_replicas:
        per_replica = math.ceil((length - num_replicas) / num_replicas)
    else:
        per_replica = math.ceil(length / num_replicas)
    total = per_replica * num_replicas
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        indices = torch.randperm(length, generator=g).tolist()
    else:
        indices = list(range(length))
    if not drop_last:
        padding = total - len(indices)
        if padding <= len(indices):
            indices += indices[:padding]
        else:
            indices += (indices * math.ceil(padding / len(indices)))[:padding]
    else:
        indices = indices[:total]
    return indices[rank:total:num_replicas]


def sample_seed(seed: int, epoch: int, virtual_rank: int, index: int) -> int:
    digest = hashlib.sha256(f"{seed}:{epoch}:{virtual_rank}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


class SeededSamples(Dataset):
    """Wraps a dataset so item (index, epoch, virtual_rank) is produced under RNG
    seeded from (job seed, epoch, virtual rank, index): torch, random and NumPy.
    The caller's RNG state is left as it was."""

    def __init__(self, dataset: Dataset, seed: int):
        self.dataset = dataset
        self.seed = seed

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, key: Tuple[int, int, int]):
        return self.__getitems__([key])[0]

    def __getitems__(self, keys: Sequence[Tuple[int, int, int]]) -> list:
        """A batch (DataLoader's fetcher calls this): each sample is seeded by its own key, so it equals
        `self[key]`; the caller's state is saved and restored once a batch (NumPy's costs 70 us a sample)."""
        py_state, np_state = random.getstate(), np.random.get_state()
        with torch.random.fork_rng(devices=[]):
            try:
                samples = []
                for index, epoch, virtual_rank in keys:
                    s = sample_seed(self.seed, epoch, virtual_rank, index)
                    torch.default_generator.manual_seed(s)  # torch.manual_seed would reseed CUDA too
                    random.seed(s)
                    np.random.seed(s & 0xFFFFFFFF)
                    samples.append(self.dataset[index])
                return samples
            finally:
                random.setstate(py_state)
                np.random.set_state(np_state)


class _StepBatches:
    """Batch sampler: for each step, one micro-batch per local virtual worker, in rank order."""

    def __init__(self, loader: "VirtualDataLoader"):
        self.loader = loader

    def __iter__(self):
        ld = self.loader
        per_rank = {v: virtual_indices(ld.length, ld.num_replicas, v, ld.epoch, ld.seed, ld.shuffle, ld.drop_last)
                    for v in ld.local_ranks}
        for step in range(ld.next_step, len(ld)):
            for v in ld.local_ranks:
                chunk = per_rank[v][step * ld.batch_size:(step + 1) * ld.batch_size]
                yield [(i, ld.epoch, v) for i in chunk]

    def __len__(self):
        return len(self.loader) * len(self.loader.local_ranks)


class VirtualDataLoader:
    """Yields, per step, a list of (virtual_rank, batch) for this process's virtual workers.

    Virtual rank v sees exactly what DistributedSampler(num_replicas=N, rank=v,
    shuffle, seed, drop_last) with set_epoch would give it, batched by
    batch_size (the last batch may be short unless drop_last_batch). Extra
    DataLoader arguments (num_workers, collate_fn, pin_memory, ...) pass through.
    `on_epoch_start()` runs when a pass over an epoch begins at its first step.
    """

    def __init__(self, dataset: Dataset, batch_size: int, num_replicas: int, local_ranks: Sequence[int],
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False, drop_last_batch: bool = False,
                 *, on_epoch_start: Optional[Callable[[], None]] = None, **dataloader_kwargs):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        for bad in ("sampler", "batch_sampler", "shuffle", "batch_size", "drop_last"):
            if bad in dataloader_kwargs:
                raise ValueError(f"VirtualDataLoader chooses {bad} itself; remove it from the arguments")
        self.length = len(dataset)
        self.batch_size = batch_size
        self.num_replicas = num_replicas
        self.local_ranks = list(local_ranks)
        self.shuffle, self.seed, self.drop_last, self.drop_last_batch = shuffle, seed, drop_last, drop_last_batch
        self.epoch = 0
        self.next_step = 0  # the data position: the next step of this epoch
        self.on_epoch_start = on_epoch_start
        # Its own generator: DataLoader draws a base seed per epoch, which must
        # not come out of (and shift) the virtual workers' RNG streams.
        dataloader_kwargs.setdefault("generator", torch.Generator().manual_seed(seed))
        self._loader = DataLoader(SeededSamples(dataset, seed), batch_sampler=_StepBatches(self),
                                  **dataloader_kwargs)

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        """Like DistributedSampler.set_epoch; start_step resumes inside the epoch."""
        if not 0 <= start_step <= len(self):
            raise ValueError(f"start_step must be in [0, {len(self)}], got {start_step}")
        self.epoch = epoch
        self.next_step = start_step

    def reassign(self, local_ranks: Sequence[int]) -> None:
        """Serve other virtual ranks from the next step on (after a scale event). The same ranks keep the
        running iterator: a new one recomputes the epoch's order (a loop that calls this every step paid it)."""
        local_ranks = list(local_ranks)
        if local_ranks != self.local_ranks:
            self.local_ranks, self._iterator = local_ranks, None

    def samples_per_replica(self) -> int:
        return len(virtual_indices(self.length, self.num_replicas, 0, 0, self.seed, False, self.drop_last))

    def __len__(self) -> int:
        n = self.samples_per_replica()
        return n // self.batch_size if self.drop_last_batch else math.ceil(n / self.batch_size)

    def __iter__(self) -> Iterator[List[Tuple[int, object]]]:
        self._iterator = None
        if self.next_step == 0 and self.on_epoch_start is not None:
            self.on_epoch_start()
        while self.next_step < len(self):
            if self._iterator is None:  # (re)start at the data position, e.g. after reassign()
                self._iterator = iter(self._loader)
            batches = [(v, next(self._iterator)) for v in self.local_ranks]
            self.next_step += 1
            yield batches
        self.next_step = 0
