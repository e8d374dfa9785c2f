"""Run the fp32 reference and a mixed program in lockstep and compare every layer by node name.

Both programs are rewrites of the same normalised capture, so their layers appear in the same
order and keep their names; the rewrite only adds casts (and fp32-accumulation wrappers)
around them. The mixed program runs node by node (``interpret.GraphRunner``); when it
produces a layer's value, the reference is advanced just until it produced the same layer, the
two values are compared in fp64 (``numerics.ErrorStats``), and only the statistics are kept. Each runner drops values
after their last use, so the memory held is two live sets and one pair of layer outputs —
never every intermediate of both programs.

This is the machinery ``mixprec.debug`` builds on; a precision search can reuse it to measure
per-layer sensitivity of many candidate programs against one reference.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.export.graph_signature import OutputKind

from ..dtypes import is_float
from ..errors import InvariantError
from ..ir.diagnose import describe
from ..ir.graph_info import META_ACC, META_ROLE, GraphInfo
from ..ir.runner import GraphRunner, lifted_inputs
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
    ref_runner = _runner(reference, user_values)
    mix_runner = _runner(mixed, user_values)
    ref_nodes = {n.name for n in ref_runner.nodes}
    mix_nodes = {n.name: n for n in mix_runner.nodes}
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

    reference_values = _Reference(ref_runner, reference, wanted)
    overflowed: dict[str, str] = {}  # mixprec cast node -> origin of the value that overflowed in it
    errors: dict[str, float] = {}
    records: list[LayerComparison] = []
    mixed_out = None
    for node in mix_runner.nodes:
        if node.op == "output":
            mixed_out = _user_outputs(mixed, mix_runner.inputs(node)[0][0])
        source = mix_runner.inputs(node)[0][0] if is_mixprec_cast(node) else None
        value = _run(mix_runner, node, "the mixed program")
        if source is not None and _overflows(source, value):
            overflowed[node.name] = origin_name(node)
        name = target.get(node.name)
        if name is None:
            continue
        expected = reference_values.get(name)
        stats = _stats(name, value, expected)
        if stats is None:
            continue
        input_error = _input_error(name, info, errors)
        errors[name] = stats["rel_l2_error"]
        records.append(
            _record(name, info[name], plan.get(name), stats, input_error, _overflowed_inputs(mix_nodes[name], overflowed))
        )
    ref_out = reference_values.finish()
    outputs = output_errors(mixed_out, ref_out) if mixed_out is not None and ref_out is not None else {}
    return records, outputs


class _Reference:
    """The reference program, advanced only as far as the mixed program needs."""

    def __init__(self, runner: GraphRunner, program: ExportedProgram, wanted: set[str]):
        self._runner = runner
        self._program = program
        self._nodes = iter(runner.nodes)
        self._wanted = wanted
        self._pending: dict[str, object] = {}
        self.outputs = None

    def get(self, name: str):
        while name not in self._pending:
            node = next(self._nodes, None)
            if node is None:
                raise InvariantError(f"layer '{name}' of the mixed program never ran in the fp32 reference")
            self._step(node, keep=name)
        return self._pending.pop(name)

    def finish(self):
        for node in self._nodes:
            self._step(node, keep=None)
        return self.outputs

    def _step(self, node, keep):
        if node.op == "output":
            self.outputs = _user_outputs(self._program, self._runner.inputs(node)[0][0])
        value = _run(self._runner, node, "the fp32 reference")
        if node.name in self._wanted:
            # a value held while the reference runs on may be overwritten by an in-place op: copy it
            self._pending[node.name] = value if node.name == keep else pytree.tree_map(_clone, value)


def _runner(program: ExportedProgram, user_values) -> GraphRunner:
    values = [_clone(v) for v in user_values]  # a program that writes into its inputs must not touch the other's
    return GraphRunner(
        program.graph_module,
        lifted_inputs(program.graph_signature.input_specs, program.state_dict, program.constants, values),
    )


def _clone(value):
    return value.clone() if isinstance(value, torch.Tensor) else value


def _run(runner: GraphRunner, node, what: str):
    try:
        return runner.run(node)
    except Exception as e:  # a kernel's error: say which layer
        raise InvariantError(f"{what} fails at {describe(node)}: {e}") from e


def _user_outputs(program: ExportedProgram, values) -> list:
    specs = program.graph_signature.output_specs
    return [v for spec, v in zip(specs, values) if spec.kind == OutputKind.USER_OUTPUT]


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
