"""Layer freezing decided from reduced gradients: the same layers freeze at the same step, and the
trained bits agree, on every placement, through in-place scale events and checkpoint restarts."""
import json

import pytest
import torch
from torch import nn

import easyscale_ext as es
from easyscale_ext.elastic import CheckpointError, Checkpointer, Position
from easyscale_ext.runtime.freeze import FreezeDecision, GradientNormFreezer
from support.jobs import run_elastic, run_job
from support.train_job import ConvNet

pytestmark = pytest.mark.multiprocess  # each case starts real processes

# A tight threshold: the CNN's layers freeze within 12 steps (two decisions, at different steps).
FREEZE = dict(n=4, steps=6, freeze=0.1)


def frozen_run(tmp_path, name, runner=run_job, *args, **options):
    log = tmp_path / name
    digest = runner(*args, **FREEZE, log_freeze=log, **options)
    return digest, log.read_text().splitlines()


@pytest.fixture(scope="module")
def fixed(tmp_path_factory):
    return frozen_run(tmp_path_factory.mktemp("fixed"), "log", run_job, "easyscale", procs=1)


def test_decisions_happen_and_change_the_result(fixed):
    digest, log = fixed
    decisions = [line for line in log if not line.startswith("exchanged")]
    assert len(decisions) >= 2, log  # the test sees freezing happen, more than once
    assert digest != run_job("easyscale", procs=1, n=4, steps=6)


@pytest.mark.parametrize("procs", [2, 4])
def test_same_decisions_and_bits_on_every_placement(fixed, procs, tmp_path):
    assert frozen_run(tmp_path, "log", run_job, "easyscale", procs=procs) == fixed


def test_frozen_parameters_leave_the_buckets_exchanged_during_backward(fixed, tmp_path):
    assert frozen_run(tmp_path, "log", run_job, "easyscale", procs=2, bucket_cap_mb=0.002) == fixed


def test_same_decisions_and_bits_through_in_place_scaling(fixed, tmp_path):
    assert frozen_run(tmp_path, "log", run_elastic, 1, "1:2,5:4,9:3") == fixed


def test_same_decisions_and_bits_through_checkpoint_restarts(fixed, tmp_path):
    ckpt = tmp_path / "ckpt"
    for segment, (procs, stop) in enumerate([(2, 3), (4, 8), (1, 0)]):
        result = frozen_run(tmp_path, f"log{segment}", run_job, "easyscale", procs=procs, ckpt_dir=ckpt,
                            resume=int(segment > 0), stop_after=stop)
    assert result == fixed


def test_frozen_parameters_are_not_exchanged(fixed):
    decisions = [FreezeDecision(int(s), json.loads(layers)) for s, layers in
                 (line.split(" ", 1) for line in fixed[1] if not line.startswith("exchanged"))]
    frozen = {i for d in decisions for i in d.layers}
    layers = [m for m in ConvNet().body if any(True for _ in m.parameters())]
    total = sum(p.numel() for p in ConvNet().parameters())
    exchanged = int(fixed[1][-1].split()[1])
    assert exchanged == total - sum(p.numel() for i in frozen for p in layers[i].parameters()) < total


class Toy(GradientNormFreezer):
    """Decides from given norms, to check the rules the base class enforces."""

    def __init__(self, wanted, **kw):
        super().__init__(**kw)
        self.wanted = wanted

    def decide(self, norms):
        return self.wanted.pop(0)


def bound(freezer, layers=5):
    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(layers)])
    params = list(model.parameters())
    return freezer, freezer.bind(model, params), params


def step(freezer, layer_of, params):
    grads = [torch.ones_like(p) for p in params]
    return freezer.after_step([grads], [layer_of])


def test_frozen_prefix_is_monotone_capped_and_logged():
    freezer, layer_of, params = bound(Toy([2, 1, 5, 5], interval=2, warmup=1, max_frozen_fraction=0.8))
    assert layer_of == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    outcomes = [step(freezer, layer_of, params) for _ in range(8)]
    # evaluated at steps 2, 4, 6, 8 (interval 2 after 1 warm-up step); 1 < 2 is ignored; the cap is 4 of 5
    assert outcomes == [False, True, False, False, False, True, False, False]
    assert freezer.log == [FreezeDecision(2, [0, 1]), FreezeDecision(6, [2, 3])]
    assert freezer.frozen == 4


def test_gradient_norm_rule_and_state_round_trip():
    freezer, layer_of, params = bound(GradientNormFreezer(window=1, threshold=0.1))
    norms = [[1.0, 1.0, 1.0, 1.0, 1.0], [1.05, 0.5, 1.0, 1.0, 1.0]]
    assert freezer.decide(norms[0]) == 0  # needs 2 windows
    assert freezer.decide(norms[1]) == 1  # layer 0 changed 5 %, layer 1 50 %: only a prefix freezes
    again, _, _ = bound(GradientNormFreezer(window=1, threshold=0.1))
    again.load_state_dict(freezer.state_dict())
    assert again.state_dict() == freezer.state_dict()


def test_layers_sharing_a_parameter_are_refused():
    shared = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="share a parameter"):
        GradientNormFreezer(layers=[shared, nn.Sequential(shared)]).bind(shared, list(shared.parameters()))


def test_checkpoint_of_a_freezing_job_needs_a_freezer(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    ddp = es.EasyScaleDDP(model, virtual_world_size=2, freezer=GradientNormFreezer())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    Checkpointer(str(tmp_path), ddp, opt).save(Position(1, 0, 1))
    plain = es.EasyScaleDDP(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)), virtual_world_size=2)
    with pytest.raises(CheckpointError, match="froze layers but this one has no freezer"):
        Checkpointer(str(tmp_path), plain, torch.optim.SGD(plain.parameters(), lr=0.1)).resume()


def test_a_frozen_layer_keeps_its_bytes_and_grad_none_under_a_momentum_optimizer():
    # Zeros instead of None would still move it (momentum, weight decay): the optimizer must skip it.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    ddp = es.EasyScaleDDP(model, virtual_world_size=2, freezer=Toy([0, 1, 1, 1, 1, 1], max_frozen_fraction=0.5))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    first = list(model[0].parameters())
    for step in range(6):
        if step == 2:  # frozen after the second step's decision
            assert ddp.freezer.frozen == 1
            kept = [p.detach().clone() for p in first] + [opt.state[p]["momentum_buffer"].clone() for p in first]
            last = model[2].weight.detach().clone()
        for x in ddp.workers([(v, torch.randn(3, 4)) for v in ddp.local_ranks]):
            ddp(x).square().sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=False)  # zeros where a gradient exists: frozen ones must stay None
    assert all(p.grad is None and not p.requires_grad for p in first)
    now = [p.detach() for p in first] + [opt.state[p]["momentum_buffer"] for p in first]
    assert all(a.view(torch.int32).equal(b.view(torch.int32)) for a, b in zip(now, kept))
    assert not torch.equal(model[2].weight, last)  # the layers after it trained on
