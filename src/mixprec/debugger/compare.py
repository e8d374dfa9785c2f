"""Run the fp32 reference and a mixed program in lockstep and compare every layer by node name.

Both programs are rewrites of the same normalised capture, so their layers appear in the same
order and keep their names; the rewrite only adds casts (and fp32-accumulation wrappers)
around them. The mixed program runs on the graph runner (``ir/runner.py``) with a lockstep
observer: when it produces a layer's value, the reference (stepped by its own runner) is advanced
just until it produced the same layer, the two values are compared in fp64
(``numerics.ErrorStats``), and only the statistics are kept. Each runner drops values after their
last use, so the memory held is two live sets and one pair of layer outputs — never every
intermediate of both programs.

This is the machinery ``mixprec.debug`` builds on; a precision search can reuse it to measure
per-layer sensitivity of many candidate programs against one reference.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram

from ..dtypes import is_float
from ..errors import InvariantError
from ..ir.graph_info import META_ACC, META_ROLE, META_SMOOTHED, GraphInfo, describe
from ..ir.runner import GraphRunner, Observer
from ..output.numerics import ErrorStats, float_leaves, output_errors
from ..plan.precision_plan import PrecisionPlan
from ..rewrite.casting import is_mixprec_cast, origin_name
from .records import LayerComparison

_COMPARED_KINDS = ("compute", "cast")


def compare_programs(
    reference: ExportedProgram,
    mixed: ExportedProgram,
    info: GraphInfo,
    plan: PrecisionPlan,
    user_values: list,
    *,
    layers: Iterable[str] | None = None,
) -> tuple[list[LayerComparison], dict]:
    """Per-layer comparisons (graph order) and the error of the user outputs (``output_errors``).

    ``layers`` restricts the comparison (default: every compute layer and cast of ``info`` that is
    in both programs). ``user_values`` are the flat user inputs; each program gets its own clone.
    """
    ref_nodes = {n.name for n in reference.graph.nodes}
    mix_nodes = {n.name: n for n in mixed.graph.nodes}
    wanted = set(layers) if layers is not None else {n for n, node in info.items() if node.kind in _COMPARED_KINDS}
    wanted &= ref_nodes & set(mix_nodes)
    # the value a layer's consumers see: after its rounding cast when it accumulates in fp32
    target = {}
    for name in wanted:
        node = mix_nodes[name]
        if node.meta.get(META_ACC) is not None:
            rounding = [u for u in node.users if u.meta.get(META_ROLE) == "acc_cast"]
            node = rounding[0] if rounding else node
        target[node.name] = name

    reference_values = _Reference(reference, _clones(user_values), wanted)
    lockstep = _Lockstep(reference_values, target, info, plan, mix_nodes)
    mixed_out = GraphRunner(mixed, observers=[_NamesLayer("the mixed program"), lockstep]).run(_clones(user_values))
    ref_out = reference_values.finish()
    return lockstep.records, output_errors(mixed_out, ref_out)


class _Lockstep(Observer):
    """Observes the mixed program: each layer it produces is compared with the reference's value of it."""

    def __init__(self, reference: "_Reference", target: dict, info: GraphInfo, plan: PrecisionPlan, mix_nodes: dict):
        self._reference = reference
        self._target = target  # mixed node whose value is compared -> layer name
        self._info = info
        self._plan = plan
        self._mix_nodes = mix_nodes
        self._source = None  # the value a mixprec cast is about to convert
        self._overflowed: dict[str, str] = {}  # mixprec cast node -> origin of the value that overflowed in it
        self._errors: dict[str, float] = {}
        self.records: list[LayerComparison] = []

    def before(self, node, args, kwargs) -> None:
        self._source = args[0] if is_mixprec_cast(node) else None

    def after(self, node, value) -> None:
        source, self._source = self._source, None
        if source is not None and _overflows(source, value):
            self._overflowed[node.name] = origin_name(node)
        name = self._target.get(node.name)
        if name is None:
            return
        stats = _stats(name, _unsmoothed(node, value), self._reference.get(name))
        if stats is None:
            return
        input_error = _input_error(name, self._info, self._errors)
        self._errors[name] = stats["rel_l2_error"]
        overflowed = _overflowed_inputs(self._mix_nodes[name], self._overflowed)
        self.records.append(_record(name, self._info[name], self._plan.get(name), stats, input_error, overflowed))


class _Reference:
    """The reference program, advanced only as far as the mixed program needs."""

    def __init__(self, program: ExportedProgram, user_values: list, wanted: set[str]):
        self._steps = GraphRunner(program, observers=[_NamesLayer("the fp32 reference")]).steps(user_values)
        self._wanted = wanted
        self._pending: dict[str, object] = {}
        self.outputs = None

    def get(self, name: str):
        while name not in self._pending:
            step = next(self._steps, None)
            if step is None:
                raise InvariantError(f"layer '{name}' of the mixed program never ran in the fp32 reference")
            self._keep(*step, keep=name)
        return self._pending.pop(name)

    def finish(self):
        for node, value in self._steps:
            self._keep(node, value, keep=None)
        return self.outputs

    def _keep(self, node, value, keep):
        if node.op == "output":
            self.outputs = value
        elif node.name in self._wanted:
            # a value held while the reference runs on may be overwritten by an in-place op: copy it
            self._pending[node.name] = value if node.name == keep else pytree.tree_map(_clone, value)


