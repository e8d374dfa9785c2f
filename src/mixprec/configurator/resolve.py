"""Request resolution: the configurator's requests on the captured graph's layers -> a :class:`Resolution`.

A request names modules; its layers are the graph layers whose module path lies under one of them, in call order
(a later request overwrites the layers it covers). The resolution also settles parameters shared by modules asked
to store them in different dtypes and the model input/output requests, each problem raised (strict) or warned
about with what is done instead. int8 requests are planned by ``plan/quant_requests.py`` (which values, grids,
smoothing) and calibrated in one ``calibrate.entry.run`` with the int8 marker regions' ranges and the smoothed
values' per-channel ranges. What the log shows is all in the Resolution (``log.py`` renders it).

Simulated int16/int4 requests (issue 32) are planned by the same ``quant_requests``, one call per precision (the
layers of one module share a boundary only with layers of their own precision), without activation smoothing
(int8's device for its kernels; AIMET's QuantSim does not smooth), their values put on their precision's grid
(``plan/quantization.precision_grid``); model inputs/outputs asked for int16/int8/int4 are ranged too. All of them in
the same calibration; a value that two precisions quantize on different grids gets its range clipped for each grid (a
second pass over the data for those values only, and only with a clipping estimator: min/max ranges are the same).

**int8 attention and residual adds** (issue 34, ``QuantPolicy.int8_attention`` / ``quantize_residuals``): the layers
no request covers that int8 reaches are the one int8 planner's (``plan/quant_requests.implied_int8``, which the search
shares); each gets int8 under the request of the int8 layer it reads, its reason and the log saying so.
"""

from __future__ import annotations

import dataclasses
import difflib
import warnings
from collections.abc import Mapping
from types import MappingProxyType

import torch

from ..calibrate import bias_correction
from ..calibrate import entry as calibration_entry
from ..dtypes import short_name
from ..errors import ConfigError
from ..formats import INTEGER_PRECISIONS, SIMULATED_PRECISIONS, WeightFormat
from ..ir.work_program import STORED_KINDS
from ..ops.table import INT8_WEIGHT_OPS
from ..plan.precision_plan import NodePrecision
from ..plan.quant_requests import QuantRequests, Smoothed, implied_int8, quant_requests
from ..plan.quantization import (
    IO_GRIDS, QuantPolicy, calibration_grids, grid_name, precision_grid, simulates_weights,
)
from .vocabulary import param_name, short_name_of


@dataclasses.dataclass(frozen=True)
class Resolution:
    """What the requests resolved to: the plan's decisions and what the log says about them."""

    decisions: Mapping[str, NodePrecision]
    inputs: Mapping[int, torch.dtype]  # model input position -> dtype
    outputs: Mapping[int, torch.dtype]
    winner: Mapping[str, object]  # layer -> the Request whose activation it gets
    param: Mapping[str, object]  # layer -> the param dtype or weight format its request gives (None: not given)
    io_winners: Mapping[str, Mapping[int, tuple[torch.dtype, int]]]  # "input"/"output" -> position -> (dtype, id)
    problems: tuple[str, ...]  # requests not realised as asked (strict=False)
    smoothed: Mapping[str, Smoothed]  # int8 Linear input -> its smoothing
    policy: QuantPolicy
    marker_ranges: Mapping[str, tuple[float, float]]  # int8 marker regions without ranges, calibrated
    input_ranges: Mapping[int, tuple[float, float]] = dataclasses.field(default_factory=dict)  # int16/int8 inputs
    output_ranges: Mapping[int, tuple[float, float]] = dataclasses.field(default_factory=dict)
    # layers no request covered that int8 reaches -> ("attention" | "residual add", the int8 layers they read)
    implied: Mapping[str, tuple[str, tuple[str, ...]]] = dataclasses.field(default_factory=dict)
    # the calibration (its first pass: statistics, marker ranges, the example's fp32 outputs when it ran on them) and
    # the values it ranged besides the marker regions: compile(plan=) reuses it (plan/origin.py)
    calibrated: object | None = None
    ranged: frozenset[str] = frozenset()


