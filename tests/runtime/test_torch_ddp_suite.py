"""PyTorch's own DDP tests with EasyScaleDDP in DistributedDataParallel's place, and EasyScaleDDP's DDP parity
(pickling, deepcopy, module checks, logging data).

`test_every_torch_ddp_pass_passes_with_easyscale_ddp` runs the DDP tests of torch's distributed suite
(`torch.testing._internal.distributed.distributed_test`, shipped in the torch wheel; it needs `expecttest`):
every test whose name contains "ddp" (any case) or "DistributedDataParallel", on gloo, 2 processes, CPU, set
up as pytorch's test/distributed/test_distributed_spawn.py does (BACKEND, WORLD_SIZE, TEMP_DIR, a
TestDistBackend/DistributedTest._DistTestBase subclass). It runs them twice, each in a subprocess: with
torch's DistributedDataParallel, then with EasyScaleDDP itself bound to every name the suite reaches DDP by
(torch.nn.parallel.DistributedDataParallel, torch.nn.parallel.distributed.DistributedDataParallel, the suite
module's own DistributedDataParallel). Every test that passes with torch's DDP in that run must pass with
EasyScaleDDP. Both pass lists are printed, attached to the JUnit report (record_property) and written to
$ES_DDP_SUITE_REPORT when set.

Nothing is excluded: on a machine without two GPUs the suite skips its GPU tests itself, for both runs. GPUs
are hidden from the suite (CUDA_VISIBLE_DEVICES=""): with one GPU, TestDistBackend would skip every test
(fewer GPUs than WORLD_SIZE), so the CPU tests run everywhere. The ranks are forked, not spawned as in
test_distributed_spawn.py: a spawned rank imports torch again (about 3 s per test and process on two cores,
7 minutes per run); ES_DDP_SUITE_START=spawn spawns them. Both ways pass the same tests here.

As a script: python test_torch_ddp_suite.py torch|easyscale OUT.json [TEST_NAME ...]
"""
import copy
import io
import json
import os
import subprocess
import sys
import tempfile
import textwrap

