"""Bitwise tests of the stateless torch ops (canonical_sum, fold_, fold_plan_, group_norms)
and the FoldStack planner against a plain-PyTorch canonical tree.

Every comparison is on bit patterns (torch.equal on integer views), never a
tolerance: the ops promise one exact association, independent of threads,
chunking and device.
"""
import itertools
import math

import pytest
import torch

import easyscale_ext as es
from support.bitwise import acc_dtype, assert_bitwise, bits, largest_pow2_below, spiky, tree_sum, tree_sum_vec

FLOAT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
KS = [1, 2, 3, 5, 8, 13]
SHAPES = [(), (0,), (7,), (3, 5), (2, 0, 3), (4, 1, 33)]


def reference_sum(xs, out_dtype=None):
    """canonical_sum in plain PyTorch: leaves converted to the accumulation type,
    the tree evaluated there, the root rounded to the output dtype."""
    dtype = xs[0].dtype
    acc = acc_dtype(dtype)
    root = tree_sum([x.to(acc) for x in xs])
    return root.to(out_dtype if out_dtype is not None else dtype)


def correctly_rounded_sqrt(x: torch.Tensor) -> torch.Tensor:
    """IEEE sqrt of a 0-d tensor. Not torch.sqrt: on CPU it can be off by an ulp
    for float32 (seen with torch 2.14's AVX512 kernel). math.sqrt on a double is
    correctly rounded, and rounding that double to float32 is too (53 >= 2*24+2)."""
    return torch.tensor(math.sqrt(x.item()), dtype=torch.float64).to(x.dtype)


def reference_norms(tensors, group_of, num_groups):
    acc = acc_dtype(tensors[0].dtype)
    out = []
    for g in range(num_groups):
        per_tensor = []
        for t, gi in zip(tensors, group_of):
            if gi == g:
                v = t.reshape(-1).to(acc)
                per_tensor.append(tree_sum_vec(v * v))
        sq = tree_sum(per_tensor) if per_tensor else torch.zeros((), dtype=acc)
        out.append(correctly_rounded_sqrt(sq))
    return torch.stack(out) if out else torch.zeros((0,), dtype=acc)


# --------------------------------------------------------------------------
# The reference itself


def test_reference_tree_shape():
    """The split rule as stated: [lo, hi) -> [lo, lo+p) and [lo+p, hi)."""
    assert [largest_pow2_below(n) for n in range(2, 11)] == [1, 2, 2, 4, 4, 4, 4, 8, 8]

    class Sym:  # records the association instead of adding
        def __init__(self, s):
            self.s = s

        def __add__(self, o):
            return Sym(f"({self.s}+{o.s})")

    leaves = [Sym(str(i)) for i in range(7)]
    assert tree_sum(leaves[:3]).s == "((0+1)+2)"
    assert tree_sum(leaves[:6]).s == "(((0+1)+(2+3))+(4+5))"
    assert tree_sum(leaves).s == "(((0+1)+(2+3))+((4+5)+6))"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_vectorised_reference_matches_recursive(dtype):
    g = torch.Generator().manual_seed(1)
    for n in range(1, 70):
        v = spiky((n,), dtype, g)
        assert_bitwise(tree_sum_vec(v), tree_sum(list(v.unbind())), f"n={n}")


