"""The verifier: invariants every rewritten graph must satisfy (DESIGN.md habit 2).

Each check is one fact of ``ir.passes.CHECKED``; the pipeline asks for the facts that hold after the pass that ran.

1. (``structure``) the graph lints (every use after its definition, one output node); mixprec's casts are float ->
   float and change the dtype (integer/bool tensors never cast), and at most one cast per (tensor, dtype);
2. (``inputs_rounded``) a model input the plan rounds is read only through its rounding cast;
3. (``layer_dtypes``) every float input of a layer has the dtype ``required_input_dtype``
   gives (layers with fp32 accumulation: their operands are rounded to the layer's precision
   and then widened to the accumulation dtype);
4. (``int8``) every quantized input, output, stored weight and model boundary of an int8 layer (and of the
   simulated int16/int4 layers, on their grids) goes through its quantize/dequantize with its range's scale,
   and no float copy of a quantized weight is read (:func:`_check_int8`);
4b. (``weight_only``) every weight-only op's layer is a weight-only decision of its bits, and reads stored int8
   (or uint8 nibbles) weights and scales whose shapes fit its input (``rewrite/weight_only.py``);
5. (``output_dtypes``) graph outputs have the requested dtypes;
6. (``meta``, ``deep=True``) the dtypes in node meta are the dtypes the ops really produce:
   the graph is re-run on fake tensors and every tensor's dtype compared (:func:`_check_meta_truthful`).

A backend's graph passes (``backends/lowering/``) are checked by :func:`verify_lowered`: it has no plan,
so it checks the facts the graph alone shows (``ir.passes.GRAPH_CHECKED``: ``structure``, ``meta`` and each of
``ir.passes.BACKEND_CHECKED``).

Raises :class:`InvariantError` (a mixprec bug, not a user error) naming the node.
"""

from __future__ import annotations

import torch

from ..dtypes import is_float
from ..errors import InvariantError
from ..ir.graph_info import META_ACC, META_ROLE
from ..ir.passes import CHECKED, GRAPH_CHECKED, PassResult
from ..ops.custom import DEQUANTIZE_OPS, GRID, PER_TENSOR_OPS, QUANTIZE_OPS
from ..ops.quant import symmetric_scale
from ..ops.names import op_name, packet_name
from ..plan.input_contract import required_input_dtype
from ..plan.quantization import IO_GRIDS, WEIGHT_GRIDS
from .casting import is_mixprec_cast, origin_name, tensor_dtype
from .weight_only_check import check_weight_only
from .context import RewriteContext
from .quantize import (
    is_dequant_node,
    input_grid,
    is_quant_node,
    output_grid,
    stored_source,
    weight_grid,
)

_WEIGHT_STORAGE = frozenset(g.dtype for g in WEIGHT_GRIDS.values())  # what a per-channel dequantize reads

_CHEAP = frozenset(CHECKED) - {"meta"}


def verify(ctx: RewriteContext, *, stage: str = "", facts=None, deep: bool = False) -> PassResult:
    """Check the ``facts`` (names from ``base.CHECKED``; default: all but the fake-tensor re-run,
    which ``deep=True`` adds). ``stage`` says when, for the error message ("after pass 'x'")."""
    facts = frozenset(_CHEAP if facts is None else facts) | ({"meta"} if deep else set())
    graph = ctx.work.graph
    where = f" after {stage}" if stage else ""
    if "structure" in facts:
        _check_structure(graph, where)
    if "inputs_rounded" in facts:
        _check_inputs(ctx, where)
    if "layer_dtypes" in facts:
        _check_layers(ctx, graph, where)
    if "int8" in facts:
        _check_int8(ctx, graph, where)
    if "weight_only" in facts:
        check_weight_only(ctx, graph, where)
    if "output_dtypes" in facts:
        _check_outputs(ctx, where)
    if "meta" in facts:
        _check_meta_truthful(graph, where)
    return PassResult(False)


