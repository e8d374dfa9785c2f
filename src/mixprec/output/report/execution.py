"""What runs: each layer's ``runs_as`` — what its backend computes it in where that differs from its precision's name
(API.md §2) — and the dtype its FLOPs count in (:func:`runs_in`).

Why a module of its own (issue 42): the precision a plan names is not always what the program executes, and a user
who previews an int8 deployment or counts low-precision FLOPs must not be told otherwise. A layer's execution is read
from three facts, never from the plan's intention alone:

* the **program** (the rewritten graph): a float Linear with a weight format became its format's op, which runs a
  native kernel on the stored codes or dequantizes them at use (the format's handler says which on these operands:
  ``ops/weight_formats.runs_on_kernel``), a layer with integer weights that no weight-only op takes reads them
  dequantized;
* the **backend's graph** (eager, inductor: the GraphModule they run): an int8 layer whose node was lowered onto
  oneDNN's int8 kernel is gone from it (``backends/lowering/qdq.py`` replaces it); one still there computes its op
  in float32 on dequantized values — simulated int8;
* the **runner's** ``computes_in`` (OpenVINO): the float type it computes a layer in, or a text ("int8 dynamic
  activations (group 32)"); and its ``weight_runs_as``: what OpenVINO's runtime model runs a weight-only layer as
  (its compressed FullyConnected on the codes, or weights it decompressed: ``backends/openvino/weight_runs.py``).

Every simulated execution — the simulated integer formats (``formats.INTEGER_FORMATS``: int16/int4 activations),
int8 fake quantization, integer weights dequantized at use — reads "simulated ..." with the type it runs in, "(runs
f32 on eager)"; such FLOPs are never low-precision ones (``summary.py`` counts them apart, as the simulated share).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType

import torch

from ...formats import INTEGER_FORMATS, SIMULATED_PRECISIONS, WEIGHT_FORMATS
from ...ops import weight_formats

# OpenVINO's short element type names: the type names of ``runs_as`` ("f32 on openvino", API.md §2)
RUNS_AS_NAMES = MappingProxyType({
    torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16", torch.float64: "f64", torch.int8: "i8",
})
# "int8 dynamic activations (group 32) on openvino": a weight-only layer whose activations OpenVINO quantizes to int8
_RUNS_AS_DTYPES = MappingProxyType({**{name: dtype for dtype, name in RUNS_AS_NAMES.items()}, "int8": torch.int8})
SIMULATED = "simulated"
# backends that run the program's graph op by op (after their own passes): what is in that graph is what runs
GRAPH_BACKENDS = frozenset({"eager", "inductor"})
# the names a record's ``weights`` starts with for weights not stored in float: the weight formats' and the per-channel
# integer weights of integer layers (``param_dtype``)
_INTEGER_WEIGHTS = frozenset(WEIGHT_FORMATS) | {f.name for f in INTEGER_FORMATS.values()}


def simulated_runs_as(precision: torch.dtype) -> str | None:
    """``runs_as`` of a layer of a simulated precision ("simulated int16 (runs f32)"); None for any other."""
    fmt = INTEGER_FORMATS.get(precision)
    return fmt.runs_as() if fmt is not None else None


def is_simulated(record) -> bool:
    """Whether the layer's quantization is simulated (quantize -> dequantize, computed in a float type)."""
    return bool(record.runs_as) and record.runs_as.startswith(SIMULATED + " ")


def runs_in(record) -> torch.dtype:
    """The dtype a layer computes in as its backend runs it: for a simulated layer the type in its "(runs f32 ...)",
    else ``runs_as``'s leading type, else its precision."""
    if is_simulated(record):
        runs = record.runs_as.split("(runs ", 1)
        name = runs[1].split(" ", 1)[0].rstrip(")") if len(runs) == 2 else "f32"
        return _RUNS_AS_DTYPES.get(name, torch.float32)
    if record.runs_as:
        dtype = _RUNS_AS_DTYPES.get(record.runs_as.split(" ", 1)[0])
        if dtype is not None:
            return dtype
    return record.precision


def weight_runs_of(runner) -> Mapping[str, str]:
    """What a backend's runner says its weight-only layers run as (OpenVINO's ``weight_runs_as``; {} for runners that
    run the program's graph)."""
    value = getattr(runner, "weight_runs_as", None)
    return value if isinstance(value, Mapping) else {}


def computes_in_of(runner) -> Mapping[str, torch.dtype]:
    """What a backend's runner says it computes nodes in, where that may differ from the program's types
    (``computes_in``: node name -> dtype, or the text of what no dtype says, e.g. "int8 dynamic activations
    (group 32)"; OpenVINO's runner has one, the eager and inductor runners compute what their graph states)."""
    value = getattr(runner, "computes_in", None)
    return value if isinstance(value, Mapping) else {}


