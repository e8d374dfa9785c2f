"""Request resolution: the configurator's requests on the captured graph's layers -> a :class:`Resolution`.

A request names modules; its layers are the graph layers whose module path lies under one of them, in call order
(a later request overwrites the layers it covers). The resolution also settles parameters shared by modules asked
to store them in different dtypes and the model input/output requests, each problem raised (strict) or warned
about with what is done instead. int8 requests are planned by ``plan/quant_requests.py`` (which values, grids,
smoothing) and calibrated in one ``calibrate.entry.run`` with the int8 marker regions' ranges and the smoothed
values' per-channel ranges. What the log shows is all in the Resolution (``log.py`` renders it).
"""

from __future__ import annotations

import dataclasses
import difflib
import warnings
from collections.abc import Mapping

import torch

from ..calibrate import entry as calibration_entry
from ..dtypes import short_name
from ..errors import ConfigError
from ..ir.work_program import STORED_KINDS
from ..plan.precision_plan import NodePrecision
from ..plan.quant_requests import QuantRequests, Smoothed, quant_requests
from ..plan.quantization import QuantPolicy, calibration_grids
from . import vocabulary


@dataclasses.dataclass(frozen=True)
class Resolution:
    """What the requests resolved to: the plan's decisions and what the log says about them."""

    decisions: Mapping[str, NodePrecision]
    inputs: Mapping[int, torch.dtype]  # model input position -> dtype
    outputs: Mapping[int, torch.dtype]
    winner: Mapping[str, object]  # layer -> the Request whose activation it gets
    param: Mapping[str, torch.dtype | None]  # layer -> the param dtype its request gives (None: not given)
    io_winners: Mapping[str, Mapping[int, tuple[torch.dtype, int]]]  # "input"/"output" -> position -> (dtype, id)
    problems: tuple[str, ...]  # requests not realised as asked (strict=False)
    smoothed: Mapping[str, Smoothed]  # int8 Linear input -> its smoothing
    policy: QuantPolicy
    marker_ranges: Mapping[str, tuple[float, float]]  # int8 marker regions without ranges, calibrated


def resolve(model, captured, requests, strict: bool, policy: QuantPolicy, data) -> Resolution:
    """Resolve ``requests`` on ``captured`` (the model run with apply's inputs); ``data``: the calibration data
    (None: the example inputs)."""
    resolver = _Resolver(model, captured, strict)
    resolver.layers(requests)
    int8 = quant_requests(captured, resolver.int8_groups(), policy)
    calibrated = calibration_entry.run(
        captured, data, statistics=False, int8_values=int8.values, channels=int8.channels,
        estimator=policy.estimator, grids=calibration_grids(captured, int8.values, policy),
    )
    smoothed = int8.smoothing(calibrated.channels)
    decisions = resolver.decisions(int8, int8.specs(calibrated.int8_ranges, smoothed))
    inputs, outputs = resolver.io_positions(requests, "input"), resolver.io_positions(requests, "output")
    return Resolution(
        decisions, inputs, outputs, dict(resolver.winner), dict(resolver.param), resolver.io_winners,
        tuple(resolver.problems), smoothed, policy, dict(calibrated.int8_ranges),
    )


