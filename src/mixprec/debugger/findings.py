"""Findings: the layers worth fixing, each with its fix as code, ranked by what the fix does to the output.

Which layers are candidates, and how a fix is measured, is ``fixes.py``. This module words them:
what happened at the layer (the first inf/NaN it made, the error it added — its output's relative
error minus its inputs', so a catastrophic cancellation stands out even when every layer after it
shows the same error — or that it produces a program output in low precision), the fix as code
(a plan edit for ``mixprec.compile``, exactly what was measured), and the other ways to keep the
layer in fp32 in the terms of whoever decided its dtype: an autocast exclusion or rule for layers
the compiler lowered, a configurator call for plan requests, a change of code for the model's own
typing.

Ranking: with measurements, the findings whose fix lowers the output error come first, by the
error left (fewer layers first on a tie); the rest follow in the heuristic's order. Without them
(a program loaded from a file, ``fixes=0``) the heuristic's order stands.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import torch

from ..dtypes import LOW_PRECISION_FLOATS, dtype_name
from ..ir.graph_info import GraphInfo
from ..plan.precision_plan import PrecisionPlan
from ..plan.rules.ranges import DEFAULT, io_bound
from . import fixes
from .records import Finding, Fix, LayerComparison


# (layers to keep in fp32) -> (output rel-L2, max abs, low-precision FLOP share) of the program so fixed
Measure = Callable[[tuple[str, ...]], tuple[float, float, float]]
# (layers, measured rel-L2 or None) -> the code that applies the fix (fixes.fix_code with the caller's names)
Code = Callable[[tuple[str, ...], "float | None"], str]


def find(
    layers: list[LayerComparison],
    info: GraphInfo,
    plan: PrecisionPlan,
    *,
    limit: int = 3,
    measure: Measure | None = None,
    before: float = math.nan,
    code: Code | None = None,
    progress=None,
    candidates: list[fixes.Candidate] | None = None,
) -> list[Finding]:
    """Findings for ``candidates`` (default: up to ``limit`` of ``fixes.candidates``); each fix measured when
    ``measure`` is given (``before``: the output error without any fix), and ranked by it."""
    code = code or (lambda names, measured: fixes.fix_code(names, plan_of="prog.plan", call="model, inputs",
                                                           settings={}, measured=measured))  # fmt: skip
    if candidates is None:
        candidates = fixes.candidates(layers, info, plan, limit, variants=measure is not None)
    largest = max((c.record.error_jump for c in candidates if math.isfinite(c.record.error_jump)), default=0.0)
    best: dict[tuple[str, str], tuple[fixes.Candidate, Fix]] = {}  # one finding a layer: its best fix measured
    for i, c in enumerate(candidates):
        key = (c.kind, c.record.name)
        if measure is None:
            best.setdefault(key, (c, Fix(c.layers, code(c.layers, None), compute=_compute(c.layers, info))))
            continue
        if progress is not None:
            progress.update(
                f"measuring fix {i + 1}/{len(candidates)}: {c.record.name} ({len(c.layers)} layers in fp32)"
            )
        fix = measured_fix(c.layers, measure, before, code, info)
        if key not in best or _better(fix, best[key][1]):
            best[key] = (c, fix)
    findings = [
        Finding(c.kind, c.record.name, c.record.module, c.record.op, c.record.precision,
                _message(c, info, plan, largest), _suggestions(c.record, info, plan, layers), fix)  # fmt: skip
        for c, fix in best.values()
    ]
    return rank(findings)


def _better(fix: Fix, other: Fix) -> bool:
    """A larger fix is worth it only when it lowers the error by at least ``fixes.HELPS`` more."""
    if len(fix.layers) <= len(other.layers):
        return fix.rel_l2_error <= other.rel_l2_error
    return fixes.helps(other.rel_l2_error, fix.rel_l2_error)


def measured_fix(layers: tuple[str, ...], measure: Measure, before: float, code: Code, info: GraphInfo) -> Fix:
    rel, max_abs, low = measure(layers)
    return Fix(layers, code(layers, rel), rel, max_abs, low, fixes.helps(before, rel), _compute(layers, info))


def _compute(layers: tuple[str, ...], info: GraphInfo) -> tuple[str, ...]:
    return tuple(n for n in layers if info[n].kind != "movement")


def rank(findings: list[Finding]) -> list[Finding]:
    """Helpful fixes first, by the output error they leave; the others after, in the heuristic's order."""
    helpful = [f for f in findings if f.helps]
    helpful.sort(key=lambda f: (f.fix.rel_l2_error, len(f.fix.layers)))
    return helpful + [f for f in findings if not f.helps]


def combined(findings: list[Finding], info: GraphInfo, measure: Measure, before: float, code: Code) -> Fix | None:
    """The helpful fixes together (when there are two or more), measured."""
    helpful = [f for f in findings if f.helps]
    if len(helpful) < 2:
        return None
    layers = tuple(sorted({n for f in helpful for n in f.fix.layers}, key=list(info).index))
    return measured_fix(layers, measure, before, code, info)


def _where(r: LayerComparison) -> str:
    return f"layer '{r.name}' ({r.op}, module '{r.module or '(top level)'}', computes in {dtype_name(r.precision)})"