def graph_of(runner) -> torch.fx.Graph | None:
    """The graph an eager or inductor runner runs (the GraphModule itself, or the one inductor compiled); None for
    a runner that runs something else (OpenVINO's compiled model)."""
    for candidate in (runner, getattr(runner, "module", None)):
        if isinstance(candidate, torch.fx.GraphModule):
            return candidate.graph
    return None


@dataclasses.dataclass(frozen=True)
class Execution:
    """The facts :func:`with_runs_as` reads: ``backend``; the runner's ``computes_in``; the node names of the graph
    an eager/inductor runner runs (None: unknown); the program's layer nodes by name (None: unknown); what the runner
    says its weight-only layers run as."""

    backend: str
    computes_in: Mapping[str, object] = dataclasses.field(default_factory=dict)
    running: frozenset[str] | None = None
    program: Mapping[str, torch.fx.Node] | None = None
    weights: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, runner, backend: str, program_graph: torch.fx.Graph | None = None) -> "Execution":
        graph = graph_of(runner) if backend in GRAPH_BACKENDS else None
        running = frozenset(n.name for n in graph.nodes) if graph is not None else None
        source = program_graph if program_graph is not None else graph
        program = {n.name: n for n in source.nodes} if source is not None else None
        return cls(backend, computes_in_of(runner), running, program, weight_runs_of(runner))


def with_runs_as(records: list, execution, backend: str | None = None) -> list:
    """The records with ``runs_as`` as ``execution`` (an :class:`Execution`; or, as before, a runner's
    ``computes_in`` mapping with ``backend``) says they run; cleared where nothing differs (records loaded from a
    file may have been written for another backend or CPU)."""
    if not isinstance(execution, Execution):
        execution = Execution(backend or "eager", execution or {})
    out = []
    for record in records:
        runs_as = runs_as_of(record, execution)
        out.append(record if runs_as == record.runs_as else dataclasses.replace(record, runs_as=runs_as))
    return out


def runs_as_of(record, e: Execution) -> str | None:
    """What the backend computes ``record``'s layer in, when that differs from its precision's name (module
    docstring); None where it runs as named."""
    if record.precision in SIMULATED_PRECISIONS:
        return simulated_runs_as(record.precision)
    said = e.computes_in.get(record.name)
    where = f"on {e.backend}"
    if isinstance(said, str):
        return f"{said} {where}"
    if record.kind != "compute" or not record.in_graph:
        return _float_runs_as(record, said, where)
    if record.precision == torch.int8:
        return _int8_runs_as(record, said, e, where)
    weights = stored_weights(record)
    node = e.program.get(record.name) if e.program is not None else None
    if weights is None or node is None:
        return _float_runs_as(record, said, where)
    computes = RUNS_AS_NAMES.get(said if isinstance(said, torch.dtype) else record.precision, "f32")
    if record.name in e.weights:  # what the backend's runtime says (OpenVINO)
        return f"{e.weights[record.name]} {where}"
    on_kernel = weight_formats.runs_on_kernel(node) if node.op == "call_function" else None
    if on_kernel is not None:
        how = "weight-only kernel" if on_kernel else f"dequantized at use from the stored {weights} codes"
        return f"{computes} x {weights} weights ({how} {where})"
    if _reads_dequantized(node):
        return f"{SIMULATED} {weights} weights (dequantized at use, runs {computes} {where})"
    return f"{computes} with float weights ({weights} not applied to {_op_name(node)}) {where}"


def _float_runs_as(record, said, where) -> str | None:
    if isinstance(said, torch.dtype) and said != record.precision:
        return f"{RUNS_AS_NAMES.get(said, said)} {where}"
    return None


def _int8_runs_as(record, said, e: Execution, where) -> str | None:
    weights = stored_weights(record)
    also = f", {weights} weights" if weights not in (None, "int8") else ""
    if e.backend in GRAPH_BACKENDS and e.running is not None:
        if record.name in e.running:  # still the float op on dequantized values: the int8 kernel did not take it
            return f"{SIMULATED} int8{also} (runs f32 {where})"
        return None
    if isinstance(said, torch.dtype) and said != torch.int8:
        return f"{SIMULATED} int8{also} (runs {RUNS_AS_NAMES.get(said, said)} {where})"
    return None


def stored_weights(record) -> str | None:
    """The weight format's name ("int4", "nf4", ...) or the integer weights' ("int16") of a layer whose weights are
    stored so (the record's ``weights``)."""
    bits = (record.weights or "").split(",", 1)[0].strip()
    return bits if bits in _INTEGER_WEIGHTS else None


def _op_name(node: torch.fx.Node) -> str:
    target = node.target
    name = getattr(target, "name", None)
    text = name() if callable(name) else str(target)
    return text.replace("::", ".").removesuffix(".default")


def _reads_dequantized(node: torch.fx.Node) -> bool:
    from ...ops.custom import DEQUANTIZE_OPS

    weight = node.args[1] if len(node.args) > 1 else None
    return isinstance(weight, torch.fx.Node) and weight.target in DEQUANTIZE_OPS
