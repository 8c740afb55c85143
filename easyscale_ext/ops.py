"""Python face of the stateless torch ops (schemas in csrc/torch/ops.cpp).

Each wrapper calls torch.ops.easyscale.*; fake kernels below let the ops
trace under torch.compile. All results depend only on the values and the
number of inputs, never on thread count, device or block size.
"""
from typing import List, Optional, Sequence

import torch

from . import _C  # noqa: F401  (registers the ops)

_ops = torch.ops.easyscale


def canonical_sum(tensors: Sequence[torch.Tensor], out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Sum same-shaped tensors in the canonical association over their indices.

    fp16/bf16 accumulate in fp32; the result has `out_dtype` (default: the
    inputs' dtype; the accumulation type is also allowed).
    """
    if len(tensors) == 0:
        raise ValueError("canonical_sum needs at least one tensor")
    return _ops.canonical_sum(list(tensors), len(tensors), out_dtype)[0]


def canonical_sum_lists(lists: Sequence[Sequence[torch.Tensor]],
                        out_dtype: Optional[torch.dtype] = None) -> list:
    """Element-wise canonical sum of K lists of T tensors each, in one launch."""
    lengths = {len(lst) for lst in lists}
    if len(lengths) != 1 or 0 in lengths:
        raise ValueError(f"canonical_sum_lists needs K non-empty lists of equal length, got lengths "
                         f"{[len(lst) for lst in lists]}")
    flat = [t for lst in lists for t in lst]
    return _ops.canonical_sum(flat, len(lists), out_dtype)


def fold_(acc: Sequence[torch.Tensor], src: Sequence[torch.Tensor], scale: float, accumulate: bool,
          frozen: Optional[Sequence[bool]] = None) -> None:
    """acc[i] = (acc[i] if accumulate) + src[i] * scale, in place, one launch.

    acc holds the accumulation type of src (fp32, or fp64 for fp64). Tensors
    marked frozen are skipped: no copy, no reduction.
    """
    if len(src) == 0:
        raise ValueError("fold_ needs at least one tensor")
    _ops.fold_(list(acc), list(src), float(scale), bool(accumulate), None if frozen is None else list(frozen))


def fold_plan_(out: torch.Tensor, pushed: Sequence[torch.Tensor], plan: Sequence[int], result: int,
               scale: float = 1.0) -> None:
    """out = slot `result` after a fold plan, in one pass: what applying the plan's operations with ``fold_`` one by
    one (each push at `scale`, each merge of partial sums at 1) leaves there, bit for bit, with no slot buffers.
    `plan`: flat (push, dst, src, accumulate) quadruples in order, as `plan_of` makes them from FoldStack pushes;
    `pushed` and `out`: float32 or float64, one size; `out` may be one of `pushed`."""
    if len(pushed) == 0:
        raise ValueError("fold_plan_ needs at least one pushed tensor")
    _ops.fold_plan_(out, list(pushed), list(plan), int(result), float(scale))


def plan_of(pushes: Sequence[Sequence]) -> List[int]:
    """The flat plan of ``fold_plan_`` from the operations FoldStack.push returned, push by push."""
    return [x for j, ops in enumerate(pushes) for op in ops for x in (j, op.dst, op.src, int(op.accumulate))]


def group_norms(tensors: Sequence[torch.Tensor], group_of: Sequence[int], num_groups: int) -> torch.Tensor:
    """L2 norm of each group of tensors (e.g. a layer's gradients) in a fixed order.

    group_of[i] == -1 marks tensor i frozen: it is skipped.
    """
    if len(tensors) == 0:
        raise ValueError("group_norms needs at least one tensor")
    return _ops.group_norms(list(tensors), list(group_of), num_groups)


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """The type tensors of `dtype` accumulate in (the kernels' and the reducer's): fp64 for fp64, else fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


@torch.library.register_fake("easyscale::canonical_sum")
def _canonical_sum_fake(inputs, k, out_dtype=None):
    n = len(inputs) // k
    dtype = out_dtype if out_dtype is not None else inputs[0].dtype
    return [torch.empty_like(inputs[t], dtype=dtype) for t in range(n)]


@torch.library.register_fake("easyscale::fold_")
def _fold_fake(acc, src, scale, accumulate, frozen=None):
    return None


@torch.library.register_fake("easyscale::fold_plan_")
def _fold_plan_fake(out, pushed, plan, result, scale=1.0):
    return None


@torch.library.register_fake("easyscale::group_norms")
def _group_norms_fake(tensors, group_of, num_groups):
    return tensors[0].new_empty((num_groups,), dtype=acc_dtype(tensors[0].dtype))