if __name__ in ("__main__", "__mp_main__"):  # the suite's runner, and its spawned ranks
    os.environ.setdefault("BACKEND", "gloo")
    os.environ.setdefault("WORLD_SIZE", "2")
    os.environ.setdefault("TEMP_DIR", tempfile.gettempdir())
    if __name__ == "__main__":
        os.environ["ES_DDP_SUITE_IMPL"] = sys.argv[1]
    import torch.nn.parallel
    import torch.nn.parallel.distributed

    if os.environ["ES_DDP_SUITE_IMPL"] == "easyscale":
        from easyscale_ext import EasyScaleDDP

        # before the suite imports it by name
        torch.nn.parallel.DistributedDataParallel = EasyScaleDDP
        torch.nn.parallel.distributed.DistributedDataParallel = EasyScaleDDP
    from torch.testing._internal.distributed import distributed_test as dt

    if os.environ["ES_DDP_SUITE_IMPL"] == "easyscale":
        dt.DistributedDataParallel = EasyScaleDDP

    class TestDistBackendWithSpawn(dt.TestDistBackend, dt.DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            if os.environ.get("ES_DDP_SUITE_START", "fork") == "spawn":
                self._spawn_processes()  # as test_distributed_spawn.py
            else:
                import torch.multiprocessing as mp

                self._start_processes(mp.get_context("fork").Process)


def ddp_tests(names):
    """The suite's DDP tests: names containing "ddp" (any case) or "DistributedDataParallel"."""
    return sorted(n for n in names if "ddp" in n.lower() or "DistributedDataParallel" in n)


def _run_suite_here(out, names):
    import time
    import traceback
    import unittest

    results = {}

    class Result(unittest.TestResult):
        def startTest(self, test):
            super().startTest(test)
            self._start = time.time()

        def _record(self, test, outcome, detail=""):
            name = test.id().split(".")[-1]
            results[name] = {"outcome": outcome, "seconds": round(time.time() - self._start, 2),
                             "detail": detail}
            print(f"{name}: {outcome} ({results[name]['seconds']} s)", flush=True)

        def addSuccess(self, test):
            super().addSuccess(test)
            self._record(test, "passed")

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            self._record(test, "skipped", reason)

        def addFailure(self, test, err):
            super().addFailure(test, err)
            self._record(test, "failed", "".join(traceback.format_exception(*err))[-6000:])

        def addError(self, test, err):
            super().addError(test, err)
            self._record(test, "error", "".join(traceback.format_exception(*err))[-6000:])

        def addExpectedFailure(self, test, err):
            super().addExpectedFailure(test, err)
            self._record(test, "expected failure")

        def addUnexpectedSuccess(self, test):
            super().addUnexpectedSuccess(test)
            self._record(test, "unexpected success")

    if not names:
        names = ddp_tests(unittest.TestLoader().getTestCaseNames(TestDistBackendWithSpawn))
    unittest.TestSuite(TestDistBackendWithSpawn(n) for n in names).run(Result())
    ddp = torch.nn.parallel.DistributedDataParallel
    with open(out, "w") as f:
        json.dump({"ddp": f"{ddp.__module__}.{ddp.__qualname__}",
                   "suite_ddp": f"{dt.DistributedDataParallel.__module__}.{dt.DistributedDataParallel.__qualname__}",
                   "results": results}, f, indent=1)


if __name__ == "__main__":
    _run_suite_here(sys.argv[2], sys.argv[3:])
    sys.exit(0)


# -- the tests ---------------------------------------------------------------------------------------------
import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import easyscale_ext as es  # noqa: E402
from easyscale_ext.runtime.freeze import Freezer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run_suite(impl: str, tmp: str, names=()) -> dict:
    out = os.path.join(tmp, f"{impl}.json")
    env = dict(os.environ, BACKEND="gloo", WORLD_SIZE="2", TEMP_DIR=tmp, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), impl, out, *names], env=env, cwd=tmp,
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 or not os.path.exists(out):
        raise RuntimeError(f"the {impl} run of torch's DDP suite failed ({proc.returncode}):\n"
                           f"{proc.stdout[-5000:]}\n{proc.stderr[-5000:]}")
    with open(out) as f:
        return json.load(f)


@pytest.mark.slow  # torch's DDP suite, twice
@pytest.mark.multiprocess
def test_every_torch_ddp_pass_passes_with_easyscale_ddp(tmp_path, record_property):
    pytest.importorskip("expecttest")  # the suite's import needs it (requirements.txt, the `test` extra)
    torch_run = _run_suite("torch", str(tmp_path))
    es_run = _run_suite("easyscale", str(tmp_path))
    assert torch_run["ddp"] == torch_run["suite_ddp"] == "torch.nn.parallel.distributed.DistributedDataParallel"
    assert es_run["ddp"] == es_run["suite_ddp"] == "easyscale_ext.runtime.ddp.EasyScaleDDP"
    assert es_run["results"].keys() == torch_run["results"].keys()

    def passed(run):
        return sorted(n for n, r in run["results"].items() if r["outcome"] == "passed")

    torch_passed, es_passed = passed(torch_run), passed(es_run)
    report = {"tests": sorted(torch_run["results"]), "torch_ddp_passed": torch_passed,
              "easyscale_ddp_passed": es_passed}
    print(f"torch's DDP suite: {len(report['tests'])} DDP tests; torch DDP passes {len(torch_passed)}: "
          f"{torch_passed}; EasyScaleDDP passes {len(es_passed)}: {es_passed}")
    record_property("torch_ddp_passed", ",".join(torch_passed))
    record_property("easyscale_ddp_passed", ",".join(es_passed))
    if os.environ.get("ES_DDP_SUITE_REPORT"):
        with open(os.environ["ES_DDP_SUITE_REPORT"], "w") as f:
            json.dump(report, f, indent=1)
    assert torch_passed, "torch's DDP passed none of the suite's DDP tests: the comparison would be empty"
    failing = {n: es_run["results"][n] for n in torch_passed if n not in es_passed}
    assert not failing, "pass with torch's DDP, not with EasyScaleDDP:\n" + "\n".join(
        f"{n}: {r['outcome']}\n{r['detail']}" for n, r in failing.items())


