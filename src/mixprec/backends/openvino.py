"""The OpenVINO backend: run the rewritten program on OpenVINO's CPU runtime.

``backend="openvino"`` (``pip install 'mixprec[openvino]'``) converts the rewritten,
strongly typed ExportedProgram with ``openvino.convert_model`` and compiles it for
OpenVINO's ``"CPU"`` device. What it does to the program on the way:

* **the plan's dtypes, or wider.** OpenVINO's CPU plugin picks an *inference precision*
  (bf16 by default on CPUs with bf16 instructions) and lowers f32 layers to it; we compile
  with ``INFERENCE_PRECISION_HINT=f32``, under which it keeps the element types the program
  states (the bf16 layers bf16, the fp32 islands f32). Then ``openvino_audit`` reads the runtime
  model back: a layer the plugin computes in a *wider* float type than planned (f32 for bf16: global
  pooling and sums on a CPU with native bf16, every bf16/fp16 layer on a CPU without it) is accepted
  and reported as it runs (the runner's ``computes_in``, the records' ``runs_as``); a narrower one is
  refused with UnsupportedModelError naming the report's nodes and modules, rather than silently
  running other numerics than the plan. Integer runtime precisions (int8 kernels, index
  arithmetic) are how int8 layers run.
* **int8 regions on int8 kernels.** mixprec's symmetric quantize/dequantize pairs
  (``ops/custom.py``) become ``quantized_decomposed`` quantize/dequantize pairs with the same
  scale, zero point 0 and range [-127, 127] (OpenVINO makes a FakeQuantize of them), and
  an int8 weight with its per-channel scales becomes Convert(int8) * scale — the
  dequantization pattern OpenVINO's low-precision transformations fold into int8
  convolution/matmul kernels. Same grid, same scales; the sums are int32's.
* **contiguous stored tensors.** OpenVINO's PyTorch frontend makes a bf16 constant from a
  *temporary* contiguous copy of a non-contiguous tensor and keeps pointing at that copy's
  memory after it is freed; mixprec stores bf16 convolution weights channels_last (the
  faster layout for PyTorch's bf16 kernels), so OpenVINO computed with freed memory
  (ResNet-50 came back with rel-L2 1.0, a tiny ResNet with NaN/inf). The program handed to
  OpenVINO holds contiguous copies of such tensors, and the runner keeps that program alive
  as long as the compiled model (whose constants share its memory).

Dynamic dimensions: OpenVINO's frontend makes every dimension dynamic; the converted
model is reshaped to the program's input specs — static sizes static, dimensions captured
as dynamic bounded by their ranges (``range_constraints``).

Threads: an OpenVINO infer request runs one inference at a time; the runner keeps a pool
of requests, takes one per call (creating one when all are busy) and gives it back after
copying the outputs out, so calls from several threads run concurrently on one compiled
model (which OpenVINO documents as thread-safe).

Save/load: a saved program is the ExportedProgram; loading with this backend converts
and compiles it again (no OpenVINO blob is stored: it is tied to the OpenVINO version and
the CPU it was compiled on).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import queue
import re

import torch
import torch.utils._pytree as pytree
from torch._guards import detect_fake_mode
from torch.export.graph_signature import InputKind, OutputKind, TensorArgument

from ..errors import ConfigError, UnsupportedModelError
from ..ir.input_check import input_specs_of
from ..ops.custom import INT8_MAX, INT8_MIN
from . import register_backend
from .openvino_audit import (
    NATIVE_CAPABILITY, NodeNames, audit, declared_precisions, int8_nodes, node_types, refusal, runtime_layers,
)

DEVICE = "CPU"
# Compile settings of every mixprec program (see the module docstring).
# f32: keep the element types the program states; no dynamic quantization of the activations of layers
# with int8 weights (weight-only int8 computes in float32 activations, as planned).
COMPILE_CONFIG = {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}

# OpenVINO's element type names -> torch dtypes (what the runner's computes_in holds)
_TORCH_TYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32, "f64": torch.float64}

log = logging.getLogger(__name__)


@register_backend("openvino")
def build(exported_program, settings=None):
    """Convert ``exported_program`` with OpenVINO and compile it for the CPU."""
    return OpenVINORunner(exported_program)


def import_openvino():
    try:
        import openvino
    except ImportError as e:
        raise ConfigError(
            "backend='openvino' needs OpenVINO, which is not installed: pip install 'mixprec[openvino]' "
            "(or pick backend='eager' or 'inductor')."
        ) from e
    return openvino


class OpenVINORunner(torch.nn.Module):
    """The compiled program: callable like the model, safe to call from several threads.

    ``computes_in``: program node name -> the torch dtype OpenVINO computes it in, for the nodes it runs
    otherwise than the program states (wider float types; int8 layers in float32 without int8 kernels).
    The report reads it into ``LayerRecord.runs_as``."""

    def __init__(self, exported_program):
        super().__init__()
        ov = import_openvino()
        self.__dict__["_program"] = exported_program  # not a submodule: the runner holds no torch state
        self._specs = input_specs_of(exported_program)
        _check_no_mutations(exported_program)
        self._user_inputs = _user_input_names(exported_program)
        self._outputs = _user_outputs(exported_program)
        self._out_spec = exported_program.call_spec.out_spec
        converted = convert_program(exported_program)
        model = converted.model
        # OpenVINO's constants point into the prepared program's tensors: they must outlive the compiled model
        self.__dict__["_prepared"] = converted.prepared
        self._input_ports = _bind_inputs(model, self._user_inputs)
        _set_input_shapes(ov, model, self._input_ports, self._specs)
        n_tensors = sum(1 for kind, _ in self._outputs if kind == "tensor")
        if len(model.outputs) != n_tensors:
            raise UnsupportedModelError(
                f"OpenVINO made {len(model.outputs)} outputs of this program's {n_tensors} output tensors "
                "(it merges outputs that are the same value); run it with backend='eager' or 'inductor'."
            )
        core = ov.Core()
        try:
            self.__dict__["_compiled"] = core.compile_model(model, DEVICE, dict(COMPILE_CONFIG))
        except RuntimeError as e:
            raise UnsupportedModelError(
                f"OpenVINO could not compile this program for its CPU device: {_first_line(e)}\n"
                "Run it with backend='eager' or 'inductor'.",
                reason=str(e),
            ) from e
        self.computes_in = _audit(ov, core, exported_program, converted, self._compiled)
        self.__dict__["_model"] = model
        self._idle: queue.SimpleQueue = queue.SimpleQueue()
        self._idle.put(self._compiled.create_infer_request())

    def forward(self, *args, **kwargs):
        from ..ir.call_signature import flat_user_inputs

        leaves = flat_user_inputs(self._program, args, kwargs)
        tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
        feed = {}
        for port, position in self._input_ports:
            feed[port] = _to_ov_tensor(tensors[position])
        try:
            request = self._idle.get_nowait()
        except queue.Empty:
            request = self._compiled.create_infer_request()
        try:
            request.infer(feed, share_inputs=True)
            results = [_to_torch(request.get_output_tensor(i)) for i in range(len(self._compiled.outputs))]
        finally:
            self._idle.put(request)
        flat, it = [], iter(results)
        for kind, value in self._outputs:
            flat.append(next(it) if kind == "tensor" else value)
        return pytree.tree_unflatten(flat, self._out_spec)

    @property
    def compiled_model(self):
        """The ``openvino.CompiledModel`` (its ``get_runtime_model()`` shows what runs in which precision)."""
        return self._compiled

    @property
    def converted_model(self):
        """The ``openvino.Model`` it was compiled from (the element types the program states)."""
        return self._model


# ---- conversion -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Converted:
    """A program converted for OpenVINO: the ``openvino.Model``, the prepared program whose tensors its
    constants share (keep it alive as long as the model or anything compiled from it), how OpenVINO's
    names map back to the program's nodes, and whether int8 layers were handed over for int8 kernels."""

    model: object
    prepared: object
    names: NodeNames
    int8_kernels: bool


