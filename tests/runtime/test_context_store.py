"""Tests of easyscale_ext.ContextStore through its Python bindings: roundtrips,
slab reuse, error mapping, serialisation, thread safety and (on a GPU) the
asynchronous pinned/device paths."""
import subprocess
import threading

import pytest
import torch

import easyscale_ext as es

MiB = 1 << 20


def make_context(seed: int, device="cpu"):
    """A worker's state as a training loop would hold it: parameters, optimizer
    moments, a step counter, RNG state bytes and a mask."""
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(33, 7, generator=g),
        torch.randn(100, generator=g, dtype=torch.float64),
        torch.randn(5, generator=g).to(torch.bfloat16),
        torch.randint(-2**62, 2**62, (3,), generator=g, dtype=torch.int64),
        torch.randint(0, 256, (5056,), generator=g, dtype=torch.uint8),  # like torch.get_rng_state()
        torch.rand(17, generator=g) < 0.5,
        torch.tensor(float(seed)),  # 0-d
        torch.empty(0, 4),
    ] if device == "cpu" else [t.to(device) for t in make_context(seed)]


def raw_bytes(t):
    t = t.detach().cpu().contiguous().reshape(-1)
    return t if t.dtype == torch.bool else t.view(torch.uint8)


def same(a, b):
    """Same dtypes, shapes and bytes (so -0.0 vs 0.0 and NaN payloads count)."""
    return len(a) == len(b) and [x.dtype for x in a] == [y.dtype for y in b] and \
        [x.shape for x in a] == [y.shape for y in b] and \
        all(torch.equal(raw_bytes(x), raw_bytes(y)) for x, y in zip(a, b))


def zeros_like_all(ts):
    return [torch.zeros_like(t) for t in ts]


# --------------------------------------------------------------------------
# CPU roundtrips and bookkeeping


def test_roundtrip_mixed_dtypes():
    store = es.ContextStore(64 * MiB)
    ctx = make_context(1)
    ctx[4].copy_(torch.get_rng_state())
    store.save(3, "train", ctx)
    out = zeros_like_all(ctx)
    store.restore(3, "train", out)
    assert same(out, ctx)
    loaded = store.load(3, "train")
    assert same(loaded, ctx)
    assert all(not t.is_cuda for t in loaded)
    assert store.contains(3, "train") and not store.contains(3, "eval") and not store.contains(4, "train")
    assert store.workers() == [3]
    assert store.names(3) == ["train"]
    sig = store.signature(3, "train")
    assert "Float[33,7]@cpu" in sig and "Bool[17]" in sig and "Float[]@cpu" in sig


def test_saved_copy_is_a_snapshot():
    store = es.ContextStore(8 * MiB)
    x = torch.arange(10.0)
    store.save(0, "s", [x])
    x.fill_(-1.0)  # later changes to the source do not reach the entry
    assert torch.equal(store.load(0, "s")[0], torch.arange(10.0))
    store.save(0, "s", [x])  # a second save overwrites it
    assert torch.equal(store.load(0, "s")[0], torch.full((10,), -1.0))


def test_workers_and_names_sorted():
    store = es.ContextStore(8 * MiB)
    for w in (5, 1, 3):
        for name in ("b", "a"):
            store.save(w, name, [torch.full((4,), float(w))])
    assert store.workers() == [1, 3, 5]
    assert store.names(3) == ["a", "b"]
    assert store.names(2) == []
    store.erase(3)
    assert store.workers() == [1, 5]
    assert not store.contains(3, "a")
    store.erase(42)  # erasing an unknown worker is a no-op


def test_empty_entry_and_empty_tensors():
    store = es.ContextStore(MiB)
    store.save(0, "none", [])
    assert store.load(0, "none") == []
    store.restore(0, "none", [])
    store.save(0, "hollow", [torch.empty(0), torch.empty(3, 0, dtype=torch.int64)])
    loaded = store.load(0, "hollow")
    assert [t.shape for t in loaded] == [(0,), (3, 0)] and loaded[1].dtype == torch.int64


def test_steady_state_allocates_nothing():
    store = es.ContextStore(256 * MiB)
    ctxs = {w: make_context(w) for w in range(4)}
    for w, c in ctxs.items():
        store.save(w, "train", c)
        store.save(w, "opt", c[:2])
    slabs, reserved = store.slab_count, store.reserved_bytes
    assert slabs >= 1 and reserved > 0
    buf = zeros_like_all(ctxs[0])
    for step in range(20):
        for w, c in ctxs.items():
            c[0].add_(1.0)
            store.save(w, "train", c)
            store.restore(w, "train", buf)
            assert same(buf, c)
            store.save(w, "opt", c[:2])
    assert store.slab_count == slabs
    assert store.reserved_bytes == reserved