# -- DDP parity, one process ------------------------------------------------------------------------------
class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.bn, self.drop, self.fc2 = nn.Linear(6, 16), nn.BatchNorm1d(16), nn.Dropout(0.3), nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(self.drop(torch.relu(self.bn(self.fc1(x)))))


def _step(ddp, opt, batches):
    for x in ddp.workers((v, batches[v]) for v in ddp.local_ranks):
        ddp(x).square().sum().backward()
    opt.step()
    opt.zero_grad()


def _state(ddp):
    return [t.clone() for t in list(ddp.parameters()) + list(ddp.buffers())]


def _bitwise_equal(a, b):
    return len(a) == len(b) and all(x.dtype == y.dtype and x.shape == y.shape and
                                    torch.equal(x.view(-1).view(torch.uint8), y.view(-1).view(torch.uint8))
                                    for x, y in zip(a, b))


def _trained(broadcast_buffers, workers=3):
    torch.manual_seed(0)
    ddp = es.EasyScaleDDP(_Net(), virtual_world_size=workers, broadcast_buffers=broadcast_buffers)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    for _ in range(2):
        _step(ddp, opt, [torch.randn(4, 6) for _ in range(workers)])
    return ddp, opt


def _continues_like(original, opt, copied, steps=2):
    """Both go on from the same process RNG with the same data: the same bits (each virtual worker's RNG
    stream and buffers travel with the copy)."""
    copied_opt = type(opt)(copied.parameters(), **opt.defaults)
    copied_opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # load_state_dict would share the tensors
    data = [[torch.randn(4, 6) for _ in original.local_ranks] for _ in range(steps)]
    rng = torch.get_rng_state()
    for batches in data:
        _step(original, opt, batches)
    torch.set_rng_state(rng)
    for batches in data:
        _step(copied, copied_opt, batches)
    return _bitwise_equal(_state(original), _state(copied))


@pytest.mark.parametrize("broadcast_buffers", [True, False])
def test_deepcopy_is_bitwise_equal_and_trains_on_identically(broadcast_buffers):
    ddp, opt = _trained(broadcast_buffers)
    copied = copy.deepcopy(ddp)
    assert copied is not ddp and copied.module is not ddp.module
    assert all(a is not b for a, b in zip(copied.parameters(), ddp.parameters()))
    assert _bitwise_equal(_state(ddp), _state(copied))
    assert copied.store is not ddp.store and copied.reducer is not ddp.reducer
    assert copied.params[0] is next(copied.module.parameters())  # the copy reduces into its own parameters
    assert _continues_like(ddp, opt, copied)


@pytest.mark.parametrize("workers", [1, 3])
def test_a_copy_under_no_sync_has_no_gradients_as_a_ddp_copy(workers):
    # Parameter's deepcopy leaves .grad out: a DDP copy has no gradients, accumulated or not. Nor has an
    # EasyScaleDDP copy, whatever its workers per process (their gradients kept in their contexts too).
    ddp, opt = _trained(broadcast_buffers=False, workers=workers)
    with ddp.no_sync():
        for x in ddp.workers((v, torch.randn(4, 6)) for v in ddp.local_ranks):
            ddp(x).square().sum().backward()
    assert ddp._accumulating == set(ddp.local_ranks)
    copied = copy.deepcopy(ddp)
    assert all(p.grad is None for p in copied.parameters()) and not copied._accumulating
    assert not any(copied.store.contains(v, "grads") for v in copied.local_ranks)
    if workers > 1:  # the original keeps its workers' gradients in their contexts
        assert all(ddp.store.contains(v, "grads") for v in ddp.local_ranks)
    # the copy steps on, looking for no kept gradients
    _step(copied, torch.optim.SGD(copied.parameters(), lr=0.05), [torch.randn(4, 6) for _ in copied.local_ranks])


