"""A program converted for OpenVINO: prepared the way OpenVINO must read it, then ``openvino.convert_model``.

Preparing is backend graph passes (``backends/lowering``: contracts, and the verifier in tests) on a private copy of
the program — the program the user holds and saves is not changed:

* **contiguous stored tensors** (``contiguous_state``). OpenVINO's PyTorch frontend makes a bf16 constant from a
  *temporary* contiguous copy of a non-contiguous tensor and keeps pointing at that copy's memory after it is freed
  (mixprec stores bf16 convolution weights channels_last), so OpenVINO computed with freed memory. The prepared
  program holds contiguous copies, and the runner keeps it alive as long as the compiled model (whose constants
  share its memory).
* **int8 regions** (``qdq_lowered``): mixprec's quantize/dequantize spelled by the OPENVINO_INT8 table of
  ``backends/lowering/qdq.py`` where OpenVINO's int8 kernels are exact on this CPU (``backends/lowering/cpu.py``),
  by the OPENVINO_FLOAT table elsewhere; then (``openvino_int8_grid``) a convolution's input grid [-127, 127] spelled
  [-128, 127] (256 levels, same scale and steps): with 255 levels OpenVINO re-maps a signed activation feeding a
  Convolution onto u8 with a second rounding (bench/log/2026-11.md "Issue 34: the configurator's int8 as NNCF's").
* **weight-only layers**, rows of the same tables (``compressed.py``): each weight format's compressed constants,
  which OpenVINO fuses into its weight-compressed FullyConnected (``f32_layers``: those layers' pattern in f32).
* **a flat tuple of output tensors** (``tensor_outputs``): the runner puts back outputs that are not tensors
  (``return y, 3``) and rebuilds the output structure; OpenVINO's decoder takes neither.

Conversion keeps the decoder it made, whose graph (the program as OpenVINO's frontend decomposed it) maps OpenVINO's
operation names back to the program's nodes (``audit.NodeNames``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re

import torch
import torch.utils._pytree as pytree

from ...errors import ConfigError, UnsupportedModelError
from ...ir.passes import PassResult, backend_pass
from ...ops.names import op_name, packet_name
from ...ops.quant import INT8_SYMMETRIC
from ..lowering import cpu, run_passes
from ..lowering.qdq import OPENVINO_FLOAT, OPENVINO_INT8, lowering_pass
from .audit import NodeNames
from .compressed import finish  # also registers the weight-only rows of the OpenVINO tables
from . import float_weights  # noqa: F401  (registers NF4, MXFP4 and FP8's forms in compressed.FORMS)
from .state import state_as_io, written_specs


def import_openvino():
    try:
        import openvino
    except ImportError as e:
        raise ConfigError(
            "backend='openvino' needs OpenVINO, which is not installed: pip install 'mixprec[openvino]' "
            "(or pick backend='eager' or 'inductor')."
        ) from e
    return openvino


@dataclasses.dataclass(frozen=True)
class Converted:
    """A program converted for OpenVINO: the ``openvino.Model``, the prepared program whose tensors its
    constants share (keep it alive as long as the model or anything compiled from it), how OpenVINO's
    names map back to the program's nodes, and whether int8 layers were handed over for int8 kernels."""

    model: object
    prepared: object
    names: NodeNames
    int8_kernels: bool
    state: int = 0  # how many written tensors the model takes and returns last (state.py: variables when compiled)


def convert(exported_program, *, int8_kernels: bool | None = None, f32_layers: frozenset = frozenset()):
    """(``openvino.convert_model`` of the program prepared for OpenVINO, the prepared program): see
    :func:`for_openvino`. The model's constants share memory with the prepared program's tensors:
    keep it alive as long as the model or anything compiled from it. UnsupportedModelError names
    the operators OpenVINO cannot convert."""
    converted = convert_program(exported_program, int8_kernels=int8_kernels, f32_layers=f32_layers)
    return converted.model, converted.prepared


def convert_program(exported_program, *, int8_kernels: bool | None = None,
                    f32_layers: frozenset = frozenset()) -> Converted:
    """:func:`convert`, with the names that map OpenVINO's layers back to the program's nodes."""
    ov = import_openvino()
    kernels = int8_kernels_default() if int8_kernels is None else int8_kernels
    prepared = for_openvino(exported_program, int8_kernels=kernels, f32_layers=f32_layers)
    try:
        with _quiet():
            # the decoder convert_model would make of the program, made here to keep the graph it reads
            # (the decomposed program, whose nodes name OpenVINO's operations): audit.NodeNames
            decoder = _decoder(prepared)
            model = ov.convert_model(decoder if decoder is not None else prepared)
            frontend = getattr(getattr(decoder, "pt_module", None), "graph", None)
            # weight formats' constants of types torch has no tensor of, found by the prepared nodes' names
            finish(model, NodeNames.within(frontend, prepared) if frontend is not None else NodeNames())
            # written tensors: trailing inputs/outputs, made OpenVINO variables before compiling (state.py)
            state = len(written_specs(exported_program.graph_signature.input_specs, exported_program.graph))
    except Exception as e:  # OpConversionFailure, and whatever its decoder raises on odd graphs
        text = str(e)
        ops = _failed_ops(text)
        what = f"the operator(s) {', '.join(ops)}" if ops else "this program"
        raise UnsupportedModelError(
            f"OpenVINO {version_of(ov)} cannot convert {what}: {first_line(e) if not ops else 'no conversion rule'}. "
            "Run the program with backend='inductor' or 'eager', or keep these operators out of the model.",
            reason=text,
        ) from e
    graph = getattr(getattr(decoder, "pt_module", None), "graph", None)
    names = NodeNames.of(graph, prepared, exported_program) if graph is not None else NodeNames()
    return Converted(model, prepared, names, kernels, state)


