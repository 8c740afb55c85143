"""A virtual worker's random streams as tensors, so the context store can keep them.

Covers torch's CPU generator, the CUDA generator of the current device (when
CUDA is initialised), Python's `random` and NumPy's legacy global generator.
"""
import random
from typing import List

import numpy as np
import torch


def capture(cuda: bool) -> List[torch.Tensor]:
    version, mt, gauss = random.getstate()
    _, keys, pos, has_gauss, cached = np.random.get_state()
    out = [
        torch.get_rng_state(),
        torch.tensor([version, *mt], dtype=torch.int64),
        torch.tensor([0.0 if gauss is None else 1.0, 0.0 if gauss is None else gauss], dtype=torch.float64),
        torch.tensor([*keys.tolist(), pos, has_gauss], dtype=torch.int64),
        torch.tensor([cached], dtype=torch.float64),
    ]
    if cuda:
        out.append(torch.cuda.get_rng_state())
    return out


def restore(states: List[torch.Tensor], cuda: bool) -> None:
    torch.set_rng_state(states[0])
    py = states[1].tolist()
    has_gauss, gauss = states[2].tolist()
    random.setstate((py[0], tuple(py[1:]), gauss if has_gauss else None))
    np_state = states[3].tolist()
    np.random.set_state(("MT19937", np.array(np_state[:624], dtype=np.uint32), np_state[624], np_state[625],
                         states[4].item()))
    if cuda:
        torch.cuda.set_rng_state(states[5])
