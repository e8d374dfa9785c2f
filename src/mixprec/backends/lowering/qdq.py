"""Quantize/dequantize lowering: one table per target, each entry the one arithmetic of ``ops/quant.py`` spelled
for that target.

The rewritten program states an int8 layer with mixprec's own ops (``ops/custom.py``). A custom op is opaque to a
compiler (inductor runs its eager kernels one by one, OpenVINO has no conversion rule for it), so each backend hands
its compiler the same values spelled in ops the compiler knows. A :class:`Table` maps the op a rule is anchored at to
the rule; a rule builds the replacement through an interpreter of ``ops/quant.py``'s arithmetic that adds ATen nodes
(:class:`GraphOps`) — the eager kernels run the very same ATen ops, which is why every spelling gives the custom ops'
values bit for bit (tests/backends/lowering/test_qdq.py):

* **ATEN** (inductor): div, round, clamp, _to_copy, which fuse with their neighbours and round half to even.
* **OPENVINO_INT8** (OpenVINO where its int8 kernels are exact, ``cpu.py``): ``quantized_decomposed`` pairs on the
  grid's scale, zero point and range, which OpenVINO turns into FakeQuantize and int8 kernels; an int8 weight is
  Convert(int8) * scale. Same grid, same scales; the sums are int32's. **OPENVINO_FLOAT** (elsewhere): as ATEN.
* **ONEDNN** (eager and inductor): an int8 Linear on oneDNN's int8 GEMM (``onednn.py``, :func:`_onednn_linear`)
  where this CPU's kernel is exact on the grid its input is handed over on; other int8 layers keep their fake
  quantization (logged at INFO with the reason).

A new grid is a parameter of the same rules (``ops.custom.GRID``), a new target a new table. The simulated grids
(int16/int4, ``ops.custom.SIMULATED_OPS``) are the ATen arithmetic on every target. Each lowering is a backend pass
with a contract (``ir/passes.py``), checked by the verifier in tests (``__init__.py``). Weight-only layers are rows of
the same tables (``weight_only=True``): a weight format's op is lowered by the rule its format registered for the
target (:func:`register_weight_only`, e.g. ``backends/openvino/compressed.py``); a target without one runs the op.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping
from types import MappingProxyType

import torch
from torch._guards import detect_fake_mode

from ...ir.passes import GraphPass, PassResult
from ...ops import weight_formats
from ...ops.custom import GRID, SIMULATED_OPS
from ...ops.quant import INT8_SYMMETRIC, UINT8, UINT8_7BIT, UINT8_SHIFTED, dequantize, quantize
from . import cpu, onednn
from ...ir.sign import is_nonnegative

logger = logging.getLogger(__name__)

aten = torch.ops.aten
_QUANT = torch.ops.mixprec.quantize_per_tensor.default
_DEQUANT = torch.ops.mixprec.dequantize_per_tensor.default
_QUANT_U8 = torch.ops.mixprec.quantize_per_tensor_u8.default
_DEQUANT_U8 = torch.ops.mixprec.dequantize_per_tensor_u8.default
_DEQUANT_CHANNEL = torch.ops.mixprec.dequantize_per_channel.default
# the activation pairs of the program and the grid oneDNN's u8 kernel reads them on (same values, zero point 0)
# (UINT8_7BIT where the input is never negative, else UINT8_SHIFTED: ``_onednn_linear``)
_KERNEL_GRID = {(_QUANT, _DEQUANT): UINT8_7BIT, (_QUANT_U8, _DEQUANT_U8): UINT8}
# why a layer keeps its fake quantization when the kernel is not exact on its grid
_NOT_EXACT = {
    UINT8_7BIT: "7-bit activations",
    UINT8: "8-bit unsigned activations",
    UINT8_SHIFTED: "signed activations (u8 = q + 128)",
}


# ---- the interpreter that writes the arithmetic into a graph ------------------------------------------------
class GraphOps:
    """Runs ``ops/quant.py``'s arithmetic by adding each op to ``graph`` at its insertion point, with the fake
    value the op really produces in its meta (the verifier re-runs it). ``made``: the nodes added."""

    def __init__(self, graph: torch.fx.Graph, like: torch.fx.Node):
        self.graph = graph
        self.like = like  # the node being replaced: its stack trace and module path go to the new nodes
        self.made: list[torch.fx.Node] = []

    def __call__(self, op, *args, **kwargs) -> torch.fx.Node:
        return self.call(op, args, kwargs)

    def call(self, op, args, kwargs=None, *, name: str | None = None) -> torch.fx.Node:
        node = self.graph.call_function(op, tuple(args), dict(kwargs or {}), name=name)
        node.meta["val"] = _fake_result(op, node.args, node.kwargs)
        for key in ("nn_module_stack", "stack_trace"):
            if key in self.like.meta:
                node.meta[key] = self.like.meta[key]
        self.made.append(node)
        return node

    def dtype(self, value: torch.fx.Node) -> torch.dtype:
        return value.meta["val"].dtype

    def ndim(self, value: torch.fx.Node) -> int:
        return value.meta["val"].dim()


def _fake_result(op, args, kwargs):
    vals = torch.fx.node.map_arg((args, kwargs), lambda n: n.meta["val"])
    fake_mode = detect_fake_mode(tuple(v for v in torch.utils._pytree.tree_leaves(vals) if isinstance(v, torch.Tensor)))
    with fake_mode if fake_mode is not None else contextlib.nullcontext(), torch.no_grad():
        return op(*vals[0], **vals[1])


# ---- tables and the engine that applies one -----------------------------------------------------------------
@dataclasses.dataclass
class Site:
    """What a rule sees besides its node: the module whose state the graph reads (a backend's GraphModule;
    None for a program), per-run memory for the rules, and the nodes a rule left as they were, with why."""

    module: torch.nn.Module | None
    memo: dict = dataclasses.field(default_factory=dict)
    kept: dict[str, str] = dataclasses.field(default_factory=dict)
    lowered: list[str] = dataclasses.field(default_factory=list)
    work: object = None  # the WorkProgram lowered (None for a GraphModule): rules add stored constants to it
    target: str = ""  # the table's target
    context: dict = dataclasses.field(default_factory=dict)  # the pass's options (``lowering_pass``)
    unread: list = dataclasses.field(default_factory=list)  # stored placeholders a rule stopped reading


# rule(node, ops, site) -> the node that takes ``node``'s place, or None to leave it
Rule = Callable[[torch.fx.Node, GraphOps, Site], "torch.fx.Node | None"]


@dataclasses.dataclass(frozen=True)
class Table:
    """A target's lowering: the op each rule is anchored at -> the rule. ``dead_code``: afterwards remove what
    only the replaced nodes read (the oneDNN pattern leaves the layer's fake quantization unread)."""

    target: str
    rules: Mapping
    dead_code: bool = False
    weight_only: bool = False  # weight formats' ops lowered by the rules registered for this target


# target -> weight format name -> the rule lowering its op there (register_weight_only)
_WEIGHT_ONLY_RULES: dict[str, dict[str, Rule]] = {}


def register_weight_only(target: str, fmt: str, rule: Rule) -> None:
    """Register ``rule`` as the lowering of weight format ``fmt``'s op on tables of ``target`` (once per pair).

    Such a rule rewrites the node in place (it keeps its name: OpenVINO names its MatMul after it) and names the
    stored inputs it leaves unread (``Site.unread``), which the lowering then drops."""
    rules = _WEIGHT_ONLY_RULES.setdefault(target, {})
    if fmt in rules:
        raise ValueError(f"the {target} lowering of weight format {fmt!r} is registered twice")
    rules[fmt] = rule


def _rule_of(table: Table, node):
    if node.op != "call_function":
        return None
    rule = table.rules.get(node.target)
    if rule is None and table.weight_only:
        fmt = weight_formats.format_of_op(node.target)
        rule = _WEIGHT_ONLY_RULES.get(table.target, {}).get(fmt) if fmt is not None else None
    return rule


def lower(subject, table: Table, **context) -> Site:
    """Apply ``table`` to ``subject`` (a GraphModule or a WorkProgram) in place; the Site says what happened.
    ``context``: options the rules read (``Site.context``)."""
    graph = subject.graph
    module = subject if isinstance(subject, torch.nn.Module) else None
    site = Site(module, work=None if module is not None else subject, target=table.target, context=context)
    for node in list(graph.nodes):
        rule = _rule_of(table, node)
        if rule is None:
            continue
        with graph.inserting_before(node):
            ops = GraphOps(graph, node)
            new = rule(node, ops, site)
        if new is None:
            for made in reversed(ops.made):  # a rule that declines late leaves nothing behind
                graph.erase_node(made)
            continue
        if new is not node:  # else the rule rewrote the node in place
            _take_place(graph, node, new, ops.made)
        site.lowered.append(node.name)
    if site.lowered:
        if table.dead_code or site.unread:
            graph.eliminate_dead_code()
        for placeholder in dict.fromkeys(site.unread):
            if not placeholder.users:
                site.work.remove_stored_input(placeholder)
        if isinstance(subject, torch.fx.GraphModule):
            subject.recompile()
        else:
            subject.sync_output_specs()
    return site


def _take_place(graph, node, new, made) -> None:
    if made == [new]:  # respelled as one op: the node keeps its name (OpenVINO names its layers after it)
        node.target, node.args, node.kwargs = new.target, new.args, new.kwargs
        node.meta["val"] = new.meta["val"]
        graph.erase_node(new)
        return
    new.meta = {**node.meta, "val": new.meta["val"]}  # the role, stack and module path of what it replaces
    node.replace_all_uses_with(new)
    graph.erase_node(node)


# ---- the rules ----------------------------------------------------------------------------------------------
def _scale(value):
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _aten_quantize(node, ops, site):
    x, scale = node.args
    if node.kwargs or _scale(scale) is None:
        return None
    return quantize(x, _scale(scale), GRID[node.target], ops)


def _aten_dequantize(node, ops, site):
    q, scale, dtype = node.args
    if node.kwargs or _scale(scale) is None:
        return None
    return dequantize(q, _scale(scale), dtype, GRID[node.target], ops)


def _aten_dequantize_channel(node, ops, site):
    q, scales, axis, dtype = node.args
    return dequantize(q, scales, dtype, GRID[node.target], ops, axis=axis)


def _decomposed_quantize(node, ops, site):
    x, scale = node.args
    grid = GRID[node.target]
    qd = _quantized_decomposed()
    return ops(qd.quantize_per_tensor.default, x, float(scale), grid.zero_point, grid.qmin, grid.qmax, grid.dtype)


def _decomposed_dequantize(node, ops, site):
    q, scale, dtype = node.args
    grid = GRID[node.target]
    qd = _quantized_decomposed()
    return ops(
        qd.dequantize_per_tensor.default, q, float(scale), grid.zero_point, grid.qmin, grid.qmax, grid.dtype,
        out_dtype=dtype,
    )


@functools.cache
def _quantized_decomposed():
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers torch.ops.quantized_decomposed)

    return torch.ops.quantized_decomposed