# --------------------------------------------------------------------------
# canonical_sum


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_canonical_sum_matches_reference(dtype, k):
    g = torch.Generator().manual_seed(1000 + k)
    for shape in SHAPES:
        xs = [spiky(shape, dtype, g) for _ in range(k)]
        out = es.canonical_sum(xs)
        assert_bitwise(out, reference_sum(xs), f"{dtype} k={k} shape={shape}")
        if dtype in (torch.float16, torch.bfloat16):
            out32 = es.canonical_sum(xs, out_dtype=torch.float32)
            assert_bitwise(out32, reference_sum(xs, torch.float32), f"{dtype}->fp32 k={k} shape={shape}")
        out_same = es.canonical_sum(xs, out_dtype=dtype)
        assert_bitwise(out_same, out, "explicit out_dtype")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_canonical_sum_signed_zero_and_inf(dtype):
    for k in KS:
        neg = [torch.full((5,), -0.0, dtype=dtype) for _ in range(k)]
        assert_bitwise(es.canonical_sum(neg), torch.full((5,), -0.0, dtype=dtype), f"all -0, k={k}")
        if k > 1:
            mixed = neg[:-1] + [torch.zeros(5, dtype=dtype)]
            assert_bitwise(es.canonical_sum(mixed), torch.zeros(5, dtype=dtype), f"-0 and +0, k={k}")
    xs = [torch.tensor([float("inf"), 1.0, -float("inf"), 2.0], dtype=dtype),
          torch.tensor([1.0, float("inf"), -1.0, 3.0], dtype=dtype)]
    assert_bitwise(es.canonical_sum(xs), reference_sum(xs))
    nan = es.canonical_sum([torch.tensor([float("inf")], dtype=dtype), torch.tensor([-float("inf")], dtype=dtype)])
    assert torch.isnan(nan).all()


def test_canonical_sum_does_not_modify_inputs():
    g = torch.Generator().manual_seed(7)
    xs = [spiky((100,), torch.float32, g) for _ in range(5)]
    before = [x.clone() for x in xs]
    es.canonical_sum(xs)
    for x, b in zip(xs, before):
        assert_bitwise(x, b)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_canonical_sum_thread_count_invariant(dtype):
    g = torch.Generator().manual_seed(3)
    n = 100_003  # several 16 Ki-element chunks, a ragged last one
    xs = [spiky((n,), dtype, g) for _ in range(5)]
    torch.set_num_threads(1)
    one = es.canonical_sum(xs)
    torch.set_num_threads(2)
    two = es.canonical_sum(xs)
    assert_bitwise(one, two, "1 vs 2 threads")
    assert_bitwise(two, reference_sum(xs), "vs reference")


def test_canonical_sum_lists_randomised():
    """~30 seeded cases over K, T, shapes, dtypes and out_dtype, one launch each."""
    g = torch.Generator().manual_seed(20240611)

    def rint(lo, hi):  # inclusive
        return int(torch.randint(lo, hi + 1, (), generator=g))

    for case in range(30):
        dtype = FLOAT_DTYPES[rint(0, 3)]
        k = rint(1, 17)
        t = rint(1, 4)
        shapes = [tuple(rint(0, 6) if rint(0, 9) == 0 else rint(1, 40) for _ in range(rint(0, 3))) for _ in range(t)]
        out_dtype = [None, dtype, acc_dtype(dtype)][rint(0, 2)]
        lists = [[spiky(s, dtype, g) for s in shapes] for _ in range(k)]
        outs = es.canonical_sum_lists(lists, out_dtype=out_dtype)
        assert len(outs) == t
        for i in range(t):
            expected = reference_sum([lst[i] for lst in lists], out_dtype)
            assert_bitwise(outs[i], expected, f"case {case}: {dtype} k={k} tensor {i} shape={shapes[i]} "
                                              f"out_dtype={out_dtype}")


def test_association_matters():
    """Guards the equality tests against being vacuous: on spiky data the
    canonical tree differs from a left-to-right sum and from torch.sum."""
    g = torch.Generator().manual_seed(11)
    k = 8
    xs = [spiky((4096,), torch.float32, g, zeros=False) for _ in range(k)]
    canon = es.canonical_sum(xs)
    left = xs[0].clone()
    for x in xs[1:]:
        left = left + x
    stacked = torch.stack(xs).sum(0)
    assert not torch.equal(bits(canon), bits(left)), "canonical tree == left-to-right sum on every element"
    assert not torch.equal(bits(canon), bits(stacked)) or not torch.equal(bits(left), bits(stacked))
    # and the mismatch really is the association: the reference tree agrees
    assert_bitwise(canon, reference_sum(xs))