def convert(exported_program, *, int8_kernels: bool | None = None):
    """(``openvino.convert_model`` of the program prepared for OpenVINO, the prepared program): see
    :func:`for_openvino`. The model's constants share memory with the prepared program's tensors:
    keep it alive as long as the model or anything compiled from it. UnsupportedModelError names
    the operators OpenVINO cannot convert."""
    converted = convert_program(exported_program, int8_kernels=int8_kernels)
    return converted.model, converted.prepared


def convert_program(exported_program, *, int8_kernels: bool | None = None) -> Converted:
    """:func:`convert`, with the names that map OpenVINO's layers back to the program's nodes."""
    ov = import_openvino()
    kernels = int8_kernels_exact() if int8_kernels is None else int8_kernels
    prepared = for_openvino(exported_program, int8_kernels=kernels)
    try:
        with _quiet():
            # the decoder convert_model would make of the program, made here to keep the graph it reads
            # (the decomposed program, whose nodes name OpenVINO's operations): openvino_audit.NodeNames
            decoder = _decoder(prepared)
            model = ov.convert_model(decoder if decoder is not None else prepared)
    except Exception as e:  # OpConversionFailure, and whatever its decoder raises on odd graphs
        text = str(e)
        ops = _failed_ops(text)
        what = f"the operator(s) {', '.join(ops)}" if ops else "this program"
        raise UnsupportedModelError(
            f"OpenVINO {_version(ov)} cannot convert {what}: {_first_line(e) if not ops else 'no conversion rule'}. "
            "Run the program with backend='inductor' or 'eager', or keep these operators out of the model.",
            reason=text,
        ) from e
    graph = getattr(getattr(decoder, "pt_module", None), "graph", None)
    names = NodeNames.of(graph, prepared, exported_program) if graph is not None else NodeNames()
    return Converted(model, prepared, names, kernels)