_WEIGHT_AXIS = 0  # output channels of aten.linear's weight


def _onednn_linear(node, ops, site):
    """A fake-quantized int8 linear layer on ``linear_u8s8``, else None.

    For ``x >= 0`` (``ir/sign.py``) the symmetric quantization equals the 7-bit u8 grid ``UINT8_7BIT`` (same scale,
    same rounding), on which every CPU's u8*s8 kernel is exact (``cpu.py``). An input that may be negative goes over
    as ``UINT8_SHIFTED``: q + 128 on zero point 128, whose integer sum is the signed one's (``sum (q + 128) w - 128
    sum w``); its u8 values reach 255, exact only with VNNI/AMX. An unsigned activation (``quantize_per_tensor_u8``)
    goes over as it is, where the kernel is exact on full-range u8. Elsewhere the layer keeps its fake quantization.
    The kernel gets the program's per-channel int8 weights and scales; its sum over K is int32 (exact), not float32,
    so outputs agree within float32 rounding of a K-term sum. A layer whose every consumer reads it through a cast to
    bf16 has the kernel write bf16 and loses the casts (issue 22) where the CPU has native bf16
    (``cpu.has_native_bf16``): the float32 result rounded to bf16 once, as the cast did (``onednn.OUT_DTYPES``)::

        r_q = mixprec.quantize_per_tensor(r, 0.013)            u = aten._to_copy(aten.clamp(aten.round(
        r_dq = mixprec.dequantize_per_tensor(r_q, 0.013, f32)        aten.div(r, 0.013)), 0, 127), uint8)
        w_dq = mixprec.dequantize_per_channel(w_int8, ...)     y = mixprec_kernels.linear_u8s8(u, 0.013, ws, b, 3,
        y = aten.linear(r_dq, w_dq, b)                                                         f32, 0)
    """
    match = _match_int8_linear(site.module, node)
    if match is None:
        return None
    value, scale, weight_int8, w_scales, bias, grid = match
    if grid is UINT8_7BIT:
        grid = cpu.kernel_grid(INT8_SYMMETRIC, is_nonnegative(value, site.memo.setdefault("nonnegative", {})))
    if not cpu.int8_kernel_exact(grid):
        site.kept[node.name] = f"this CPU's int8 kernel is not exact on {_NOT_EXACT[grid]} (no VNNI)"
        return None
    try:
        handle = onednn.pack_for(site.module, weight_int8)
    except RuntimeError as e:  # oneDNN refused this weight: the layer keeps its fake quantization
        site.kept[node.name] = f"oneDNN could not pack its weight ({e})"
        return None
    u = quantize(value, scale, grid, ops)
    # every consumer reads the layer in bf16 (a mixed int8/bf16 plan): the kernel writes bf16 where the CPU does
    # that natively, and the casts float32 -> bf16 go. out_dtype and x_zero_point are always spelled out: inductor's
    # FX graph cache key does not cover the op's schema, and a graph that left a default implicit would match
    # entries made with the op before it took that argument.
    casts = _bf16_casts(node) if cpu.has_native_bf16() else []
    out_dtype = torch.bfloat16 if casts else torch.float32
    kernel = ops.call(onednn.KERNEL, (u, scale, w_scales, bias, handle, out_dtype, grid.zero_point),
                      name=f"{node.name}_int8")
    for cast in casts:
        cast.replace_all_uses_with(kernel)
        ops.graph.erase_node(cast)
    return kernel