def test_canonical_sum_errors():
    x = torch.ones(3)
    with pytest.raises(ValueError, match="at least one tensor"):
        es.canonical_sum([])
    with pytest.raises(RuntimeError, match="shape"):
        es.canonical_sum([x, torch.ones(4)])
    with pytest.raises(RuntimeError, match="contiguous"):
        es.canonical_sum([torch.ones(3, 4).t()] * 2)
    with pytest.raises(RuntimeError, match="share a dtype"):
        es.canonical_sum([x, x.double()])
    with pytest.raises(TypeError, match="float32, float64, float16 or bfloat16"):
        es.canonical_sum([torch.ones(3, dtype=torch.int32)])
    with pytest.raises(ValueError, match="output dtype"):
        es.canonical_sum([x], out_dtype=torch.float64)
    with pytest.raises(ValueError, match="output dtype"):
        es.canonical_sum([x.half()], out_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="equal length"):
        es.canonical_sum_lists([[x, x], [x]])
    with pytest.raises(RuntimeError, match="shape"):
        es.canonical_sum_lists([[x, torch.ones(2)], [x, torch.ones(5)]])


def test_canonical_sum_lists_rejects_ragged_lists():
    x = torch.ones(3)
    with pytest.raises((RuntimeError, ValueError)):
        es.canonical_sum_lists([[x], [x, x, x]])
    with pytest.raises(ValueError, match="equal length"):
        es.canonical_sum_lists([[x], [x, x, x]])


# --------------------------------------------------------------------------
# fold_


def _scale_t(scale, acc):
    return torch.tensor(scale, dtype=acc)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_fold_start_and_accumulate(dtype):
    g = torch.Generator().manual_seed(5)
    acc_t = acc_dtype(dtype)
    shapes = [(), (0,), (17,), (3, 40)]
    for scale in (1.0, 0.125, 1.0 / 3.0, -1.0 / 7.0):
        src = [spiky(s, dtype, g) for s in shapes]
        acc = [torch.full(s, float("nan"), dtype=acc_t) for s in shapes]
        es.fold_(acc, src, scale, accumulate=False)
        for a, x in zip(acc, src):  # start: the old (nan) contents are never read
            assert_bitwise(a, x.to(acc_t) * _scale_t(scale, acc_t), f"start scale={scale}")
        prev = [a.clone() for a in acc]
        src2 = [spiky(s, dtype, g) for s in shapes]
        es.fold_(acc, src2, scale, accumulate=True)
        for a, p, x in zip(acc, prev, src2):  # mul, then a separately rounded add
            scaled = x.to(acc_t) * _scale_t(scale, acc_t)
            assert_bitwise(a, p + scaled, f"accumulate scale={scale}")


def test_fold_is_not_fused():
    """acc + src*scale rounded twice differs from a single-rounding FMA on
    suitable inputs; the op must give the twice-rounded result."""
    g = torch.Generator().manual_seed(9)
    src = torch.rand(4096, generator=g, dtype=torch.float32) + 1.0
    scale = 1.0 / 3.0
    acc = -(src.double() * scale).float()  # cancels the product's leading bits
    expected = acc + src * _scale_t(scale, torch.float32)
    fused = (acc.double() + src.double() * torch.tensor(scale, dtype=torch.float32).double()).float()
    assert not torch.equal(bits(expected), bits(fused)), "test data does not separate FMA from mul+add"
    out = acc.clone()
    es.fold_([out], [src], scale, accumulate=True)
    assert_bitwise(out, expected)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_fold_preserves_negative_zero(dtype):
    acc_t = acc_dtype(dtype)
    acc = [torch.full((6,), 5.0, dtype=acc_t)]
    es.fold_(acc, [torch.full((6,), -0.0, dtype=dtype)], 0.5, accumulate=False)
    assert_bitwise(acc[0], torch.full((6,), -0.0, dtype=acc_t), "start from -0")
    es.fold_(acc, [torch.full((6,), -0.0, dtype=dtype)], 1.0, accumulate=True)
    assert_bitwise(acc[0], torch.full((6,), -0.0, dtype=acc_t), "-0 + -0")
    es.fold_(acc, [torch.zeros(6, dtype=dtype)], -1.0, accumulate=False)
    assert_bitwise(acc[0], torch.full((6,), -0.0, dtype=acc_t), "+0 * -1")


