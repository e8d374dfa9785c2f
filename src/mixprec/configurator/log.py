"""The configurator's log (API.md §4): what was asked, what each module got and what each layer runs.

Three tables, rendered from the :class:`~mixprec.configurator.resolve.Resolution` the requests resolved to and
the plan realised (the policy of its int8 requests on one line):

1. the requests as given, with their IDs;
2. the effective precision of every module that runs a layer, with the ID of the request that won
   (and the model inputs/outputs);
3. the realised precision of every graph layer after the rewrite, with the casts (and int8
   quantize/dequantize) inserted on its inputs and output;
4. the int8 Linear inputs smoothed (``calibrate/smoothing.py``): which value, read by which modules, the
   divisors' spread and the range then quantized.

Simulated layers (int16/int4 activations or weights, issue 32) are listed after table 3, saying that they are
quantize -> dequantize computed in float32; table 3 names the grid of every quantize/dequantize it shows.
"""

from __future__ import annotations

import torch

from ..dtypes import short_name
from ..ir.graph_info import META_ROLE
from ..ops.custom import GRID
from ..plan.quantization import SIMULATED_PRECISIONS, grid_name, simulates_weights
from ..rewrite.casting import is_mixprec_cast, origin_name, tensor_dtype
from .vocabulary import short_name_of


def render_log(requests, resolved, info, plan, realised) -> str:
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
    parts += _section("3. Realised precision per graph layer", (
        "layer", "module", "op", "precision", "inputs", "outputs", "source", "casts inserted"),
        _layer_rows(info, plan, realised))
    if resolved.smoothed:
        parts += _section("4. Activation smoothing (int8 Linear inputs divided per channel by s; s multiplies the "
                          "weight columns)", ("input", "read by", "channels", "s min", "s max", "range of input / s"),
                          _smoothing_rows(resolved, info))
    parts += _simulated_lines(plan)
    casts = sum(1 for n in realised.graph.nodes if is_mixprec_cast(n))
    grids: dict[str, int] = {}
    for n in realised.graph.nodes:
        if n.meta.get(META_ROLE) == "quant":
            grids[grid_name(GRID[n.target])] = grids.get(grid_name(GRID[n.target]), 0) + 1
    parts.append(f"casts inserted: {casts}; quantize points: {sum(grids.values())}"
                 + (f" ({', '.join(f'{g}: {k}' for g, k in sorted(grids.items()))})" if grids else ""))
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
                     short_name(param) if param is not None else "=activation", f"#{request.id}"))
    return rows


def _io_rows(requests, resolved):
    rows = []
    for which in ("input", "output"):
        for position, (dtype, request_id) in sorted(resolved.io_winners.get(which, {}).items()):
            how = {torch.int16: " (simulated: quantize -> dequantize, float32)",
                   torch.int8: " (quantize -> dequantize)"}
            rows.append((f"{which} {position}", short_name(dtype) + how.get(dtype, ""), f"#{request_id}"))
    return rows or [("(none requested)", "", "")]


def _layer_rows(info, plan, realised):
    nodes = {n.name: n for n in realised.graph.nodes}
    rows = []
    for name, decision in plan.items():
        node = nodes.get(name)
        if node is None:
            rows.append((name, info[name].module or "(top)", _op(info[name].op), short_name(decision.precision), "", "",
                         decision.source, "(removed: a cast made redundant)"))
            continue
        casts = []
        for inp in node.all_input_nodes:
            if is_mixprec_cast(inp):
                casts.append(f"{inp.args[0].name}->{short_name(inp.args[1])}")
            elif inp.meta.get(META_ROLE) == "dequant":
                per_tensor = inp.target in GRID and inp.target is not _PER_CHANNEL
                bits = grid_name(GRID[inp.target]) if per_tensor else short_name_of(decision.stored_param_dtype)
                casts.append(f"{origin_name(inp, through_quantize=True)}->{bits}")
        for user in node.users:
            if user.meta.get(META_ROLE) == "quant" and decision.int8 is not None and decision.int8.output is not None:
                casts.append(f"output->{grid_name(GRID[user.target])}")
            elif is_mixprec_cast(user) and user.meta.get(META_ROLE) in ("acc_cast", "io_cast"):
                casts.append(f"output->{short_name(user.args[1])}")
        rows.append((
            name, info[name].module or "(top)", _op(info[name].op), short_name(decision.precision),
            ",".join(short_name(tensor_dtype(i)) for i in node.all_input_nodes if tensor_dtype(i) is not None),
            short_name(tensor_dtype(node)) if tensor_dtype(node) is not None else "-",
            decision.source, ", ".join(casts) or "-",
        ))
    return rows


_PER_CHANNEL = torch.ops.mixprec.dequantize_per_channel.default


def _section(title, header, rows) -> list[str]:
    rows = [tuple(str(c) for c in row) for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]

    def fmt(cells):
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    return ["", title, fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]


def _op(op: str) -> str:
    return op.removeprefix("aten.").removesuffix(".default")


def _short_type(module_type: str) -> str:
    return module_type.rsplit(".", 1)[-1] if module_type else "-"