def test_deepcopy_with_a_frozen_prefix_keeps_it_frozen():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    ddp = es.EasyScaleDDP(net, virtual_world_size=2, freezer=Freezer(layers=list(net)))
    ddp.load_freezer_state(dict(ddp.freezer_state(), frozen=1))
    copied = copy.deepcopy(ddp)
    assert [p.requires_grad for p in copied.parameters()] == [False, False, True, True]
    assert len(copied.params) == 2 and copied.params[0] is copied.module[1].weight


def test_torch_save_and_load_round_trip():
    ddp, opt = _trained(broadcast_buffers=False)
    buffer = io.BytesIO()
    torch.save(ddp, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert type(loaded) is es.EasyScaleDDP
    assert _bitwise_equal(_state(ddp), _state(loaded))
    assert loaded.state_dict().keys() == ddp.state_dict().keys()
    assert loaded.process_group is None and loaded.local_ranks == ddp.local_ranks
    assert _continues_like(ddp, opt, loaded)


def test_pickling_inside_a_step_fails_clearly():
    ddp = es.EasyScaleDDP(nn.Linear(4, 2), virtual_world_size=1)
    out = ddp(torch.randn(3, 4)).sum()  # the implicit step is open until its backward
    with pytest.raises(RuntimeError, match="between steps only"):
        copy.deepcopy(ddp)
    out.backward()
    copy.deepcopy(ddp)


def test_module_without_trainable_parameters_fails_as_in_ddp():
    message = "is not needed when a module doesn't have any parameter that requires a gradient"
    with pytest.raises(RuntimeError, match=message):
        es.EasyScaleDDP(nn.Module())
    frozen = nn.Linear(3, 3).requires_grad_(False)
    with pytest.raises(RuntimeError, match=message):
        es.EasyScaleDDP(frozen, virtual_world_size=2)


def test_lazy_module_fails_as_in_ddp():
    with pytest.raises(RuntimeError, match="uninitialized parameters"):
        es.EasyScaleDDP(nn.LazyLinear(2))


def test_logging_data_samples_as_ddp():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 10, bias=False), nn.ReLU(), nn.Linear(10, 4, bias=False))
    refused = es.EasyScaleDDP(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="equal or greater than 1"):
        refused._set_ddp_runtime_logging_sample_rate(0)
    assert refused._get_ddp_logging_data()["has_error"] == 1  # as DDP's _log_and_throw
    ddp = es.EasyScaleDDP(net)
    ddp._set_ddp_runtime_logging_sample_rate(3)
    seen = []
    for _ in range(16):
        ddp(torch.randn(3, 2)).sum().backward()
        seen.append(ddp._get_ddp_logging_data().get("iteration"))
    # published at each step's start, for the last sampled step: 1..10, then every 3rd (12, 15)
    assert seen == [None] + list(range(1, 11)) + [10, 12, 12, 12, 15]
    data = ddp._get_ddp_logging_data()
    sizes = [10 * 4 * 4, 2 * 10 * 4]
    assert data["module_name"] == "Sequential" and data["world_size"] == 1 and data["rank"] == 0
    assert data["num_parameter_tensors"] == 2 and data["total_parameter_size_bytes"] == sum(sizes)
    assert data["bucket_sizes"] == data["rebuilt_bucket_sizes"] == str(sum(sizes)) and data["dtypes"] == "float"
    assert data["rebuilt_per_bucket_param_indices"] == "1 0"
    assert data["prev_iteration_grad_ready_order_indices"] == "1, 0"
    for key in ("forward_compute_time", "backward_compute_time", "backward_comm_time"):
        assert data[key] >= 1 and data["avg_" + key] >= 1
    assert data["backward_compute_time"] >= data["backward_compute_comm_overlap_time"] >= 0
    assert data["forward_compute_time_start"] <= data["backward_compute_time_start"] <= \
        data["backward_compute_time_end"] <= data["backward_comm_time_start"] <= data["backward_comm_time_end"]