def test_fold_frozen_untouched():
    g = torch.Generator().manual_seed(6)
    src = [spiky((50,), torch.bfloat16, g) for _ in range(4)]
    acc = [torch.full((50,), 42.0) for _ in range(3)] + [torch.full((9,), 42.0)]  # frozen may even mismatch
    frozen = [False, True, False, True]
    es.fold_(acc, src, 0.25, accumulate=True, frozen=frozen)
    for a, x, f in zip(acc, src, frozen):
        if f:
            assert_bitwise(a, torch.full(a.shape, 42.0), "frozen")
        else:
            assert_bitwise(a, torch.full((50,), 42.0) + x.float() * _scale_t(0.25, torch.float32))
    es.fold_(acc[:3], src[:3], 0.25, accumulate=False, frozen=[True, True, True])
    assert_bitwise(acc[1], torch.full((50,), 42.0))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_fold_thread_count_invariant(dtype):
    g = torch.Generator().manual_seed(12)
    src = [spiky((100_003,), dtype, g), spiky((40_000,), dtype, g)]
    base = [spiky(x.shape, acc_dtype(dtype), g) for x in src]
    results = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        acc = [b.clone() for b in base]
        es.fold_(acc, src, 0.1, accumulate=True)
        results.append(acc)
    for a, b in zip(*results):
        assert_bitwise(a, b, "1 vs 2 threads")


def test_fold_errors():
    x = torch.ones(3)
    with pytest.raises(RuntimeError, match="must be Float"):
        es.fold_([torch.zeros(3, dtype=torch.float16)], [x.half()], 1.0, False)
    with pytest.raises(RuntimeError, match="must be Float"):
        es.fold_([torch.zeros(3, dtype=torch.float64)], [x], 1.0, False)
    with pytest.raises(RuntimeError, match="must be Double"):
        es.fold_([torch.zeros(3)], [x.double()], 1.0, False)
    with pytest.raises(RuntimeError, match="1 accumulators for 2 sources"):
        es.fold_([torch.zeros(3)], [x, x], 1.0, False)
    with pytest.raises(RuntimeError, match="frozen mask"):
        es.fold_([torch.zeros(3)], [x], 1.0, False, frozen=[False, True])
    with pytest.raises(RuntimeError, match="contiguous"):
        es.fold_([torch.zeros(4, 3).t()], [torch.ones(3, 4)], 1.0, False)
    with pytest.raises(RuntimeError, match="contiguous"):
        es.fold_([torch.zeros(3, 4)], [torch.ones(4, 3).t()], 1.0, False)
    with pytest.raises(RuntimeError, match="shape"):
        es.fold_([torch.zeros(4)], [x], 1.0, False)
    with pytest.raises(ValueError, match="at least one tensor"):
        es.fold_([], [], 1.0, False)


# --------------------------------------------------------------------------
# FoldStack: streaming fold across processes reproduces the tree


def _ranges(rs):
    return [tuple(r) for r in rs]


def _reference_local_roots(a, b, n):
    out = []

    def walk(lo, hi):
        if hi <= a or lo >= b:
            return
        if a <= lo and hi <= b:
            out.append((lo, hi))
            return
        mid = lo + largest_pow2_below(hi - lo)
        walk(lo, mid)
        walk(mid, hi)

    walk(0, n)
    return out


