"""PlanOrigin: the capture and calibration a plan was made on, so that ``compile(plan=)`` does not make them again.

Why (issue 44): the configurator's ``apply()`` captures the model and calibrates it to make its plan; ``compile`` given
that plan for the same model and inputs captured and calibrated again. As pt2e's quantizer annotates and its
``prepare``/``convert`` reuse one graph, a plan from ``apply()`` carries what it was made on and compile takes it when
it fits:

* **the capture** (``ir.captured.CapturedModel``) when compile gets the same model object — its parameters the
  tensors the capture reads, in eval mode — the same example inputs (equal values, shapes, dtypes) and no
  ``dynamic_shapes``;
* **the calibration** (``calibrate.entry.Calibrated``) when, besides, both calibrated on the example inputs (no
  calibration data given to either) with the plan's own policy; compile then finds there the ranges of the int8
  marker regions, the statistics autocast's rules read (when the configurator ran its calibration at all) and the
  fp32 reference outputs its report compares with.

It is never part of the plan's value: not compared, not written by ``to_json`` (a plan read back has none), and a
plan that holds it holds the capture — and so the model's parameters — until the plan is dropped.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.utils._pytree as pytree


@dataclasses.dataclass(frozen=True, eq=False)
class PlanOrigin:
    """``captured``: the CapturedModel the plan was resolved on; ``calibrated``: its calibration on the example
    inputs (None: it calibrated on other data); ``values``: the graph values that calibration ranged besides the
    marker regions (compile reuses it only where those are not marker values, whose ranges it would clip alike)."""

    captured: object
    calibrated: object | None = None
    values: frozenset[str] = frozenset()

    def capture_for(self, model, args: tuple, kwargs: dict, dynamic_shapes=None):
        """The capture, when compile's ``model``, inputs and ``dynamic_shapes`` are what it was made of; else None."""
        captured = self.captured
        if dynamic_shapes is not None or not isinstance(model, torch.nn.Module) or captured.model is not model:
            return None
        if model.training or not (_same(args, captured.args) and _same(kwargs, captured.kwargs)):
            return None
        state = dict(model.state_dict(keep_vars=True))
        read = captured.exported.state_dict
        if any(state.get(name) is not tensor for name, tensor in read.items()):
            return None  # a parameter replaced since: the capture reads the old tensor
        return captured

    def calibration_for(self, loader, statistics: bool, markers) -> object | None:
        """The calibration, when compile would calibrate the same: no ``loader``, the statistics there when
        ``statistics`` are needed, no marker value among the values it ranged for the configurator."""
        calibrated = self.calibrated
        if calibrated is None or loader is not None:
            return None
        if statistics and calibrated.calibration is None:
            return None
        if set(markers) & self.values:
            return None
        return calibrated


def _same(a, b) -> bool:
    """Equal example inputs: the same structure, tensors of equal shape, dtype, device and values."""
    flat_a, spec_a = pytree.tree_flatten(a)
    flat_b, spec_b = pytree.tree_flatten(b)
    if spec_a != spec_b:
        return False
    for x, y in zip(flat_a, flat_b):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
        if isinstance(x, torch.Tensor):
            if x is y:
                continue
            if (x.shape, x.dtype, x.device) != (y.shape, y.dtype, y.device) or not torch.equal(x, y):
                return False
        elif x != y:
            return False
    return True