def _decoder(prepared):
    """OpenVINO's FX decoder of ``prepared`` (what ``convert_model`` builds for an ExportedProgram), or None
    where this OpenVINO has no such class (then the names are read as the program's own)."""
    try:
        from openvino.frontend.pytorch.fx_decoder import TorchFXPythonDecoder
    except ImportError:
        return None
    make = getattr(TorchFXPythonDecoder, "from_exported_program", None)
    return make(prepared) if make is not None else None


def for_openvino(exported_program, *, int8_kernels: bool | None = None):
    """The program as OpenVINO should read it: mixprec's int8 operators as the quantize/dequantize
    patterns OpenVINO runs on int8 kernels (where they compute today's numerics: ``int8_kernels``, by
    default :func:`int8_kernels_exact`), stored tensors contiguous. Returns a new ExportedProgram
    (the given one is not changed; unchanged tensors are shared)."""
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers torch.ops.quantized_decomposed)

    from ..ir.work_program import WorkProgram

    work = WorkProgram.from_exported(exported_program)
    for store in (work.state_dict, work.constants):
        for name, value in list(store.items()):
            if isinstance(value, torch.Tensor) and not value.is_contiguous():
                contiguous = value.detach().contiguous()
                store[name] = torch.nn.Parameter(contiguous, requires_grad=False) if isinstance(
                    value, torch.nn.Parameter) else contiguous
    _lower_int8(work, int8_kernels_exact() if int8_kernels is None else int8_kernels)
    _drop_constant_outputs(work)
    return work.to_exported()


