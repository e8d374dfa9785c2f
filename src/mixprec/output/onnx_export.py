"""Export a compiled program to a strongly typed ONNX model (``prog.export_onnx(path)``).

The rewritten ExportedProgram already spells out every precision decision: each layer
computes in its planned dtype, and every conversion is an explicit ``aten.to.dtype``
node. torch's ONNX exporter (``torch.onnx.export(..., dynamo=True)``) translates that
graph op for op, so the ONNX model carries the plan as tensor types and Cast nodes.
A strongly typed consumer — ONNX Runtime (tested), TensorRT's strongly-typed mode (the
target; no GPU here to test it) — then runs each node in the dtype the plan chose
instead of picking precisions of its own.

mixprec does not take that on trust. After translation it walks the ONNX graph and,
for every ONNX value that carries an FX value, checks that its element type is the
dtype of the FX value (which mixprec's verifier has checked against the plan); a
mismatch is an error, not a silent change of precision. Every ONNX node that comes
from a planned layer is annotated (``metadata_props``: ``mixprec.layer``,
``mixprec.precision``, ``mixprec.accumulate``, ``mixprec.module``), casts mixprec made
carry ``mixprec.cast``, and the model carries the whole plan as ``mixprec.plan``.

The exporter decomposes some layers into several ONNX nodes (attention becomes
MatMul/Softmax/MatMul; batch norm goes through ``_native_batch_norm_legit``); node
provenance (``from_node``) maps each decomposed node back to the layer it came from.

``onnx`` and ``onnxscript`` are optional dependencies (``pip install mixprec[onnx]``),
imported only here.
"""

from __future__ import annotations

import ast
import importlib.util
import os
from collections.abc import Mapping

import torch
import torch.utils._pytree as pytree
from torch.export.graph_signature import OutputKind

from ..dtypes import dtype_name, is_float
from ..errors import ConfigError, UnsupportedModelError
from ..ir.graph_info import META_ACC, META_ROLE, module_of
from . import onnx_float_weights, onnx_weight_only  # noqa: F401  (onnx_float_weights: NF4, MXFP4, FP8's forms)

_REQUIRED = ("onnx", "onnxscript")
_SCOPES = "pkg.torch.onnx.name_scopes"
_ORIGINAL_NAME = "pkg.torch.onnx.original_node_name"
_KEPT = frozenset({"Cast", "DequantizeLinear"})  # never folded into constants
_BF16_OPSET = 22  # ONNX opset 22 added bfloat16 to Conv, ConvTranspose, MaxPool, AveragePool, ...


