"""Source 5 (default): every layer nothing stronger decided keeps the dtype the graph computes in.

Tested on hand-built layers (one per dtype and kind) and on a captured model whose dtypes are
read off its code; the expected decisions are written out in full.
"""

import torch
from helpers import captured
from models import SeedExplicit

from mixprec.ir.graph_info import GraphInfo, NodeInfo
from mixprec.plan.precision_plan import NodePrecision
from mixprec.plan.sources import default


def _node(name, precision, kind="compute", op="aten.linear.default"):
    return NodeInfo(name, op, kind, "m", "torch.nn.Linear", precision, {}, (), 0)


def _info(*nodes):
    return GraphInfo({n.name: n for n in nodes}, {})


def _kept(dtype_name):
    return f"{dtype_name} as written in the model"


def test_every_free_layer_keeps_its_own_dtype_whatever_its_kind():
    info = _info(
        _node("fp32", torch.float32),
        _node("bf16", torch.bfloat16),
        _node("fp64", torch.float64),
        _node("index", torch.int64, op="aten.add.Tensor"),  # an integer index computation
        _node("view", torch.float16, kind="movement", op="aten.view.default"),
        _node("cast", torch.float32, kind="cast", op="aten.to.dtype"),
    )
    assert default.decide(info, {}) == {
        "fp32": NodePrecision(torch.float32, None, "default", _kept("float32")),
        "bf16": NodePrecision(torch.bfloat16, None, "default", _kept("bfloat16")),
        "fp64": NodePrecision(torch.float64, None, "default", _kept("float64")),
        "index": NodePrecision(torch.int64, None, "default", _kept("int64")),
        "view": NodePrecision(torch.float16, None, "default", _kept("float16")),
        "cast": NodePrecision(torch.float32, None, "default", _kept("float32")),
    }


def test_decided_layers_are_left_out_and_the_decisions_are_not_changed():
    info = _info(_node("a", torch.float32), _node("b", torch.float32), _node("c", torch.bfloat16))
    stronger = NodePrecision(torch.bfloat16, None, "plan", "asked for")
    decided = {"b": stronger}
    out = default.decide(info, decided)
    assert list(out) == ["a", "c"]  # graph order, without the decided layer
    assert decided == {"b": stronger}
    assert default.decide(info, {"a": stronger, "b": stronger, "c": stronger}) == {}


def test_an_empty_graph_has_no_decisions():
    assert default.decide(_info(), {}) == {}


def test_a_captured_model_keeps_the_dtypes_its_code_computes_in():
    """SeedExplicit: linear2 is a .half() module between casts, linear1 and linear3 are fp32."""
    work, info = captured(SeedExplicit().eval(), SeedExplicit.example_inputs())
    out = default.decide(info, {})
    assert set(out) == set(info)
    by_module = {info[n].module: d for n, d in out.items() if info[n].kind == "compute"}
    assert by_module == {
        "linear1": NodePrecision(torch.float32, None, "default", _kept("float32")),
        "linear2": NodePrecision(torch.float16, None, "default", _kept("float16")),
        "linear3": NodePrecision(torch.float32, None, "default", _kept("float32")),
    }
    casts = [out[n].precision for n in info if info[n].kind == "cast"]
    assert casts == [torch.float16, torch.float32]  # x.to(float16), then x.to(float32)
