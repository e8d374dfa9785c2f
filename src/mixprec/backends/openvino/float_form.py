"""The model OpenVINO compiles for a program with bf16 layers: NNCF's form — an f32 graph, bf16 inference precision.

Why (issue 22). A mixed int8/bf16 program states its types: an int8 Linear computes in f32 between a bf16
producer and a bf16 consumer, so the converted model carries a Convert bf16->f32 before each int8 region and a
Convert f32->bf16 after it. Compiled with ``INFERENCE_PRECISION_HINT=f32`` (so that the plugin keeps the stated
types), each is a pass over the tensor of its own (the recorded runtime tables of a bf16 CPU,
tests/backends/openvino/fixtures/openvino-bf16-cpu/, show them as separate layers), and they cut the int8
kernels off their fusions; mixed plans ran slower than int8 alone (bench/log/2026-11.md, "Issue 22 round three:
mixed int8/bf16 plans"). NNCF hands OpenVINO an f32 model with FakeQuantize nodes and no float Convert at all,
compiled with the default inference precision (bf16 on such a CPU): the plugin lowers the f32 layers to bf16
itself (``Graph::EnforceInferencePrecision``) and picks every output type so that nothing is converted twice.

So a program with bf16 layers is handed over in that form (:func:`float_form`), from the model converted with the
stated types: every Convert between float types on the way of an activation is removed, and the layers the plan
keeps in f32 are pinned there with OpenVINO's rt_info (:data:`PIN_KEY`: the mark that makes the CPU plugin's
``Node::keepOrigPrecision()`` true, which its bf16 enforcement skips). Python cannot make that attribute, OpenVINO's
IR reader can: a model with pins goes once through ``save_model``/``read_model`` in a temporary directory.

The audit (``audit.py``) judges the compiled model against :attr:`FloatForm.declared`: the stated types, with the
exemptions :func:`float_form` lists. The plugin keeps some layers wider than planned (the tail after the last
matmul; every bf16 layer on a CPU without bf16): accepted and reported, as before. A layer it runs narrower (a
pin that did not hold in this OpenVINO version) makes the runner fall back to the stated types compiled with f32
inference precision (``runner.py``), the form of every program without bf16 layers.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from .audit import FLOAT_RANK, NodeNames

log = logging.getLogger(__name__)

# inference precision of the float form; the stated form's is f32 (runner.COMPILE_CONFIG); no dynamic int8
# activations unless the caller opts in (the runner puts weight_only_dynamic_activations in place of the 0)
FLOAT_FORM_CONFIG = MappingProxyType({"INFERENCE_PRECISION_HINT": "bf16", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0})
# The pin: OpenVINO's rt_info mark that keeps a node's element type. The key is DisableFP16Compression's
# ("precise", version 0): OpenVINO before 2026 reads it as it is (fp16_compression_is_disabled: the key's presence);
# OpenVINO 2026's IR writer turns it into DisablePrecisionConversion "dynamic:f16", whose reader makes the attribute
# the CPU plugin asks for (is_conversion_disabled(node, f16), for bf16 and f16 enforcement alike). Measured on
# OpenVINO 2026.4.1: the key "DisablePrecisionConversion_0" with a string value is not written to IR, and given
# to compile_model as it is it makes ConvertMatMulToFC throw ("Bad as from string to DisablePrecisionConversion").
PIN_KEY, PIN_VALUE = "precise_0", ""
PINNED_KEYS = frozenset({PIN_KEY, "DisablePrecisionConversion_0"})
_LOW = "bf16"
_NOT_PINNED = frozenset({"Parameter", "Result", "Constant", "FakeQuantize", "Convert"})


@dataclasses.dataclass(frozen=True)
class FloatForm:
    """``model``: the f32 model to compile with :data:`FLOAT_FORM_CONFIG`; ``declared``: operation -> the type the
    plan gives it (for the audit); ``removed``: the float Converts taken out; ``pinned``: operations kept in f32."""

    model: object
    declared: Mapping[str, str]
    removed: tuple[str, ...]
    pinned: tuple[str, ...]


def float_converts(model) -> list[str]:
    """The Converts between float types that act on values computed at run time (not on constants): what the
    float form removes. Converts of weights (int8 -> f32 for dequantization, bf16 constants) are not counted."""
    constant = constant_ops(model)
    out = []
    for op in model.get_ordered_ops():
        if op.get_type_name() != "Convert" or op.get_friendly_name() in constant:
            continue
        if _float(op.get_input_element_type(0)) and _float(op.get_output_element_type(0)):
            out.append(op.get_friendly_name())
    return out


def constant_ops(model) -> set[str]:
    """Operations whose every input derives from constants only (weights and their dequantization)."""
    constant: set[str] = set()
    for op in model.get_ordered_ops():
        kind = op.get_type_name()
        if kind == "Constant" or (kind not in ("Parameter", "ReadValue") and op.get_input_size() > 0 and all(
                op.input_value(i).get_node().get_friendly_name() in constant for i in range(op.get_input_size()))):
            constant.add(op.get_friendly_name())
    return constant


def float_form(ov, stated, declared: Mapping[str, str], *, names: NodeNames, int8_nodes: Iterable[str],
               int8_kernels: bool) -> FloatForm | None:
    """The float form of ``stated`` (the model converted with the program's types; left unchanged), or None where
    it does not apply: no bf16 layer, an f16 layer (the CPU's f16 is another matter), or a graph whose types do
    not all become f32 once the Converts are gone.

    * every Convert between float types on the way of an activation is removed (one that widens a graph input or
      feeds an output stays: it is the program's I/O dtype; an f32 input's Convert to bf16 goes, its f32 readers
      round it at bf16 inference precision as the bf16 layer did); stored codes decompressed to bf16 (a weight-only
      pattern) decompress to f32; bf16 constants (weights stored bf16) are read through a
      Convert to f32, which the plugin folds and — being bf16 values — lowers back to bf16 exactly;
    * the layers the plan keeps in f32 are pinned (:data:`PIN_KEY`, the mark OpenVINO's own precision-sensitive
      passes set);
    * not pinned, besides the bf16 layers: FakeQuantize (it reads the same values from a bf16 tensor as from its
      f32 copy, and pinning it would put the Convert back), constant subgraphs (weights and their
      dequantization), and — when int8 layers run on the int8 kernels — an int8 layer's matmul and bias whose
      value only bf16 layers read (:func:`_int8_outputs`) and an elementwise scaling by a constant that only a
      FakeQuantize reads (:func:`_quantizer_inputs`). For the audit these are declared bf16
      (:attr:`FloatForm.declared`)."""
    types = set(declared.values())
    if _LOW not in types or "f16" in types:
        return None
    model = stated.clone()
    ops = {op.get_friendly_name(): op for op in model.get_ordered_ops()}
    constant = constant_ops(model)
    exempt = (_int8_outputs(model, names, set(int8_nodes), constant) | _quantizer_inputs(model, constant)
              if int8_kernels else set())

    removed = []
    for name in float_converts(model):
        op = ops[name]
        source = op.input_value(0)
        users = [t.get_node().get_type_name() for t in op.output(0).get_target_inputs()]
        widens = FLOAT_RANK[op.get_output_element_type(0).get_type_name()] > \
            FLOAT_RANK[op.get_input_element_type(0).get_type_name()]
        if (source.get_node().get_type_name() == "Parameter" and widens) or "Result" in users:
            continue  # the program's I/O dtype (a bf16 input read as f32 stays; an f32 input is rounded by the plugin)
        op.output(0).replace(source)
        removed.append(name)
    for name in constant:  # stored codes decompressed to bf16 (a weight-only pattern): to f32, as in NNCF's model
        op = ops[name]
        if op.get_type_name() == "Convert" and op.get_output_element_type(0).get_type_name() == _LOW \
                and not _float(op.get_input_element_type(0)):
            wide = _convert(op.input_value(0), ov)
            wide.set_friendly_name(name)  # the pattern's marker (compressed.py): what weight_runs.py reads
            op.output(0).replace(wide.output(0))
    for op in model.get_ordered_ops():  # bf16 weights (and inputs) read through a Convert to f32
        if op.get_type_name() in ("Constant", "Parameter") and op.get_output_element_type(0).get_type_name() == _LOW:
            targets = [t for t in op.output(0).get_target_inputs() if t.get_node().get_type_name() != "Convert"]
            if targets:
                to_f32 = _convert(op, ov)
                for target in targets:
                    target.replace_source_output(to_f32.output(0))
    try:
        model.validate_nodes_and_infer_types()
        for result, stated_result in zip(model.get_results(), stated.get_results()):  # the program's output dtypes
            want = stated_result.get_input_element_type(0)
            if result.get_input_element_type(0) != want:
                result.input(0).replace_source_output(_convert(result.input_value(0), ov, want).output(0))
        model.validate_nodes_and_infer_types()
    except Exception as e:  # an operation with a fixed bf16 attribute (a dtype argument): keep the stated form
        log.info("OpenVINO: the f32 form of this program does not type-check (%s); stated types kept", e)
        return None
    left = [op.get_friendly_name() for op in model.get_ordered_ops()
            if op.get_output_size() and op.get_output_element_type(0).get_type_name() == _LOW
            and op.get_type_name() not in ("Constant", "Parameter", "Convert")]
    if left:
        log.info("OpenVINO: %s still compute bf16 in the f32 form; stated types kept", ", ".join(left[:5]))
        return None

    pinned = []
    for op in model.get_ordered_ops():
        name = op.get_friendly_name()
        if declared.get(name) == "f32" and op.get_type_name() not in _NOT_PINNED and name not in constant \
                and name not in exempt:
            op.get_rt_info()[PIN_KEY] = PIN_VALUE
            pinned.append(name)
    if pinned:
        model = _through_ir(ov, model)
    planned = dict(declared)
    planned.update({name: _LOW for name in exempt})
    return FloatForm(model, MappingProxyType(planned), tuple(removed), tuple(pinned))


def pinned_ops(model) -> list[str]:
    """Operations of ``model`` that carry the pin (for tests and the bench)."""
    return [op.get_friendly_name() for op in model.get_ordered_ops() if PINNED_KEYS & set(op.get_rt_info().keys())]


def _int8_outputs(model, names: NodeNames, int8: set[str], constant: set[str]) -> set[str]:
    """Operations of an int8 layer (its matmul, bias) whose value reaches nothing but Converts to bf16, directly or
    through operations of the same layer: these may write bf16. Rounding an int32 sum times its scale to bf16 at
    the kernel's output is the very value the bf16 consumer read through the removed Convert."""
    out: set[str] = set()
    for op in reversed(model.get_ordered_ops()):
        name = op.get_friendly_name()
        nodes = names.nodes(name)
        if name in constant or not nodes or not set(nodes) <= int8 or op.get_output_size() != 1:
            continue
        if op.get_output_element_type(0).get_type_name() != "f32":
            continue
        users = [t.get_node() for t in op.output(0).get_target_inputs()]
        if users and all(_to_low(u) or (u.get_friendly_name() in out and names.nodes(u.get_friendly_name()) == nodes)
                         for u in users):
            out.add(name)
    return out


_SCALING = frozenset({"Multiply", "Add", "Subtract", "Divide"})


def _quantizer_inputs(model, constant: set[str]) -> set[str]:
    """Elementwise operations by a constant whose value only FakeQuantize reads (activation smoothing's multiply):
    OpenVINO folds them into the FakeQuantize's input ranges (MulFakeQuantizeFusion, AddFakeQuantizeFusion).
    Should the plugin compute such a multiply in bf16 after all, its value is rounded to bf16 (relative 2^-9)
    before a quantization to 256 levels: accepted by the audit, not refused."""
    out: set[str] = set()
    for op in reversed(model.get_ordered_ops()):
        if op.get_type_name() not in _SCALING or op.get_friendly_name() in constant:
            continue
        inputs = [op.input_value(i).get_node().get_friendly_name() for i in range(op.get_input_size())]
        if sum(name not in constant for name in inputs) != 1:
            continue
        users = [t for t in op.output(0).get_target_inputs()]
        if users and all((t.get_node().get_type_name() == "FakeQuantize" and t.get_index() == 0)
                         or t.get_node().get_friendly_name() in out for t in users):
            out.add(op.get_friendly_name())
    return out


def _to_low(op) -> bool:
    return op.get_type_name() == "Convert" and op.get_output_element_type(0).get_type_name() == _LOW


def _float(element_type) -> bool:
    return element_type.get_type_name() in FLOAT_RANK


def _convert(op, ov, element_type=None):
    from openvino import opset13

    return opset13.convert(op, ov.Type.f32 if element_type is None else element_type)


def _through_ir(ov, model):
    """``model`` written as IR and read back: OpenVINO's IR reader makes the pins real rt_info attributes."""
    with tempfile.TemporaryDirectory(prefix="mixprec-ov-", ignore_cleanup_errors=True) as tmp:
        path = os.path.join(tmp, "model.xml")
        ov.save_model(model, path, compress_to_fp16=False)
        # read into memory (no mmap of a file about to be deleted)
        return ov.Core().read_model(path, config={"ENABLE_MMAP": False}) if _takes_config(ov) else \
            ov.Core().read_model(path)


def _takes_config(ov) -> bool:
    import inspect

    try:
        return "config" in inspect.signature(ov.Core.read_model).parameters
    except (TypeError, ValueError):
        return False