def test_erase_frees_and_reuses():
    store = es.ContextStore(256 * MiB)
    for w in range(6):
        store.save(w, "train", make_context(w))
    slabs, reserved = store.slab_count, store.reserved_bytes
    for rnd in range(5):  # workers leave and others arrive with the same layout
        store.erase(rnd)
        assert not store.contains(rnd, "train")
        with pytest.raises(es.UnknownContextError):
            store.load(rnd, "train")
        store.save(100 + rnd, "train", make_context(100 + rnd))
        assert store.slab_count == slabs and store.reserved_bytes == reserved
    for w in list(range(5, 6)) + [100 + r for r in range(5)]:
        assert same(store.load(w, "train"), make_context(w))


def test_large_copies_multithreaded():
    """Copies over 4 MiB are split across the store's threads."""
    store = es.ContextStore(64 * MiB, num_threads=2)
    g = torch.Generator().manual_seed(3)
    big = [torch.randn(1_500_001, generator=g), torch.randint(0, 255, (5 * MiB + 3,), dtype=torch.uint8, generator=g)]
    store.save(0, "big", big)
    out = zeros_like_all(big)
    store.restore(0, "big", out)
    assert same(out, big)


# --------------------------------------------------------------------------
# Errors


def test_unknown_key_is_keyerror():
    store = es.ContextStore(MiB)
    assert issubclass(es.UnknownContextError, KeyError)
    with pytest.raises(es.UnknownContextError, match="worker 7"):
        store.restore(7, "train", [torch.zeros(3)])
    with pytest.raises(KeyError):
        store.load(7, "train")
    with pytest.raises(KeyError):
        store.signature(7, "train")
    with pytest.raises(KeyError):
        store.serialize(7)
    store.save(7, "train", [torch.zeros(3)])
    with pytest.raises(KeyError):
        store.restore(7, "eval", [torch.zeros(3)])


def test_over_capacity_is_memoryerror():
    assert issubclass(es.ContextStoreFullError, MemoryError)
    store = es.ContextStore(MiB)
    first = torch.ones(150_000)  # 600 kB
    store.save(0, "a", [first])
    with pytest.raises(es.ContextStoreFullError, match="memory cap"):
        store.save(1, "a", [torch.ones(150_000)])
    with pytest.raises(MemoryError):
        store.save(2, "a", [torch.ones(300_000)])
    assert not store.contains(1, "a") and not store.contains(2, "a")
    assert store.reserved_bytes <= store.capacity == MiB
    assert torch.equal(store.load(0, "a")[0], first)  # the store still works
    store.erase(0)
    store.save(1, "a", [torch.ones(150_000)])  # the freed region fits it
    with pytest.raises(ValueError):
        es.ContextStore(0)


@pytest.mark.parametrize("bad", [
    [torch.zeros(33, 8)],                          # shape
    [torch.zeros(33, 7, dtype=torch.float64)],     # dtype
    [torch.zeros(7, 33)],                          # same bytes, other shape
    [torch.zeros(33 * 7)],                         # same bytes, other rank
    [torch.zeros(33, 7, dtype=torch.int32)],       # same bytes, other dtype
    [torch.zeros(33, 7), torch.zeros(1)],          # count
    [],
])
def test_layout_mismatch_is_valueerror(bad):
    store = es.ContextStore(MiB)
    store.save(0, "s", [torch.ones(33, 7)])
    with pytest.raises(ValueError, match="must match the first save"):
        store.restore(0, "s", bad)
    with pytest.raises(ValueError, match="must match the first save"):
        store.save(0, "s", bad)
    assert torch.equal(store.load(0, "s")[0], torch.ones(33, 7))


def test_noncontiguous_is_runtimeerror():
    store = es.ContextStore(MiB)
    with pytest.raises(RuntimeError, match="contiguous"):
        store.save(0, "s", [torch.ones(4, 3).t()])
    assert not store.contains(0, "s")
    store.save(0, "s", [torch.ones(3, 4)])
    with pytest.raises(RuntimeError, match="contiguous"):
        store.restore(0, "s", [torch.ones(4, 3).t()])


def test_bad_location():
    store = es.ContextStore(MiB)
    with pytest.raises(ValueError, match="host"):
        store.save(0, "s", [torch.ones(3)], location="pinned")
    with pytest.raises(ValueError, match="host"):
        store.save(0, "s", [torch.ones(3)], location="device")
    with pytest.raises(ValueError, match="location must be"):
        store.save(0, "s", [torch.ones(3)], location="disk")
    assert not store.contains(0, "s")


# --------------------------------------------------------------------------
# Serialisation