def resolve(model, captured, requests, strict: bool, policy: QuantPolicy, data) -> Resolution:
    """Resolve ``requests`` on ``captured`` (the model run with apply's inputs); ``data``: the calibration data
    (None: the example inputs)."""
    resolver = _Resolver(model, captured, strict)
    resolver.layers(requests)
    implied = resolver.implied_int8(policy)
    inputs, outputs = resolver.io_positions(requests, "input"), resolver.io_positions(requests, "output")
    planned = {bits: quant_requests(captured, groups, policy) if bits == torch.int8 else _simulated(
        quant_requests(captured, groups, dataclasses.replace(policy, smoothing_alpha=None)), bits)
        for bits, groups in resolver.integer_groups().items()}
    int8 = planned.get(torch.int8) or quant_requests(captured, [], policy)
    boundary = resolver.boundary_values(inputs, outputs)
    # on the example inputs (one batch) the calibration's pass holds the int8 layers' inputs for bias correction,
    # which then needs no pass of its own (calibrate/bias_correction.KeptInputs)
    kept = bias_correction.KeptInputs(captured.base, planned[torch.int8].entries) if (
        data is None and policy.bias_correction and torch.int8 in planned) else None
    calibrated, ranges = _calibrate(captured, data, planned, boundary, policy, int8.channels, kept)
    smoothed = int8.smoothing(calibrated.channels)
    specs = {}
    for bits, planned_bits in planned.items():
        mine = {n: ranges[(n, planned_bits.grids[n])] for n in planned_bits.values}
        made = planned_bits.specs(mine, smoothed if bits == torch.int8 else None)
        if bits == torch.int8 and policy.bias_correction:
            # int8 layers with int8 weights (the shift is measured with them); simulated int16/int4 layers and
            # weights are AIMET QuantSim's simulation as it is: their biases stay the model's
            plain = {n: spec for n, spec in made.items() if resolver.param.get(n) in (None, torch.int8)}
            made = {**made, **bias_correction.corrected_specs(captured, data, plain, kept)}
        specs.update(made)
    decisions = resolver.decisions(planned, specs)
    return Resolution(
        decisions, inputs, outputs, dict(resolver.winner), dict(resolver.param), resolver.io_winners,
        tuple(resolver.problems), smoothed, policy, dict(calibrated.int8_ranges),
        *({i: ranges[value] for i, value in boundary[which].items()} for which in ("input", "output")),
        implied, calibrated, frozenset(name for name, _ in ranges),
    )


def _simulated(planned: QuantRequests, bits: torch.dtype) -> QuantRequests:
    """``planned`` (int8's choice of values and grids) with every value on the grid of ``bits`` (int16, int4)."""
    return dataclasses.replace(planned, grids=MappingProxyType(
        {n: precision_grid(g, bits) for n, g in planned.grids.items()}))


def _calibrate(captured, data, planned, boundary, policy, channels, kept=None):
    """(the calibration, (value, grid) -> range) of every value an integer layer or the model's boundary quantizes:
    one pass (two with a clipping estimator, ``calibrate.entry.run``) for all, and more for the values that
    several precisions quantize on different grids, with a clipping estimator (each grid clips for its own step).
    ``kept``: bias correction's observer of the first pass (None: none)."""
    wanted: dict[str, set] = {}
    for planned_bits in planned.values():
        for name, grid in planned_bits.grids.items():
            wanted.setdefault(name, set()).add(grid)
    for values in boundary.values():
        for name, grid in values.values():
            wanted.setdefault(name, set()).add(grid)
    markers = calibration_grids(captured, (), policy)  # the marker regions' ranges come from the first run: their grid
    chosen = {name: markers[name] if markers.get(name) in grids else min(grids, key=grid_name)
              for name, grids in wanted.items()}
    # on the example inputs of a graph captured in fp32 the first outputs are the fp32 reference compile's report
    # compares with (kept for compile(plan=) to reuse, as compile keeps them itself)
    keep = data is None and captured.computes_in_fp32
    calibrated = calibration_entry.run(captured, data, statistics=False, int8_values=set(wanted), channels=channels,
                                       estimator=policy.estimator, grids={**markers, **chosen}, keep_first_outputs=keep,
                                       observers=(kept,) if kept is not None else ())
    ranges = {(name, grid): calibrated.int8_ranges[name] for name, grid in chosen.items()}
    for grid in sorted({g for grids in wanted.values() for g in grids}, key=grid_name):
        names = {name for name, grids in wanted.items() if grid in grids and (name, grid) not in ranges}
        if names and policy.estimator == "minmax":
            ranges.update({(name, grid): calibrated.int8_ranges[name] for name in names})
        elif names:
            again = calibration_entry.run(captured, data, statistics=False, int8_values=names,
                                          estimator=policy.estimator, grids={**markers, **{n: grid for n in names}})
            ranges.update({(name, grid): again.int8_ranges[name] for name in names})
    return calibrated, ranges