def _decoder(prepared):
    """OpenVINO's FX decoder of ``prepared`` (what ``convert_model`` builds for an ExportedProgram), or None
    where this OpenVINO has no such class (then the names are read as the program's own)."""
    try:
        from openvino.frontend.pytorch.fx_decoder import TorchFXPythonDecoder
    except ImportError:
        return None
    make = getattr(TorchFXPythonDecoder, "from_exported_program", None)
    return make(prepared) if make is not None else None


def int8_kernels_default() -> bool:
    """Whether int8 layers go to OpenVINO's int8 kernels: where they are exact for mixprec's symmetric int8
    activations on this CPU (VNNI or AMX: ``backends/lowering/cpu.py``)."""
    return cpu.int8_kernel_exact(INT8_SYMMETRIC)


def for_openvino(exported_program, *, int8_kernels: bool | None = None, f32_layers: frozenset = frozenset()):
    """The program as OpenVINO should read it (see the module docstring): ``int8_kernels`` says whether int8
    layers go to OpenVINO's int8 kernels (default :func:`int8_kernels_default`); ``f32_layers``: weight-only layers
    whose compressed pattern is in f32. Returns a new ExportedProgram (the given one is not changed; unchanged tensors
    are shared)."""
    from ...ir.work_program import WorkProgram

    kernels = int8_kernels_default() if int8_kernels is None else int8_kernels
    work = WorkProgram.from_exported(exported_program)
    table = OPENVINO_INT8 if kernels else OPENVINO_FLOAT  # quantize/dequantize and weight-only rows (compressed.py)
    lowering = lowering_pass(table, f32_layers=frozenset(f32_layers))
    qdq = (lowering, openvino_int8_grid) if kernels else (lowering,)
    run_passes(work, (state_as_io, contiguous_state, *qdq, drop_constant_outputs))
    return work.to_exported()


@backend_pass("contiguous_state", ensures={"contiguous_state"})
def contiguous_state(work) -> PassResult:
    """Contiguous copies of the stored tensors that are not (why: the module docstring)."""
    changed = False
    for store in (work.state_dict, work.constants):
        for name, value in list(store.items()):
            if isinstance(value, torch.Tensor) and not value.is_contiguous():
                contiguous = value.detach().contiguous()
                store[name] = torch.nn.Parameter(contiguous, requires_grad=False) if isinstance(
                    value, torch.nn.Parameter) else contiguous
                changed = True
    return PassResult(changed)


@backend_pass("openvino_int8_grid")
def openvino_int8_grid(work) -> PassResult:
    """Symmetric int8 quantize/dequantize pairs read by a convolution on [-128, 127] (FakeQuantize levels 256; why:
    the module docstring): same scale and steps, only a value below -127.5 steps lands on -128, not -127. Linears and
    matmuls, exact with 255 levels, keep them."""
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers torch.ops.quantized_decomposed)

    qd = torch.ops.quantized_decomposed
    changed = False
    for dq in list(work.graph.nodes):
        if dq.op != "call_function" or dq.target is not qd.dequantize_per_tensor.default:
            continue
        q = dq.args[0]
        if (tuple(dq.args[2:6]) != _SYMMETRIC or not isinstance(q, torch.fx.Node)
                or q.target is not qd.quantize_per_tensor.default or tuple(q.args[2:6]) != _SYMMETRIC
                or not any(_is_convolution(user) for user in dq.users)):
            continue
        for node in (q, dq):
            node.args = (*node.args[:3], -128, *node.args[4:])
        changed = True
    return PassResult(changed)


def _is_convolution(node) -> bool:
    return node.op == "call_function" and packet_name(op_name(node.target)) in _CONVOLUTIONS


@backend_pass("tensor_outputs", ensures={"tensor_outputs"})
def drop_constant_outputs(work) -> PassResult:
    """The program with a flat tuple of its output tensors: outputs that are not tensors (``return y, 3``)
    are put back by the runner, which also rebuilds the output structure; OpenVINO's decoder takes neither."""
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
    return PassResult(True)


_CONVOLUTIONS = frozenset({"aten.conv1d", "aten.conv2d", "aten.conv3d", "aten.convolution", "aten._convolution"})
_SYMMETRIC = (0, INT8_SYMMETRIC.qmin, INT8_SYMMETRIC.qmax, INT8_SYMMETRIC.dtype)  # zero point, qmin, qmax, dtype


def _failed_ops(text: str) -> list[str]:
    ops = []
    for pattern in (r"No conversion rule found for operations: ([^\n]+)", r"Conversion is failed for: ([^\n]+)"):
        for match in re.finditer(pattern, text):
            ops.extend(op.strip() for op in match.group(1).split(",") if op.strip())
    return list(dict.fromkeys(ops))


def version_of(ov) -> str:
    return str(getattr(ov, "__version__", "?")).split("-")[0]


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


def first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
