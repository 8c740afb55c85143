"""Per-sample seeding: a sample's random augmentation depends on its key alone, not on the batch it is
fetched in, and the caller's RNG streams are left where they were."""
import random

import numpy as np
import torch

from easyscale_ext.runtime.loader import SeededSamples


class Draws(torch.utils.data.Dataset):
    """Each item draws from torch's, Python's and NumPy's global generators, as augmentations do."""

    def __len__(self):
        return 10

    def __getitem__(self, index):
        return index, torch.rand(2), random.random(), np.random.rand()


def as_bits(samples):
    return [(i, t.view(torch.int32).tolist(), float.hex(r), float.hex(n)) for i, t, r, n in samples]


def test_a_batch_equals_its_samples_fetched_one_by_one():
    data = SeededSamples(Draws(), seed=3)
    keys = [(4, 1, 0), (7, 1, 2), (4, 2, 0), (4, 1, 1)]
    batch = data.__getitems__(keys)
    assert as_bits(batch) == as_bits([data[k] for k in keys])
    assert as_bits(data.__getitems__(keys[::-1])) == as_bits(batch[::-1])
    # epoch and virtual rank are part of the seed: the same index draws differently under another key
    assert len({tuple(s[1]) for s in as_bits(batch[:1] + batch[2:])}) == 3


def test_the_callers_streams_are_left_where_they_were():
    torch.manual_seed(1), random.seed(1), np.random.seed(1)
    expected = torch.rand(1), random.random(), np.random.rand()
    torch.manual_seed(1), random.seed(1), np.random.seed(1)
    SeededSamples(Draws(), seed=0).__getitems__([(1, 0, 0), (2, 0, 1)])
    assert (torch.rand(1), random.random(), np.random.rand()) == expected