def _bf16_casts(node) -> list:
    """The users of ``node`` if every one is a plain cast of it to bfloat16 (the float32 -> bf16 round trip of an
    int8 layer read by bf16 layers), else []."""
    users = list(node.users)
    return users if users and all(_cast_dtype(u) is torch.bfloat16 and u.args[0] is node for u in users) else []


def _cast_dtype(node):
    """The dtype ``node`` casts its input to, if it is nothing but a cast (no copy, layout or device change)."""
    if node.op != "call_function":
        return None
    if node.target is aten.to.dtype and len(node.args) == 2 and not node.kwargs:
        return node.args[1]
    if node.target is aten._to_copy.default and len(node.args) == 1 and set(node.kwargs) == {"dtype"}:
        return node.kwargs["dtype"]
    if node.target is torch.ops.prims.convert_element_type.default and not node.kwargs:
        return node.args[1]
    return None


def _match_int8_linear(module, node):
    """(quantized value, scale, int8 weight tensor, weight-scale node, bias) of a fake-quant int8 linear, else None."""
    if module is None or node.kwargs:
        return None
    x_dq, w_dq = node.args[0], node.args[1]
    bias = node.args[2] if len(node.args) > 2 else None
    pair = (getattr(x_dq.args[0], "target", None), getattr(x_dq, "target", None)) if _is_node(x_dq) else None
    if pair not in _KERNEL_GRID or x_dq.args[2] != torch.float32 or not _is_node(x_dq.args[0]):
        return None
    x_q = x_dq.args[0]
    scale = x_q.args[1]
    if x_dq.args[1] != scale or not isinstance(scale, float) or not 0 < scale < float("inf"):
        return None  # the kernel's u8 grid is the fake quantization's only for a positive scale
    if not (_is(w_dq, _DEQUANT_CHANNEL) and w_dq.args[2] == _WEIGHT_AXIS and w_dq.args[3] == torch.float32):
        return None
    weight, w_scales = (_attr(module, a) for a in w_dq.args[:2])
    if weight is None or w_scales is None or weight.dtype != torch.int8 or weight.dim() != 2:
        return None
    if weight.device.type != "cpu" or w_scales.dtype != torch.float32:
        return None
    if bias is not None and (_attr(module, bias) is None or _attr(module, bias).dtype != torch.float32):
        return None
    val = x_q.args[0].meta.get("val") if isinstance(x_q.args[0], torch.fx.Node) else None
    if not isinstance(val, torch.Tensor) or not val.dtype.is_floating_point:
        return None
    return x_q.args[0], scale, weight, w_dq.args[1], bias, _KERNEL_GRID[pair]