def verify_lowered(subject, *, stage: str, facts) -> PassResult:
    """Check ``facts`` (those of ``ir.passes.GRAPH_CHECKED`` among them) on a backend's ``subject``: the
    GraphModule it runs or the WorkProgram it converts. ``stage`` names the pass that just ran."""
    facts = frozenset(facts) & GRAPH_CHECKED
    graph = subject.graph
    where = f" after {stage}"
    if "structure" in facts:
        _check_structure(graph, where)
    if "qdq_lowered" in facts:
        left = [n.name for n in graph.nodes if n.op == "call_function" and n.target in QUANTIZE_OPS | DEQUANTIZE_OPS]
        if left:
            raise InvariantError(f"mixprec quantize/dequantize left{where}: {', '.join(left)}")
    if "tensor_outputs" in facts:
        outputs = graph.output_node().args[0]
        if not isinstance(outputs, tuple) or not all(isinstance(tensor_dtype(v), torch.dtype) for v in outputs):
            raise InvariantError(f"the graph's outputs{where} are not a flat tuple of tensors: {outputs}")
    if "contiguous_state" in facts:
        strided = [name for name, t in _state(subject) if isinstance(t, torch.Tensor) and not t.is_contiguous()]
        if strided:
            raise InvariantError(f"stored tensors{where} are not contiguous: {', '.join(strided)}")
    if "meta" in facts:
        _check_meta_truthful(graph, where)
    return PassResult(False)


def _state(subject):
    """(name, tensor) of everything ``subject`` stores: a WorkProgram's state and constants, a module's."""
    if isinstance(subject, torch.nn.Module):
        return list(subject.state_dict(keep_vars=True).items())
    return list(subject.state_dict.items()) + list(subject.constants.items())


def _check_structure(graph, where):
    try:
        graph.lint()
    except RuntimeError as e:
        raise InvariantError(f"graph does not lint{where}: {e}") from e
    _check_casts(graph, where)


def _check_casts(graph, where):
    seen = set()
    for node in graph.nodes:
        if not is_mixprec_cast(node):
            continue
        src, dst = tensor_dtype(node.args[0]), node.args[1]
        if not (is_float(src) and is_float(dst)):
            raise InvariantError(f"cast {node.name}{where} converts {src} -> {dst}; only float tensors may be cast")
        if src == dst:
            raise InvariantError(f"cast {node.name}{where} converts {src} to itself")
        if tensor_dtype(node) != dst:
            raise InvariantError(f"cast {node.name}{where}: meta says {tensor_dtype(node)}, target {dst}")
        key = (node.args[0], dst)
        if key in seen:
            raise InvariantError(f"two casts of {node.args[0].name} to {dst}{where}")
        seen.add(key)


def _check_layers(ctx, graph, where):
    for node in graph.nodes:
        if node.op != "call_function" or is_mixprec_cast(node):
            continue
        info = ctx.info.get(node.name)
        decision = ctx.plan.get(node.name)
        acc = node.meta.get(META_ACC)
        if info is not None and decision is not None and info.kind != "cast":
            out = [d for d in (getattr(v, "dtype", None) for v in _tensors(node.meta.get("val"))) if is_float(d)]
            expected = acc if acc is not None else decision.compute_dtype
            if out and out[0] != expected:
                raise InvariantError(
                    f"layer {node.name} ({info.module or 'top level'}){where} produces {out[0]}, plan says {expected}"
                )
        for inp in node.all_input_nodes:
            current = tensor_dtype(inp)
            if current is None or not is_float(current):
                continue
            if acc is not None:
                if current != acc or tensor_dtype(inp.args[0] if is_mixprec_cast(inp) else inp) != decision.precision:
                    raise InvariantError(
                        f"layer {node.name}{where} accumulates in {acc} but its input {inp.name} is not its "
                        f"{decision.precision} operand widened to {acc}"
                    )
                continue
            required = required_input_dtype(info, decision, origin_name(inp), current)
            if required != current:
                raise InvariantError(
                    f"layer {node.name} ({info.module if info else ''}){where} receives {inp.name} as {current}, "
                    f"needs {required}"
                )