def test_pickling_takes_the_default_group_and_refuses_another(tmp_path):
    # As DDP: pickling needs the default process group, which the copy takes without any collective.
    script = textwrap.dedent(f"""
        import copy, os, torch, torch.distributed as dist
        from torch import nn
        from easyscale_ext import EasyScaleDDP
        dist.init_process_group("gloo", init_method="file://{tmp_path}/rendezvous", rank=0, world_size=1)
        ddp = EasyScaleDDP(nn.Linear(4, 2), virtual_world_size=2)
        for x in ddp.workers((v, torch.randn(3, 4)) for v in ddp.local_ranks):
            ddp(x).sum().backward()
        copied = copy.deepcopy(ddp)
        print(copied.process_group is dist.group.WORLD, copied._get_ddp_logging_data()["backend_name"])
        other = EasyScaleDDP(nn.Linear(4, 2), process_group=dist.new_group([0]))
        try:
            copy.deepcopy(other)
        except RuntimeError as e:
            print(e)
        dist.destroy_process_group()
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.returncode == 0, out.stderr
    default, refused = out.stdout.splitlines()
    assert default == "True gloo"
    assert refused.startswith("DDP Pickling/Unpickling are only supported when using DDP with the default process")


_TWO_PROCESSES = """
import copy, io, sys, torch, torch.distributed as dist
from torch import nn
from easyscale_ext import EasyScaleDDP
rank, init = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.Dropout(0.3), nn.Linear(16, 3))
ddp = EasyScaleDDP(net, virtual_world_size=4, broadcast_buffers=False, bucket_cap_mb=0.0005)  # 2 buckets
opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
def step(model, optimizer, batches):
    for x in model.workers((v, batches[v]) for v in model.local_ranks):
        model(x).square().sum().backward()
    optimizer.step()
    optimizer.zero_grad()
g = torch.Generator().manual_seed(1)
data = [[torch.randn(4, 6, generator=g) for _ in range(4)] for _ in range(4)]
step(ddp, opt, data[0])
if rank == 0:
    copy.deepcopy(ddp)  # on one process only: unpickling runs no collective
buffer = io.BytesIO()
torch.save(ddp, buffer)
buffer.seek(0)
loaded = torch.load(buffer, weights_only=False)
loaded_opt = torch.optim.SGD(loaded.parameters(), **opt.defaults)
loaded_opt.load_state_dict(copy.deepcopy(opt.state_dict()))
rng = torch.get_rng_state()
for batches in data[1:]:
    step(ddp, opt, batches)
torch.set_rng_state(rng)
for batches in data[1:]:
    step(loaded, loaded_opt, batches)
state = lambda m: list(m.parameters()) + list(m.buffers())
print(all(torch.equal(a, b) for a, b in zip(state(ddp), state(loaded))), loaded.process_group is dist.group.WORLD,
      loaded.local_ranks)
dist.destroy_process_group()
"""


@pytest.mark.multiprocess
def test_two_processes_save_load_and_deepcopy_on_one_rank_go_on_with_the_same_bits(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(_TWO_PROCESSES)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    procs = [subprocess.Popen([sys.executable, str(script), str(r), f"file://{tmp_path}/rendezvous"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    outs = [p.communicate(timeout=180) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-3000:] for _, err in outs]
    assert [out.strip() for out, _ in outs] == ["True True [0, 1]", "True True [2, 3]"]
