"""EasyScaleDDP is bitwise identical for every placement of N virtual workers.

Each case runs tests/support/train_job.py as real processes (gloo on localhost) and
compares a SHA-256 over parameters, buffers and optimizer state after two
epochs of three steps with the single-process pure-PyTorch reference.
"""
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

import easyscale_ext as es
from easyscale_ext import determinism
from support.jobs import D1, OLDER, needs_older, reference, run_job

pytestmark = pytest.mark.multiprocess  # every test starts processes


@pytest.mark.parametrize("procs,ranges", [(1, ""), (2, ""), (4, ""), (2, "0,3,4")],
                         ids=["P1", "P2", "P4", "split3+1"])
def test_cnn_n4_every_placement_matches_reference(procs, ranges):
    assert run_job("easyscale", procs=procs, n=4, ranges=ranges) == reference()


@pytest.mark.slow  # 25 processes, 64 virtual workers each step
def test_n64_on_1_8_and_16_processes_is_one_hash():
    # a real job's width: 64 virtual workers, 64, 8 or 4 of them a process (each process folds several, the top
    # adds 8 or 16 partials, its chunks exchanged among up to 16 processes)
    expected = reference(n=64, steps=2, epochs=1)
    for procs in (1, 8, 16):
        assert run_job("easyscale", procs=procs, n=64, steps=2, epochs=1, timeout=600) == expected, procs


def test_dataloader_workers_do_not_change_bits():
    assert run_job("easyscale", procs=2, n=4, num_workers=2) == reference()


@pytest.mark.parametrize("procs", [1, 2])
def test_transformer_n4(procs):
    assert run_job("easyscale", procs=procs, n=4, model="transformer") == reference("transformer")


@pytest.mark.parametrize("procs", [1, 2])
def test_cnn_n8(procs):
    assert run_job("easyscale", procs=procs, n=8) == reference(n=8)


def test_placements_are_not_trivially_equal():
    # The hash sees the worker count: a test comparing hashes can fail.
    assert reference(n=4) != reference(n=8)


@pytest.mark.parametrize("model", ["cnn", "transformer"])
def test_n2_on_one_process_equals_torch_ddp_on_two(model):
    assert run_job("easyscale", procs=1, n=2, model=model) == run_job("ddp", procs=2, n=2, model=model)


@pytest.mark.parametrize("model", ["cnn", "transformer"])
def test_unchanged_ddp_loop_with_one_virtual_worker_per_process_equals_torch_ddp(model):
    assert run_job("easyscale", procs=2, n=2, model=model, implicit=1) == run_job("ddp", procs=2, n=2, model=model)


@pytest.mark.parametrize("procs", [1, 2, 4])
def test_unbroadcast_buffers_are_the_first_workers_on_every_placement(procs):
    # Between steps a process holds its first virtual worker's buffers, as a DDP rank holds its own:
    # rank 0's state_dict() (BatchNorm running stats) is virtual worker 0's whatever P is.
    n2 = run_job("easyscale", procs=1, n=2, broadcast_buffers=0)
    if procs <= 2:
        assert run_job("easyscale", procs=procs, n=2, broadcast_buffers=0) == n2
    else:
        assert run_job("easyscale", procs=procs, n=4, broadcast_buffers=0) == \
            run_job("easyscale", procs=1, n=4, broadcast_buffers=0)


def test_unbroadcast_buffers_equal_torch_ddp_rank_0():
    assert run_job("easyscale", procs=1, n=2, broadcast_buffers=0) == \
        run_job("ddp", procs=2, n=2, broadcast_buffers=0)


@pytest.mark.parametrize("procs", [1, 2])
def test_parameters_no_worker_used_keep_no_gradient(procs):
    # AdamW leaves a parameter with grad None untouched, as torch DDP's find_unused_parameters does.
    assert run_job("easyscale", procs=procs, n=4, model="branchy") == reference("branchy")


SMALL_BUCKETS = 0.002  # MB: the test CNN in three buckets of 5, 1 and 4 parameters, exchanged during backward


