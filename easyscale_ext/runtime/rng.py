"""A virtual worker's random streams as tensors, so the context store can keep them.

Covers torch's CPU generator, the CUDA generator of the model's device (when
it is a GPU: not whichever device is current), Python's `random` and NumPy's legacy global generator.
Conversions go through NumPy arrays: this runs at every context switch.
"""
import random
from typing import List, Optional

import numpy as np
import torch


def capture(cuda: Optional[torch.device]) -> List[torch.Tensor]:
    version, mt, gauss = random.getstate()
    _, keys, pos, has_gauss, cached = np.random.get_state()
    py = np.empty(len(mt) + 1, dtype=np.int64)
    py[0] = version
    py[1:] = mt
    np_state = np.empty(len(keys) + 2, dtype=np.int64)
    np_state[:-2] = keys
    np_state[-2:] = (pos, has_gauss)
    out = [
        torch.get_rng_state(),
        torch.from_numpy(py),
        torch.from_numpy(np.array([gauss is not None, gauss or 0.0, cached], dtype=np.float64)),
        torch.from_numpy(np_state),
    ]
    if cuda is not None:
        out.append(torch.cuda.get_rng_state(cuda))
    return out


def restore(states: List[torch.Tensor], cuda: Optional[torch.device]) -> None:
    torch.set_rng_state(states[0])
    py = states[1].numpy()
    has_gauss, gauss, cached = states[2].tolist()
    random.setstate((int(py[0]), tuple(py[1:].tolist()), gauss if has_gauss else None))
    np_state = states[3].numpy()
    np.random.set_state(("MT19937", np_state[:-2].astype(np.uint32), int(np_state[-2]), int(np_state[-1]), cached))
    if cuda is not None:
        torch.cuda.set_rng_state(states[4], cuda)
