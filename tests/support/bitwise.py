"""Bitwise comparison, and the canonical reduction tree written in plain PyTorch (the reference every op
is held to)."""
import torch

_INT_VIEW = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
}

def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bit patterns of a floating tensor, as integers of the same width."""
    return t.contiguous().view(_INT_VIEW[t.dtype])


def assert_bitwise(actual: torch.Tensor, expected: torch.Tensor, what: str = "") -> None:
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    a, e = bits(actual.cpu()), bits(expected.cpu())
    if not torch.equal(a, e):
        diff = (a != e).reshape(-1).nonzero()
        i = int(diff[0])
        raise AssertionError(
            f"{what}: {diff.numel()} of {a.numel()} elements differ bitwise; first at flat index {i}: "
            f"got {actual.reshape(-1)[i].item()!r} (0x{int(a.reshape(-1)[i]) & 0xFFFFFFFFFFFFFFFF:x}), "
            f"expected {expected.reshape(-1)[i].item()!r} (0x{int(e.reshape(-1)[i]) & 0xFFFFFFFFFFFFFFFF:x})")


def largest_pow2_below(n: int) -> int:
    p = 1
    while p * 2 < n:
        p *= 2
    return p


def tree_sum(xs):
    """Canonical tree over a list: node [lo, hi) = [lo, lo + p) + [lo + p, hi), p the
    largest power of two < hi - lo. Each `+` is one correctly rounded tensor add."""
    n = len(xs)
    assert n >= 1
    if n == 1:
        return xs[0]
    p = largest_pow2_below(n)
    return tree_sum(xs[:p]) + tree_sum(xs[p:])


def tree_sum_vec(v: torch.Tensor) -> torch.Tensor:
    """The same tree over the elements of a 1-D tensor, vectorised: the left child
    of every node has a power-of-two size, and over 2^k items the tree is the
    balanced pairwise one. Returns a 0-d tensor (0 for an empty input)."""
    n = v.numel()
    if n == 0:
        return torch.zeros((), dtype=v.dtype)
    if n == 1:
        return v[0]
    p = largest_pow2_below(n)
    left = v[:p]
    while left.numel() > 1:
        left = left[0::2] + left[1::2]
    return left[0] + tree_sum_vec(v[p:])


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def spiky(shape, dtype, gen: torch.Generator, zeros: bool = True) -> torch.Tensor:
    """Values over a huge dynamic range (so association changes the rounding),
    with some +0 and -0 mixed in; fp16 ranges reach into its subnormals."""
    lo, hi = {torch.float64: (-40, 40), torch.float32: (-12, 12),
              torch.bfloat16: (-12, 12), torch.float16: (-8, 3)}[dtype]
    base = torch.randn(shape, generator=gen, dtype=torch.float64)
    exps = torch.randint(lo, hi + 1, shape, generator=gen).to(torch.float64)
    x = base * torch.pow(10.0, exps)
    if zeros and x.numel():
        pick = torch.rand(shape, generator=gen)
        x = torch.where(pick < 0.03, torch.zeros_like(x), x)
        x = torch.where((pick >= 0.03) & (pick < 0.06), torch.full_like(x, -0.0), x)
    return x.to(dtype)