def _check_int8(ctx, graph, where):
    """Every input an int8 layer quantizes is the dequantized int8 value of that input with the scale of its
    range, a quantized output is read only through its quantize node, weights stored as int8 reach their layer
    through a per-channel dequantize of an int8 tensor, and no float copy of such a weight is read; the same for
    the simulated int16/int4 layers on their grids (weights stored per channel on the grid of their bits, their
    values within it); model inputs and outputs of an integer precision are read / leave through the boundary's
    quantize/dequantize with their range's scale."""
    for node in graph.nodes:
        if is_quant_node(node):
            grid = GRID[node.target]
            if not is_float(tensor_dtype(node.args[0])) or tensor_dtype(node) != grid.dtype:
                raise InvariantError(f"quantize {node.name}{where} must turn a float tensor into {grid.dtype}")
        elif node.target is torch.ops.mixprec.dequantize_per_channel.default:
            if tensor_dtype(node.args[0]) not in _WEIGHT_STORAGE:
                raise InvariantError(f"dequantize {node.name}{where} reads {tensor_dtype(node.args[0])}, not a stored "
                                     f"weight's integers ({', '.join(sorted(map(str, _WEIGHT_STORAGE)))})")
        elif is_dequant_node(node) and tensor_dtype(node.args[0]) != GRID[node.target].dtype:
            raise InvariantError(
                f"dequantize {node.name}{where} reads {tensor_dtype(node.args[0])}, not {GRID[node.target].dtype}"
            )
        decision = ctx.plan.get(node.name)
        if node.op != "call_function" or decision is None:
            continue
        spec = decision.int8
        if spec is not None:
            for inp in node.all_input_nodes:
                origin = origin_name(inp, through_quantize=True)
                value_range = spec.input_range(origin)
                if value_range is None:
                    continue
                source = inp.args[0].args[0] if is_dequant_node(inp) and is_quant_node(inp.args[0]) else inp
                grid = input_grid(ctx.plan, spec, origin, source, precision=decision.precision)
                if not _on_grid(inp, symmetric_scale(value_range, grid), grid):
                    raise InvariantError(
                        f"int8 layer {node.name}{where} reads {inp.name}, which is not {origin_name(inp, through_quantize=True)} "
                        f"quantized with scale {symmetric_scale(value_range, grid):.6g} on [{grid.qmin}, {grid.qmax}]"
                    )
            if spec.output is not None:
                grid = output_grid(ctx.plan, spec, node, precision=decision.precision)
                scale = symmetric_scale(spec.output, grid)
                q_op = PER_TENSOR_OPS[grid][0]
                if not node.users or not all(u.target is q_op and u.args[1] == scale for u in node.users):
                    raise InvariantError(
                        f"int8 layer {node.name}{where}: its output must be read only through its quantize node "
                        f"(scale {scale:.6g}); readers: {', '.join(u.name for u in node.users)}"
                    )
        bits = weight_grid(decision, packet_name(op_name(node.target)))
        if bits is not None and len(node.args) > 1:
            weight = node.args[1]
            if is_dequant_node(weight):
                _, stored, _ = stored_source(ctx.work, weight.args[0])
                if weight.args[0].op != "placeholder" or stored is None:
                    raise InvariantError(f"layer {node.name}{where}: its int8 weight is not a stored int8 tensor")
                _check_weight_grid(node, ctx.work.stored_tensor(stored), bits, where)
            elif stored_source(ctx.work, weight)[0] is not None:  # a float copy of a stored weight
                raise InvariantError(
                    f"layer {node.name}{where} stores its weights in int8 but reads the float weight {weight.name}"
                )


def _check_weight_grid(layer, tensor, grid, where) -> None:
    """A stored per-channel weight holds integers of its grid's dtype within the grid (int4: [-7, 7] as int8)."""
    if tensor.dtype != grid.dtype or (tensor.numel() and not grid.qmin <= int(tensor.min()) <= int(tensor.max())
                                      <= grid.qmax):
        raise InvariantError(f"layer {layer.name}{where}: its stored weight ({tensor.dtype}) is not on the grid "
                             f"[{grid.qmin}, {grid.qmax}] as {grid.dtype} its plan gives it")


def _on_grid(value, scale, grid) -> bool:
    q_op, dq_op = PER_TENSOR_OPS[grid]
    return (
        isinstance(value, torch.fx.Node) and value.target is dq_op and value.args[1] == scale
        and value.args[0].target is q_op and value.args[0].args[1] == scale
    )