class _Resolver:
    """Maps requests onto graph layers; remembers the winners and the problems."""

    def __init__(self, model, captured, strict: bool):
        self.model = model
        self.captured = captured
        self.base = captured.base
        self.info = captured.info
        self.strict = strict
        self.problems: list[str] = []
        self.winner: dict[str, object] = {}
        self.param: dict[str, object] = {}  # layer -> its request's param: a dtype, a weight format or None
        self.io_winners: dict[str, dict[int, tuple[torch.dtype, int]]] = {}
        self.implied: dict[str, tuple[str, tuple[str, ...]]] = {}
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

    def implied_int8(self, policy: QuantPolicy) -> dict[str, tuple[str, tuple[str, ...]]]:
        """int8 for the layers no request covers that int8 reaches (``plan/quant_requests.implied_int8``: attention
        matmuls, residual adds), each under the request of the first int8 layer it reads. Returns layer ->
        ("attention" | "residual add", the int8 layers it reads)."""
        int8 = {name for name, request in self.winner.items() if request.activation == torch.int8}
        for name, (kind, sources) in implied_int8(self.captured, self.winner, int8, policy).items():
            self.winner[name] = self.winner[sources[0]]
            self.param[name] = None
            self.implied[name] = (kind, sources)
        return dict(self.implied)

    def int8_groups(self) -> list[set[str]]:
        """The int8 layers grouped by module: a module's boundary is where its int8 values are quantized."""
        return self.integer_groups().get(torch.int8, [])

    def integer_groups(self) -> dict[torch.dtype, list[set[str]]]:
        """The layers of each integer precision (int8, int16, int4) grouped by module, as :meth:`int8_groups`."""
        groups: dict[torch.dtype, dict[str, set[str]]] = {}
        for name, request in self.winner.items():
            if request.activation in INTEGER_PRECISIONS:
                groups.setdefault(request.activation, {}).setdefault(self.info[name].module, set()).add(name)
        return {bits: list(by_module.values()) for bits, by_module in groups.items()}

    def boundary_values(self, inputs, outputs) -> dict[str, dict[int, tuple[str, object]]]:
        """"input"/"output" -> position -> (graph value, grid) of every model input/output asked for int16/int8."""
        float_inputs = [n for n in self.base.user_input_nodes() if _dtype_of(n) is not None]
        values = {"input": {i: float_inputs[i].name for i in inputs},
                  "output": {i: v.name for i, v in self.base.user_output_nodes() if isinstance(v, torch.fx.Node)}}
        return {which: {i: (values[which][i], IO_GRIDS[d]) for i, d in dtypes.items() if d in IO_GRIDS}
                for which, dtypes in (("input", inputs), ("output", outputs))}

    def decisions(self, planned: Mapping[torch.dtype, QuantRequests], specs) -> dict[str, NodePrecision]:
        out = {}
        int8 = planned.get(torch.int8)
        operandless = frozenset().union(*(p.operandless for p in planned.values()))
        for name, request in self.winner.items():
            activation, param = request.activation, self.param[name]
            reason = f"request #{request.id} set_precision({request.target_text()}, {request.precision_text()})"
            if name in self.implied:
                reason += _implied_reason(*self.implied[name])
            smoothed = [inp for inp, _ in specs[name].smoothing] if name in specs else []
            if smoothed:
                reason += (f"; input {', '.join(smoothed)} smoothed: divided per channel by s, weight columns "
                           f"multiplied by s (alpha {int8.policy.smoothing_alpha})")
            if activation in INTEGER_PRECISIONS and name in operandless:
                reason += ("; its operands stay float: the attention's output matmul reads the softmax probabilities "
                           "(plan/int8_operands.py, QuantPolicy.quantize_probabilities)")
            elif activation == torch.int8 and self.info[name].flops == 0:
                reason += ("; no int8 arithmetic for this op: it computes in float32 on dequantized values, inside the "
                           "module's int8 region (only matmul, convolution and attention layers run int8)")
            if isinstance(param, WeightFormat):  # weight-only: the format is the layer's weights
                out[name] = NodePrecision(activation, None, "plan", reason, weights=param)
                continue
            reason += _simulated_reason(activation, param if param is not None else activation, self.info[name])
            out[name] = NodePrecision(
                activation, None, "plan", reason, param if param != activation else None, specs.get(name)
            )
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
                          f"param={_param_text(self.param[layer])})" for layer in layers})
            self.problem(
                f"parameter '{specs[placeholder].target}' is shared by modules asked to store it in different "
                f"dtypes: {', '.join(who)}",
                f"it is stored in {_param_text(latest.param)} (request #{latest.id}, the latest)",
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


def _simulated_reason(activation, weights, node) -> str:
    """What the reason says of a layer simulated in part or whole (int16/int4 activations or weights)."""
    parts = []
    if activation in SIMULATED_PRECISIONS:
        parts.append(f"simulated {short_name_of(activation)}: its inputs quantized -> dequantized on the "
                     f"{short_name_of(activation)} grid, computed in float32 (no CPU kernel; AIMET QuantSim's "
                     "semantics), not low-precision FLOPs")
    if simulates_weights(activation, weights) and node.packet in INT8_WEIGHT_OPS:
        parts.append(f"weights simulated {short_name_of(weights)} per output channel (symmetric), dequantized to "
                     "float32 at use")
    return "".join(f"; {p}" for p in parts)


def _param_text(param) -> str:
    return param.describe() if isinstance(param, WeightFormat) else param_name(param)


def _implied_reason(kind: str, sources: tuple[str, ...]) -> str:
    if kind == "attention":
        return (f" on the layers its operands come from ({', '.join(sources)}): int8 attention as NNCF's TRANSFORMER "
                "mode makes it (QuantPolicy.int8_attention=False keeps it float)")
    return (f" on the convolution(s) it adds ({', '.join(sources)}): a residual add, both inputs quantized as NNCF "
            "does, so OpenVINO adds in the int8 convolution (QuantPolicy.quantize_residuals=False keeps it float)")


def _under(module: str, path: str) -> bool:
    return path == "" or module == path or module.startswith(path + ".")


def _dtype_of(node) -> torch.dtype | None:
    val = node.meta.get("val")
    return val.dtype if isinstance(val, torch.Tensor) else None
