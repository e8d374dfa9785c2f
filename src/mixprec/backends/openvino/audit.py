"""What OpenVINO's CPU plugin really computes each layer of a program in, against what the program states.

OpenVINO compiles a program into its own *runtime model*: layers fused, renamed, and each given a precision. mixprec
compiles a program either with ``INFERENCE_PRECISION_HINT=f32`` so that the plugin keeps the element types the
program states, or — a program with bf16 layers — in NNCF's form (``float_form.py``), and then reads the runtime
model back (:func:`audit`) against the types the plan gives each operation (``declared``; for the float form
``FloatForm.declared``) to know what runs:

* **the same type as planned**: nothing to say;
* **a wider float type** (f32 for a bf16 or fp16 layer): accepted, and said: the layer's report record gets
  ``runs_as="f32 on openvino"`` (API.md §2). The plugin does this for layers it has no low-precision kernel for
  (with native bf16: global average pooling and sums), and for every bf16/fp16 layer on a CPU without native bf16;
* **a narrower or unrelated type** (bf16 for an f32 layer, fp16 for bf16): refused (:func:`refusal`, raised by the
  backend as UnsupportedModelError) — for the float form, a pin that did not hold, which makes the runner compile
  the stated types instead;
* **int8 layers** compute in float32 where the backend lowers them to float arithmetic (CPUs without VNNI:
  ``backends/lowering/cpu.py``), and on OpenVINO's int8 kernels otherwise.

The runtime model names layers after the operations OpenVINO's frontend made of the program (decomposed:
``adaptive_avg_pool2d`` becomes ``mean``; renamed: a folded batch norm is called after its multiply).
:class:`NodeNames` maps them back through the decomposition's provenance (``node.meta["from_node"]``), so messages
and records use the report's node names and module paths. Everything here reads plain tables, so the audit is tested
on tables recorded on other CPUs (tests/backends/openvino/fixtures/openvino-bf16-cpu/).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from types import MappingProxyType

import torch
import torch.utils._pytree as pytree

# OpenVINO's float element types by width: a layer may run in a higher rank than declared, never lower.
# bf16 and f16 share a rank: neither holds the other's values.
FLOAT_RANK = MappingProxyType({"f16": 1, "bf16": 1, "f32": 2, "f64": 3})
# The OPTIMIZATION_CAPABILITIES entry that says a CPU computes a type natively; without it the plugin
# converts the type to f32 throughout the model.
NATIVE_CAPABILITY = MappingProxyType({"bf16": "BF16", "f16": "FP16"})
# Layers whose arithmetic runs in their runtime precision (matmul class): judged by it. Other layers
# (elementwise, normalisation, pooling) may compute internally in f32 as PyTorch's CPU kernels do; what
# matters for them is the precision they round their output to.
COMPUTE_LAYER_TYPES = frozenset({
    "FullyConnected", "MatMul", "Convolution", "GroupConvolution", "Deconvolution", "ScaledDotProductAttention",
})
SKIPPED_LAYER_TYPES = frozenset({"Input", "Parameter", "Output", "Result", "Const", "Constant"})
_OV_TYPES = MappingProxyType({torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32", torch.float64: "f64"})
_DEQUANTIZE = frozenset({
    "mixprec.dequantize_per_tensor.default", "mixprec.dequantize_per_tensor_u8.default", "mixprec.dequantize_per_channel.default",
})


# ---- reading OpenVINO's models -----------------------------------------------------------------


def runtime_layers(compiled_model) -> list[dict]:
    """The runtime model's layers: {"name", "type", "precision", "output", "originals", "inputs"} each (precision:
    OpenVINO's runtimePrecision; output: the precision of its first output; originals: the converted
    model's operations the layer computes; inputs: its inputs' element types, OpenVINO's short names)."""
    out = []
    for op in compiled_model.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()

        def get(key, default=""):
            return info[key].astype(str) if key in info else default

        originals = [n for n in get("originalLayersNames").split(",") if n]
        outputs = [p for p in get("outputPrecisions").replace(",", " ").split() if p]
        out.append({
            "name": op.get_friendly_name(), "type": get("layerType"), "precision": get("runtimePrecision"),
            "output": outputs[0] if outputs else "", "originals": originals,
            "inputs": [op.input(i).get_element_type().get_type_name() for i in range(op.get_input_size())],
        })
    return out


def declared_precisions(model) -> dict[str, str]:
    """Float element type each operation of the converted model declares for its output (OpenVINO's short names)."""
    out = {}
    for op in model.get_ordered_ops():
        if op.get_output_size() == 0:
            continue
        name = op.get_output_element_type(0).get_type_name()
        if name in FLOAT_RANK:
            out[op.get_friendly_name()] = name
    return out


# ---- the program's side ------------------------------------------------------------------------


