"""The code's fp32 intent and written-out normalisations, found on small captured graphs."""

import torch
from helpers import captured
from torch import nn

from mixprec.plan.rules import get_rule
from mixprec.plan.rules.intent import fp32_intent
from mixprec.plan.rules.stream import residual_stream, structural_norms

from ._nodes import make_context, make_node


class _WrittenRMSNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(8))
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = x.to(torch.float32)
        v = h.pow(2).mean(-1, keepdim=True)
        y = self.w * (h * torch.rsqrt(v + 1e-6)).to(x.dtype)
        z = self.fc(y)
        return z * 2.0


def _intent(model, inputs, **kw):
    work, info = captured(model, inputs)
    return info, fp32_intent(work.graph, info, **kw)


def test_an_fp32_cast_protects_what_reads_it_up_to_the_matmul():
    info, intent = _intent(_WrittenRMSNorm(), (torch.randn(2, 8),))
    by_op = {info[n].op: n for n in intent}
    assert set(by_op) >= {"aten.pow.Tensor_Scalar", "aten.mean.dim", "aten.add.Tensor", "aten.rsqrt.default", "aten.mul.Tensor"}
    assert "aten.linear.default" not in by_op  # torch.autocast lowers the matmul
    after = [n for n, layer in info.items() if layer.op == "aten.mul.Tensor" and n not in intent]
    assert len(after) == 1  # z * 2.0 reads the bf16 matmul output only
    why = intent[by_op["aten.pow.Tensor_Scalar"]]
    assert "test_intent.py:" in why and "`h = x.to(torch.float32)`" in why and "torch.autocast runs it in float32" in why


def test_a_cast_to_another_values_dtype_is_not_intent():
    class Match(nn.Module):
        def forward(self, x, y):
            return (x.to(y.dtype) * 3.0).exp()

    info, intent = _intent(Match(), (torch.randn(4), torch.randn(4)))
    assert intent == {}


def test_positions_converted_to_float_and_their_angles():
    class Rope(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, 8, 2).float() / 8))

        def forward(self, x, positions):
            angles = positions.float()[..., None] * self.inv_freq
            emb = torch.cat([angles, angles], -1)
            return x * emb.cos() + x * emb.sin()

    info, intent = _intent(Rope(), (torch.randn(5, 8), torch.arange(5)))
    ops = sorted(info[n].op for n in intent)
    assert ops.count("aten.mul.Tensor") == 3 and "aten.cos.default" in ops and "aten.sin.default" in ops
    assert "aten.add.Tensor" in ops
    assert "converts to float32" in intent[next(n for n in intent if info[n].op == "aten.cos.default")]


def test_dtype_float32_arguments_autocast_disabled_regions_and_embeddings():
    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.fc = nn.Linear(4, 4)

        def forward(self, ids, x):
            e = self.emb(ids) + 1.0
            s = torch.softmax(self.fc(x), -1, dtype=torch.float32) * 2.0
            with torch.autocast("cpu", enabled=False):
                t = x.exp()
            return e, s, t + 1.0

    inputs = (torch.tensor([1, 2]), torch.randn(2, 4))
    info, intent = _intent(Mixed(), inputs)
    assert "embedding output" in intent["embedding"] and "embedding output" in intent["add"]
    assert "dtype=torch.float32" in intent["mul"] and "linear" not in intent
    assert "torch.autocast(enabled=False)" in intent["exp"] and "torch.autocast(enabled=False)" in intent["add_1"]
    _, without = _intent(Mixed(), inputs, embeddings=False)
    assert not any(info[n].op == "aten.embedding.default" for n in without)


def test_intent_rule_reads_the_context():
    rule = get_rule("fp32_intent")
    node = make_node(name="pow_1", op="aten.pow.Tensor_Scalar")
    assert rule.match(node, make_context()) is None
    hit = rule.match(node, make_context(fp32_intent={"pow_1": "because"}))
    assert (hit.precision, hit.rule, hit.reason) == (torch.float32, "fp32_intent", "because")


def test_written_out_norms_are_found_by_structure():
    class Norms(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            h = x + self.fc(x)
            rms = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
            c = rms - rms.mean(-1, keepdim=True)
            ln = c / torch.sqrt((c * c).mean(-1, keepdim=True) + 1e-5)
            pooled = self.fc(ln).mean(-1)  # a plain mean is no normalisation
            return pooled

    work, info = captured(Norms(), (torch.randn(2, 8),))
    found = structural_norms(work.graph, info)
    ops = sorted(info[n].op for n in found)
    assert ops.count("aten.mean.dim") == 3 and "aten.rsqrt.default" in ops and "aten.sqrt.default" in ops
    assert ops.count("aten.sub.Tensor") == 1 and "aten.div.Tensor" in ops and "aten.pow.Tensor_Scalar" in ops
    last_mean = [n for n, layer in info.items() if layer.op == "aten.mean.dim"][-1]
    assert last_mean not in found
    assert "RMS normalisation written out" in next(why for n, why in found.items() if info[n].op == "aten.rsqrt.default")
    stream = residual_stream(work.graph, info)
    assert "add" in stream and "residual addition" in stream["add"]  # x + fc(x) feeds the written-out RMSNorm


def test_sin_cos_of_a_float_input_and_their_argument_stay_fp32():
    class Timesteps(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("freqs", torch.exp(-torch.arange(4.0)))
            self.fc = nn.Linear(8, 8)

        def forward(self, t):  # float timesteps: no cast says fp32
            angles = t[:, None] * self.freqs * 2.0
            return self.fc(torch.cat([angles.sin(), angles.cos()], -1)).sin() + 1.0

    work, info = captured(Timesteps(), (torch.rand(3) * 1000,))
    from mixprec.plan.rules.intent import angle_layers

    angles = angle_layers(work.graph, info)
    ops = sorted(info[n].op for n in angles)
    assert ops == ["aten.cos.default", "aten.mul.Tensor", "aten.mul.Tensor", "aten.sin.default", "aten.sin.default"]
    assert "linear" not in angles and "add" not in angles  # the matmul ends the argument; after sin is no angle
    assert "computes the argument of sin" in angles["mul"] or "computes the argument of cos" in angles["mul"]
    rule = get_rule("angle")
    assert rule.match(make_node(name="sin"), make_context(angles={"sin": "why"})).reason == "why"
