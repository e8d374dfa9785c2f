"""Which inputs of an int8 matmul-class or attention layer are quantized: its activation operands.

A matmul between two activations (``q @ k.transpose(-1, -2)``, ``probs @ v``: ``aten.matmul``, ``bmm``, ``mm``,
``baddbmm``, ``einsum``) and ``aten.scaled_dot_product_attention`` have no weight and usually no module of their
own: they sit in the attention module, next to the Linears that make their operands. An int8 kernel for them needs
*both* operands on an int8 grid, wherever those are made — quantizing only the values that enter a module from
outside (the configurator's rule for every other layer) leaves them float when the operands are made in the same
module (``nn.MultiheadAttention``'s one module; the softmax probabilities of an eager attention). So an int8
layer of these ops quantizes its operands per tensor, on the unsigned grid where the graph proves them never
negative (softmax probabilities: ``ir/sign.py``), with ranges from the same calibration pass as the rest.

Which operands, by op (:data:`OPERANDS`; SDPA's query and key only, as NNCF; the attention's output matmul only with
``QuantPolicy.quantize_probabilities``), and why: :func:`operands`' docstring.

The attention mask of SDPA (and any other non-operand input) is never an operand: an additive float mask holds
``finfo.min``, which no per-tensor grid of the scores' range can carry.

Where int8 reaches layers no request names (``configurator/resolve.py``, issue 34): :func:`made_by` follows an
operand back to the layer that makes it (an attention whose query and key int8 Linears make gets int8), and
:func:`is_residual_add` tells a residual add (an int8 convolution's, through its batch norm: both inputs quantized).
"""

from __future__ import annotations

from types import MappingProxyType

import torch

from ..ops.names import op_name, packet_name
from ..ops.table import MOVEMENT_OPS
from .quantization import DEFAULT_POLICY, QuantPolicy

# op packet -> positions of its activation operands (einsum: position 1 is the list of operand tensors)
OPERANDS = MappingProxyType({
    "aten.matmul": (0, 1),
    "aten.mm": (0, 1),
    "aten.bmm": (0, 1),
    "aten.baddbmm": (1, 2),
    "aten.addbmm": (1, 2),
    "aten.addmm": (1, 2),
    "aten.einsum": (1,),
})
_SDPA = "aten.scaled_dot_product_attention"
_SOFTMAX = frozenset({"aten.softmax", "aten._softmax"})


def is_operand_op(node: torch.fx.Node) -> bool:
    """Whether ``node`` is a matmul-class or attention op whose activation operands int8 quantizes."""
    return node.op == "call_function" and packet_name(op_name(node.target)) in OPERANDS.keys() | {_SDPA}


def operands(node: torch.fx.Node, stored=frozenset(), policy: QuantPolicy = DEFAULT_POLICY) -> list[torch.fx.Node]:
    """The float activation operands of an int8 ``node`` that are quantized (none for other ops). ``stored``: names of
    the graph's parameters, buffers and constants (quantized per channel from themselves where at all, never per
    tensor here). ``policy``: its ``sdpa_operands`` and ``quantize_probabilities``.

    Which operands (:data:`OPERANDS`, by op; chosen by measurement, bench/log/2026-11.md "Issue 22 round three:
    int8 attention matmuls"):

    * every matmul-class op: both matrix operands (``baddbmm``/``addmm``'s added term stays float: it is a bias);
      ``einsum``: every tensor in its operand list;
    * ``scaled_dot_product_attention``: **query and key only** (``QuantPolicy.sdpa_operands``). That is what NNCF
      3.4 does for OpenVINO's ScaledDotProductAttention (its metatype's ``target_input_ports = [0, 1]``, symmetric);
      OpenVINO's PyTorch frontend decomposes the op into MatMul, Softmax, MatMul, and with FakeQuantize on q and k
      its CPU plugin runs the first MatMul in i8 (runtime graph, this machine), while a quantized v meets float
      probabilities: the second MatMul stays f32, so quantizing v costs error and buys no int8 kernel. The finer
      alternative — decomposing the op so that the probabilities are quantized too and ``probs @ v`` can be int8 —
      is what the eager attention (``attn_implementation="eager"``) gives with
      ``QuantPolicy.quantize_probabilities``; measured there.
    * the attention's output matmul, ``softmax(...) @ v`` (a matmul whose operand is a softmax output, through
      movement ops and dropout): quantized only with ``QuantPolicy.quantize_probabilities``; NNCF's TRANSFORMER mode
      leaves it float too (its ignored pattern "multihead_attention_output").
    """
    if not is_operand_op(node):
        return []
    if not policy.quantize_probabilities and any(_reads_softmax(a) for a in _at(node, (0, 1))):
        return []
    out = []
    packet = packet_name(op_name(node.target))
    for value in _at(node, policy.sdpa_operands if packet == _SDPA else OPERANDS[packet]):
        val = value.meta.get("val")
        if isinstance(val, torch.Tensor) and val.dtype.is_floating_point and value.name not in stored:
            if value not in out:
                out.append(value)
    return out