def _message(c: fixes.Candidate, info: GraphInfo, plan: PrecisionPlan, largest: float) -> str:
    r = c.record
    if c.kind == "nonfinite":
        text = _nonfinite_message(r)
    elif c.kind == "output":
        text = (
            f"{_where(r)} produces a program output: its rounding reaches the output as it is (relative error "
            f"{r.input_error:.3g} on its inputs -> {r.rel_l2_error:.3g} on its output)."
        )
    else:
        text = _jump_message(r, r.error_jump >= largest)
    decision = plan.get(r.name)
    if decision is not None and decision.reason and fixes.integer(decision):
        text += f" Its plan: {decision.reason.rstrip('.')}."  # integer activations or weights: how they are made
    if not fixes.is_low(plan, r.name):
        producers = fixes.low_producers(r.name, info, plan)
        names = ", ".join(f"'{p}' (module '{info[p].module or '(top level)'}')" for p in producers)
        text += (
            f" It computes in {dtype_name(r.precision)}: the error comes with its inputs, made in low precision by "
            f"{names}."
        )
    return text


def _nonfinite_message(r: LayerComparison) -> str:
    head = f"first inf/NaN: {_where(r)} made {r.new_nonfinite} of {r.numel} values inf/NaN where fp32 has finite values"
    if r.precision not in LOW_PRECISION_FLOATS and not r.overflowed_inputs:
        return head + f"; its fp32 output absmax is {r.ref_absmax:.3g}."
    top = torch.finfo(r.precision).max
    if r.overflowed_inputs:
        return head + (
            f": its input {', '.join(r.overflowed_inputs)} overflows {dtype_name(r.precision)} (largest value "
            f"{top:.6g}) when cast to the layer's precision."
        )
    if r.ref_absmax > top:
        return head + (
            f": its output reaches absmax {r.ref_absmax:.3g} in fp32, beyond {dtype_name(r.precision)}'s largest "
            f"value {top:.6g}."
        )
    return head + (
        f": its fp32 output is in range (absmax {r.ref_absmax:.3g}), so an intermediate result inside the op exceeded "
        f"{dtype_name(r.precision)}'s range (largest value {top:.6g}) or a divisor rounded to zero."
    )


def _jump_message(r: LayerComparison, largest: bool) -> str:
    what = "largest error jump" if largest else "error jump"
    return (
        f"{what}: {_where(r)}: relative error {r.input_error:.3g} on its inputs -> {r.rel_l2_error:.3g} on its output "
        f"(+{r.error_jump:.3g}); max abs error {r.max_abs_error:.3g}, fp32 absmax {r.ref_absmax:.3g}."
    )


def _suggestions(r: LayerComparison, info: GraphInfo, plan: PrecisionPlan, layers) -> tuple[str, ...]:
    """Other ways than the fix's plan edit to keep the layer in fp32, in the terms of whoever decided its dtype."""
    if not fixes.is_low(plan, r.name):
        producers = fixes.low_producers(r.name, info, plan)
        if not producers:
            return ()
        patterns = ", ".join(repr(p) for p in sorted({_pattern_of(info[p].module, p) for p in producers}))
        return (f"under enable_autocast=True: autocast_excluded_nodes={{{patterns}}} keeps its producers in fp32",)
    decision = plan.get(r.name)
    source = decision.source if decision is not None else r.source
    absmax = _finite_max([r.ref_absmax, _input_absmax(r, info, layers)])
    # autocast_max_output_threshold's default for this low type (a range rule of low float types: integer layers and
    # integer weights have none)
    default = io_bound(DEFAULT, r.precision) if r.precision in LOW_PRECISION_FLOATS else None
    over = default is not None and absmax > default.limit
    io_rule = (
        f"the IO range rule keeps a layer in fp32 when |value| on its inputs/outputs exceeds "
        f"autocast_max_output_threshold (default for {dtype_name(r.precision)}: {default.label}); this one reaches "
        f"{absmax:.3g}"
    ) if default is not None else ""
    where = f"module '{r.module or '(top level)'}'"
    out = []
    if source in ("autocast_rule", "default"):
        out.append(f"under enable_autocast=True: autocast_excluded_nodes={{{_pattern(r)!r}}} keeps it in fp32")
        if over:
            out.append(io_rule + " (lower the threshold if you raised it)")
        return tuple(out)
    if source == "weak_typing":
        out.append("weak typing chose its dtype for speed; the plan edit above overrides it")
    elif source == "plan":
        out.append(f"the plan puts it in {dtype_name(r.precision)}")
        if r.module:
            out.append(f"with the configurator: cfg.set_precision({r.module!r}, activation='fp32')")
    elif source == "marker":
        out.append(f"it is inside a start_setting_precision region: end the region before {where}")
    elif source == "torch_autocast":
        out.append(
            f"torch.autocast runs it in {dtype_name(r.precision)}: run {where} under torch.autocast(device_type, "
            "enabled=False) with .float() inputs"
        )
    else:  # "explicit": the model's code
        reason = f" ({decision.reason})" if decision is not None and decision.reason else ""
        out.append(f"the model's code runs it in {dtype_name(r.precision)}{reason}; change the code")
    if over:
        out.append(f"with enable_autocast=True deciding it instead, {io_rule}, so autocast would keep it in fp32")
    return tuple(out)


def _input_absmax(r: LayerComparison, info: GraphInfo, layers) -> float:
    return fixes.input_absmax(r.name, info, {x.name: x for x in layers})


def _finite_max(values) -> float:
    return max((v for v in values if math.isfinite(v)), default=0.0)


def _pattern(r: LayerComparison) -> str:
    return _pattern_of(r.module, r.name)


def _pattern_of(module: str, name: str) -> str:
    return f"^{re.escape(module)}$" if module else f"^{re.escape(name)}$"