def test_serialize_roundtrip_into_second_store():
    a = es.ContextStore(64 * MiB)
    ctx, opt = make_context(8), make_context(9)[:3]
    a.save(8, "train", ctx)
    a.save(8, "opt", opt)
    a.save(9, "train", make_context(99))
    data = a.serialize(8)
    assert isinstance(data, bytes)

    b = es.ContextStore(64 * MiB)
    assert b.deserialize(data) == 8
    assert b.workers() == [8] and b.names(8) == ["opt", "train"]
    assert b.signature(8, "train") == a.signature(8, "train")
    assert same(b.load(8, "train"), ctx) and same(b.load(8, "opt"), opt)
    out = zeros_like_all(ctx)
    b.restore(8, "train", out)
    assert same(out, ctx)
    assert b.serialize(8) == data  # stable bytes

    # into an existing entry of the same layout: overwritten in place
    c = es.ContextStore(64 * MiB)
    c.save(8, "train", make_context(1))
    assert c.deserialize(data) == 8
    assert same(c.load(8, "train"), ctx)
    # into an existing entry of another layout: refused
    d = es.ContextStore(64 * MiB)
    d.save(8, "train", [torch.ones(3)])
    with pytest.raises(ValueError):
        d.deserialize(data)


def test_failed_deserialize_leaves_store_unchanged():
    a = es.ContextStore(8 * MiB)
    a.save(8, "a", [torch.full((3,), 1.0)])
    a.save(8, "b", [torch.full((3,), 1.0)])
    data = a.serialize(8)
    d = es.ContextStore(8 * MiB)
    d.save(8, "a", [torch.full((3,), 2.0)])   # same layout as the bytes
    d.save(8, "b", [torch.full((4,), 2.0)])   # other layout: the bytes must be refused
    with pytest.raises(ValueError):
        d.deserialize(data)
    assert torch.equal(d.load(8, "a")[0], torch.full((3,), 2.0)), "entry 'a' was overwritten by a refused load"
    fresh = es.ContextStore(8 * MiB)
    fresh.save(8, "b", [torch.full((4,), 2.0)])
    with pytest.raises(ValueError):
        fresh.deserialize(data)
    assert fresh.names(8) == ["b"], "entry 'a' was created by a refused load"