def test_local_roots_and_split():
    for n in range(1, 14):
        for a in range(n):
            for b in range(a + 1, n + 1):
                assert _ranges(es.local_roots(a, b, n)) == _reference_local_roots(a, b, n), (a, b, n)
    for lo, hi in [(0, 2), (0, 3), (0, 5), (3, 12), (8, 9 + 8)]:
        assert es._C.canonical_split(lo, hi) == lo + largest_pow2_below(hi - lo)
    with pytest.raises(ValueError):
        es.local_roots(2, 2, 5)
    with pytest.raises(ValueError):
        es.local_roots(0, 6, 5)


def test_foldstack_errors():
    with pytest.raises(ValueError):
        es.FoldStack(0)
    s = es.FoldStack(5)
    with pytest.raises(ValueError, match="not a node"):
        s.push(1, 3)  # [1,3) is not a node of the tree over 5
    s.push(0, 1)
    with pytest.raises(ValueError, match="out of order"):
        s.push(2, 3)
    assert s.n == 5


def _apply(ops, slots, pushed, scale, acc_t, like):
    for op in ops:
        if op.dst not in slots:  # fresh slot: garbage that a wrong 'accumulate' would expose
            slots[op.dst] = torch.full(like.shape, float("nan"), dtype=acc_t)
        if op.src == es._C.PUSHED:
            es.fold_([slots[op.dst]], [pushed], scale, op.accumulate)
        else:
            assert op.accumulate
            es.fold_([slots[op.dst]], [slots[op.src]], 1.0, True)