def node_types(exported_program) -> dict[str, frozenset[str]]:
    """Program node -> OpenVINO's names of the float types it reads or writes."""
    out = {}
    for node in exported_program.graph.nodes:
        if node.op != "call_function":
            continue
        values = [node.meta.get("val")] + [i.meta.get("val") for i in node.all_input_nodes]
        types = {_OV_TYPES.get(v.dtype) for v in pytree.tree_leaves(values) if isinstance(v, torch.Tensor)}
        out[node.name] = frozenset(types - {None})
    return out


def int8_nodes(exported_program) -> list[str]:
    """The program's int8 layers: nodes that read a value mixprec dequantizes (an activation or a weight)."""
    return [
        n.name for n in exported_program.graph.nodes
        if n.op == "call_function" and any(str(i.target) in _DEQUANTIZE for i in n.all_input_nodes)
    ]


# ---- names -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class NodeNames:
    """OpenVINO's operation names -> the program's node names (and their module paths, for messages).

    OpenVINO names an operation converted from an FX node ``"<node>/<aten op>/<OpenVINO op>"``
    (``mean/aten.mean.dim/ReduceMean``); ``program`` maps ``<node>`` of the graph the frontend read to
    the program node it came from. ``program=None`` takes ``<node>`` as the program's own name (tables
    recorded without the program at hand)."""

    program: Mapping[str, str] | None = None
    modules: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def nodes(self, openvino_name: str) -> tuple[str, ...]:
        if "/" not in openvino_name:  # made by OpenVINO (Constant_3, Multiply_4021) or a graph input/output
            return ()
        fx_name = openvino_name.split("/", 1)[0]
        if self.program is None:
            return (fx_name,)
        node = self.program.get(fx_name)
        return (node,) if node is not None else ()

    def where(self, node: str) -> str:
        module = self.modules.get(node)
        return f"{node} (module '{module}')" if module else node

    @classmethod
    def of(cls, frontend_graph, prepared_program, program) -> "NodeNames":
        """Names for a program converted through ``prepared_program`` (what ``convert.for_openvino`` made of
        ``program``), whose FX graph as the frontend read it (decomposed) is ``frontend_graph``."""
        from ...ir.graph_info import module_of

        target = id(prepared_program.graph)
        prepared = {n.name for n in prepared_program.graph.nodes}
        known = {n.name: n for n in program.graph.nodes}
        mapping = {}
        for node in frontend_graph.nodes:
            if node.op != "call_function":  # OpenVINO names only operations after FX nodes
                continue
            source = _source_in(node, target, prepared)
            if source in known:
                mapping[node.name] = source
        modules = {name: module_of(node)[0] for name, node in known.items()}
        return cls(program=MappingProxyType(mapping), modules=MappingProxyType(modules))


    @classmethod
    def within(cls, frontend_graph, prepared_program) -> "NodeNames":
        """Names mapping OpenVINO's operations to the nodes of ``prepared_program`` itself (what ``convert.py``
        converted): the nodes its passes made, which the report's program does not hold."""
        target = id(prepared_program.graph)
        prepared = {n.name for n in prepared_program.graph.nodes}
        mapping = {node.name: source for node in frontend_graph.nodes if node.op == "call_function"
                   for source in [_source_in(node, target, prepared)] if source is not None}
        return cls(program=MappingProxyType(mapping))


def _source_in(node, graph_id: int, names: set[str]) -> str | None:
    """The node of the graph ``graph_id`` that ``node`` was made from (torch.fx provenance: each
    ``from_node`` entry names the node it came from and that node's graph), else ``node``'s own name
    when the graph has it (a frontend that converts the program without decomposing it)."""
    stack = list(node.meta.get("from_node") or ())
    fallback = None
    seen = 0
    while stack and seen < 1000:  # provenance chains are short; the bound keeps a damaged one finite
        seen += 1
        source = stack.pop()
        if getattr(source, "graph_id", None) == graph_id:
            return source.name
        if fallback is None and getattr(source, "name", None) in names:
            fallback = source.name
        stack.extend(getattr(source, "from_node", None) or ())
    if fallback is not None:
        return fallback
    return node.name if node.name in names else None


# ---- the audit ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """A runtime layer computing in a narrower (or unrelated) type than its operations declare."""

    layer: str  # OpenVINO's runtime layer name
    nodes: tuple[str, ...]  # the program nodes it computes
    planned: str  # the declared type(s), "bf16" or "bf16/f32"
    runs: str


@dataclasses.dataclass(frozen=True)
class Audit:
    """``computes_in``: program node -> the OpenVINO type it computes in, for the nodes that run otherwise
    than the program states (wider float types; int8 layers in float). ``narrower``: what must be refused."""

    computes_in: Mapping[str, str]
    narrower: tuple[Mismatch, ...]