class _Resolver:
    """Maps requests onto graph layers; remembers the winners and the problems."""

    def __init__(self, model, captured, strict: bool):
        self.model = model
        self.base = captured.base
        self.info = captured.info
        self.strict = strict
        self.problems: list[str] = []
        self.winner: dict[str, object] = {}
        self.param: dict[str, torch.dtype | None] = {}
        self.io_winners: dict[str, dict[int, tuple[torch.dtype, int]]] = {}
        self.paths: dict[int, list[str]] = {}
        for path, module in model.named_modules(remove_duplicate=False):
            self.paths.setdefault(id(module), []).append(path)

    # ---- problems ---------------------------------------------------------------------------
    def problem(self, message: str, fallback: str) -> None:
        """strict: raise; else warn, saying what is done instead (``fallback``)."""
        if self.strict:
            raise ConfigError(f"{message}. With apply(strict=False) mixprec warns instead: {fallback}.")
        self.problems.append(f"{message}; {fallback}")
        warnings.warn(f"{message}; {fallback}", UserWarning, stacklevel=2)

    # ---- layers ----------------------------------------------------------------------------
    def layers(self, requests) -> None:
        """Each layer's winning request and param dtype, shared parameters settled."""
        for request in requests:
            if request.api != "set_precision":
                continue
            paths = self._paths_of(request)
            layers = [name for name in self.info if any(_under(self.info[name].module, p) for p in paths)]
            if paths and not layers:
                self.problem(
                    f"request #{request.id} set_precision({request.target_text()}): the module "
                    f"({', '.join(repr(p) for p in paths)}) never runs a layer in forward",
                    "the request is ignored",
                )
            for name in layers:
                self.winner[name] = request
                self.param[name] = request.param
        self._shared_parameters()

    def int8_groups(self) -> list[set[str]]:
        """The int8 layers grouped by module: a module's boundary is where its int8 values are quantized."""
        groups: dict[str, set[str]] = {}
        for name, request in self.winner.items():
            if request.activation == torch.int8:
                groups.setdefault(self.info[name].module, set()).add(name)
        return list(groups.values())

    def decisions(self, int8: QuantRequests, specs) -> dict[str, NodePrecision]:
        out = {}
        for name, request in self.winner.items():
            activation, param = request.activation, self.param[name]
            reason = f"request #{request.id} set_precision({request.target_text()}, {request.precision_text()})"
            smoothed = [inp for inp, _ in specs[name].smoothing] if name in specs else []
            if smoothed:
                reason += (f"; input {', '.join(smoothed)} smoothed: divided per channel by s, weight columns "
                           f"multiplied by s (alpha {int8.policy.smoothing_alpha})")
            if activation == torch.int8 and name in int8.operandless:
                reason += ("; its operands stay float: the attention's output matmul reads the softmax probabilities "
                           "(plan/int8_operands.py, QuantPolicy.quantize_probabilities)")
            elif activation == torch.int8 and self.info[name].flops == 0:
                reason += ("; no int8 arithmetic for this op: it computes in float32 on dequantized values, inside the "
                           "module's int8 region (only matmul, convolution and attention layers run int8)")
            out[name] = NodePrecision(
                activation, None, "plan", reason, param if param != activation else None, specs.get(name)
            )
            out[name] = vocabulary.weight_only_decision(out[name], request)  # weight-only: group, symmetry
        return out

    def _paths_of(self, request) -> list[str]:
        target = request.target
        modules = dict(self.model.named_modules(remove_duplicate=False))
        if isinstance(target, str):
            path = target.strip()
            if path not in modules:
                close = difflib.get_close_matches(path, [p for p in modules if p], n=1)
                self.problem(
                    f"request #{request.id} set_precision('{target}'): no module has this path in the model"
                    + (f" (did you mean '{close[0]}'?)" if close else ""),
                    "the request is ignored",
                )
                return []
            return [path]
        if isinstance(target, type):
            paths = [p for p, m in modules.items() if isinstance(m, target)]
            if not paths:
                self.problem(f"request #{request.id} set_precision({request.target_text()}): no module of this type "
                             "is part of the model", "the request is ignored")
            return paths
        paths = self.paths.get(id(target), [])
        if not paths:
            self.problem(
                f"request #{request.id} set_precision({request.target_text()}): this {type(target).__name__} is "
                "not part of the model the configurator was made for",
                "the request is ignored",
            )
        return paths

    def _shared_parameters(self) -> None:
        """One parameter read by layers whose requests ask for different ``param`` dtypes.

        (Layers without a ``param`` request read it in their own precision; when that differs the
        parameter simply gets a second stored copy, as with any tied weight.)
        """
        readers: dict[str, list[str]] = {}
        specs = {s.arg.name: s for s in self.base.input_specs if s.kind in STORED_KINDS and hasattr(s.arg, "name")}
        for name, node in self.info.items():
            for inp in node.input_dtypes:
                if inp in specs and self.param.get(name) is not None:
                    readers.setdefault(inp, []).append(name)
        for placeholder, layers in readers.items():
            if len({self.param[layer] for layer in layers}) < 2:
                continue
            latest = max((self.winner[layer] for layer in layers), key=lambda r: r.id)
            who = sorted({f"'{self.info[layer].module or '(top)'}' (request #{self.winner[layer].id}: "
                          f"param={short_name(self.param[layer])})" for layer in layers})
            self.problem(
                f"parameter '{specs[placeholder].target}' is shared by modules asked to store it in different "
                f"dtypes: {', '.join(who)}",
                f"it is stored in {short_name(latest.param)} (request #{latest.id}, the latest)",
            )
            for layer in layers:
                self.param[layer] = latest.param

    # ---- model inputs / outputs -------------------------------------------------------------------
    def io_positions(self, requests, which: str) -> dict[int, torch.dtype]:
        api = f"set_model_{which}_precision"
        if which == "input":
            dtypes = [_dtype_of(n) for n in self.base.user_input_nodes()]
            dtypes = [d for d in dtypes if d is not None]  # plan.inputs counts tensor inputs
        else:
            dtypes = list(self.base.user_output_dtypes())
        out = self.io_winners.setdefault(which, {})
        for request in requests:
            if request.api != api:
                continue
            wanted = request.activation
            if not isinstance(wanted, tuple):
                floats = {i: (wanted, request.id) for i, d in enumerate(dtypes)
                          if d is not None and d.is_floating_point}
                if not floats:
                    self.problem(
                        f"request #{request.id} {api}({short_name(wanted)}): the model has no floating-point "
                        f"{which} to give this precision (integer {which}s, e.g. token ids, keep their dtype)",
                        "the request does nothing",
                    )
                out.update(floats)
                continue
            if len(wanted) != len(dtypes):
                self.problem(
                    f"request #{request.id} {api} gives {len(wanted)} precision(s) for a model with {len(dtypes)} "
                    f"{which}(s); give one per {which} (None for those left as they are)",
                    f"the precisions given are used for the first {min(len(wanted), len(dtypes))} {which}(s)",
                )
            for i, dtype in enumerate(wanted[: len(dtypes)]):
                if dtype is None:
                    continue
                if dtypes[i] is None or not dtypes[i].is_floating_point:
                    self.problem(f"request #{request.id} {api}: {which} {i} is not a floating-point tensor",
                                 "it is left as it is")
                    continue
                out[i] = (dtype, request.id)
        return {i: dtype for i, (dtype, _) in out.items()}


def _under(module: str, path: str) -> bool:
    return path == "" or module == path or module.startswith(path + ".")


def _dtype_of(node) -> torch.dtype | None:
    val = node.meta.get("val")
    return val.dtype if isinstance(val, torch.Tensor) else None
