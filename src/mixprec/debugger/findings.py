"""Naming the culprit: the first layer that produced inf/NaN, and the layer with the largest error jump.

The first inf/NaN producer is the first layer in graph order with inf/NaN where the fp32
value of the same tensor is finite: every layer before it had none, so it made them (not a
layer downstream that merely propagated them). The error jump of a layer is the relative
error of its output minus the largest relative error of its inputs: the error it added itself,
so a catastrophic cancellation (``x - x_shifted`` in bf16) stands out even when every layer
after it shows the same large error.

Each finding says what would keep the layer in fp32, in the terms of whoever decided its dtype:
an autocast exclusion or rule for layers the compiler lowered, a plan entry or configurator
call for plan requests, a change of code for the model's own typing.
"""

from __future__ import annotations

import math
import re

import torch

from ..dtypes import LOW_PRECISION_FLOATS, dtype_name
from ..ir.graph_info import GraphInfo
from ..plan.precision_plan import PrecisionPlan
from ..plan.rules.ranges import DEFAULT, io_bound
from .records import Finding, LayerComparison



def find(layers: list[LayerComparison], info: GraphInfo, plan: PrecisionPlan) -> list[Finding]:
    """Findings, the culprit first: the first inf/NaN producer if any, then the largest error jump."""
    findings = []
    first = next((r for r in layers if r.new_nonfinite > 0), None)
    if first is not None:
        findings.append(Finding("nonfinite", first.name, first.module, first.op, first.precision,
                                _nonfinite_message(first), _suggestions(first, info, plan, layers)))  # fmt: skip
    jumps = [r for r in layers if math.isfinite(r.error_jump) and r.error_jump > 0]
    if jumps:
        worst = max(jumps, key=lambda r: r.error_jump)
        findings.append(Finding("error_jump", worst.name, worst.module, worst.op, worst.precision,
                                _jump_message(worst), _suggestions(worst, info, plan, layers)))  # fmt: skip
    return findings


def _where(r: LayerComparison) -> str:
    return f"layer '{r.name}' ({r.op}, module '{r.module or '(top level)'}', computes in {dtype_name(r.precision)})"


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


def _jump_message(r: LayerComparison) -> str:
    return (
        f"largest error jump: {_where(r)}: relative error {r.input_error:.3g} on its inputs -> {r.rel_l2_error:.3g} "
        f"on its output (+{r.error_jump:.3g}); max abs error {r.max_abs_error:.3g}, fp32 absmax {r.ref_absmax:.3g}."
    )


def _suggestions(r: LayerComparison, info: GraphInfo, plan: PrecisionPlan, layers) -> tuple[str, ...]:
    """What would keep ``r`` in fp32, first in the terms of whoever decided its dtype."""
    if r.precision not in LOW_PRECISION_FLOATS:
        return _from_inputs(r, info, plan)
    decision = plan.get(r.name)
    source = decision.source if decision is not None else r.source
    exclude = f"autocast_excluded_nodes={{{_pattern(r)!r}}}"
    plan_entry = (
        f"a plan entry: plan = prog.plan.with_nodes({{'{r.name}': NodePrecision(torch.float32, source='plan', "
        f"reason='keep fp32')}}), then mixprec.compile(model, inputs, plan=plan)"
    )
    absmax = _finite_max([r.ref_absmax, _input_absmax(r, info, layers)])
    default = io_bound(DEFAULT, r.precision)  # autocast_max_output_threshold's default for this low type
    io_rule = (
        f"the IO range rule keeps a layer in fp32 when |value| on its inputs/outputs exceeds "
        f"autocast_max_output_threshold (default for {dtype_name(r.precision)}: {default.label}); this one reaches "
        f"{absmax:.3g}"
    )
    where = f"module '{r.module or '(top level)'}'"
    if source in ("autocast_rule", "default"):
        out = [f"{exclude} keeps it in fp32 under enable_autocast=True"]
        if absmax > default.limit:
            out.append(io_rule + " (lower the threshold if you raised it)")
        return (*out, plan_entry)
    if source == "weak_typing":
        out = [f"weak typing chose its dtype for speed; {plan_entry}"]
    elif source == "plan":
        out = [f"the plan puts it in {dtype_name(r.precision)}; {plan_entry}"]
        if r.module:
            out.append(f"or with the configurator: cfg.set_precision({r.module!r}, activation='fp32')")
    elif source == "marker":
        out = [f"it is inside a start_setting_precision region: end the region before {where}, or {plan_entry}"]
    elif source == "torch_autocast":
        out = [
            f"torch.autocast runs it in {dtype_name(r.precision)}: run {where} under torch.autocast(device_type, "
            f"enabled=False) with .float() inputs, or {plan_entry}"
        ]
    else:  # "explicit": the model's code
        reason = f" ({decision.reason})" if decision is not None and decision.reason else ""
        out = [f"the model's code runs it in {dtype_name(r.precision)}{reason}; change the code, or {plan_entry}"]
    if absmax > default.limit:
        out.append(f"with enable_autocast=True deciding it instead, {io_rule}, so autocast would keep it in fp32")
    return tuple(out)


def _from_inputs(r: LayerComparison, info: GraphInfo, plan: PrecisionPlan) -> tuple[str, ...]:
    """A layer computing in fp32 whose result is bad: the error came in with its inputs."""
    producers = _low_producers(r.name, info, plan)
    if not producers:
        return (f"it computes in {dtype_name(r.precision)}; its inputs come from the model's inputs or parameters",)
    names = ", ".join(f"'{p}' (module '{info[p].module or '(top level)'}')" for p in producers)
    patterns = {_pattern_of(info[p].module, p) for p in producers}
    return (
        f"it computes in {dtype_name(r.precision)}: the error comes with its inputs, produced in low precision by "
        f"{names}; keep them in fp32: autocast_excluded_nodes={sorted(patterns)!r}, or plan entries in float32",
    )


def _low_producers(name: str, info: GraphInfo, plan: PrecisionPlan) -> list[str]:
    found, seen, stack = [], set(), list(info[name].input_dtypes)
    while stack:
        p = stack.pop()
        if p in seen or p not in info:
            continue
        seen.add(p)
        decision = plan.get(p)
        if info[p].kind == "movement" or decision is None:
            stack.extend(info[p].input_dtypes)
        elif decision.precision in LOW_PRECISION_FLOATS:
            found.append(p)
    return sorted(found, key=list(info).index)


def _input_absmax(r: LayerComparison, info: GraphInfo, layers) -> float:
    by_name = {x.name: x for x in layers}
    return _finite_max(by_name[p].ref_absmax for p in info[r.name].input_dtypes if p in by_name)


def _finite_max(values) -> float:
    return max((v for v in values if math.isfinite(v)), default=0.0)


def _pattern(r: LayerComparison) -> str:
    return _pattern_of(r.module, r.name)


def _pattern_of(module: str, name: str) -> str:
    return f"^{re.escape(module)}$" if module else f"^{re.escape(name)}$"