def _drop_constant_outputs(work) -> None:
    """The program with a flat tuple of its output tensors: outputs that are not tensors (``return y, 3``)
    are put back by the runner, which also rebuilds the output structure; OpenVINO's decoder takes neither."""
    import dataclasses

    output = work.graph.output_node()
    values = output.args[0]
    keep = [i for i, v in enumerate(values) if isinstance(v, torch.fx.Node)]
    output.args = (tuple(values[i] for i in keep),)
    work.output_specs[:] = [work.output_specs[i] for i in keep]
    flat = pytree.tree_structure(tuple(range(len(keep))))
    codegen = work.graph._codegen
    if getattr(codegen, "pytree_info", None) is not None:
        codegen.pytree_info = codegen.pytree_info._replace(out_spec=flat)
    work.module_call_graph[:] = [
        dataclasses.replace(entry, signature=dataclasses.replace(entry.signature, out_spec=flat))
        if entry.fqn == "" and entry.signature is not None else entry
        for entry in work.module_call_graph
    ]


def int8_kernels_exact() -> bool:
    """Whether this CPU's int8 kernels compute today's int8 numerics: they need VNNI (or AMX).

    Without it (AVX2 only) the int8 matmul multiplies u8 by s8 and adds pairs of products in 16
    bits (vpmaddubsw), which saturates on full-range 8-bit weights: four int8 Linear(1024) layers
    on OpenVINO's int8 kernels came out with rel-L2 0.24 against the same quantized layers in
    float32 (bench/RESULTS.md, "OpenVINO backend").
    """
    try:
        if torch.cpu._is_vnni_supported() or torch.cpu._is_amx_tile_supported():
            return True
    except AttributeError:  # older torch: read the flags
        pass
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return bool({"avx512_vnni", "avx_vnni", "amx_int8"} & set(flags))


def _lower_int8(work, kernels: bool) -> None:
    """mixprec's quantize/dequantize as OpenVINO reads them.

    ``kernels``: quantize -> dequantize pairs become quantized_decomposed pairs (OpenVINO's
    FakeQuantize, which its low-precision transformations turn into int8 kernels). Otherwise the
    same arithmetic as ``ops/custom.py`` in plain float32 operations (fake quantization, as on the eager
    backend). Per-channel weights are Convert(int8) * scale either way.
    """
    qd = torch.ops.quantized_decomposed
    graph = work.graph
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is torch.ops.mixprec.quantize_per_tensor.default:
            x, scale = node.args
            if kernels:
                node.target = qd.quantize_per_tensor.default
                node.args = (x, float(scale), 0, INT8_MIN, INT8_MAX, torch.int8)
                continue
            with graph.inserting_before(node):
                as_float = x
                if x.meta["val"].dtype != torch.float32:
                    as_float = _call(graph, torch.ops.aten.to.dtype, (x, torch.float32), x, torch.float32)
                scaled = _call(graph, torch.ops.aten.div.Tensor, (as_float, float(scale)), x, torch.float32)
                rounded = _call(graph, torch.ops.aten.round.default, (scaled,), x, torch.float32)
                bounds = (float(INT8_MIN), float(INT8_MAX))
                clamped = _call(graph, torch.ops.aten.clamp.default, (rounded, *bounds), x, torch.float32)
                out = _call(graph, torch.ops.aten.to.dtype, (clamped, torch.int8), x, torch.int8)
            node.replace_all_uses_with(out)
            graph.erase_node(node)
        elif node.target is torch.ops.mixprec.dequantize_per_tensor.default:
            q, scale, dtype = node.args
            if kernels:
                node.target = qd.dequantize_per_tensor.default
                node.args = (q, float(scale), 0, INT8_MIN, INT8_MAX, torch.int8)
                node.kwargs = {"out_dtype": dtype}
                continue
            with graph.inserting_before(node):
                as_float = _call(graph, torch.ops.aten.to.dtype, (q, torch.float32), q, torch.float32)
                out = _call(graph, torch.ops.aten.mul.Tensor, (as_float, float(scale)), q, torch.float32)
                if dtype != torch.float32:
                    out = _call(graph, torch.ops.aten.to.dtype, (out, dtype), q, dtype)
            node.replace_all_uses_with(out)
            graph.erase_node(node)
        elif node.target is torch.ops.mixprec.dequantize_per_channel.default:
            q, scales, axis, dtype = node.args
            shape = [1] * q.meta["val"].dim()
            shape[axis] = -1
            with graph.inserting_before(node):
                as_float = _call(graph, torch.ops.aten.to.dtype, (q, torch.float32), q, torch.float32)
                column = graph.call_function(torch.ops.aten.view.default, (scales, shape))
                column.meta["val"] = _fake(scales, lambda v: v.view(shape))
                out = _call(graph, torch.ops.aten.mul.Tensor, (as_float, column), q, torch.float32)
                if dtype != torch.float32:
                    out = _call(graph, torch.ops.aten.to.dtype, (out, dtype), q, dtype)
            node.replace_all_uses_with(out)
            graph.erase_node(node)
    work.sync_output_specs()


