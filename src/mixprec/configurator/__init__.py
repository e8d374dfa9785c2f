"""MixedPrecisionConfigurator: AIMET-style manual mixed precision (API.md §4) → a PrecisionPlan.

Requests name modules (a leaf, a non-leaf module for all its leaves, every module of a type, or a module path) and
precisions; ``apply`` captures the model once, resolves every request on the graph layers that run in those modules
(``resolve.py``), calibrates what integer requests quantize, and returns one ``source="plan"`` decision per requested
layer, which ``mixprec.compile(..., plan=plan)`` honours over everything else — the speed checks included (issue 42).

Why requests resolve on layers, in call order: a non-leaf request covers every layer under it and a later request
overwrites the layers it covers, so "all of L1 at P1 except its leaf L2 at P2" is two requests in that order (AIMET
resolves on quantizers and refuses exactly this combination in strict mode).

``activation`` is the dtype a module computes in; ``param`` the dtype (or weight format) its weights are stored in.
What each combination means — int8, weight-only (a float activation with a weight format), simulated int16/int4 as
AIMET's QuantSim — is ``vocabulary.py``'s; which values int8 quantizes, with which grid, smoothing and attention
operands, and which layers no request covers int8 reaches, is ``plan/quant_requests.py``'s and ``apply``'s ``policy``
(``plan/quantization.QuantPolicy``), recorded in the plan.
The value leaving an int8 module is the dequantized result an int8 kernel delivers, quantized where the next int8
module reads it (``QuantPolicy.quantize_exits``: README "Manual mixed precision" says why).

``apply`` makes a plan, not a program (issue 44): no rewrite. The plan carries the capture and calibration it was
made on (``plan/origin.py``), which ``compile(plan=)`` reuses for the same model and inputs; compile completes the
log (``log.py``) with the layers as realised (``output/report/layer_log.py``).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch

from ..dtypes import short_name
from ..errors import ConfigError
from ..formats import WeightFormat
from ..ir.export import as_input_tuple
from ..ir.captured import CapturedModel
from ..plan import planner
from ..plan.options import PlanningOptions
from ..plan.origin import PlanOrigin
from ..plan.precision_plan import PrecisionPlan
from ..plan.quantization import DEFAULT_POLICY, QuantPolicy
from ..searching.frontier import register_module_int8
from .log import render_log
from . import vocabulary
from .resolve import resolve

# AIMET: int16/int8/int4 at the boundary too: a quantize/dequantize pair there (rewrite/io_types.py), ranged by
# apply's calibration
_IO_NAMES = ("fp32", "fp16", "bf16", "int16", "int8", "int4")


@dataclasses.dataclass(frozen=True)
class Request:
    """One call of the configurator, as given (the log's first table)."""

    id: int
    api: str  # "set_precision" | "set_model_input_precision" | "set_model_output_precision"
    target: Any  # module, module type or path (set_precision); None for model inputs/outputs
    activation: Any  # dtype; for inputs/outputs a dtype or a tuple of (dtype | None)
    param: torch.dtype | WeightFormat | None = None  # a weight format: weight-only (vocabulary.weights_of)
    label: str = ""  # how the log names the target

    def target_text(self) -> str:
        return self.label

    def precision_text(self) -> str:
        if isinstance(self.activation, tuple):
            return "[" + ", ".join(short_name(d) if d is not None else "None" for d in self.activation) + "]"
        text = f"activation={short_name(self.activation)}"
        text += f", param={vocabulary.param_name(self.param)}" if self.param is not None else ""
        if isinstance(self.param, WeightFormat):
            text += f" (weight-only {self.param.describe()})"
        return text


class MixedPrecisionConfigurator:
    """Collects precision requests for ``model``; ``apply(inputs)`` turns them into a PrecisionPlan."""

    def __init__(self, model: torch.nn.Module, inputs=None, calibration_dataloader=None):
        """``inputs`` (AIMET's QuantSim holds its dummy input; so may the configurator): the example inputs ``apply()``
        runs the model with when called without them; ``calibration_dataloader``: its default calibration data."""
        if not isinstance(model, torch.nn.Module):
            raise ConfigError(
                f"MixedPrecisionConfigurator needs the torch.nn.Module whose modules the requests name, got "
                f"{type(model).__name__}."
            )
        self._model = model
        self._inputs = inputs
        self._calibration = calibration_dataloader
        self._requests: list[Request] = []

    def set_precision(self, target, activation, param=None, *, group_size=None, symmetric: bool = True) -> None:
        """Set the precision of a module (leaf or non-leaf), of every module of a type, or of a module path.

        A float ``activation`` with a weight format, ``param={'weight': 'int8'}``, ``'int4'``, ``'nf4'``, ``'mxfp4'``
        or ``'fp8'`` (``mixprec.formats``), is weight-only (W8A16 / W4A16 / NF4 ...: the Linears run the format's op):
        ``group_size`` input channels share a scale (default: the format's — 128 for int4, one scale per output
        channel for int8, 32 for mxfp4; ``'per_channel'`` asks for one per output channel), ``symmetric=False`` gives
        each group a zero offset too where the format has one (int8, int4: min/max of the group on the whole grid)."""
        is_type = isinstance(target, type) and issubclass(target, torch.nn.Module)
        if not (isinstance(target, (torch.nn.Module, str)) or is_type):
            raise ConfigError(
                f"set_precision target {target!r} is not a module, a module type (e.g. torch.nn.Linear) or a "
                "module path string (e.g. 'encoder.layers.3')."
            )
        act = vocabulary.precision(activation, "activation")
        par = vocabulary.param_precision(param)
        what = f"set_precision(activation={activation!r}, param={param!r})"
        self._add("set_precision", target, act, vocabulary.weights_of(what, act, par, group_size, symmetric))

    def set_model_input_precision(self, activation) -> None:
        """Round model inputs to this precision on entry: one value for every float input, or one per input
        tensor with None for inputs left as they are."""
        self._add("set_model_input_precision", None, _io_precisions(activation, "set_model_input_precision"))

    def set_model_output_precision(self, activation) -> None:
        """Give model outputs this dtype: one value for every float output, or one per output (None: untouched)."""
        self._add("set_model_output_precision", None, _io_precisions(activation, "set_model_output_precision"))

    def _add(self, api, target, activation, param=None) -> None:
        self._requests.append(Request(len(self._requests) + 1, api, target, activation, param,
                                      self._label(api, target)))

    def _label(self, api: str, target) -> str:
        if api != "set_precision":
            return "model inputs" if api == "set_model_input_precision" else "model outputs"
        if isinstance(target, str):
            return f"'{target}'"
        if isinstance(target, type):
            return f"type {target.__module__}.{target.__qualname__}"
        path = next((p for p, m in self._model.named_modules(remove_duplicate=False) if m is target), None)
        kind = type(target).__name__
        return f"{kind} '{path}'" if path else (f"{kind} (the model)" if path == "" else f"{kind} (not in the model)")

    def apply(self, inputs=None, log_file=None, strict: bool = True, *, calibration_dataloader=None,
              policy: QuantPolicy | None = None) -> PrecisionPlan:
        """Resolve every request on the model run with ``inputs``; returns the plan (its log in ``plan.log``).

        strict=True raises ConfigError for a request that cannot be realised as asked; strict=False warns
        (UserWarning) and takes the latest request. ``calibration_dataloader`` (a mixprec extension): the
        batches int8 ranges are calibrated on — any form and sizes ``mixprec.compile``'s calibration takes
        (tuples, dicts by forward's names, a DataLoader); without it, ``inputs``. ``policy`` (a mixprec extension):
        how int8 requests are quantized (``mixprec.QuantPolicy``; None: the measured defaults). ``inputs`` and
        ``calibration_dataloader`` left out: those given at construction (AIMET's ``apply()`` takes no arguments).
        ``log_file``: a path or an open text file (AIMET's ``apply(f)``: an open file given first, with the inputs held
        by the configurator, is the log file).

        The plan carries the capture and calibration it was made on: ``mixprec.compile(model, inputs, plan=plan)`` for
        the same model and inputs reuses them (``plan/origin.py``) and completes ``plan.log`` with the realised layers
        and the casts inserted, in the program's ``prog.plan.log``.
        """
        if _is_file(inputs) and log_file is None and self._inputs is not None:
            inputs, log_file = None, inputs  # AIMET's apply(f): the log file first
        if inputs is None:
            inputs = self._inputs
        if inputs is None:
            raise ConfigError(
                "apply() needs the model's example inputs to capture it: pass them at construction, "
                "MixedPrecisionConfigurator(model, inputs) (then apply() takes no arguments, as AIMET's), or as "
                "apply(inputs)."
            )
        if calibration_dataloader is None:
            calibration_dataloader = self._calibration
        if not isinstance(strict, bool):
            raise ConfigError(f"strict must be True or False, got {strict!r}.")
        if policy is None:
            policy = DEFAULT_POLICY
        if not isinstance(policy, QuantPolicy):
            raise ConfigError(f"policy must be a mixprec.QuantPolicy (how int8 requests are quantized), got "
                              f"{type(policy).__name__}; pass QuantPolicy(...) or leave it out for the defaults.")
        # capture, calibrate, plan — no rewrite (issue 44): compile(plan=) realises it, reusing this capture and
        # calibration for the same model and inputs (plan/origin.py), and completes the log with what it inserted
        captured = CapturedModel(self._model, as_input_tuple(inputs))
        resolved = resolve(self._model, captured, self._requests, strict, policy, calibration_dataloader)
        plan = PrecisionPlan(resolved.decisions, inputs=resolved.inputs, outputs=resolved.outputs, policy=policy,
                             input_ranges=resolved.input_ranges, output_ranges=resolved.output_ranges)
        full = planner.build_plan(captured.info, PlanningOptions(plan=plan), int8_ranges=resolved.marker_ranges)
        text = render_log(self._requests, resolved, captured.info, full)
        if _is_file(log_file):
            log_file.write(text)
        elif log_file is not None:
            with open(os.fspath(log_file), "w", encoding="utf-8") as fh:
                fh.write(text)
        on_examples = resolved.calibrated if calibration_dataloader is None else None
        origin = PlanOrigin(captured, on_examples, resolved.ranged)
        return PrecisionPlan(plan, inputs=plan.inputs, outputs=plan.outputs, log=text, policy=policy,
                             input_ranges=plan.input_ranges, output_ranges=plan.output_ranges, origin=origin)


def _is_file(value) -> bool:
    """An open text file (what AIMET's apply takes as its log), not a path or the example inputs."""
    return callable(getattr(value, "write", None)) and not isinstance(value, (torch.Tensor, str, os.PathLike))


def _io_precisions(value, api: str):
    if isinstance(value, (list, tuple)):
        return tuple(_io_precision(v, f"{api}[{i}]") if v is not None else None for i, v in enumerate(value))
    return _io_precision(value, api)


def _io_precision(value, what: str) -> torch.dtype:
    return vocabulary.precision(value, what, accepted=_IO_NAMES)


def _all_int8(model, args, paths, calibration) -> PrecisionPlan:
    """The configurator's plan of the leaf modules at ``paths`` in int8 (its grids, smoothing, bias correction, the
    attention they feed in int8), calibrated on ``calibration`` (None: ``args``): a plan the search's frontier measures
    beside its own (issue 45). The search ranks before the configurator and may not import it, so the configurator
    offers it (``searching.frontier.register_module_int8``), which ``import mixprec`` does."""
    cfg = MixedPrecisionConfigurator(model)
    for path in paths:
        cfg.set_precision(path, activation="int8")
    return cfg.apply(args, strict=False, calibration_dataloader=calibration)


register_module_int8("configurator", _all_int8)
