"""Fixes the debugger proposes, measured: what keeping a layer (or a few) in fp32 does to the OUTPUT error.

The layer with the largest error jump is where the most error is *added*, not where the output error comes from:
error added early is diluted by the residual stream, error added at the end reaches the output unchanged (in a
2-layer Qwen2 decoder in bf16, keeping the first layer's ``q_proj``, the largest jump, in fp32 did not help;
``lm_head``, twelfth by jump, did). So the debugger does not guess: for a few candidates it realises the program with
the fix applied (the plan with those layers in fp32, on the same capture), runs it on the inputs, and ranks the
findings by the output error that remains.

Candidates, at most ``limit`` (their order is the heuristic that picks which to measure):

1. the first layer that produced inf/NaN;
2. the low-precision layers that produce a program output (through data movement only): their rounding reaches the
   output as it is;
3. the layers by error jump, largest first.

"Low precision" is any decision that rounds more than fp32 (:func:`lowers`): a low float type, an integer precision
or integer weights. A low-precision layer's fix keeps it in fp32; an fp32 layer whose error came with its inputs is
fixed by keeping its low-precision producers in fp32. Either way the data-movement nodes after the fixed layers that
only followed their dtype go to fp32 with them: otherwise they would round the value again.

Every fix is also code that does exactly what was measured: a plan edit passed to ``mixprec.compile``
(:func:`fix_code`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable

import torch

from ..dtypes import LOW_PRECISION_FLOATS, is_float
from ..ir.captured import CapturedModel
from ..ir.graph_info import GraphInfo
from ..ir.runner import run_user_outputs
from ..output.numerics import output_errors
from ..plan.follow import transparent
from ..plan.precision_plan import NodePrecision, PrecisionPlan
from ..plan.quantization import INTEGER_PRECISIONS, WEIGHT_GRIDS
from ..rewrite.pipeline import realise
from .records import LayerComparison

REASON = "kept in fp32 by mixprec.debug"
HELPS = 0.01  # a fix that lowers the output error by less than 1% is reported as without effect


@dataclasses.dataclass(frozen=True)
class Candidate:
    kind: str  # "nonfinite" | "output" | "error_jump"
    record: LayerComparison
    layers: tuple[str, ...]  # what the fix puts in fp32, in graph order


def candidates(
    layers: list[LayerComparison], info: GraphInfo, plan: PrecisionPlan, limit: int, *, variants: bool = True
) -> list[Candidate]:
    """At most ``limit`` fixes worth measuring, in the order of the heuristic (see the module docstring).

    A layer may come with two fixes (adjacent in the list): alone, and with more layers — for the first
    inf/NaN the low-precision layers whose fp32 values exceed their type's range (an overflow in fc1
    is an overflow in the relu after it too), for an error jump its low-precision producers (a
    cancellation ``(x + 1000) - 1000`` loses the digits in the add, and shows them missing in the sub).
    ``variants=False``: the first fix of each layer only (when nothing is measured, one is as good as another)."""
    by_name = {r.name: r for r in layers}
    ordered: list[tuple[str, LayerComparison, list[str]]] = []
    first = next((r for r in layers if r.new_nonfinite > 0), None)
    if first is not None:
        own = roots_of(first, info, plan)
        ordered.append(("nonfinite", first, own))
        if variants:
            out_of_range = [r.name for r in layers if _out_of_range(r, info, plan, by_name)]
            ordered.append(("nonfinite", first, own + out_of_range))
    ordered += [("output", by_name[n], [n]) for n in output_producers(info, plan) if n in by_name]
    jumps = sorted((r for r in layers if math.isfinite(r.error_jump) and r.error_jump > 0), key=lambda r: -r.error_jump)
    for r in jumps:
        own = roots_of(r, info, plan)
        ordered.append(("error_jump", r, own))
        if variants and is_low(plan, r.name):
            ordered.append(("error_jump", r, own + low_producers(r.name, info, plan)))
    out, seen = [], set()
    for kind, r, roots in ordered:
        fixed = with_followers(roots, info, plan)
        if not fixed or frozenset(fixed) in seen:
            continue
        seen.add(frozenset(fixed))
        out.append(Candidate(kind, r, fixed))
        if len(out) >= limit:
            break
    return out


def roots_of(r: LayerComparison, info: GraphInfo, plan: PrecisionPlan) -> list[str]:
    """What to keep in fp32 for ``r``: itself if it computes in low precision, else its low-precision producers."""
    return [r.name] if is_low(plan, r.name) else low_producers(r.name, info, plan)


def _out_of_range(r: LayerComparison, info: GraphInfo, plan: PrecisionPlan, by_name: dict) -> bool:
    """A low-precision layer that made inf/NaN and whose fp32 values, read or produced, exceed its type's range."""
    if not is_low(plan, r.name) or r.new_nonfinite == 0 or r.precision not in LOW_PRECISION_FLOATS:
        return False
    return max(r.ref_absmax, input_absmax(r.name, info, by_name)) > torch.finfo(r.precision).max