def _check_inputs(ctx, where):
    float_inputs = [n for n in ctx.work.user_input_nodes() if tensor_dtype(n) is not None]
    for position, dtype in ctx.plan.inputs.items():
        if dtype is None or position >= len(float_inputs) or tensor_dtype(float_inputs[position]) == dtype:
            continue
        node = float_inputs[position]
        if dtype in IO_GRIDS:
            grid = IO_GRIDS[dtype]
            q_op = PER_TENSOR_OPS[grid][0]
            scale = symmetric_scale(ctx.plan.input_ranges[position], grid)
            if not node.users or not all(u.target is q_op and u.args[1] == scale for u in node.users):
                raise InvariantError(f"model input {position} ({node.name}){where} is read otherwise than through its "
                                     f"{dtype} quantize (scale {scale:.6g}): {', '.join(u.name for u in node.users)}")
            continue
        for user in node.users:
            if not (is_mixprec_cast(user) and user.meta.get(META_ROLE) == "io_cast" and user.args[1] == dtype):
                raise InvariantError(
                    f"model input {position} ({node.name}){where} is read by {user.name} without its rounding to {dtype}"
                )


def _check_outputs(ctx, where):
    for position, value in ctx.work.user_output_nodes():
        current = tensor_dtype(value)
        if current is None:
            continue
        wanted = ctx.plan.outputs.get(position)
        if wanted in IO_GRIDS:
            grid = IO_GRIDS[wanted]
            if not _on_grid(value, symmetric_scale(ctx.plan.output_ranges[position], grid), grid):
                raise InvariantError(f"output {position}{where} ({value.name}) does not leave through its {wanted} "
                                     "quantize/dequantize")
            wanted = None
        if wanted is None and ctx.keep_io_types:
            wanted = ctx.captured_output_dtypes[position]
        if wanted is not None and wanted != current:
            raise InvariantError(f"output {position}{where} is {current}, should be {wanted}")


def _tensors(val):
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (list, tuple)):
        return [t for v in val for t in _tensors(v)]
    return []


def _check_meta_truthful(graph, where):
    """Re-run every op on fake tensors and compare the dtypes it really produces with the meta.

    Its own loop, not an observer of the graph runner (``ir/runner.py``): it is propagation of meta values, not a
    run of the program. It feeds placeholders from their ``meta["val"]`` inside the capture's fake mode (the
    runner feeds real state from the signature), calls only ``call_function`` targets (a real ``get_attr`` tensor
    must not enter the fake mode), needs no freeing (fake tensors hold no memory) and no user outputs. None of the
    runner's three services would be used; only its ten-line node loop would be shared."""
    from torch._guards import detect_fake_mode

    env = {}
    vals = [n.meta.get("val") for n in graph.nodes if n.op == "placeholder"]
    fake_mode = detect_fake_mode(tuple(v for v in vals if isinstance(v, torch.Tensor)))
    if fake_mode is None:
        return
    # no autograd: programs are for inference, and an in-place write into a fake leaf that requires grad
    # (a KV cache lifted from a module) would be refused by autograd, not by the op
    with fake_mode, torch.no_grad():
        for node in graph.nodes:
            if node.op in ("placeholder", "get_attr"):  # a backend's module reads its state through get_attr
                env[node] = node.meta.get("val")
                continue
            if node.op != "call_function" or node.meta.get(META_ROLE) == "guard":
                continue  # the run-time guard reads values (backends/guard.py): it has no dtype to check
            args = torch.fx.node.map_arg(node.args, lambda n: env[n])
            kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
            try:
                result = node.target(*args, **kwargs)
            except Exception as e:  # the op rejects the dtypes it is given: exactly what we check for
                raise InvariantError(f"{node.name} ({node.target}){where} fails on its inputs: {e}") from e
            real = [t.dtype for t in _tensors(result)]
            meta = [t.dtype for t in _tensors(node.meta.get("val"))]
            if real != meta:
                raise InvariantError(f"{node.name}{where}: meta says {meta}, the op produces {real}")
            env[node] = result