class _NamesLayer(Observer):
    """A kernel's error while a program runs, as an InvariantError naming the layer."""

    def __init__(self, what: str):
        self._what = what

    def failed(self, node, error) -> None:
        raise InvariantError(f"{self._what} fails at {describe(node)}: {error}") from error


def _clones(user_values) -> list:
    return [_clone(v) for v in user_values]  # a program that writes into its inputs must not touch the other's


def _clone(value):
    return value.clone() if isinstance(value, torch.Tensor) else value


def _unsmoothed(node, value):
    """A LayerNorm that took int8 activation smoothing's divisors into its affine computes the model's value
    divided by them: compared as the value the model computes (times the divisors, in fp64), so the fold is
    not reported as that layer's error."""
    divisors = node.meta.get(META_SMOOTHED)
    if divisors is None or not isinstance(value, torch.Tensor):
        return value
    return value.double() * torch.tensor(divisors, dtype=torch.float64, device=value.device)


def _stats(name: str, value, expected) -> dict | None:
    """Error and range statistics of one layer's output(s) against fp32 (``numerics.ErrorStats``):
    the error over positions finite on both sides, the inf/NaN counted apart."""
    if not float_leaves(value):
        return None
    try:
        e = ErrorStats().add(value, expected)
    except ValueError as err:
        raise InvariantError(
            f"layer '{name}' has different outputs in the mixed program and the fp32 reference: {err}"
        ) from err
    s = {key: getattr(e, key) for key in ("numel", "compared", "absmax", "ref_absmax", "nonfinite", "ref_nonfinite",
                                          "new_nonfinite")}  # fmt: skip
    s["rel_l2_error"] = e.finite_rel_l2_error
    s["max_abs_error"] = e.finite_max_abs_error
    if s["absmax"] == 0.0 and s["nonfinite"] == s["numel"]:
        s["absmax"] = math.nan  # no finite value at all
    if s["ref_absmax"] == 0.0 and s["ref_nonfinite"] == s["numel"]:
        s["ref_absmax"] = math.nan
    return s


def _input_error(name: str, info: GraphInfo, errors: dict[str, float]) -> float:
    """Largest error among the values a layer reads, looking through layers that were not compared
    (data movement, casts the rewrite folded away). Placeholders (inputs, weights) count as exact."""
    memo: dict[str, float] = {}

    def error_of(producer: str) -> float:
        if producer in errors:
            value = errors[producer]
            return value if math.isfinite(value) else 0.0
        if producer not in info:
            return 0.0
        if producer not in memo:
            memo[producer] = max((error_of(p) for p in info[producer].input_dtypes), default=0.0)
        return memo[producer]

    return max((error_of(p) for p in info[name].input_dtypes), default=0.0)


def _overflows(source, value) -> bool:
    """A cast to a narrower range (fp32 -> fp16) that turned finite values into inf."""
    if not (isinstance(value, torch.Tensor) and isinstance(source, torch.Tensor)):
        return False
    if not (is_float(value.dtype) and is_float(source.dtype)):
        return False
    if torch.finfo(value.dtype).max >= torch.finfo(source.dtype).max:
        return False
    return int((~value.isfinite()).sum()) > int((~source.isfinite()).sum())


def _overflowed_inputs(node, overflowed: dict[str, str]) -> tuple[str, ...]:
    found = []
    for inp in node.all_input_nodes:
        while is_mixprec_cast(inp):
            if inp.name in overflowed and overflowed[inp.name] not in found:
                found.append(overflowed[inp.name])
            inp = inp.args[0]
    return tuple(found)


def _record(name, node_info, decision, s, input_error, overflowed_inputs) -> LayerComparison:
    rel = s["rel_l2_error"]
    return LayerComparison(
        name=name,
        op=node_info.op,
        module=node_info.module,
        module_type=node_info.module_type,
        kind=node_info.kind,
        precision=decision.precision if decision is not None else node_info.precision,
        source=decision.source if decision is not None else "default",
        numel=s["numel"],
        rel_l2_error=rel,
        max_abs_error=s["max_abs_error"],
        absmax=s["absmax"],
        ref_absmax=s["ref_absmax"],
        nonfinite=s["nonfinite"],
        ref_nonfinite=s["ref_nonfinite"],
        new_nonfinite=s["new_nonfinite"],
        input_error=input_error,
        error_jump=rel - input_error if math.isfinite(rel) else math.nan,
        overflowed_inputs=overflowed_inputs,
    )