def non_operands(node: torch.fx.Node) -> frozenset[str]:
    """Inputs of an attention op that are never quantized (its mask): names of the inputs not at an operand
    position of ``scaled_dot_product_attention``; empty for every other op."""
    if node.op != "call_function" or packet_name(op_name(node.target)) != _SDPA:
        return frozenset()
    kept = {n.name for n in _at(node, (0, 1, 2))}
    return frozenset(n.name for n in node.all_input_nodes if n.name not in kept)


def _at(node: torch.fx.Node, positions) -> list[torch.fx.Node]:
    out = []
    for i in positions:
        arg = node.args[i] if i < len(node.args) else None
        for value in arg if isinstance(arg, (list, tuple)) else (arg,):
            if isinstance(value, torch.fx.Node):
                out.append(value)
    return out


def _reads_softmax(value: torch.fx.Node) -> bool:
    """A softmax output, seen through movement ops (views, dropout, ...)."""
    while value.op == "call_function":
        packet = packet_name(op_name(value.target))
        if packet in _SOFTMAX:
            return True
        if packet not in MOVEMENT_OPS or not value.args or not isinstance(value.args[0], torch.fx.Node):
            return False
        value = value.args[0]
    return False


def place(
    group_nodes, group: frozenset[str], entries: dict[str, list[str]], stored=frozenset(),
    policy: QuantPolicy = DEFAULT_POLICY,
) -> dict[str, list[str]]:
    """The configurator's int8 inputs of one module (``entries``: layer -> the input values it quantizes, those
    entering the module from outside) with the operand rule applied to its matmul-class and attention layers:

    * an operand is quantized once: where it enters the module, when it reaches the layer through movement ops
      (``view``, ``transpose``) that quantize it on the way in, else at the layer itself;
    * an input that is no operand of the layer (SDPA's mask, its value with ``policy.sdpa_operands`` (0, 1), an
      output matmul's operands without ``policy.quantize_probabilities``) is not quantized for it: not at the layer,
      nor at the entry of a chain of movement ops that only this input runs through.

    ``group_nodes``: the module's layers as graph nodes; ``group``: their names. Returns a new mapping."""
    out = {name: list(values) for name, values in entries.items()}
    for node in group_nodes:
        if not is_operand_op(node):
            continue
        wanted = operands(node, stored, policy)
        mine = out.setdefault(node.name, [])
        for inp in dict.fromkeys(node.all_input_nodes):
            val = inp.meta.get("val")
            if not (isinstance(val, torch.Tensor) and val.dtype.is_floating_point) or inp.name in stored:
                continue
            entry = _chain_entry(inp, group, out)
            if inp in wanted:
                if entry is None and inp.name not in mine:
                    mine.append(inp.name)
                continue
            if inp.name in mine:
                mine.remove(inp.name)
            if entry is not None and entry[2]:
                out[entry[0].name].remove(entry[1].name)
    return out


def _chain_entry(value: torch.fx.Node, group, entries):
    """(movement layer, its input, whether only this chain reads the nodes between) where ``value``, followed back
    through the module's own movement ops, is quantized on its way into the module; None when it is not."""
    exclusive = len(value.users) == 1
    while value.name in group and value.op == "call_function" and packet_name(op_name(value.target)) in MOVEMENT_OPS:
        source = value.args[0] if value.args and isinstance(value.args[0], torch.fx.Node) else None
        if source is None:
            return None
        if source.name in entries.get(value.name, ()):
            return value, source, exclusive
        value = source
        exclusive = exclusive and len(value.users) == 1
    return None


# batch norms OpenVINO folds into the convolution before them (made_by follows a residual add back through them)
NORMS = frozenset({"aten._native_batch_norm_legit_no_training", "aten.batch_norm", "aten.native_batch_norm"})
_ADDS = frozenset({"aten.add", "aten.add_"})


def is_residual_add(node: torch.fx.Node) -> bool:
    """An add of two float tensors of one shape (not a bias or a mask broadcast onto a value)."""
    if node.op != "call_function" or packet_name(op_name(node.target)) not in _ADDS or len(node.args) < 2:
        return False
    vals = [a.meta.get("val") if isinstance(a, torch.fx.Node) else None for a in node.args[:2]]
    return (all(isinstance(v, torch.Tensor) and v.dtype.is_floating_point for v in vals)
            and vals[0].shape == vals[1].shape and (len(node.args) < 3 and node.kwargs.get("alpha", 1) == 1))


def made_by(value: torch.fx.Node, through=frozenset()) -> torch.fx.Node | None:
    """The node that makes ``value``, followed back through movement ops (view, transpose, getitem, ...) and the
    ops in ``through`` (their first argument)."""
    while value.op == "call_function" and packet_name(op_name(value.target)) in MOVEMENT_OPS | through:
        if not value.args or not isinstance(value.args[0], torch.fx.Node):
            return None
        value = value.args[0]
    return value if value.op == "call_function" else None