def _is_node(node) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function"


def _is(node, target) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target is target


def _attr(module, node):
    """The tensor behind a get_attr node (a parameter or buffer of the module), else None."""
    if not isinstance(node, torch.fx.Node) or node.op != "get_attr":
        return None
    value = module
    for part in node.target.split("."):
        value = getattr(value, part, None)
    return value if isinstance(value, torch.Tensor) else None


# ---- the tables ---------------------------------------------------------------------------------------------
# simulated grids (int16/int4, ``ops/custom.py``) are float arithmetic on every target: no kernel computes on them
_SIMULATED = {op: rule for pair in SIMULATED_OPS.values() for op, rule in zip(pair, (_aten_quantize, _aten_dequantize))}
_ATEN_RULES = MappingProxyType({
    _QUANT: _aten_quantize, _DEQUANT: _aten_dequantize, _QUANT_U8: _aten_quantize, _DEQUANT_U8: _aten_dequantize,
    _DEQUANT_CHANNEL: _aten_dequantize_channel, **_SIMULATED,
})
ATEN = Table("aten", _ATEN_RULES)
OPENVINO_FLOAT = Table("openvino_float", _ATEN_RULES, weight_only=True)
OPENVINO_INT8 = Table(
    "openvino_int8",
    MappingProxyType({
        _QUANT: _decomposed_quantize, _DEQUANT: _decomposed_dequantize, _QUANT_U8: _decomposed_quantize,
        _DEQUANT_U8: _decomposed_dequantize, _DEQUANT_CHANNEL: _aten_dequantize_channel, **_SIMULATED,
    }),
    weight_only=True,
)
ONEDNN = Table("onednn", MappingProxyType({aten.linear.default: _onednn_linear}), dead_code=True)