def input_absmax(name: str, info: GraphInfo, by_name: dict) -> float:
    """The largest finite fp32 |value| a layer reads, from the compared layers behind it (through data movement)."""
    out, seen, stack = 0.0, set(), list(info[name].input_dtypes)
    while stack:
        p = stack.pop()
        if p in seen or p not in info:
            continue
        seen.add(p)
        if p in by_name:
            value = by_name[p].ref_absmax
            out = max(out, value) if math.isfinite(value) else out
        else:
            stack.extend(info[p].input_dtypes)
    return out


def is_low(plan: PrecisionPlan, name: str) -> bool:
    decision = plan.get(name)
    return decision is not None and lowers(decision)


def lowers(decision: NodePrecision) -> bool:
    """The decision rounds more than fp32: a low float type, an integer precision or integer weights."""
    return decision.precision in LOW_PRECISION_FLOATS or integer(decision)


def integer(decision: NodePrecision) -> bool:
    """Integer activations (int8, simulated int16/int4) or compressed weights (a weight format, simulated integers)."""
    return (decision.precision in INTEGER_PRECISIONS or decision.param_dtype in WEIGHT_GRIDS
            or decision.weights is not None)


def low_producers(name: str, info: GraphInfo, plan: PrecisionPlan) -> list[str]:
    """The low-precision layers whose values reach ``name`` through data movement (or unplanned nodes)."""
    found, seen, stack = [], set(), list(info[name].input_dtypes)
    while stack:
        p = stack.pop()
        if p in seen or p not in info:
            continue
        seen.add(p)
        decision = plan.get(p)
        if info[p].kind == "movement" or decision is None:
            stack.extend(info[p].input_dtypes)
        elif lowers(decision):
            found.append(p)
    return sorted(found, key=list(info).index)


def output_producers(info: GraphInfo, plan: PrecisionPlan) -> list[str]:
    """Low-precision layers that produce a program output through dtype-transparent nodes only."""
    found, seen, stack = [], set(), [n for n in info if n in info.outputs]
    while stack:
        name = stack.pop()
        if name in seen or name not in info:
            continue
        seen.add(name)
        if transparent(info[name]):
            stack.extend(info[name].input_dtypes)
        elif is_low(plan, name) and info[name].kind == "compute":
            found.append(name)
    return sorted(found, key=list(info).index)


def with_followers(roots: Iterable[str], info: GraphInfo, plan: PrecisionPlan) -> tuple[str, ...]:
    """``roots`` and the dtype-transparent low-precision nodes after them whose float producers are then all fp32."""
    users: dict[str, list[str]] = {}
    for name, node in info.items():
        for producer in node.input_dtypes:
            users.setdefault(producer, []).append(name)
    fixed = set(roots)
    stack = list(fixed)
    while stack:
        for user in users.get(stack.pop(), ()):
            if user in fixed or not is_low(plan, user) or not transparent(info[user]):
                continue
            producers = [p for p, d in info[user].input_dtypes.items() if p in info and is_float(d)]
            if all(p in fixed or not is_low(plan, p) for p in producers):
                fixed.add(user)
                stack.append(user)
    return tuple(sorted(fixed, key=list(info).index))


