"""MixedPrecisionConfigurator: AIMET-style manual mixed precision (API.md §4) → a PrecisionPlan.

Requests name modules (a leaf, a non-leaf module for all its leaves, every module of a
type, or a module path) and precisions; ``apply`` captures the model once, maps every
request onto the graph layers that run in those modules, and writes one ``source="plan"``
decision per requested layer, which ``mixprec.compile(..., plan=plan)`` honours over
everything else.

Why requests resolve on layers, in call order: a non-leaf request covers every layer whose
module path lies under it, a later request overwrites the layers it covers, so "all of L1
at P1 except its leaf L2 at P2" is just two requests in that order. (AIMET resolves on
quantizers and rejects exactly this combination in strict mode, and drops it silently
otherwise.)

``activation`` is the dtype the module computes in (and so produces); ``param`` the dtype
its parameters are stored in (cast at use when it differs). int8 activations quantize the values
entering each module from outside it, with ranges calibrated on ``apply``'s ``calibration_dataloader`` (else
the inputs given to it), in one pass with the ranges of int8 marker regions (``calibrate.entry``); int8
parameters store convolution and linear weights per output channel. The value *leaving* an int8 module is the
dequantized result, as an int8 kernel delivers it (int32 sums scaled back to float): it is quantized where the
next int8 module reads it, not on its way out — quantizing it there too costs accuracy (a conv's output
before its batch norm and relu, on the signed grid; a Linear's output with the outliers of the residual stream)
and buys no int8 kernel. :data:`QUANTIZE_EXITS` turns the exit quantization back on; off was chosen by
measurement (bench/int8_nncf.py, bench/RESULTS.md "Issue 22 round two: int8 numerics"). An int8 Linear's
input that is not provably non-negative is smoothed (``calibrate/smoothing.py``, :data:`SMOOTHING_ALPHA`): the
per-channel divisors come from one more calibration pass (per-channel ranges) and travel in the plan's
``Int8Spec.smoothing``; the rewrite (``rewrite/quantize.py``) applies them to copies in the captured program.

Matmuls between two activations and ``scaled_dot_product_attention`` have no module of their own; an int8 request
on a module that runs them (an attention module, or the whole model) quantizes their operands too, wherever they
are made — once, where they enter the module when they come from outside through views — and never an input that is
no operand (SDPA's mask): ``plan/int8_operands.py`` says which (SDPA: query and key; an attention's output matmul:
none by default), and why.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import warnings
from typing import Any

import torch

from ..calibrate import entry as calibration_entry
from ..calibrate import smoothing
from ..calibrate.int8_ranges import readable_twice
from ..calibrate.shards import as_shards
from ..calibrate.statistics import calibrate
from ..dtypes import parse_dtype, short_name
from ..errors import ConfigError, InvariantError
from ..ir.capture import as_input_tuple
from ..ir.sign import is_nonnegative
from ..ir.frontend import CapturedModel
from ..ir.work_program import STORED_KINDS, WorkProgram
from ..plan import int8_operands, planner
from ..plan.options import PlanningOptions
from ..plan.precision_plan import Int8Spec, NodePrecision, PrecisionPlan
from ..rewrite.pipeline import realise
from .log import render_log

_PRECISIONS = frozenset({torch.float32, torch.float16, torch.bfloat16, torch.int8})
_IO_PRECISIONS = frozenset({torch.float32, torch.float16, torch.bfloat16})
# int8 modules' outputs also quantized on their way out (the module's boundary both ways); off by measurement:
# ResNet-50 0.0467 -> 0.0352 rel-L2, trained MiniLM 0.464 -> 0.161 (bench/RESULTS.md "Issue 22 round two")
QUANTIZE_EXITS = False
# activation smoothing of int8 Linears' inputs (calibrate/smoothing.py): its alpha, None for none; chosen by
# measurement (bench/RESULTS.md "Issue 22 round two: int8 numerics")
SMOOTHING_ALPHA: float | None = smoothing.DEFAULT_ALPHA


@dataclasses.dataclass(frozen=True)
class Request:
    """One call of the configurator, as given (the log's first table)."""

    id: int
    api: str  # "set_precision" | "set_model_input_precision" | "set_model_output_precision"
    target: Any  # module, module type or path (set_precision); None for model inputs/outputs
    activation: Any  # dtype; for inputs/outputs a dtype or a tuple of (dtype | None)
    param: torch.dtype | None = None
    label: str = ""  # how the log names the target

    def target_text(self) -> str:
        return self.label

    def precision_text(self) -> str:
        if isinstance(self.activation, tuple):
            return "[" + ", ".join(short_name(d) if d is not None else "None" for d in self.activation) + "]"
        text = f"activation={short_name(self.activation)}"
        return text + (f", param={short_name(self.param)}" if self.param is not None else "")


class MixedPrecisionConfigurator:
    """Collects precision requests for ``model``; ``apply(inputs)`` turns them into a PrecisionPlan."""

    def __init__(self, model: torch.nn.Module):
        if not isinstance(model, torch.nn.Module):
            raise ConfigError(
                f"MixedPrecisionConfigurator needs the torch.nn.Module whose modules the requests name, got "
                f"{type(model).__name__}."
            )
        self._model = model
        self._requests: list[Request] = []

    def set_precision(self, target, activation, param=None) -> None:
        """Set the precision of a module (leaf or non-leaf), of every module of a type, or of a module path."""
        is_type = isinstance(target, type) and issubclass(target, torch.nn.Module)
        if not (isinstance(target, (torch.nn.Module, str)) or is_type):
            raise ConfigError(
                f"set_precision target {target!r} is not a module, a module type (e.g. torch.nn.Linear) or a "
                "module path string (e.g. 'encoder.layers.3')."
            )
        act = parse_dtype(activation, what="activation", allowed=_PRECISIONS)
        par = parse_dtype(param, what="param", allowed=_PRECISIONS) if param is not None else None
        self._add("set_precision", target, act, par)

    def set_model_input_precision(self, activation) -> None:
        """Round model inputs to this precision on entry: one value for every float input, or one per input
        tensor with None for inputs left as they are."""
        self._add("set_model_input_precision", None, _io_precisions(activation, "set_model_input_precision"))

    def set_model_output_precision(self, activation) -> None:
        """Give model outputs this dtype: one value for every float output, or one per output (None: untouched)."""
        self._add("set_model_output_precision", None, _io_precisions(activation, "set_model_output_precision"))

    def _add(self, api, target, activation, param=None) -> None:
        self._requests.append(Request(len(self._requests) + 1, api, target, activation, param, self._label(api, target)))

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

    def apply(self, inputs, log_file=None, strict: bool = True, *, calibration_dataloader=None) -> PrecisionPlan:
        """Resolve every request on the model run with ``inputs``; returns the plan (its log in ``plan.log``).

        strict=True raises ConfigError for a request that cannot be realised as asked; strict=False warns
        (UserWarning) and takes the latest request. ``calibration_dataloader`` (a mixprec extension): the
        batches int8 ranges are calibrated on — any form and sizes ``mixprec.compile``'s calibration takes
        (tuples, dicts by forward's names, a DataLoader); without it, ``inputs``.
        """
        if not isinstance(strict, bool):
            raise ConfigError(f"strict must be True or False, got {strict!r}.")
        args = as_input_tuple(inputs)
        captured = CapturedModel(self._model, args)
        base, info = captured.base, captured.info
        resolver = _Resolver(self._model, base, info, strict)
        decisions = resolver.decide(self._requests, _OneCalibration(captured, calibration_dataloader))
        plan = PrecisionPlan(
            decisions, inputs=resolver.io_positions(self._requests, "input"),
            outputs=resolver.io_positions(self._requests, "output"),
        )
        full = planner.build_plan(info, PlanningOptions(plan=plan), int8_ranges=resolver.marker_ranges)
        realised = realise(captured, full, keep_io_types=True)
        text = render_log(self._requests, resolver, info, full, realised)
        if log_file is not None:
            with open(os.fspath(log_file), "w", encoding="utf-8") as fh:
                fh.write(text)
        return PrecisionPlan(plan, inputs=plan.inputs, outputs=plan.outputs, log=text)


class _OneCalibration:
    """The configurator's one calibration (``calibrate.entry.run``), made when first needed: the int8 requests'
    boundary values and the int8 marker regions without ranges are ranged in the same run."""

    def __init__(self, captured: CapturedModel, data):
        self.captured, self.data, self._done = captured, data, None

    def ranges(self, values=()) -> dict:
        """int8 ranges of ``values`` and of the marker regions; the first call runs the calibration."""
        if self._done is None:
            self._done = calibration_entry.run(self.captured, self.data, statistics=False, int8_values=values)
        missing = set(values) - set(self._done.int8_ranges)
        if missing:  # decide() asks once with every value it needs: a second, wider request is a bug
            raise InvariantError(f"the configurator's calibration ran before it was asked for {sorted(missing)}")
        return dict(self._done.int8_ranges)

    def channel_ranges(self, values) -> dict | None:
        """Per-channel ranges of ``values`` (``calibrate/channels.py``) from one more pass over the data; None when
        the data cannot be read again here (a one-shot iterator, shards on Ray workers)."""
        if not values:
            return {}
        if self.data is not None and (as_shards(self.data) is not None or not readable_twice(self.data)):
            return None
        calibration, _ = calibrate(self.captured, self.data, channels=frozenset(values))
        return dict(calibration.channels)


class _Resolver:
    """Maps requests onto graph layers; remembers the winners and the problems for the log."""

    def __init__(self, model, base: WorkProgram, info, strict: bool):
        self.model = model
        self.base = base
        self.info = info
        self.strict = strict
        self.problems: list[str] = []
        self.smoothed: dict = {}  # int8 Linear input -> (divisors, range, readers): what the log states
        self.operandless: frozenset[str] = frozenset()  # int8 matmul-class layers whose operands stay float
        self._signs: dict = {}  # the sign analysis's memory
        self.marker_ranges: dict = {}  # int8 marker regions without ranges: calibrated in decide()
        self.winner: dict[str, Request] = {}  # layer -> request whose activation it gets
        self.param: dict[str, torch.dtype | None] = {}  # layer -> the param dtype its request gives (None: not given)
        self.io_winners: dict[str, dict[int, tuple[torch.dtype, int]]] = {}  # "input"/"output" -> position -> ...
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
    def decide(self, requests, calibration: _OneCalibration) -> dict[str, NodePrecision]:
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
        int8 = self._int8_specs(calibration)
        # marker regions without ranges calibrate on the same pass (run only if some exist or int8 asked it)
        self.marker_ranges = calibration.ranges()
        out = {}
        for name, request in self.winner.items():
            activation, param = request.activation, self.param[name]
            reason = f"request #{request.id} set_precision({request.target_text()}, {request.precision_text()})"
            smoothed = [inp for inp, _ in int8[name].smoothing] if name in int8 else []
            if smoothed:
                reason += (f"; input {', '.join(smoothed)} smoothed: divided per channel by s, weight columns "
                           f"multiplied by s (alpha {SMOOTHING_ALPHA})")
            if activation == torch.int8 and name in self.operandless:
                reason += ("; its operands stay float: the attention's output matmul reads the softmax probabilities "
                           "(plan/int8_operands.py, QUANTIZE_PROBABILITIES)")
            elif activation == torch.int8 and self.info[name].flops == 0:
                reason += ("; no int8 arithmetic for this op: it computes in float32 on dequantized values, inside the "
                           "module's int8 region (only matmul, convolution and attention layers run int8)")
            out[name] = NodePrecision(
                activation, None, "plan", reason, param if param != activation else None, int8.get(name)
            )
        return out

    def _paths_of(self, request: Request) -> list[str]:
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

    def _int8_specs(self, calibration: _OneCalibration) -> dict[str, Int8Spec]:
        """Quantize the values entering each int8 module from outside (and those leaving it with QUANTIZE_EXITS)."""
        groups: dict[str, set[str]] = {}
        for name, request in self.winner.items():
            if request.activation == torch.int8:
                groups.setdefault(self.info[name].module, set()).add(name)
        if not groups:
            return {}
        stored = {s.arg.name for s in self.base.input_specs if s.kind in STORED_KINDS and hasattr(s.arg, "name")}
        nodes = {n.name: n for n in self.base.graph.nodes}
        entries: dict[str, list[str]] = {}
        exits: set[str] = set()
        for group in groups.values():
            for name in group:
                node = self.info[name]
                entries[name] = [
                    inp for inp, d in node.input_dtypes.items()
                    if d is not None and d.is_floating_point and inp not in group and inp not in stored
                ]
                if QUANTIZE_EXITS and any(user.name not in group for user in nodes[name].users):
                    exits.add(name)
            # matmul-class and attention layers: their activation operands, wherever made (plan/int8_operands.py)
            in_order = [n for n in nodes.values() if n.name in group]
            self.operandless |= {n.name for n in in_order if int8_operands.is_operand_op(n)
                                 and not int8_operands.operands(n, stored)}
            entries.update(int8_operands.place(in_order, frozenset(group), entries, stored))
        wanted = {n for names in entries.values() for n in names} | exits
        ranges = calibration.ranges(wanted)
        smoothed = self._smoothing(groups, entries, nodes, calibration)
        self.smoothed = smoothed
        specs = {}
        for group in groups.values():
            for name in group:
                mine = {inp: smoothed[inp] for inp in entries[name] if inp in smoothed and name in smoothed[inp][2]}
                specs[name] = Int8Spec(
                    tuple((inp, mine[inp][1] if inp in mine else ranges[inp]) for inp in entries[name]),
                    ranges[name] if name in exits else None,
                    tuple((inp, tuple(mine[inp][0].tolist())) for inp in mine),
                )
        return specs

    def _smoothing(self, groups, entries, nodes, calibration: _OneCalibration) -> dict:
        """Activation smoothing of int8 Linears' inputs (``calibrate/smoothing.py``): input value -> (divisors,
        range of input / divisors, the Linears that read it smoothed). One divisor vector per value, shared by
        every int8 Linear reading it; values the graph proves never negative keep the unsigned grid instead."""
        if SMOOTHING_ALPHA is None:
            return {}
        readers: dict[str, list[str]] = {}
        for group in groups.values():
            for name in group:
                node = nodes[name]
                if node.target is not torch.ops.aten.linear.default or len(node.args) < 2:
                    continue
                x, w = node.args[0], node.args[1]
                if not isinstance(x, torch.fx.Node) or x.name not in entries[name] or self._stored_weight(w) is None:
                    continue
                if is_nonnegative(x, self._signs):
                    continue
                readers.setdefault(x.name, []).append(name)
        channels = calibration.channel_ranges(set(readers))
        if not channels:
            return {}
        out = {}
        for value, layers in readers.items():
            x = channels.get(value)
            weights = [self._stored_weight(nodes[layer].args[1]) for layer in layers]
            if x is None or any(w.dim() != 2 or w.shape[1] != x.mins.numel() for w in weights):
                continue
            column = torch.stack([smoothing.column_absmax(w).to(x.mins.device) for w in weights]).amax(dim=0)
            s = smoothing.divisors(x, column, SMOOTHING_ALPHA)
            out[value] = (s, smoothing.smoothed_range(x, s), frozenset(layers))
        return out

    def _stored_weight(self, node):
        """The stored tensor a weight argument is (a parameter/buffer/constant placeholder), else None."""
        if not isinstance(node, torch.fx.Node) or node.op != "placeholder":
            return None
        spec = self.base.input_spec_of(node)
        return self.base.stored_tensor(spec) if spec is not None and spec.kind in STORED_KINDS else None

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
                out.update({i: (wanted, request.id) for i, d in enumerate(dtypes) if d is not None and d.is_floating_point})
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


def _io_precisions(value, api: str):
    if isinstance(value, (list, tuple)):
        return tuple(
            parse_dtype(v, what=f"{api}[{i}]", allowed=_IO_PRECISIONS) if v is not None else None
            for i, v in enumerate(value)
        )
    return parse_dtype(value, what=api, allowed=_IO_PRECISIONS)
