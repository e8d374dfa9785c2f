"""The one int8 planner: which values an int8 request quantizes, on which grid, and which it smooths.

The configurator (a module's int8 request) and the search (an int8 trial of one layer) both ask
:func:`quant_requests` and then make their ``Int8Spec`` from its answer and the calibrated ranges
(:meth:`QuantRequests.specs`), so an int8 layer is the same thing whichever tool asked for it.

The rules, for each group of int8 layers (the layers one module runs; the search's groups hold one layer):

* a layer quantizes its floating inputs that enter the group from outside — never a stored tensor (weights are
  quantized per output channel from themselves) and never a value the group makes itself;
* matmul-class and attention layers quantize their activation operands wherever they are made, once, and never an
  input that is no operand (``plan/int8_operands.py``, with the policy's ``sdpa_operands`` and
  ``quantize_probabilities``); such a layer whose operands all stay float is ``operandless``;
* with the policy's ``quantize_exits`` a layer read outside its group is quantized on its way out too;
* with the policy's ``smoothing_alpha`` an int8 Linear's input that the graph does not prove non-negative, with a
  stored 2-D weight, is smoothed (``calibrate/smoothing.py``): its per-channel ranges are calibrated
  (``channels``), and one divisor vector serves every int8 Linear reading it;
* every value quantized gets its grid from ``plan/quantization.py`` (``grids``), for the calibration to clip for and
  the plan to record.

**Int8 beyond the requests** (:func:`implied_int8`; the policy's ``int8_attention``, ``quantize_residuals``): an
attention/matmul layer nobody decided whose quantized operands all come from int8 layers with weights, and an add of
an int8 convolution's output and a value of its shape, get int8 too, as NNCF does (bench/log/2026-11.md "Issue 34").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping
from types import MappingProxyType

import torch

from ..calibrate import smoothing
from ..ir.sign import is_nonnegative
from ..ir.work_program import STORED_KINDS
from ..ops.quant import Grid
from ..ops.table import INT8_WEIGHT_OPS
from . import int8_operands
from .precision_plan import Int8Spec
from .quantization import QuantPolicy, value_grids

Range = tuple[float, float]


@dataclasses.dataclass(frozen=True)
class Smoothed:
    """One smoothed value: its per-channel divisors s, the range of value / s, and the int8 Linears reading it so."""

    divisors: torch.Tensor
    range: Range
    readers: frozenset[str]


@dataclasses.dataclass(frozen=True)
class QuantRequests:
    """What the int8 layers of a request quantize (see the module docstring)."""

    policy: QuantPolicy
    entries: Mapping[str, tuple[str, ...]]  # int8 layer -> the values it quantizes on their way in
    exits: frozenset[str]  # int8 layers quantized on their way out
    readers: Mapping[str, tuple[str, ...]]  # value to smooth -> the int8 Linears reading it smoothed
    grids: Mapping[str, Grid]  # every value quantized -> its grid
    operandless: frozenset[str]  # matmul-class/attention layers whose operands int8 leaves float
    weights: Mapping[str, torch.Tensor]  # smoothed Linear -> its stored weight

    @property
    def values(self) -> frozenset[str]:
        """The values to range (per tensor)."""
        return frozenset(v for names in self.entries.values() for v in names) | self.exits

    @property
    def channels(self) -> frozenset[str]:
        """The values to range per channel (the smoothed ones)."""
        return frozenset(self.readers)

    def smoothing(self, channel_ranges: Mapping | None) -> dict[str, Smoothed]:
        """The divisors of every value to smooth from its per-channel ranges (``calibrate/channels.py``; None or a
        missing value: not smoothed) and the column magnitudes of the weights of every Linear reading it."""
        if not channel_ranges:
            return {}
        out = {}
        for value, layers in self.readers.items():
            x = channel_ranges.get(value)
            weights = [self.weights[layer] for layer in layers]
            if x is None or any(w.dim() != 2 or w.shape[1] != x.mins.numel() for w in weights):
                continue
            column = torch.stack([smoothing.column_absmax(w).to(x.mins.device) for w in weights]).amax(dim=0)
            s = smoothing.divisors(x, column, self.policy.smoothing_alpha)
            out[value] = Smoothed(s, smoothing.smoothed_range(x, s), frozenset(layers))
        return out

    def specs(self, ranges: Mapping[str, Range], smoothed: Mapping[str, Smoothed] | None = None
              ) -> dict[str, Int8Spec]:
        """Each int8 layer's Int8Spec from the calibrated ``ranges`` of :attr:`values` and ``smoothed``
        (:meth:`smoothing`): ranges, grids, the output's when it exits, the divisors of its smoothed inputs."""
        smoothed = smoothed or {}
        out = {}
        for name, inputs in self.entries.items():
            mine = {inp: smoothed[inp] for inp in inputs if inp in smoothed and name in smoothed[inp].readers}
            out[name] = Int8Spec(
                tuple((inp, mine[inp].range if inp in mine else ranges[inp]) for inp in inputs),
                ranges[name] if name in self.exits else None,
                tuple((inp, tuple(mine[inp].divisors.tolist())) for inp in mine),
                tuple((inp, self.grids[inp]) for inp in inputs),
                self.grids[name] if name in self.exits else None,
            )
        return out


