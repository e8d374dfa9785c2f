"""Read the precision-marker regions of a captured graph into node meta, then remove the markers.

``torch.ops.mixprec.start_setting_precision(x, dtype)`` / ``..._with_dr`` / ``stop_setting_precision(x)``
survive ``torch.export`` as identity nodes. This pass (:func:`strip_markers`, run by ``normalize``) turns
them into data: every node inside a region gets the region's :class:`~mixprec.ir.graph_info.MarkerRegion`
in ``meta["mixprec_marker"]``, and the marker nodes disappear, so that the rest of mixprec (analysis, plan,
rewrite, report) sees the model's own layers only.

Region semantics (API.md §3):

* a node is inside a region when any of its floating-point inputs is (the start marker's
  result is); "all the following layers" of TRTorch's wording, so a residual add of a region
  value and an outside value is inside the region;
* ``stop_setting_precision`` ends the innermost region on its input's path; what follows gets
  the precision in force before that region (the enclosing region's, or none);
* regions nest (the innermost decides); two regions whose values meet at one layer without
  being nested are a ConfigError, as are a start whose values reach the model's output
  without a stop and a stop whose input is in no region;
* only floating-point values carry a region (an index computed in a region does not drag the
  layers it feeds into it);
* the casts torch.autocast makes for a layer inside a region (of its weights, say) are in the
  region too, so an fp32 region inside an autocast region computes with fp32 weights.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re

import torch

from ..dtypes import dtype_name, is_float
from ..errors import ConfigError
from ..ops.custom import START_MARKERS, STOP_MARKERS
from .graph_info import META_MARKER, META_ROLE, GraphInfo, MarkerRegion, module_of, tensor_metas
from .passes import PassResult
from .work_program import WorkProgram

MARKER_PRECISIONS = frozenset({torch.float32, torch.float16, torch.bfloat16, torch.int8})

_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def strip_markers(work: WorkProgram) -> PassResult:
    """The regions into node meta, the markers removed (module docstring: what is inside a region). Before::

        start = mixprec.start_setting_precision(c1, fp16)
        conv2d_1 = aten.conv2d(start, w, b)
        stop = mixprec.stop_setting_precision(conv2d_1)
        pool = aten.max_pool2d(stop)

    After::

        conv2d_1 = aten.conv2d(c1, w, b)   # meta: MarkerRegion(fp16, entry=c1, exits=(conv2d_1,))
        pool = aten.max_pool2d(conv2d_1)
    """
    graph = work.graph
    markers = [n for n in graph.nodes if _is_marker(n)]
    if not markers:
        return PassResult(False)
    regions = _Regions()
    for node in graph.nodes:
        if node.op == "output":
            _check_outputs(node, regions)
        elif node.op == "call_function":
            regions.visit(node)
    regions.absorb_autocast_casts(graph)
    final = regions.freeze()
    for node in graph.nodes:
        stack = regions.state.get(node, ())
        if stack and not _is_marker(node):
            node.meta[META_MARKER] = final[stack[-1].index]
    for node in markers:
        node.replace_all_uses_with(node.args[0])
        graph.erase_node(node)
    work.sync_output_specs()
    graph.lint()
    return PassResult(True)


def _is_marker(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and (node.target in START_MARKERS or node.target in STOP_MARKERS)


@dataclasses.dataclass
class _Open:
    """A region while the graph is being walked (exits are found along the way)."""

    index: int
    dtype: torch.dtype
    ranges: tuple[float, float, float, float] | None
    where: str
    entry: str
    exits: list[str] = dataclasses.field(default_factory=list)


class _Regions:
    def __init__(self):
        self.state: dict[torch.fx.Node, tuple[_Open, ...]] = {}
        self.opened: list[_Open] = []

    def visit(self, node: torch.fx.Node) -> None:
        if node.target in START_MARKERS:
            self._start(node)
        elif node.target in STOP_MARKERS:
            self._stop(node)
        else:
            self.state[node] = self._merge(node)

    def absorb_autocast_casts(self, graph: torch.fx.Graph) -> None:
        """A cast torch.autocast makes for a layer belongs to that layer: when every reader of such a cast
        (of a weight, or of a value from outside) is in one region, the cast is in it too, so that a region
        inside an autocast region really computes in the region's precision, weights included."""
        for node in graph.nodes:
            if node.meta.get(META_ROLE) != "autocast_cast" or self.state.get(node):
                continue
            stacks = [self.state.get(user, ()) for user in node.users]
            if stacks and stacks[0] and all(len(s) == len(stacks[0]) and s[-1] is stacks[0][-1] for s in stacks):
                self.state[node] = stacks[0]

    def freeze(self) -> dict[int, MarkerRegion]:
        return {
            r.index: MarkerRegion(r.index, r.dtype, r.ranges, r.where, r.entry, tuple(dict.fromkeys(r.exits)))
            for r in self.opened
        }

    def _start(self, node: torch.fx.Node) -> None:
        x = node.args[0]
        dtype = node.args[1]
        name = _op_short(node)
        position = position_of(node)
        if not _carries_float(x):
            raise ConfigError(
                f"{name} at {position} is applied to a tensor that is not floating point; precision markers "
                "go on the floating-point activations that enter the layers to set."
            )
        if dtype not in MARKER_PRECISIONS:
            raise ConfigError(
                f"{name}(x, {dtype}) at {position}: the precision must be torch.float32, torch.float16, "
                "torch.bfloat16 or torch.int8."
            )
        ranges = None
        if node.target is torch.ops.mixprec.start_setting_precision_with_dr.default:
            ranges = _checked_ranges(tuple(float(v) for v in node.args[2:6]), dtype, position)
        where = f"{name}({dtype_name(dtype)}{_ranges_text(ranges)}) at {position}"
        region = _Open(len(self.opened), dtype, ranges, where, _value_name(x))
        self.opened.append(region)
        self.state[node] = self.state.get(x, ()) + (region,)

    def _stop(self, node: torch.fx.Node) -> None:
        x = node.args[0]
        stack = self.state.get(x, ())
        if not stack:
            raise ConfigError(
                f"stop_setting_precision at {position_of(node)} has no start: its input is not inside a region "
                "opened by start_setting_precision. Add the start marker before the layers to set, or remove "
                "this stop marker."
            )
        stack[-1].exits.append(_value_name(x))
        self.state[node] = stack[:-1]

    def _merge(self, node: torch.fx.Node) -> tuple[_Open, ...]:
        deepest: tuple[_Open, ...] = ()
        for inp in node.all_input_nodes:
            if not _carries_float(inp):
                continue
            stack = self.state.get(inp, ())
            short, long = (stack, deepest) if len(stack) <= len(deepest) else (deepest, stack)
            if not all(a is b for a, b in zip(short, long)):
                module = module_of(node)[0] or "top level"
                first, second = sorted((short[-1], long[-1]), key=lambda r: r.index)
                raise ConfigError(
                    f"layer {node.name} ({module}, at {position_of(node)}) takes values from two precision "
                    f"regions that are not nested: {first.where} and {second.where}. Close one region "
                    "with stop_setting_precision before its values meet the other's."
                )
            deepest = long
        return deepest