@pytest.mark.parametrize("model,procs,n,ranges,whole_bytes", [
    ("cnn", 2, 4, "0,3,4", 0), ("cnn", 4, 4, "", -1), ("cnn", 4, 4, "", 0), ("cnn", 2, 2, "", 0),
    ("branchy", 2, 4, "", -1), ("branchy", 4, 4, "", 0)],
    ids=["split3+1-chunks", "P4-whole", "P4-chunks", "N2P2-chunks", "branchy", "branchy-P4-chunks"])
def test_buckets_exchanged_during_backward_keep_the_bits(model, procs, n, ranges, whole_bytes):
    # several buckets, an uneven split, parameters no worker used, small buckets exchanged whole (the default
    # for these) or in chunks (their results written into the parameters' .grad, but for those no worker used;
    # with one virtual worker per process, the gradients sent unfolded): the same canonical sums
    assert run_job("easyscale", procs=procs, n=n, model=model, ranges=ranges, bucket_cap_mb=SMALL_BUCKETS,
                   whole_bytes=whole_bytes) == reference(model, n=n)


@pytest.mark.parametrize("procs,node_size,n,ranges", [
    (4, 2, 4, ""), (4, 2, 12, "0,5,6,11,12"), (6, 2, 6, ""), (8, 4, 16, "")],
    ids=["N4P4-2-nodes", "uneven-2-nodes", "N6P6-3-nodes", "N16P8-2-nodes"])
def test_two_levels_keep_the_bits(procs, node_size, n, ranges):
    # reduced inside each node of node_size processes ($LOCAL_WORLD_SIZE, as torchrun sets it), then between
    # nodes, every bucket in chunks; nodes whose workers are not one aligned block hold several roots (uneven)
    env = [{"LOCAL_WORLD_SIZE": str(node_size)}] * procs
    assert run_job("easyscale", procs=procs, n=n, ranges=ranges, bucket_cap_mb=SMALL_BUCKETS, whole_bytes=0,
                   env_per_rank=env) == reference(n=n)


def test_two_levels_only_where_nodes_divide_the_processes(monkeypatch):
    from easyscale_ext.placement import even_ranges
    from easyscale_ext.runtime.reducer import CanonicalReducer

    def levels(procs, node_size, rank=0):
        params = [nn.Parameter(torch.zeros(100))]
        return CanonicalReducer(params, 16, even_ranges(16, procs), rank, False, 25.0, node_size).node_size
    assert levels(4, 2) == 2 and levels(8, 4, rank=5) == 4 and levels(16, 2) == 2
    assert levels(4, 4) == levels(4, 3) == levels(4, 1) == levels(4, 0) == levels(2, 1) == 0
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert es.EasyScaleDDP(nn.Linear(4, 2)).node_size == 2  # torchrun's, by default
    with pytest.raises(ValueError, match="node_size must be >= 0"):
        es.EasyScaleDDP(nn.Linear(4, 2), node_size=-1)


def test_two_backwards_in_the_last_worker_fail_clearly():
    ddp = es.EasyScaleDDP(nn.Linear(4, 2), virtual_world_size=2)
    with pytest.raises(RuntimeError, match="got a gradient twice .* run one backward per virtual worker"):
        for x in ddp.workers((v, torch.randn(3, 4)) for v in ddp.local_ranks):
            ddp(x).sum().backward()
            ddp(x).sum().backward()


def test_unused_parameters_match_torch_ddp():
    assert run_job("easyscale", procs=1, n=2, model="branchy") == run_job("ddp", procs=2, n=2, model="branchy")


@pytest.mark.parametrize("procs", [1, 2])
def test_no_sync_accumulation_matches_reference(procs):
    # Every virtual worker keeps its own gradient partial across no_sync steps.
    assert run_job("easyscale", procs=procs, n=4, accumulate=2) == reference(accumulate=2)
    assert reference(accumulate=2) != reference()  # accumulation changes the result: the test can fail


def test_no_sync_with_two_workers_on_one_process_equals_torch_ddp():
    assert run_job("easyscale", procs=1, n=2, accumulate=2) == run_job("ddp", procs=2, n=2, accumulate=2)


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
@pytest.mark.parametrize("procs", [1, 2])
def test_mixed_precision_matches_reference(amp, procs):
    # autocast's lower-precision forward, and fp16's loss scaling (GradScaler unscales the reduced gradients).
    assert run_job("easyscale", procs=procs, n=4, amp=amp) == reference(amp=amp)
    assert reference(amp=amp) != reference()  # the forward ran at the lower precision: the test can fail