def _splits(n, max_parts=3):
    for parts in range(1, min(max_parts, n) + 1):
        for cuts in itertools.combinations(range(1, n), parts - 1):
            bounds = (0,) + cuts + (n,)
            yield list(zip(bounds[:-1], bounds[1:]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_streaming_fold_reproduces_tree(dtype):
    acc_t = acc_dtype(dtype)
    g = torch.Generator().manual_seed(21)
    checked = 0
    for n in range(1, 10):
        xs = [spiky((37,), dtype, g) for _ in range(n)]
        scale = 1.0 / n
        expected = tree_sum([x.to(acc_t) * _scale_t(scale, acc_t) for x in xs])
        assert_bitwise(es.canonical_sum([x.to(acc_t) * _scale_t(scale, acc_t) for x in xs]), expected)
        for split in _splits(n):
            # each process folds its own leaves into its local roots
            partials = []
            for a, b in split:
                stack, slots = es.FoldStack(n), {}
                for i in range(a, b):
                    _apply(stack.push(i, i + 1), slots, xs[i], scale, acc_t, xs[i])
                assert _ranges(stack.nodes()) == _reference_local_roots(a, b, n), (n, split)
                assert len(slots) <= stack.max_slots
                partials += [(node, slots[s]) for node, s in zip(stack.nodes(), stack.slots())]
            # then the local roots of all processes, in order, finish the tree
            stack, slots = es.FoldStack(n), {}
            for node, buf in partials:
                _apply(stack.push(node.lo, node.hi), slots, buf, 1.0, acc_t, buf)
            assert _ranges(stack.nodes()) == [(0, n)]
            assert_bitwise(slots[stack.slots()[0]], expected, f"n={n} split={split}")
            # the same top in one pass, no slot buffers
            top = es.FoldStack(n)
            plan = es.plan_of([top.push(node.lo, node.hi) for node, _ in partials])
            out = torch.full(expected.shape, float("nan"), dtype=acc_t)
            es.fold_plan_(out, [buf for _, buf in partials], plan, top.slots()[0])
            assert_bitwise(out, expected, f"fold_plan_ n={n} split={split}")
            checked += 1
    assert checked == 129


def _top_plan(n, procs):
    """The top of the tree over n leaves split evenly over `procs` processes: (plan, result slot, pushes)."""
    top = es.FoldStack(n)
    nodes = [r for p in range(procs) for r in es.local_roots(n * p // procs, n * (p + 1) // procs, n)]
    plan = es.plan_of([top.push(r.lo, r.hi) for r in nodes])
    return plan, top.slots()[0], len(nodes)


def test_fold_plan_at_a_scale_equals_each_leaf_folded_first():
    """One leaf per process: the top over the raw leaves with pushes at 1/N gives the bits of each process folding
    its leaf (x * 1/N) and the top at scale 1; in place too (out one of the pushed tensors)."""
    g = torch.Generator().manual_seed(17)
    for n in (3, 12, 64):
        plan, result, _ = _top_plan(n, n)
        xs = [spiky((10_007,), torch.float32, g) for _ in range(n)]
        roots = [torch.empty(10_007) for _ in range(n)]
        for root, x in zip(roots, xs):
            es.fold_([root], [x], 1.0 / n, False)
        expected = torch.empty(10_007)
        es.fold_plan_(expected, roots, plan, result)
        out = torch.full((10_007,), float("nan"))
        es.fold_plan_(out, xs, plan, result, 1.0 / n)
        assert_bitwise(out, expected, f"n={n}")
        first = xs[0].clone()
        es.fold_plan_(first, [first, *xs[1:]], plan, result, 1.0 / n)
        assert_bitwise(first, expected, f"n={n}, in place")


def test_fold_plan_thread_count_invariant():
    g = torch.Generator().manual_seed(13)
    plan, result, pushes = _top_plan(64, 5)
    pushed = [spiky((100_003,), torch.float32, g) for _ in range(pushes)]
    outs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        outs.append(torch.empty(100_003))
        es.fold_plan_(outs[-1], pushed, plan, result)
    assert_bitwise(outs[0], outs[1], "1 vs 2 threads")


def test_fold_plan_errors():
    x = torch.ones(3)
    plan, result, _ = _top_plan(2, 2)
    with pytest.raises(ValueError, match="float32 or float64"):
        es.fold_plan_(x.half(), [x.half(), x.half()], plan, result)
    with pytest.raises(RuntimeError, match="has 4 elements, out 3"):
        es.fold_plan_(torch.empty(3), [x, torch.ones(4)], plan, result)
    with pytest.raises(ValueError, match="push outside"):
        es.fold_plan_(torch.empty(3), [x], plan, result)
    with pytest.raises(ValueError, match="before any operation wrote it"):
        es.fold_plan_(torch.empty(3), [x, x], plan[4:], result)
    with pytest.raises(RuntimeError, match="quadruples"):
        es.fold_plan_(torch.empty(3), [x, x], plan[:-1], result)


# --------------------------------------------------------------------------
# group_norms


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_group_norms_matches_reference(dtype):
    g = torch.Generator().manual_seed(31)
    shapes = [(5000,), (3, 7), (), (0,), (2049,), (2048,), (64, 65), (1,), (10,)]
    tensors = [spiky(s, dtype, g) for s in shapes]
    group_of = [0, 1, 0, 2, 1, -1, 3, -1, 0]  # group 4 is empty; 2 holds only an empty tensor
    norms = es.group_norms(tensors, group_of, 5)
    assert norms.dtype == acc_dtype(dtype) and norms.shape == (5,)
    assert_bitwise(norms, reference_norms(tensors, group_of, 5))
    assert norms[2].item() == 0.0 and norms[4].item() == 0.0


def test_group_norms_frozen_skipped():
    g = torch.Generator().manual_seed(32)
    a, b = spiky((300,), torch.float32, g), spiky((40,), torch.float32, g)
    huge = torch.full((10,), 1e30)
    with_frozen = es.group_norms([a, huge, b], [0, -1, 0], 1)
    without = es.group_norms([a, b], [0, 0], 1)
    assert_bitwise(with_frozen, without)
    assert_bitwise(es.group_norms([huge], [-1], 0), torch.zeros(0))


def test_group_norms_order_is_list_order():
    """The tree over a group's tensors follows list order, so it is a
    different association than the tree over their concatenation."""
    g = torch.Generator().manual_seed(33)
    ts = [spiky((3,), torch.float32, g, zeros=False) for _ in range(600)]
    per_tensor = es.group_norms(ts, [0] * len(ts), 1)
    assert_bitwise(per_tensor, reference_norms(ts, [0] * len(ts), 1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16], ids=str)
def test_group_norms_thread_count_invariant(dtype):
    g = torch.Generator().manual_seed(34)
    tensors = [spiky((100_003,), dtype, g), spiky((2048 * 5,), dtype, g), spiky((77,), dtype, g)]
    torch.set_num_threads(1)
    one = es.group_norms(tensors, [0, 1, 0], 2)
    torch.set_num_threads(2)
    two = es.group_norms(tensors, [0, 1, 0], 2)
    assert_bitwise(one, two)
    assert_bitwise(two, reference_norms(tensors, [0, 1, 0], 2))


def test_group_norms_errors():
    x = torch.ones(3)
    with pytest.raises(RuntimeError, match="group index 1 outside"):
        es.group_norms([x], [1], 1)
    with pytest.raises(RuntimeError, match="group index -2 outside"):
        es.group_norms([x], [-2], 1)
    with pytest.raises(RuntimeError, match="2 group indices for 1 tensors"):
        es.group_norms([x], [0, 0], 1)
    with pytest.raises(RuntimeError, match="num_groups"):
        es.group_norms([x], [-1], -1)
    with pytest.raises(RuntimeError, match="contiguous"):
        es.group_norms([torch.ones(3, 4).t()], [0], 1)
    with pytest.raises(TypeError):
        es.group_norms([torch.ones(3, dtype=torch.int64)], [0], 1)


# --------------------------------------------------------------------------
# torch.library.opcheck (schemas, fake kernels, dispatch)


def _opcheck_cases(device):
    g = torch.Generator().manual_seed(41)

    def mk(shape, dtype):
        return spiky(shape, dtype, g).to(device)

    xs = [t for _ in range(3) for t in (mk((4, 5), torch.float32), mk((7,), torch.float32))]  # worker-major
    halves = [mk((6,), torch.float16) for _ in range(2)]
    src = [mk((4, 5), torch.bfloat16), mk((3,), torch.bfloat16)]
    acc = [mk((4, 5), torch.float32), mk((3,), torch.float32)]
    norm_in = [mk((50,), torch.float64), mk((2, 3), torch.float64), mk((4,), torch.float64)]
    ops = torch.ops.easyscale
    return [
        (ops.canonical_sum.default, (xs, 3, None)),
        (ops.canonical_sum.default, (halves, 2, torch.float32)),
        (ops.fold_.default, (acc, src, 0.5, True, None)),
        (ops.fold_.default, (acc, src, 0.5, False, [False, True])),
        (ops.group_norms.default, (norm_in, [0, -1, 1], 2)),
        (ops.fold_plan_.default, (mk((9,), torch.float32), [mk((9,), torch.float32) for _ in range(3)],
                                  _top_plan(3, 3)[0], _top_plan(3, 3)[1])),
    ]


@pytest.mark.parametrize("case", range(6))
def test_opcheck_cpu(case):
    op, args = _opcheck_cases("cpu")[case]
    torch.library.opcheck(op, args)


# --------------------------------------------------------------------------
# CUDA: same bits as the CPU kernels


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_fold_plan_matches_cpu(dtype):
    g = torch.Generator().manual_seed(53)
    for n, procs in ((3, 3), (12, 5), (1024, 32)):
        plan, result, pushes = _top_plan(n, procs)
        pushed = [spiky((100_003,), dtype, g) for _ in range(pushes)]
        cpu, cuda = torch.empty(100_003, dtype=dtype), torch.empty(100_003, dtype=dtype, device="cuda")
        es.fold_plan_(cpu, pushed, plan, result, 1.0 / n)
        es.fold_plan_(cuda, [x.cuda() for x in pushed], plan, result, 1.0 / n)
        assert_bitwise(cuda.cpu(), cpu, f"n={n} procs={procs}")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_canonical_sum_matches_cpu(dtype):
    g = torch.Generator().manual_seed(51)
    for k in KS + [32, 33]:
        for shape in [(), (0,), (1000,), (3, 5), (100_003,)]:
            xs = [spiky(shape, dtype, g) for _ in range(k)]
            cpu = es.canonical_sum(xs)
            cuda = es.canonical_sum([x.cuda() for x in xs])
            assert cuda.is_cuda
            assert_bitwise(cuda, cpu, f"{dtype} k={k} shape={shape}")
            if dtype in (torch.float16, torch.bfloat16):
                assert_bitwise(es.canonical_sum([x.cuda() for x in xs], out_dtype=torch.float32),
                               es.canonical_sum(xs, out_dtype=torch.float32), "to fp32")
    lists = [[spiky((33,), dtype, g), spiky((2, 9), dtype, g)] for _ in range(6)]
    for c, r in zip(es.canonical_sum_lists([[t.cuda() for t in lst] for lst in lists]),
                    es.canonical_sum_lists(lists)):
        assert_bitwise(c, r, "lists")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_fold_matches_cpu(dtype):
    g = torch.Generator().manual_seed(52)
    acc_t = acc_dtype(dtype)
    shapes = [(), (0,), (17,), (100_003,), (3, 40)]
    src = [spiky(s, dtype, g) for s in shapes]
    base = [spiky(s, acc_t, g) for s in shapes]
    frozen = [False, False, True, False, False]
    for accumulate in (False, True):
        cpu = [b.clone() for b in base]
        cuda = [b.cuda() for b in base]
        es.fold_(cpu, src, 1.0 / 3.0, accumulate, frozen=frozen)
        es.fold_(cuda, [s.cuda() for s in src], 1.0 / 3.0, accumulate, frozen=frozen)
        for c, r in zip(cuda, cpu):
            assert_bitwise(c, r, f"accumulate={accumulate}")
    neg = torch.full((8,), -0.0, dtype=dtype, device="cuda")
    acc = [torch.ones(8, dtype=acc_t, device="cuda")]
    es.fold_(acc, [neg], 0.5, False)
    assert_bitwise(acc[0], torch.full((8,), -0.0, dtype=acc_t), "-0 on start")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_group_norms_matches_cpu(dtype):
    g = torch.Generator().manual_seed(53)
    shapes = [(100_003,), (3, 7), (), (0,), (2049,), (2048,), (64, 65), (1,), (2048 * 9 + 5,)]
    tensors = [spiky(s, dtype, g) for s in shapes]
    group_of = [0, 1, 0, 2, 1, -1, 3, -1, 0]
    cpu = es.group_norms(tensors, group_of, 5)
    cuda = es.group_norms([t.cuda() for t in tensors], group_of, 5)
    assert cuda.is_cuda
    assert_bitwise(cuda, cpu)
    assert_bitwise(cpu, reference_norms(tensors, group_of, 5))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_rejects_mixed_devices():
    with pytest.raises(RuntimeError, match="one device"):
        es.canonical_sum([torch.ones(3), torch.ones(3, device="cuda")])
    with pytest.raises(RuntimeError):
        es.fold_([torch.zeros(3)], [torch.ones(3, device="cuda")], 1.0, False)


@pytest.mark.parametrize("case", range(6))
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_opcheck_cuda(case):
    op, args = _opcheck_cases("cuda")[case]
    torch.library.opcheck(op, args)
