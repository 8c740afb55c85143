"""Layer freezing (AutoFreeze, IceFrog's layer elasticity), decided from reduced gradients.

A freezer watches per-layer norms of the *reduced* gradient, which every
process holds bit for bit whatever the placement, so every process takes the
same decision at the same step without exchanging anything, on any P, across
scale events and restarts. Layers freeze as a prefix (front layers first, as
AutoFreeze does): backward stops before them, EasyScaleDDP drops their
parameters from the reduction plan, and optimizers skip them (grad None).

A policy subclasses `Freezer` and implements `decide()`; the base class keeps
the step count, the frozen prefix, the decision log and the state that
checkpoints and scale events carry.
"""
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import torch
from torch import nn

from ..ops import group_norms


@dataclass(frozen=True)
class FreezeDecision:
    step: int           # optimizer steps taken when the decision was made; applies from the next step
    layers: List[int]   # indices of the layers frozen by this decision


class Freezer:
    """Base of freezing policies: every `interval` optimizer steps after `warmup`, `decide()` sees the
    reduced gradient's per-layer norms and returns how many front layers are frozen from now on."""

    def __init__(self, layers: Optional[Sequence[nn.Module]] = None, interval: int = 1, warmup: int = 0,
                 max_frozen_fraction: float = 0.8):
        if interval < 1 or warmup < 0 or not 0.0 <= max_frozen_fraction <= 1.0:
            raise ValueError("need interval >= 1, warmup >= 0 and 0 <= max_frozen_fraction <= 1")
        self._layer_modules = None if layers is None else list(layers)
        self.interval, self.warmup, self.max_frozen_fraction = interval, warmup, max_frozen_fraction
        self.steps = 0
        self.frozen = 0  # the frozen prefix: layers [0, frozen)
        self.log: List[FreezeDecision] = []

    # -- the policy ----------------------------------------------------------------------
    def decide(self, norms: List[float]) -> int:
        """Given this evaluation's per-layer gradient norms (frozen layers' are 0), return the new
        frozen prefix length; the base class keeps it monotone and under the cap."""
        raise NotImplementedError

    def policy_state(self) -> dict:
        return {}

    def load_policy_state(self, state: dict) -> None:
        pass

    # -- used by EasyScaleDDP ------------------------------------------------------------
    def bind(self, module: nn.Module, params: Sequence[nn.Parameter]) -> List[int]:
        """Each parameter's layer index (-1: in no layer, never frozen). Layers are the given modules,
        by default the module's top-level children, that hold trainable parameters, in order."""
        modules = module.children() if self._layer_modules is None else self._layer_modules
        modules = [m for m in modules if any(p.requires_grad for p in m.parameters())]
        layer_of: Dict[int, int] = {}
        for i, m in enumerate(modules):
            for p in m.parameters():
                if id(p) in layer_of:
                    raise ValueError(f"layers {layer_of[id(p)]} and {i} share a parameter: give disjoint layers")
                layer_of[id(p)] = i
        self.num_layers = len(modules)
        if self.num_layers == 0:
            raise ValueError("the freezer found no layers with trainable parameters: pass layers=[...]")
        self.cap = int(self.max_frozen_fraction * self.num_layers)
        return [layer_of.get(id(p), -1) for p in params]

    def after_step(self, grads_by_dtype: Sequence[List[torch.Tensor]], layers_by_dtype: Sequence[List[int]]) -> bool:
        """Count a synchronised step; evaluate when due. Returns whether the frozen prefix grew."""
        self.steps += 1
        if self.steps <= self.warmup or self.steps % self.interval:
            return False
        norms = self.layer_norms(grads_by_dtype, layers_by_dtype)
        wanted = min(max(int(self.decide(norms)), self.frozen), self.cap)
        if wanted == self.frozen:
            return False
        self.log.append(FreezeDecision(self.steps, list(range(self.frozen, wanted))))
        self.frozen = wanted
        return True

    def layer_norms(self, grads_by_dtype, layers_by_dtype) -> List[float]:
        """One group_norms launch per dtype; dtypes combine as sqrt(a^2 + b^2 + ...) in a fixed order."""
        squares = [0.0] * self.num_layers
        for grads, layers in zip(grads_by_dtype, layers_by_dtype):
            if grads:
                for i, n in enumerate(group_norms(grads, layers, self.num_layers).tolist()):
                    squares[i] += n * n
        return [s ** 0.5 for s in squares]

    def state_dict(self) -> dict:
        return {"steps": self.steps, "frozen": self.frozen, "policy": self.policy_state(),
                "log": [(d.step, list(d.layers)) for d in self.log]}

    def load_state_dict(self, state: dict) -> None:
        self.steps, self.frozen = int(state["steps"]), int(state["frozen"])
        self.log = [FreezeDecision(int(s), [int(x) for x in layers]) for s, layers in state["log"]]
        self.load_policy_state(state["policy"])


class GradientNormFreezer(Freezer):
    """AutoFreeze's criterion: a layer has converged when its gradient norm's relative change between
    the last `window` evaluations and the `window` before them falls below `threshold`; the frozen
    prefix extends over every converged layer that follows it."""

    def __init__(self, layers=None, interval: int = 1, window: int = 2, threshold: float = 0.05,
                 warmup: int = 0, max_frozen_fraction: float = 0.8):
        super().__init__(layers, interval, warmup, max_frozen_fraction)
        if window < 1 or threshold < 0:
            raise ValueError("need window >= 1 and threshold >= 0")
        self.window, self.threshold = window, threshold
        self.history: List[List[float]] = []  # the last 2 * window evaluations' norms

    def decide(self, norms: List[float]) -> int:
        self.history = (self.history + [norms])[-2 * self.window:]
        if len(self.history) < 2 * self.window:
            return self.frozen
        frozen = self.frozen
        for layer in range(self.frozen, self.num_layers):
            before = sum(h[layer] for h in self.history[:self.window])
            recent = sum(h[layer] for h in self.history[self.window:])
            if before == 0.0 or abs(recent - before) / before >= self.threshold:
                break
            frozen = layer + 1
        return frozen

    def policy_state(self) -> dict:
        return {"history": [list(h) for h in self.history]}

    def load_policy_state(self, state: dict) -> None:
        self.history = [[float(x) for x in h] for h in state["history"]]