def test_n1_equals_plain_training():
    assert run_job("easyscale", procs=1, n=1) == run_job("plain", n=1)




def test_d1_matches_reference_with_deterministic_kernels():
    assert run_job("easyscale", procs=2, n=4, level="D1", env_per_rank=[D1, D1]) == reference(level="D1")


@needs_older
def test_d1_differs_across_instruction_sets():
    old_machine = dict(D1, **determinism.isa_caps(OLDER))
    mixed = run_job("easyscale", procs=2, n=4, level="D1", env_per_rank=[D1, old_machine])
    assert mixed != reference(level="D1")
    assert mixed != reference(level="D1", isa=OLDER)


@needs_older
def test_d2_agrees_across_instruction_sets():
    # A process on this CPU held to the older machine's floor computes the older machine's bits.
    d2 = determinism.environment("D2", isa=OLDER)
    old_machine = dict(d2, **determinism.isa_caps(OLDER))
    mixed = run_job("easyscale", procs=2, n=4, level="D2", env_per_rank=[d2, old_machine])
    assert mixed == reference(level="D2", isa=OLDER)
    assert mixed != reference(level="D1")  # the floor took effect here: the test can fail


def test_d2_without_its_environment_fails_clearly():
    unset = dict(D1, **{k: "" for k in determinism.isa_caps("AVX2")})  # also where the caller pinned them
    with pytest.raises(RuntimeError, match="ONEDNN_MAX_CPU_ISA=AVX2"):
        run_job("easyscale", procs=1, n=2, level="D2", env_per_rank=[unset])


def test_d2_floor_differing_between_processes_fails_clearly():
    cpu = determinism.cpu_isa()
    floors = [f for f in determinism.FLOORS if cpu and determinism.ISAS.index(f) <= determinism.ISAS.index(cpu)]
    if len(floors) < 2:
        pytest.skip(f"needs two D2 floors this CPU ({cpu}) can run")
    envs = [determinism.environment("D2", isa=floors[-1]), determinism.environment("D2", isa=floors[-2])]
    with pytest.raises(RuntimeError, match="different job setting"):
        run_job("easyscale", procs=2, n=2, level="D2", env_per_rank=envs)


def test_d2_floor_above_the_cpu_fails_clearly():
    with pytest.raises(RuntimeError, match=r"holds this job to AVX2, but this CPU lacks avx2, fma: "
                                           r"run the whole job with --isa AVX \(or lower\)"):
        determinism.check_cpu("AVX2", flags={"sse4_1", "sse4_2", "avx"})
    determinism.check_cpu("AVX2", flags={"sse4_1", "sse4_2", "avx", "avx2", "fma"})


def test_native_isa_counts_environment_caps():
    cpu = determinism.cpu_isa()
    if cpu is None:
        pytest.skip("this CPU's flags are unknown")
    assert determinism.native_isa({}) == cpu
    below = determinism.isa_below(cpu)
    if below in determinism.FLOORS:
        assert determinism.native_isa(determinism.isa_caps(below)) == below


@pytest.mark.parametrize("name,setting,expected", [
    ("FILL_ENV", None, "True True"), ("FILL_ENV", "1", "True True"), ("FILL_ENV", "0", "False True"),
    ("FILL_ENV", "no", None), ("CUDNN_ENV", "0", "True False"), ("CUDNN_ENV", "off", None)])
def test_d1_switches_from_the_environment(name, setting, expected):
    """The fill of uninitialized memory and cuDNN stay on unless the environment says 0; other values fail."""
    variable = getattr(determinism, name)
    env = dict(os.environ, **D1)
    env.pop(determinism.FILL_ENV, None)
    env.pop(determinism.CUDNN_ENV, None)
    if setting is not None:
        env[variable] = setting
    script = ("import torch; from easyscale_ext import determinism; determinism.apply('D1', 1, cuda=False); "
              "print(torch.utils.deterministic.fill_uninitialized_memory, torch.backends.cudnn.enabled)")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    if expected is None:
        assert out.returncode != 0 and f"{variable}={setting!r}: set it to 1" in out.stderr, out.stderr
        return
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == expected