def _fake(like: torch.fx.Node, make):
    val = like.meta["val"]
    fake_mode = detect_fake_mode((val,))
    with fake_mode if fake_mode is not None else contextlib.nullcontext():
        return make(val)


def _call(graph, target, args, like: torch.fx.Node, dtype) -> torch.fx.Node:
    """A new node computing ``target(*args)`` with the shape of ``like`` and ``dtype``."""
    node = graph.call_function(target, args)
    node.meta["val"] = _fake(like, lambda v: torch.empty_like(v, dtype=dtype))
    return node


def _failed_ops(text: str) -> list[str]:
    ops = []
    for pattern in (r"No conversion rule found for operations: ([^\n]+)", r"Conversion is failed for: ([^\n]+)"):
        for match in re.finditer(pattern, text):
            ops.extend(op.strip() for op in match.group(1).split(",") if op.strip())
    return list(dict.fromkeys(ops))


# ---- inputs and outputs ---------------------------------------------------------------------


def _check_no_mutations(exported_program) -> None:
    mutating = [
        s.target for s in exported_program.graph_signature.output_specs
        if s.kind in (OutputKind.BUFFER_MUTATION, OutputKind.PARAMETER_MUTATION, OutputKind.USER_INPUT_MUTATION)
    ]
    if mutating:
        raise UnsupportedModelError(
            f"this program writes into {', '.join(map(str, mutating))} when it runs; OpenVINO runs stateless "
            "programs only. Run it with backend='eager' or 'inductor'."
        )


def _user_input_names(exported_program) -> list[str]:
    """Placeholder names of the user input tensors, in the order of the flattened call's tensors."""
    user = {s.arg.name for s in exported_program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT}
    return [
        n.name for n in exported_program.graph.nodes
        if n.op == "placeholder" and n.name in user and isinstance(n.meta.get("val"), torch.Tensor)
    ]


def _user_outputs(exported_program) -> list[tuple[str, object]]:
    """("tensor", None) or ("constant", value) for every user output, in order."""
    out = []
    for spec in exported_program.graph_signature.output_specs:
        if spec.kind != OutputKind.USER_OUTPUT:
            continue
        if isinstance(spec.arg, TensorArgument):
            out.append(("tensor", None))
        else:
            out.append(("constant", getattr(spec.arg, "value", None)))
    return out


def _bind_inputs(model, names: list[str]) -> list[tuple[int, int]]:
    """(OpenVINO input index, position among the call's tensors) for every input the model kept.

    OpenVINO keeps the program's input order; when it dropped inputs (unused ones), the others are
    matched by name (OpenVINO may name an input after the argument, "input", where fx says "input_1")."""
    if len(model.inputs) == len(names):
        return [(i, i) for i in range(len(names))]
    position = {name: i for i, name in enumerate(names)}
    ports = []
    for index, port in enumerate(model.inputs):
        hits = [position[n] for n in port.get_names() if n in position]
        if not hits:
            raise UnsupportedModelError(
                f"OpenVINO's model has an input {sorted(port.get_names())} that is none of the program's inputs "
                f"({', '.join(names)}); run it with backend='eager' or 'inductor'."
            )
        ports.append((index, hits[0]))
    return ports