def audit(
    declared: Mapping[str, str],
    layers: Iterable[dict],
    *,
    names: NodeNames | None = None,
    capabilities: Iterable[str] = (),
    node_types: Mapping[str, frozenset[str]] | None = None,
    int8_nodes: Iterable[str] = (),
    int8_kernels: bool = False,
) -> Audit:
    """Judge every runtime layer against the types the converted model declares for its operations.

    ``layers``: :func:`runtime_layers`; ``declared``: :func:`declared_precisions`; ``capabilities``: the
    CPU's OPTIMIZATION_CAPABILITIES; ``node_types``: program node -> the OpenVINO float types it reads or
    writes; ``int8_nodes``: program nodes that read a dequantized int8 value (int8 layers);
    ``int8_kernels``: whether they were handed to OpenVINO as FakeQuantize for its int8 kernels (else as
    float arithmetic).

    A layer's type is its runtime precision for matmul-class layers, its output's for the others;
    integer types are how int8 layers run and are not judged. Operations no runtime layer lists (the
    plugin merged them away, e.g. a cast it found to be a no-op) in a type this CPU lacks natively
    compute in f32: the plugin converts such types throughout the model.
    """
    names = names or NodeNames()
    computes_in: dict[str, str] = {}
    narrower: list[Mismatch] = []

    def claim(openvino_names, precision):
        for openvino_name in openvino_names:
            for node in names.nodes(openvino_name):
                if FLOAT_RANK.get(computes_in.get(node), 0) < FLOAT_RANK[precision]:
                    computes_in[node] = precision

    listed: set[str] = set()
    int8_compute: dict[str, set[str]] = {}
    for layer in layers:
        originals = layer["originals"]
        listed.update(originals)
        if layer["type"] in SKIPPED_LAYER_TYPES:
            continue
        compute = layer["type"] in COMPUTE_LAYER_TYPES
        got = layer["precision"] if compute else (layer["output"] or layer["precision"])
        if compute:
            for original in originals:
                for node in names.nodes(original):
                    int8_compute.setdefault(node, set()).add(layer["precision"])
        if got not in FLOAT_RANK:
            continue
        wanted = {o: declared[o] for o in originals if o in declared}
        if not wanted:
            continue
        if got in wanted.values() or all(FLOAT_RANK[got] > FLOAT_RANK[d] for d in wanted.values()):
            claim([o for o, d in wanted.items() if FLOAT_RANK[got] > FLOAT_RANK[d]], got)
            continue
        nodes = tuple(dict.fromkeys(n for o in originals for n in names.nodes(o)))
        narrower.append(Mismatch(layer["name"], nodes, "/".join(sorted(set(wanted.values()))), got))

    native = set(capabilities)  # empty when OpenVINO did not say: then nothing is assumed
    lacking = {t for t, capability in NATIVE_CAPABILITY.items() if native and capability not in native}
    if lacking:  # what the runtime model shows comes first; the rest runs as the plugin converts it
        seen = {n for o in listed for n in names.nodes(o)}
        claim([o for o, d in declared.items() if d in lacking and o not in listed], "f32")
        for node, types in (node_types or {}).items():
            narrower_than_f32 = FLOAT_RANK.get(computes_in.get(node), 0) < FLOAT_RANK["f32"]
            if node not in seen and types & lacking and narrower_than_f32:
                computes_in[node] = "f32"

    for node in int8_nodes:
        floats = [p for p in int8_compute.get(node, ()) if p in FLOAT_RANK]
        if floats:  # a matmul-class layer OpenVINO computes in a float type
            computes_in[node] = max(floats, key=FLOAT_RANK.__getitem__)
        elif not int8_kernels:  # float arithmetic by construction (convert.for_openvino)
            types = sorted((node_types or {}).get(node, ()), key=FLOAT_RANK.__getitem__)
            computes_in.setdefault(node, types[-1] if types else "f32")
    return Audit(MappingProxyType(computes_in), tuple(dict.fromkeys(narrower)))


def refusal(narrower: Iterable[Mismatch], names: NodeNames, *, capabilities: Iterable[str], version: str) -> str:
    """The UnsupportedModelError message for layers the plugin would run narrower than planned: the
    report's nodes and modules, what this CPU computes natively, and what to do."""
    narrower = list(narrower)
    listed = []
    for m in narrower[:8]:
        what = ", ".join(names.where(n) for n in m.nodes) if m.nodes else f"OpenVINO layer {m.layer}"
        listed.append(f"{what} ({m.planned} planned, runs {m.runs})")
    more = f" and {len(narrower) - 8} more" if len(narrower) > 8 else ""
    capabilities = list(capabilities)
    facts = (f"OpenVINO {version} on this CPU computes {'/'.join(capabilities)}" if capabilities
             else f"OpenVINO {version} did not say which precisions this CPU computes")
    low = [n for m in narrower if set(m.planned.split("/")) & {"bf16", "f16"} for n in m.nodes]
    hint = ""
    if low:
        patterns = ", ".join(f"'^{n}$'" for n in dict.fromkeys(low))
        hint = f", or keep the low-precision ones in float32 (autocast_excluded_nodes={{{patterns}}})"
    return (
        f"OpenVINO's CPU plugin would run these layers in a narrower type than the program states: "
        f"{'; '.join(listed)}{more}. {facts}; mixprec accepts layers OpenVINO keeps wider than planned, "
        "never narrower: that would be neither the plan nor what the report measured. "
        f"Run the program with backend='inductor' or 'eager'{hint}."
    )