def fixed_plan(plan: PrecisionPlan, layers: Iterable[str]) -> PrecisionPlan:
    """The plan with ``layers`` in fp32: what the printed code builds (``fix_code``)."""
    return plan.with_nodes({name: NodePrecision(torch.float32, source="plan", reason=REASON) for name in layers})


class Measurer:
    """Runs the program with a fix applied on the debugger's inputs: a ``findings.Measure``."""

    def __init__(self, captured: CapturedModel, plan: PrecisionPlan, user_values: list, reference_outputs,
                 *, keep_io_types: bool):  # fmt: skip
        self.captured = captured
        self.plan = plan
        self.user_values = user_values
        self.reference_outputs = reference_outputs
        self.keep_io_types = keep_io_types

    def __call__(self, layers: tuple[str, ...]) -> tuple[float, float, float]:
        """(output rel-L2, max abs error, low-precision FLOP share) of the program with ``layers`` in fp32."""
        plan = fixed_plan(self.plan, layers)
        work = realise(self.captured, plan, keep_io_types=self.keep_io_types, verify_each=False)
        self.captured.reset_state()  # every run starts from the captured state (ir/written_state.py)
        with torch.no_grad():
            values = [v.clone() if isinstance(v, torch.Tensor) else v for v in self.user_values]
            outputs = run_user_outputs(work, values)
        errors = output_errors(outputs, self.reference_outputs)
        return errors["rel_l2_error"], errors["max_abs_error"], low_flops_fraction(self.captured.info, plan)


def low_flops_fraction(info: GraphInfo, plan: PrecisionPlan) -> float:
    """The share of matmul/conv FLOPs in low precision (as the report's summary counts it)."""
    compute = [(n, node.flops) for n, node in info.items() if node.kind == "compute" and n in plan]
    total = sum(f for _, f in compute)
    low = sum(f for n, f in compute if plan[n].precision not in (torch.float32, torch.float64))
    return low / total if total else 0.0


def helps(before: float, after: float | None) -> bool:
    """The fix lowers the output error by at least ``HELPS`` (or makes a non-finite error finite)."""
    if after is None or not math.isfinite(after):
        return False
    return not math.isfinite(before) or after < before * (1 - HELPS)


def fix_code(layers: tuple[str, ...], *, plan_of: str, call: str, settings: dict, measured: float | None) -> str:
    """Python that builds and compiles the fixed plan, runnable as pasted (``plan_of``: the expression of the
    debugged plan, e.g. ``prog.plan``; ``call``: compile's first arguments, e.g. ``model, inputs``)."""
    quoted = [json.dumps(n) for n in layers]  # a Python string literal whatever the name holds (a file's names)
    names = ", ".join(quoted)
    if len(names) > 70:  # one name a line keeps every line short
        names = "\n" + "".join(f"    {n},\n" for n in quoted)
    extra = "".join(f", {k}={v}" for k, v in _compile_settings(settings).items())
    lines = [
        "import torch",
        "import mixprec",
        "",
        f'fp32 = mixprec.NodePrecision(torch.float32, source="plan", reason="{REASON}")',
        f"plan = {plan_of}.with_nodes({{name: fp32 for name in [{names}]}})",
        f"prog = mixprec.compile({call}, plan=plan{extra})",
    ]
    check = 'print(prog.report.summary["rel_l2_error"])'
    if measured is not None:
        check += f"  # mixprec.debug measured {measured:.3g}"
    return "\n".join(lines + [check])


def _compile_settings(settings: dict) -> dict[str, str]:
    """The compile settings the fixed program needs besides the plan (which decides every layer)."""
    out = {}
    if settings.get("keep_io_types") is False:
        out["keep_io_types"] = "False"
    if settings.get("backend", "eager") != "eager":
        out["backend"] = repr(settings["backend"])
    if settings.get("runtime_guard"):
        out["runtime_guard"] = repr(settings["runtime_guard"])
    if "dynamic_shapes" in settings:
        out["dynamic_shapes"] = "dynamic_shapes"  # given as an object: the user's own variable
    return out