def _check_outputs(output: torch.fx.Node, regions: _Regions) -> None:
    for value in output.all_input_nodes:
        stack = regions.state.get(value, ())
        if stack and _carries_float(value):
            raise ConfigError(
                f"{stack[-1].where} has no stop: its values reach the model's output (through {value.name}) "
                "without passing stop_setting_precision. Add torch.ops.mixprec.stop_setting_precision(x) "
                "where the region ends."
            )



def calibration_targets(info: GraphInfo) -> frozenset[str]:
    """Values whose (min, max) must come from calibration: the boundaries of int8 regions without ranges.

    A fact of the captured graph (which values cross an int8 region's boundary), known right after
    normalisation: compile, the configurator and the search ask it before calibrating."""
    names = set()
    for node in info.values():
        region = node.marker
        if region is not None and region.dtype == torch.int8 and region.ranges is None:
            names.add(region.entry)
            names.update(region.exits)
    return frozenset(names)


def _checked_ranges(ranges, dtype, position) -> tuple[float, float, float, float]:
    if dtype != torch.int8:
        raise ConfigError(
            f"start_setting_precision_with_dr at {position} asks for {dtype_name(dtype)}: dynamic ranges only "
            "apply to int8. Use start_setting_precision(x, dtype) for floating-point precisions."
        )
    in_min, in_max, out_min, out_max = ranges
    for what, lo, hi in (("input", in_min, in_max), ("output", out_min, out_max)):
        if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi or max(abs(lo), abs(hi)) == 0:
            raise ConfigError(
                f"start_setting_precision_with_dr at {position}: the {what} range [{lo}, {hi}] is not a usable "
                "dynamic range; give finite min <= max, not both zero."
            )
    return ranges


def _ranges_text(ranges) -> str:
    if ranges is None:
        return ""
    return ", " + ", ".join(f"{v:g}" for v in ranges)


def _op_short(node: torch.fx.Node) -> str:
    return node.target._schema.name.split("::")[-1]  # "start_setting_precision" / "..._with_dr"


def _value_name(node: torch.fx.Node) -> str:
    """The node that really produces a value (looking through other markers)."""
    while _is_marker(node):
        node = node.args[0]
    return node.name


def _carries_float(node) -> bool:
    return isinstance(node, torch.fx.Node) and any(is_float(m.dtype) for m in tensor_metas(node.meta.get("val")))


def position_of(node: torch.fx.Node) -> str:
    """'model.py:37 in module 'block'' from the node's stack trace; the node name when there is none."""
    frames = _FRAME.findall(node.meta.get("stack_trace") or "")
    where = f"{os.path.basename(frames[-1][0])}:{frames[-1][1]}" if frames else f"graph node {node.name}"
    module = module_of(node)[0]
    return where + (f" in module '{module}'" if module else "")