def test_d1_without_the_fill_trains_to_the_filled_references_bits():
    unfilled = dict(D1, **{determinism.FILL_ENV: "0"})
    ref = run_job("reference", n=4, model="cnn", level="D1", env_per_rank=[D1])
    assert run_job("easyscale", procs=2, n=4, model="cnn", level="D1", env_per_rank=[unfilled] * 2) == ref


def test_fewer_virtual_workers_than_processes_fails_clearly():
    with pytest.raises(RuntimeError, match="smaller than the 2 processes"):
        run_job("easyscale", procs=2, n=1)


def test_n_differing_between_processes_fails_clearly():
    with pytest.raises(RuntimeError, match="virtual_world_size differs between processes"):
        run_job("easyscale", procs=2, n=4, mismatch_n=1)


def test_sync_batchnorm_with_several_workers_per_process_fails_clearly():
    with pytest.raises(RuntimeError, match="SyncBatchNorm cannot run several virtual workers"):
        run_job("easyscale", procs=1, n=2, sync_bn=1)


def test_destroy_process_group_ends_the_group_while_easyscale_ddp_lives(tmp_path):
    # A gloo group alive at interpreter shutdown can abort the process there (pytorch/pytorch#190489),
    # so the script's destroy_process_group() must end it. D1 imports torch.distributed.nn (through
    # use_deterministic_algorithms) after the group exists: a fresh interpreter sees that.
    script = f"""
import weakref, torch, torch.distributed as dist
from torch import nn
from easyscale_ext import EasyScaleDDP
dist.init_process_group("gloo", init_method="file://{tmp_path}/rendezvous", rank=0, world_size=1)
ddp = EasyScaleDDP(nn.Linear(4, 2), virtual_world_size=2, determinism_level="D1")
for x in ddp.workers((v, torch.randn(3, 4)) for v in ddp.local_ranks):
    ddp(x).sum().backward()
group = weakref.ref(ddp.process_group)
dist.destroy_process_group()
print("alive" if group() is not None else "destroyed")
try:
    ddp.process_group
except RuntimeError as e:
    print(e)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    destroyed, error = out.stdout.splitlines()
    assert destroyed == "destroyed"
    assert error.startswith("this EasyScaleDDP's process group was destroyed") and "reconfigure()" in error


@pytest.mark.parametrize("model", ["cnn", "transformer"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_one_process_matches_cuda_reference(model):
    ref = run_job("reference", n=4, model=model, device="cuda", level="D1", env_per_rank=[D1])
    assert run_job("easyscale", procs=1, n=4, model=model, device="cuda", level="D1", env_per_rank=[D1]) == ref


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_mixed_precision_on_two_processes_sharing_the_gpu(amp):
    d2 = determinism.environment("D2")
    options = dict(n=4, model="cnn", device="cuda", level="D2", amp=amp)
    ref = run_job("reference", env_per_rank=[d2], **options)
    assert run_job("easyscale", procs=2, backend="gloo", env_per_rank=[d2, d2], **options) == ref


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_without_cudnn_two_processes_match_the_reference_without_it():
    d2 = determinism.environment("D2")
    off = dict(d2, **{determinism.CUDNN_ENV: "0"})
    options = dict(n=4, model="cnn", device="cuda", level="D2")
    ref = run_job("reference", env_per_rank=[off], **options)
    assert ref != run_job("reference", env_per_rank=[d2], **options)  # the switch reached the kernels
    assert run_job("easyscale", procs=2, backend="gloo", env_per_rank=[off, off], **options) == ref


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs (NCCL, one process per GPU)")
def test_cuda_nccl_two_processes_match_reference():
    ref = run_job("reference", n=4, device="cuda", level="D1", env_per_rank=[D1])
    assert run_job("easyscale", procs=2, n=4, device="cuda", level="D1", env_per_rank=[D1, D1]) == ref


@pytest.mark.parametrize("argument", ["mixed_precision", "device_mesh", "delay_all_reduce_named_params",
                                      "param_to_hook_all_reduce"])
def test_arguments_it_cannot_honour_are_refused(argument):
    with pytest.raises(ValueError, match=f"does not support {argument}; leave it unset"):
        es.EasyScaleDDP(nn.Linear(2, 2), virtual_world_size=1, **{argument: object()})