def export_onnx(prog, path, *, opset_version: int | None = None, optimize: bool = False, check: bool = True) -> str:
    """Write ``prog`` (a MixedPrecisionModule) to ``path`` as ONNX; return the path.

    opset_version: None picks the exporter's default, or opset 22 when the program holds bf16
        tensors (the first opset whose Conv and pooling ops accept bfloat16).
    optimize: run onnxscript's whole graph optimiser. Off by default: its fusion rules rewrite
        layers the plan typed one by one (on this project's bf16 ConvNet it folded batch norm into
        the bf16 conv with fp32 weights, an ill-typed model); ONNX Runtime and TensorRT optimise
        anyway. Without it the graph is only simplified (see ``_simplify``).
    check: run ``onnx.checker.check_model`` with full shape/type inference on the written file.
    """
    _require_packages()
    import onnx_ir as ir

    ep = prog.exported_program
    path = os.fspath(path)
    if opset_version is None and _holds(ep, torch.bfloat16):
        opset_version = _BF16_OPSET
    weight_only = onnx_weight_only.holds_weight_only(ep)
    if weight_only and (opset_version or 0) < onnx_weight_only.opset(ep):
        opset_version = onnx_weight_only.opset(ep)  # e.g. int4 DequantizeLinear with block_size (opset 21)
    try:
        onnx_program = torch.onnx.export(
            ep,
            (),
            dynamo=True,
            optimize=False,
            verbose=False,
            opset_version=opset_version,
            output_names=_output_names(ep),
            custom_translation_table=onnx_weight_only.translations() if weight_only else None,
        )
    except Exception as e:  # the exporter raises many types; all mean "could not translate"
        raise UnsupportedModelError(
            f"torch.onnx.export could not translate this program: {_first_line(e)}\n"
            "The program still runs in PyTorch (prog(...)); ONNX export needs every op of the rewritten graph to "
            "have an ONNX translation.",
            reason=str(e),
        ) from e

    if weight_only:
        onnx_weight_only.finish(onnx_program.model, ep)
    if optimize:
        onnx_program.optimize()
    else:
        _simplify(onnx_program.model)
    model = onnx_program.model
    decomposed = onnx_program.exported_program
    origins = _origins(decomposed.graph)
    rewritten = {n.name: n for n in ep.graph.nodes}
    _check_types(model, decomposed.graph, origins, rewritten, _onnx_float_types(ir))
    _annotate(model, prog.plan, origins, rewritten)
    model.metadata_props["mixprec.plan"] = prog.plan.to_json(indent=None)
    from .._version import __version__

    model.metadata_props["mixprec.version"] = __version__
    onnx_program.save(path)
    if check:
        import onnx

        try:
            onnx.checker.check_model(path, full_check=True)
        except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
            raise UnsupportedModelError(
                f"the ONNX model written to {path} does not pass the ONNX checker: {_first_line(e)}",
                reason=str(e),
            ) from e
    return path


def _simplify(model) -> None:
    """Fold constant subgraphs and drop dead nodes; change no layer and no cast.

    Needed beyond tidiness: the exporter writes ``aten.split`` as SplitToSequence, which ONNX
    does not define for bfloat16; constant folding turns it into Split, which it does. Cast
    nodes are never folded: a stored-low weight cast up at use stays an explicit Cast.
    """
    import onnxscript.optimizer as optimizer

    optimizer.inline(model)
    provenance = {v.name: dict(n.metadata_props) for n in model.graph.all_nodes() for v in n.outputs}
    # nor DequantizeLinear: weight-only layers keep their int8/int4 initializers (onnx_weight_only.py)
    optimizer.fold_constants(model, should_fold=lambda node: False if node.op_type in _KEPT else None)
    optimizer.remove_unused_nodes(model)
    for node in model.graph.all_nodes():  # a node the folder made in place of another keeps its provenance
        if not node.metadata_props:
            known = next((provenance[v.name] for v in node.outputs if provenance.get(v.name)), {})
            node.metadata_props.update(known)


def _holds(ep, dtype: torch.dtype) -> bool:
    """Whether any value of the program (parameters included) is a tensor of ``dtype``."""
    for node in ep.graph.nodes:
        val = node.meta.get("val")
        vals = val if isinstance(val, (list, tuple)) else (val,)
        if any(isinstance(v, torch.Tensor) and v.dtype == dtype for v in vals):
            return True
    return False


