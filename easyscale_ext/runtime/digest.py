"""The SHA-256 of a training state: the bitwise verdict that two runs ended alike."""
import hashlib

import torch


def _bytes(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def state_sha256(module: torch.nn.Module, optimizer=None) -> str:
    """Over every parameter and buffer of `module` (by name) and every tensor and value of `optimizer`'s
    state: equal digests mean bitwise equal states (-0.0 and +0.0 differ, as they should)."""
    h = hashlib.sha256()
    for name, t in module.state_dict().items():
        h.update(name.encode())
        h.update(_bytes(t))
    if optimizer is not None:
        for pid, st in sorted(optimizer.state_dict()["state"].items()):
            for k, v in sorted(st.items()):
                h.update(f"{pid}.{k}".encode())
                h.update(_bytes(v) if torch.is_tensor(v) else repr(v).encode())
    return h.hexdigest()
