"""The configurator's log (API.md §4): what was asked, what each module got and what each layer runs.

Tables rendered from the :class:`~mixprec.configurator.resolve.Resolution` the requests resolved to and the plan
(the policy of its int8 requests on one line):

1. the requests as given, with their IDs;
2. the effective precision of every module that runs a layer, with the ID of the request that won
   (and the model inputs/outputs);
3. the precision of every graph layer as planned, with its weights and the request that decided it;
4. the int8 Linear inputs smoothed (``calibrate/smoothing.py``): which value, read by which modules, the
   divisors' spread and the range then quantized.

Simulated layers (int16/int4 activations or weights, issue 32) are listed after table 3, saying that they are
quantize -> dequantize computed in float32. ``apply()`` does not rewrite the graph (issue 44): the realised layers and
the casts inserted are known when compile realises the plan, and ``compile(plan=)`` completes the log with them
(``output/report/layer_log.py``: table 5 in ``prog.plan.log``, from the same records as the report).
"""

from __future__ import annotations

import torch

from ..dtypes import short_name
from ..output.report.layer_log import HEADING as REALISED, section as _section
from ..output.report.weights import weight_precisions
from ..formats import SIMULATED_PRECISIONS
from ..plan.quantization import simulates_weights
from .vocabulary import param_name, short_name_of


def render_log(requests, resolved, info, plan) -> str:
    parts = ["mixprec manual mixed precision"]
    parts += _section("1. Requests (in call order; the latest wins)", ("id", "call", "target", "precision"), [
        (f"#{r.id}", r.api, r.target_text(), r.precision_text()) for r in requests
    ] or [("-", "(no requests)", "", "")])
    parts.append(f"int8 policy: {resolved.policy.describe()}")
    attention = [n for n, (kind, _) in resolved.implied.items() if kind == "attention"]
    residual = [n for n, (kind, _) in resolved.implied.items() if kind == "residual add"]
    if attention:
        parts.append(f"int8 attention (QuantPolicy.int8_attention; its query/key made by int8 layers, as NNCF's "
                     f"TRANSFORMER mode): {', '.join(attention)}")
    if residual:
        parts.append(f"int8 residual adds (QuantPolicy.quantize_residuals; both inputs quantized, as NNCF does for "
                     f"int8 convolutions): {', '.join(residual)}")
    parts += _section("2. Effective precision per module", ("module", "type", "activation", "param", "request"),
                      _module_rows(resolved, info, plan))
    parts += _section("   Model inputs and outputs", ("value", "precision", "request"), _io_rows(requests, resolved))
    parts += _section("3. Precision per graph layer (as planned; compile realises it)", (
        "layer", "module", "op", "precision", "weights", "source", "decided by"), _layer_rows(info, plan, resolved))
    if resolved.smoothed:
        parts += _section("4. Activation smoothing (int8 Linear inputs divided per channel by s; s multiplies the "
                          "weight columns)", ("input", "read by", "channels", "s min", "s max", "range of input / s"),
                          _smoothing_rows(resolved, info))
    parts += _simulated_lines(plan)
    parts += ["", "casts inserted: counted when compile realises the plan — "
                  f"compile(model, inputs, plan=plan).plan.log ends with table {REALISED.split('.')[0]}, the realised "
                  "layers"]
    if resolved.problems:
        parts += ["", "Requests not realised as asked (strict=False):"] + [f"  - {p}" for p in resolved.problems]
    return "\n".join(parts) + "\n"


def _simulated_lines(plan) -> list[str]:
    """The simulated layers: int16/int4 activations, or int16/int4 weights (quantize -> dequantize, float32)."""
    acts = [n for n, d in plan.items() if d.precision in SIMULATED_PRECISIONS]
    weights = [n for n, d in plan.items() if simulates_weights(d.precision, d.param_dtype) and d.precision not in
               SIMULATED_PRECISIONS]
    lines = []
    if acts:
        names = ", ".join(f"{n} ({short_name_of(plan[n].precision)})" for n in acts)
        lines.append(f"simulated (quantize -> dequantize on the int16/int4 grid, computed in float32: no CPU kernel; "
                     f"not low-precision FLOPs): {names}")
    if weights:
        lines.append(f"simulated weights (per output channel, dequantized to float32 at use): "
                     f"{', '.join(f'{n} ({short_name_of(plan[n].param_dtype)})' for n in weights)}")
    return [""] + lines if lines else []


def _smoothing_rows(resolved, info):
    rows = []
    for value, smoothed in sorted(resolved.smoothed.items()):
        s, (lo, hi), layers = smoothed.divisors, smoothed.range, smoothed.readers
        modules = sorted({info[layer].module or "(top)" for layer in layers})
        rows.append((value, ", ".join(modules), str(s.numel()), f"{float(s.min()):.3g}", f"{float(s.max()):.3g}",
                     f"[{lo:.4g}, {hi:.4g}]"))
    return rows


def _module_rows(resolved, info, plan):
    seen = {}
    for name, node in info.items():
        seen.setdefault(node.module, (node.module_type, name))
    rows = []
    for module, (module_type, first) in seen.items():
        request = resolved.winner.get(first)
        decision = plan[first]
        if request is None:
            rows.append((module or "(top)", _short_type(module_type), short_name(decision.precision), "-",
                         f"- ({decision.source})"))
            continue
        param = resolved.param.get(first)
        rows.append((module or "(top)", _short_type(module_type), short_name(request.activation),
                     param_name(param) if param is not None else "=activation", f"#{request.id}"))
    return rows


def _io_rows(requests, resolved):
    rows = []
    for which in ("input", "output"):
        for position, (dtype, request_id) in sorted(resolved.io_winners.get(which, {}).items()):
            how = {torch.int16: " (simulated: quantize -> dequantize, float32)",
                   torch.int4: " (simulated: quantize -> dequantize, float32)",
                   torch.int8: " (quantize -> dequantize)"}
            rows.append((f"{which} {position}", short_name_of(dtype) + how.get(dtype, ""), f"#{request_id}"))
    return rows or [("(none requested)", "", "")]


def _layer_rows(info, plan, resolved):
    weights = weight_precisions(plan)
    rows = []
    for name, decision in plan.items():
        request = resolved.winner.get(name)
        rows.append((name, info[name].module or "(top)", _op(info[name].op), short_name_of(decision.precision),
                     weights.get(name, "-"), decision.source, f"#{request.id}" if request is not None else "-"))
    return rows


def _op(op: str) -> str:
    return op.removeprefix("aten.").removesuffix(".default")


def _short_type(module_type: str) -> str:
    return module_type.rsplit(".", 1)[-1] if module_type else "-"
