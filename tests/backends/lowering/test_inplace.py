"""The eager backend quantizes an int8 kernel's input in place (``backends/lowering/inplace.py``): the same ops on
the same values, bit for bit, with the chain's intermediates written into one fresh tensor; nothing else changes."""

from types import MappingProxyType

import torch
from models import ReluNet

import mixprec
from mixprec.backends.lowering import inplace, onednn

aten = torch.ops.aten


def _program(model, x, **kw):
    cfg = mixprec.MixedPrecisionConfigurator(model)
    cfg.set_precision(torch.nn.Linear, activation="int8")
    # 7-bit activations (non-negative inputs on the symmetric grid): on the kernel on every CPU
    plan = cfg.apply((x,), policy=mixprec.QuantPolicy(unsigned_activations=False))
    return mixprec.compile(model, (x,), plan=plan, backend="eager", int8_require_speedup=False, **kw)


def _targets(prog):
    return [n.target for n in prog.runner.graph.nodes if n.op == "call_function"]


def test_the_kernel_input_is_quantized_in_place_with_the_same_values(monkeypatch):
    torch.manual_seed(0)
    model, x = ReluNet(64, 3, relu_in=True).eval(), torch.randn(8, 64)
    prog = _program(model, x)
    in_place_ops = set(inplace._INPLACE.values())
    monkeypatch.setattr(inplace, "_INPLACE", MappingProxyType({k: k for k in inplace._INPLACE}))
    functional = _program(model, x)
    kernels = sum(1 for t in _targets(prog) if t is onednn.KERNEL)
    assert kernels == (3 if onednn.is_available() else 0)
    # round and clamp of each layer's input write into div's result (7-bit: no zero point to add; div reads relu's)
    assert _targets(prog).count(aten.round_.default) == _targets(prog).count(aten.clamp_.default) == kernels
    assert not in_place_ops & set(_targets(functional))
    before = x.clone()
    with torch.inference_mode():
        out, again, ref = prog(x), prog(x), functional(x)
    assert torch.equal(out, ref) and torch.equal(again, ref)  # bit for bit, and nothing carried between calls
    assert torch.equal(x, before)  # the user's input is never written


def _val(shape):
    return torch.empty(shape)


def test_a_value_read_elsewhere_or_broadcast_into_stays_functional():
    """div's result read by the output as well, and a clamp whose input is smaller than its result: functional."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = _val((4, 8))
    scale = graph.placeholder("s")
    scale.meta["val"] = _val((8,))
    small = graph.placeholder("small")
    small.meta["val"] = _val((1, 8))
    nodes = {}
    for name, op, args, shape in (
        ("div", aten.div.Tensor, (x, 0.5), (4, 8)),
        ("round", aten.round.default, ("div",), (4, 8)),  # div is also an output: round may not write into it
        ("mul", aten.mul.Tensor, (small, scale), (1, 8)),
        ("add", aten.add.Tensor, ("mul", x), (4, 8)),  # broadcast: [1, 8] + [4, 8] -> [4, 8]
        ("clamp", aten.clamp.default, ("round", 0, 127), (4, 8)),
    ):
        node = graph.call_function(op, tuple(nodes.get(a, a) if isinstance(a, str) else a for a in args))
        node.meta["val"] = _val(shape)
        nodes[name] = node
    u8 = graph.call_function(aten._to_copy.default, (nodes["clamp"],), {"dtype": torch.uint8})
    u8.meta["val"] = torch.empty((4, 8), dtype=torch.uint8)
    graph.output((u8, nodes["div"], nodes["add"]))
    assert not inplace._writable(nodes["round"])  # div has two users
    assert inplace._writable(nodes["clamp"])  # round: fresh, read by clamp alone, same shape
    assert not inplace._writable(nodes["add"])  # not an op of the chain's end, and mul's result is [1, 8]
    assert not inplace._writable(nodes["div"])  # its input is the user's