# ---- the passes ---------------------------------------------------------------------------------------------
def lowering_pass(table: Table, **context) -> GraphPass:
    """The backend pass applying ``table`` with ``context`` (the rules' options, ``Site.context``)."""
    def run(subject) -> PassResult:
        return PassResult(bool(lower(subject, table, **context).lowered))

    return GraphPass(f"qdq_{table.target}", run, ensures=frozenset({"qdq_lowered"}), breaks=frozenset({"int8"}),
                     stage="backend")


_qdq_pass = lowering_pass


QDQ_ATEN = _qdq_pass(ATEN)
QDQ_OPENVINO_FLOAT = _qdq_pass(OPENVINO_FLOAT)
QDQ_OPENVINO_INT8 = _qdq_pass(OPENVINO_INT8)


def _int8_linears(module) -> PassResult:
    """Run the int8 linear layers of ``module`` (a backend's GraphModule) on ``linear_u8s8`` where this CPU's
    kernel is exact on their inputs' grid. Changes ``module`` in place (the backend's own, never the user's nor the
    saved one)."""
    if not onednn.is_available() or not isinstance(module, torch.fx.GraphModule):
        return PassResult(False)
    site = lower(module, ONEDNN)
    if site.lowered or site.kept:
        reasons: dict[str, list[str]] = {}
        for name, why in site.kept.items():
            reasons.setdefault(why, []).append(name)
        kept = "; ".join(f"{', '.join(names)} ({why})" for why, names in reasons.items())
        logger.info("int8 linear layers on oneDNN's int8 kernel: %s; kept as fake quantization: %s",
                    ", ".join(site.lowered) or "none", kept or "none")
    return PassResult(bool(site.lowered))


# reads the fake-quantization pattern the rewrite made (``int8``), which the quantize/dequantize lowering breaks
INT8_LINEARS = GraphPass("int8_linears", _int8_linears, requires=frozenset({"int8"}), breaks=frozenset({"int8"}),
                         stage="backend")