def test_corrupted_bytes_are_valueerror():
    a = es.ContextStore(8 * MiB)
    a.save(2, "train", make_context(2))
    data = a.serialize(2)
    b = es.ContextStore(8 * MiB)
    cuts = [0, 5, 15, 16, 17, 100, len(data) // 2, len(data) - 9, len(data) - 8, len(data) - 1]
    for n in cuts:
        with pytest.raises(ValueError):
            b.deserialize(data[:n])
    for pos in [0, 7, 8, 16, 30, 200, len(data) // 2, len(data) - 20, len(data) - 8, len(data) - 1]:
        flipped = bytearray(data)
        flipped[pos] ^= 0x10
        with pytest.raises(ValueError):
            b.deserialize(bytes(flipped))
    with pytest.raises(ValueError):
        b.deserialize(data + b"\0")
    with pytest.raises(ValueError):
        b.deserialize(b"")
    assert b.workers() == []  # nothing half-written
    assert b.deserialize(data) == 2


# --------------------------------------------------------------------------
# Concurrency: Python threads call in with the GIL released


def test_concurrent_threads_own_workers():
    store = es.ContextStore(64 * MiB, num_threads=1)
    errors = []

    def run(w):
        try:
            g = torch.Generator().manual_seed(w)
            src = [torch.randn(2000, generator=g), torch.randint(0, 9, (300,), generator=g), torch.zeros(4, dtype=torch.bool)]
            dst = zeros_like_all(src)
            for i in range(50):
                src[0].add_(1.0)
                src[1][0] = i
                src[2][i % 4] = True
                store.save(w, "train", src)
                store.restore(w, "train", dst)
                if not same(dst, src):
                    errors.append(f"worker {w} step {i}: restored contents differ")
                    return
                if i % 10 == 0 and not same(store.load(w, "train"), src):
                    errors.append(f"worker {w} step {i}: load differs")
                    return
        except Exception as e:  # pragma: no cover - reported below
            errors.append(f"worker {w}: {e!r}")

    threads = [threading.Thread(target=run, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert store.workers() == [0, 1, 2, 3]



def test_the_extension_links_the_shared_libstdcxx_as_torch_does():
    # A private, static copy interposes with torch's and crashed the first stream output in _C (setup.py).
    out = subprocess.run(["ldd", es._C.__file__], capture_output=True, text=True, check=True).stdout
    assert "libstdc++.so" in out, out

# --------------------------------------------------------------------------
# CUDA: pinned and device memory, asynchronous saves


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("location", ["pinned", "device"])
def test_cuda_roundtrip(location):
    store = es.ContextStore(256 * MiB)
    ctx = make_context(4, "cuda")
    store.save(0, "train", ctx, location=location)
    store.wait()
    out = zeros_like_all(ctx)
    store.restore(0, "train", out)
    torch.cuda.synchronize()
    assert same(out, ctx)
    loaded = store.load(0, "train")
    assert all(t.is_cuda for t in loaded) and same(loaded, ctx)
    assert "@cuda" in store.signature(0, "train") and "@cuda:" not in store.signature(0, "train")  # any GPU
    with pytest.raises(ValueError, match="'pinned' or 'device'"):
        store.save(1, "train", ctx, location="host")
    with pytest.raises(ValueError, match="memory, not"):  # the entry's location is fixed
        store.save(0, "train", ctx, location="device" if location == "pinned" else "pinned")
    with pytest.raises(ValueError, match="must match the first save"):  # device is part of the layout
        store.restore(0, "train", zeros_like_all(make_context(4)))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("location", ["pinned", "device"])
def test_cuda_save_then_overwrite_then_restore(location):
    store = es.ContextStore(256 * MiB)
    big = [torch.randn(4_000_000, device="cuda"), torch.arange(1000, device="cuda")]
    expected = [t.clone() for t in big]
    store.save(0, "s", big, location=location)  # asynchronous
    store.wait()  # the saved buffers may be modified only after this (or via restore)
    for t in big:
        t.zero_()
    store.restore(0, "s", big)
    torch.cuda.synchronize()
    assert same(big, expected)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("location", ["pinned", "device"])
def test_cuda_restore_orders_after_pending_saves(location):
    """Switching workers on one set of buffers without waiting: each restore
    must see the save enqueued before it."""
    store = es.ContextStore(512 * MiB)
    live = [torch.empty(3_000_000, device="cuda"), torch.empty(7, dtype=torch.int64, device="cuda")]
    values = {}
    for w in range(3):
        if w > 0:
            # no wait(): writing `live` now would race the pending save, so
            # first overwrite it through restore(), which orders after saves
            store.restore(w - 1, "s", live)
        for t in live:
            t.fill_(w + 1)
        values[w] = [t.clone() for t in live]
        store.save(w, "s", live, location=location)
    for step in range(3):
        for w in (2, 0, 1):
            # mutate through restore only, then save it back asynchronously
            store.restore(w, "s", live)
            live[1].add_(0)  # compute on the current stream after the restore
            store.save(w, "s", live, location=location)
    store.wait()
    for w in range(3):
        out = store.load(w, "s")
        torch.cuda.synchronize()
        assert same(out, values[w])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_serialize_roundtrip():
    a = es.ContextStore(64 * MiB)
    ctx = make_context(6, "cuda")
    a.save(6, "train", ctx, location="device")
    data = a.serialize(6)  # waits for the pending save
    b = es.ContextStore(64 * MiB)
    assert b.deserialize(data) == 6
    out = zeros_like_all(ctx)
    b.restore(6, "train", out)
    torch.cuda.synchronize()
    assert same(out, ctx)
    assert same(b.load(6, "train"), ctx)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_cuda_context_moves_to_the_importing_process_gpu():
    # A scale event hands a worker saved on one process's GPU to a process on another GPU.
    a = es.ContextStore(64 * MiB)
    ctx = [t.to("cuda:1") for t in make_context(7)]
    a.save(7, "train", ctx, location="pinned")
    b = es.ContextStore(64 * MiB)
    assert b.deserialize(a.serialize(7), device=0) == 7
    loaded = b.load(7, "train")
    assert all(t.device == torch.device("cuda:0") for t in loaded) and same([t.cpu() for t in loaded], make_context(7))
    out = [torch.zeros_like(t, device="cuda:0") for t in ctx]
    b.restore(7, "train", out)
    torch.cuda.synchronize()
    assert same([t.cpu() for t in out], make_context(7))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_steady_state_and_threads():
    store = es.ContextStore(256 * MiB)
    errors = []

    def run(w):
        try:
            torch.cuda.set_device(0)
            src = [torch.full((50_000,), float(w), device="cuda"), torch.zeros(3, dtype=torch.int64, device="cuda")]
            dst = zeros_like_all(src)
            for i in range(20):
                src[1][0] = i
                store.save(w, "s", src, location="device" if w % 2 else "pinned")
                store.restore(w, "s", dst)
                torch.cuda.current_stream().synchronize()
                if not same(dst, src):
                    errors.append(f"worker {w} step {i}")
                    return
        except Exception as e:  # pragma: no cover
            errors.append(repr(e))

    threads = [threading.Thread(target=run, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    store.wait()
    assert errors == []
    slabs = store.slab_count
    for w in range(4):
        x = store.load(w, "s")
        store.save(w, "s", x, location="device" if w % 2 else "pinned")
    store.wait()
    assert store.slab_count == slabs