def _set_input_shapes(ov, model, ports, specs) -> None:
    shapes = {}
    for index, position in ports:
        dims = []
        for d in specs[position].dims:
            if isinstance(d, int):
                dims.append(ov.Dimension(d))
            else:
                low, high = d
                dims.append(ov.Dimension(int(low), int(high) if high is not None else -1))
        shapes[model.inputs[index]] = ov.PartialShape(dims)
    if shapes:
        model.reshape(shapes)


_TO_OV_VIEW = {torch.bfloat16: torch.int16}


def _to_ov_tensor(tensor: torch.Tensor):
    import openvino as ov

    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return ov.Tensor(t.view(torch.int16).numpy(), ov.Shape(list(t.shape)), ov.Type.bf16)
    if t.dtype == torch.bool:
        return ov.Tensor(t.numpy())
    return ov.Tensor(t.numpy(), shared_memory=True)


def _to_torch(ov_tensor) -> torch.Tensor:
    import numpy as np
    import openvino as ov

    data = np.array(ov_tensor.data, copy=True)  # the request's buffer is reused by its next inference
    if ov_tensor.element_type == ov.Type.bf16:
        return torch.from_numpy(data.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(data)


# ---- precisions -----------------------------------------------------------------------------


def _audit(ov, core, exported_program, converted: Converted, compiled) -> dict:
    """What the runtime model computes in which type (openvino_audit): program node -> torch dtype for the
    nodes that run otherwise than the program states; refuses layers the plugin would run narrower."""
    capabilities = _capabilities(core)
    result = audit(
        declared_precisions(converted.model), runtime_layers(compiled), names=converted.names,
        capabilities=capabilities, node_types=node_types(exported_program), int8_nodes=int8_nodes(exported_program),
        int8_kernels=converted.int8_kernels,
    )
    if result.narrower:
        raise UnsupportedModelError(
            refusal(result.narrower, converted.names, capabilities=capabilities, version=_version(ov)),
            reason="; ".join(f"{m.layer}: {m.planned} -> {m.runs}" for m in result.narrower),
        )
    computes_in = {node: _TORCH_TYPES[t] for node, t in result.computes_in.items()}
    if computes_in:
        lacking = [t for t in ("bf16", "f16") if NATIVE_CAPABILITY[t] not in capabilities]
        why = (f"this CPU computes no {'/'.join(lacking)} natively (OpenVINO's capabilities: {'/'.join(capabilities)})"
               if lacking else "OpenVINO has no low-precision kernel or output for them on this CPU")
        log.info("OpenVINO computes %d node(s) in a wider type than the program states (%s): %s", len(computes_in),
                 why, ", ".join(f"{n} in {t}" for n, t in list(result.computes_in.items())[:20]))
    return computes_in


def _version(ov) -> str:
    return str(getattr(ov, "__version__", "?")).split("-")[0]


def _capabilities(core) -> list[str]:
    """The CPU's OPTIMIZATION_CAPABILITIES (BF16, FP16, FP32, INT8, ...): which types it computes natively."""
    try:
        return [str(c) for c in core.get_property(DEVICE, "OPTIMIZATION_CAPABILITIES")]
    except Exception:  # an OpenVINO that does not say: nothing is known to be native
        return []


@contextlib.contextmanager
def _quiet():
    """Conversion without OpenVINO's chatter: FutureWarnings, and the warnings (with tracebacks) its decoder
    logs on the root logger about its decomposition table, which ``convert_model`` silences itself."""
    import warnings

    def keep(record) -> bool:
        return not (record.levelno < logging.ERROR and "openvino" in record.pathname.replace("\\", "/").split("/"))

    root = logging.getLogger()
    root.addFilter(keep)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning)
            yield
    finally:
        root.removeFilter(keep)


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