def _require_packages() -> None:
    missing = [name for name in _REQUIRED if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(
            f"export_onnx needs the package(s) {', '.join(missing)}, which are not installed; "
            "install them with: pip install 'mixprec[onnx]'  (or: pip install onnx onnxscript)."
        )


def _output_names(ep) -> list[str] | None:
    """ONNX output names from the model's output structure: 'output', 'output_0', 'logits', ...

    None (the exporter's own names) when the program returns anything but user tensors.
    """
    if any(spec.kind != OutputKind.USER_OUTPUT for spec in ep.graph_signature.output_specs):
        return None
    values = ep.graph.output_node().args[0]
    if not all(isinstance(v, torch.fx.Node) and isinstance(v.meta.get("val"), torch.Tensor) for v in values):
        return None
    spec = ep.call_spec.out_spec
    if spec is None or spec.num_leaves != len(values):
        return None
    leaves = pytree.tree_flatten_with_path(pytree.tree_unflatten(list(range(spec.num_leaves)), spec))[0]
    names: list[str] = []
    for keys, _ in leaves:
        parts = [_key_part(k) for k in keys]
        named = parts and not isinstance(keys[0], pytree.SequenceKey)  # a dict key or attribute names it
        name = "_".join(parts) if named else "_".join(["output", *parts])
        while name in names:
            name += "_"
        names.append(name)
    return names


def _key_part(key) -> str:
    if isinstance(key, pytree.MappingKey):
        return str(key.key)
    if isinstance(key, pytree.SequenceKey):
        return str(key.idx)
    return str(getattr(key, "name", key))


def _origins(graph: torch.fx.Graph) -> dict[str, str]:
    """Decomposed node name -> name of the node of the rewritten graph it came from."""
    out = {}
    for node in graph.nodes:
        name = node.name
        sources = node.meta.get("from_node")
        while sources:
            source = sources[-1]
            name = source.name
            sources = source.from_node
        out[node.name] = name
    return out


def _onnx_nodes(model):
    """(ONNX node, name of the decomposed FX node it was translated from) for every node, subgraphs included."""
    for node in model.graph.all_nodes():
        scopes = node.metadata_props.get(_SCOPES)
        fx_name = None
        if scopes:
            try:
                fx_name = ast.literal_eval(scopes)[-1]
            except (ValueError, SyntaxError, IndexError):
                fx_name = None
        yield node, fx_name


def _onnx_float_types(ir) -> dict:
    return {
        torch.float32: ir.DataType.FLOAT,
        torch.float16: ir.DataType.FLOAT16,
        torch.bfloat16: ir.DataType.BFLOAT16,
        torch.float64: ir.DataType.DOUBLE,
    }


def _check_types(model, graph: torch.fx.Graph, origins: Mapping[str, str], rewritten: Mapping, onnx_types) -> None:
    """Every ONNX value named after an FX value has that value's float dtype (strong typing held)."""
    values = {v.name: v for v in model.graph.inputs}
    for value in model.graph.initializers.values():  # named after the state dict; the placeholder name is kept
        values.setdefault(value.metadata_props.get(_ORIGINAL_NAME, value.name), value)
    for node in model.graph.all_nodes():
        for value in node.outputs:
            values.setdefault(value.name, value)
    for fx_node in graph.nodes:
        val = fx_node.meta.get("val")
        value = values.get(fx_node.name)
        if value is None or not isinstance(val, torch.Tensor) or not is_float(val.dtype) or value.dtype is None:
            continue
        if value.dtype != onnx_types[val.dtype]:
            origin = rewritten.get(origins.get(fx_node.name, fx_node.name))
            where = f"'{fx_node.name}'"
            if origin is not None:
                where = f"layer '{origin.name}' (module '{module_of(origin)[0]}')"
            raise UnsupportedModelError(
                f"the ONNX exporter typed the value '{value.name}' of {where} as {value.dtype.name}, but the "
                f"program computes it in {dtype_name(val.dtype)}; the ONNX model would not follow the plan. "
                "Deploy the PyTorch program instead (or, if you passed optimize=True, export without it)."
            )


def _annotate(model, plan, origins: Mapping[str, str], rewritten: Mapping) -> None:
    for onnx_node, fx_name in _onnx_nodes(model):
        origin = rewritten.get(origins.get(fx_name, fx_name)) if fx_name else None
        if origin is None:
            continue
        decision = plan.get(origin.name)
        props = onnx_node.metadata_props
        if decision is not None:
            props["mixprec.layer"] = origin.name
            props["mixprec.module"] = module_of(origin)[0]
            props["mixprec.precision"] = dtype_name(decision.precision)
            accumulate = origin.meta.get(META_ACC) or decision.accumulate
            if accumulate is not None:
                props["mixprec.accumulate"] = dtype_name(accumulate)
        role = origin.meta.get(META_ROLE)
        if role is not None and onnx_node.op_type == "Cast":
            props["mixprec.cast"] = role


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
