"""What OpenVINO runs a weight-only layer as, read from its runtime model: its compressed FullyConnected on the stored
codes, or a FullyConnected on weights it decompressed.

Why read it (issue 45): OpenVINO's CPU plugin decides per layer whether a compressed weight stays compressed. On an
AMX Xeon with bf16 activations it decompresses every int4/int8 weight to bf16, at one row too, several times slower
than f32 activations on its i4 kernel (``../shared/fixtures/openvino-amx-xeon/``); on an avx512_bf16 EPYC without AMX
it keeps them, and nf4/f4e2m1 ones too, while it decompresses f8e4m3 weights there (f32 or bf16 activations).
Which CPU does what is not guessed:
the runtime model says, per layer, the element type of its weight input (:func:`weight_runs`), and the runner asks
for f32 activations where bf16 ones made OpenVINO decompress (``runner.py``). Everything here reads plain tables
(``audit.runtime_layers``'s, or tables recorded on other CPUs), so it is tested on the recorded AMX tables.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping

# element types a FullyConnected reads its weight in when it runs on the compressed codes
COMPRESSED_TYPES = frozenset({"i8", "u8", "i4", "u4", "nf4", "f4e2m1", "f8e4m3", "f8e5m2"})
_WEIGHT_LAYER_TYPES = frozenset({"FullyConnected", "MatMul"})
# str(ov.Type) / C type names -> OpenVINO's short names ("<Type: 'uint4_t'>" -> "u4")
_C_NAMES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "float64": "f64", "int8_t": "i8", "uint8_t": "u8",
            "int4_t": "i4", "uint4_t": "u4", "nfloat4": "nf4", "f4e2m1": "f4e2m1", "f8e4m3": "f8e4m3",
            "f8e5m2": "f8e5m2", "f8e8m0": "f8e8m0", "int32_t": "i32", "int64_t": "i64", "dynamic": "dynamic"}


def element_name(text: str) -> str:
    """OpenVINO's short name of an element type written as ``str(ov.Type)`` ("<Type: 'uint4_t'>"), its C name or its
    short name."""
    match = re.fullmatch(r"<Type: '([^']*)'>", text.strip())
    name = match.group(1) if match else text.strip()
    return _C_NAMES.get(name, name)


@dataclasses.dataclass(frozen=True)
class WeightRun:
    """How OpenVINO runs one weight-only layer: the element types its FullyConnected reads the activations and the
    weight in."""

    activations: str
    weights: str

    @property
    def compressed(self) -> bool:
        return self.weights in COMPRESSED_TYPES

    def text(self, fmt: str, *, asked_f32: bool = False) -> str:
        """``runs_as``'s words (the backend's "on openvino" is added by the report)."""
        if self.compressed:
            why = "; bf16 activations made OpenVINO decompress them, so they get f32 ones" if asked_f32 else ""
            return f"{self.activations} x {self.weights} weights (OpenVINO's compressed FullyConnected{why})"
        return f"{self.activations} x {fmt} weights decompressed to {self.weights} by OpenVINO"


def layer_run(layer: Mapping) -> WeightRun | None:
    """The :class:`WeightRun` of one runtime layer (``{"type", "inputs": [element types]}``), None for a layer that
    reads no weight."""
    inputs = [element_name(t) for t in layer.get("inputs", ())]
    if layer.get("type") not in _WEIGHT_LAYER_TYPES or len(inputs) < 2:
        return None
    return WeightRun(inputs[0], inputs[1])


def weight_runs(layers: Iterable[Mapping], names, nodes: Iterable[str], casts: Mapping[str, str] | None = None,
                ) -> dict[str, WeightRun]:
    """Weight-only program node -> how the runtime model runs it (``layers``: ``audit.runtime_layers``; ``names``:
    ``audit.NodeNames``; ``nodes``: the weight-only layers' names; ``casts``: a cast node of the program -> the node
    it casts, for a layer OpenVINO names after the cast it absorbed)."""
    wanted, out, casts = set(nodes), {}, casts or {}
    for layer in layers:
        run = layer_run(layer)
        if run is None:
            continue
        # its originals, and its own name: OpenVINO lists a FullyConnected that absorbed the activation's Convert
        # (bf16 activations) under the Convert alone, while its name is still the MatMul's; one that absorbed the
        # output's Convert, under that Convert's name alone (the layer is the node the cast reads)
        for original in (*layer.get("originals", ()), layer.get("name", "")):
            for node in names.nodes(original):
                node = node if node in wanted else casts.get(node, node)
                if node in wanted and node not in out:
                    out[node] = run
    return out


def cast_sources(graph) -> dict[str, str]:
    """A dtype cast of ``graph`` (an fx graph; the casts of ``ops.table.CAST_OPS``) -> the name of the node it casts
    (for :func:`weight_runs`)."""
    from torch.fx import Node

    from ...ops.names import op_name, packet_name
    from ...ops.table import CAST_OPS

    return {n.name: n.args[0].name for n in graph.nodes if n.op == "call_function" and n.args
            and isinstance(n.args[0], Node) and packet_name(op_name(n.target)) in CAST_OPS}


def decompressed_low(runs: Mapping[str, WeightRun]) -> frozenset[str]:
    """The layers whose weights OpenVINO decompressed while their activations are 16-bit: those the runner asks for in
    f32 (where OpenVINO may keep them compressed)."""
    return frozenset(n for n, r in runs.items() if not r.compressed and r.activations in ("bf16", "f16"))