def quant_requests(captured, layers: Iterable[Collection[str]], policy: QuantPolicy) -> QuantRequests:
    """What int8 quantizes for ``layers`` — groups of int8 layer names, one per module whose boundary they share —
    of ``captured`` (an ``ir.captured.CapturedModel``) under ``policy``."""
    base, info = captured.base, captured.info
    stored = frozenset(s.arg.name for s in base.input_specs if s.kind in STORED_KINDS and hasattr(s.arg, "name"))
    nodes = {n.name: n for n in base.graph.nodes}
    entries: dict[str, list[str]] = {}
    exits: set[str] = set()
    operandless: set[str] = set()
    groups = [frozenset(group) for group in layers]
    for group in groups:
        for name in group:
            entries[name] = [
                inp for inp, d in info[name].input_dtypes.items()
                if d is not None and d.is_floating_point and inp not in group and inp not in stored
            ]
            if policy.quantize_exits and any(user.name not in group for user in nodes[name].users):
                exits.add(name)
        # matmul-class and attention layers: their activation operands, wherever made (plan/int8_operands.py)
        in_order = [n for n in base.graph.nodes if n.name in group]
        operandless |= {n.name for n in in_order if int8_operands.is_operand_op(n)
                        and not int8_operands.operands(n, stored, policy)}
        entries.update(int8_operands.place(in_order, group, entries, stored, policy))
    readers, weights = _smoothing_readers(base, groups, entries, nodes, policy)
    frozen = {name: tuple(values) for name, values in entries.items()}
    wanted = {v for values in frozen.values() for v in values} | exits
    return QuantRequests(
        policy, MappingProxyType(frozen), frozenset(exits),
        MappingProxyType({v: tuple(layers) for v, layers in readers.items()}),
        MappingProxyType(value_grids(base.graph, wanted, policy)), frozenset(operandless), MappingProxyType(weights),
    )


def implied_int8(captured, decided: Collection[str], int8: Collection[str], policy: QuantPolicy
                 ) -> dict[str, tuple[str, tuple[str, ...]]]:
    """The layers of ``captured`` not in ``decided`` that int8 reaches (module docstring), given the int8 layers
    ``int8``: layer -> ("attention" | "residual add", the int8 layers it reads, the first one's request to take)."""
    base, info = captured.base, captured.info
    stored = frozenset(s.arg.name for s in base.input_specs if s.kind in STORED_KINDS and hasattr(s.arg, "name"))
    int8 = frozenset(int8)

    def with_weights(node, convolution: bool = False) -> bool:
        if node is None or node.name not in int8:
            return False
        packet = info[node.name].packet
        return packet in INT8_WEIGHT_OPS and (not convolution or packet.startswith("aten.conv"))

    implied: dict[str, tuple[str, tuple[str, ...]]] = {}
    for node in base.graph.nodes:
        if node.name not in info or node.name in decided or node.name in implied:
            continue
        if policy.int8_attention and int8_operands.is_operand_op(node):
            sources = [int8_operands.made_by(v) for v in int8_operands.operands(node, stored, policy)]
            if not sources or not all(with_weights(s) for s in sources):
                continue
            kind = "attention"
        elif policy.quantize_residuals and int8_operands.is_residual_add(node):
            made = [int8_operands.made_by(v, int8_operands.NORMS) for v in node.args[:2]]
            sources = [s for s in made if with_weights(s, convolution=True)]
            if not sources:
                continue
            kind = "residual add"
        else:
            continue
        implied[node.name] = (kind, tuple(dict.fromkeys(s.name for s in sources)))
    return implied


def _smoothing_readers(base, groups, entries, nodes, policy: QuantPolicy):
    """(value -> the int8 Linears that read it smoothed, Linear -> its stored weight): an int8 Linear's input that
    it quantizes, with a stored weight, that the graph does not prove never negative (that one keeps the unsigned
    grid instead)."""
    if policy.smoothing_alpha is None:
        return {}, {}
    readers: dict[str, list[str]] = {}
    weights: dict[str, torch.Tensor] = {}
    signs: dict = {}
    for group in groups:
        for name in group:
            node = nodes[name]
            if node.target is not torch.ops.aten.linear.default or len(node.args) < 2:
                continue
            x, w = node.args[0], node.args[1]
            weight = _stored_weight(base, w)
            if not isinstance(x, torch.fx.Node) or x.name not in entries[name] or weight is None:
                continue
            if is_nonnegative(x, signs):
                continue
            readers.setdefault(x.name, []).append(name)
            weights[name] = weight
    return readers, weights


def _stored_weight(base, node):
    """The stored tensor a weight argument is (a parameter/buffer/constant placeholder), else None."""
    if not isinstance(node, torch.fx.Node) or node.op != "placeholder":
        return None
    spec = base.input_spec_of(node)
    return base.stored_tensor(spec) if spec is not None and spec.kind in STORED_KINDS else None
