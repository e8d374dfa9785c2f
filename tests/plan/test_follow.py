"""Dtype-transparent nodes follow the dtypes around them: hand-built graphs, then a model end to end."""

import torch
from models import MovementOnParams

import mixprec
from mixprec.ir.graph_info import GraphInfo, NodeInfo, TensorMeta
from mixprec.plan.follow import follow
from mixprec.plan.precision_plan import NodePrecision

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16


def layer(name, op, kind="compute", inputs=None, precision=F32, out=F32):
    outputs = (TensorMeta((2, 4), out),) if out is not None else ()
    return NodeInfo(name, op, kind, "", "", precision, dict(inputs or {}), outputs, 0)


def graph(*nodes, outputs=()):
    return GraphInfo({n.name: n for n in nodes}, {}, frozenset(outputs))


def run(info, decisions):
    decided = {name: decisions.get(name, NodePrecision(info[name].precision)) for name in info}
    follow(info, decided)
    return {name: d.precision for name, d in decided.items()}, decided


LOW = NodePrecision(BF16, None, "autocast_rule", "lowered")
KEPT = NodePrecision(F32, None, "autocast_rule", "kept")


def test_view_follows_its_lowered_producer():
    info = graph(
        layer("linear", "aten.linear.default", inputs={"x": F32, "p_w": F32}),
        layer("view", "aten.view.default", "movement", {"linear": F32}),
        layer("norm", "aten.layer_norm.default", inputs={"view": F32}),
    )
    dtypes, decided = run(info, {"linear": LOW, "norm": KEPT})
    assert dtypes["view"] == BF16
    assert decided["view"].source == "autocast_rule"
    assert decided["view"].reason == "data movement: follows its producer linear (bfloat16)"


def test_cat_of_disagreeing_producers_takes_what_consumers_use_else_the_widest():
    nodes = (
        layer("a", "aten.relu.default", inputs={"x": F32}),
        layer("b", "aten.linear.default", inputs={"x": F32}),
        layer("cat", "aten.cat.default", "movement", {"a": F32, "b": F32}),
        layer("view", "aten.view.default", "movement", {"cat": F32}),
        layer("consumer", "aten.linear.default", inputs={"view": F32}),
    )
    dtypes, decided = run(graph(*nodes), {"a": KEPT, "b": LOW, "consumer": LOW})
    assert (dtypes["cat"], dtypes["view"]) == (BF16, BF16)
    assert "takes the dtype its consumers use" in decided["cat"].reason
    dtypes, decided = run(graph(*nodes), {"a": KEPT, "b": LOW, "consumer": KEPT})
    assert dtypes["cat"] == F32  # the widest: the fp32 producer's values are not rounded
    assert decided["cat"].source == "default"


def test_a_stored_tensor_beside_a_lowered_value_counts_with_its_own_dtype():
    """CLIP's cat(class_embedding, patches): an fp32 consumer keeps the parameter unrounded (torch.autocast promotes)."""
    nodes = (
        layer("conv", "aten.conv2d.default", inputs={"x": F32, "p_w": F32}),
        layer("expand", "aten.expand.default", "movement", {"p_class": F32}),
        layer("cat", "aten.cat.default", "movement", {"expand": F32, "conv": F32}),
        layer("add", "aten.add.Tensor", inputs={"cat": F32, "pos": F32}),
    )
    dtypes, decided = run(graph(*nodes), {"conv": LOW, "add": KEPT})
    assert (dtypes["cat"], dtypes["expand"]) == (F32, F32)
    assert decided["cat"].source == "default"  # it keeps the dtype it was captured in
    dtypes, _ = run(graph(*nodes), {"conv": LOW, "add": LOW})  # a low consumer: the cat and the parameter go low
    assert (dtypes["cat"], dtypes["expand"]) == (BF16, BF16)


def test_views_of_stored_tensors_take_their_consumers_dtype():
    info = graph(
        layer("t", "aten.t.default", "movement", {"p_w": F32}),
        layer("mm", "aten.mm.default", inputs={"x": F32, "t": F32}),
        layer("t_1", "aten.t.default", "movement", {"p_v": F32}),
        layer("mm_1", "aten.mm.default", inputs={"x": F32, "t_1": F32}),
        layer("add", "aten.add.Tensor", inputs={"t_1": F32, "x": F32}),
    )
    dtypes, _ = run(info, {"mm": LOW, "mm_1": LOW, "add": KEPT})
    assert dtypes["t"] == BF16
    assert dtypes["t_1"] == F32  # its consumers disagree: stays as captured


def test_a_returned_view_of_an_input_is_not_rounded():
    nodes = (
        layer("view", "aten.view.default", "movement", {"x": F32}),
        layer("linear", "aten.linear.default", inputs={"view": F32}),
    )
    dtypes, _ = run(graph(*nodes), {"linear": LOW})
    assert dtypes["view"] == BF16  # cast x once, before the view
    dtypes, _ = run(graph(*nodes, outputs=["view", "linear"]), {"linear": LOW})
    assert dtypes["view"] == F32  # returned as well: stays exact


def test_noop_casts_and_float_consumers_without_float_outputs_follow():
    info = graph(
        layer("emb", "aten.embedding.default", inputs={"p_e": F32, "ids": torch.int64}),
        layer("to", "aten.to.dtype_layout", "cast", {"emb": F32}),
        layer("gt", "aten.gt.Scalar", inputs={"to": F32}, out=None),
    )
    dtypes, _ = run(info, {"emb": LOW})
    assert dtypes["to"] == BF16 and dtypes["gt"] == BF16


def test_getitem_takes_the_dtype_of_the_element_it_selects():
    info = graph(
        layer("linear", "aten.linear.default", inputs={"x": F32}),
        layer("split", "aten.split.Tensor", "movement", {"linear": F32}),
        layer("getitem", "getitem", "movement", {"split": F32}),
        layer("getitem_1", "getitem", "movement", {"split": F32}),
    )
    dtypes, _ = run(info, {"linear": LOW})
    assert dtypes["split"] == dtypes["getitem"] == dtypes["getitem_1"] == BF16


def test_nothing_moves_when_every_producer_keeps_its_captured_dtype():
    info = graph(
        layer("h", "aten.linear.default", inputs={"x": F16}, precision=F16, out=F16),
        layer("g", "aten.linear.default", inputs={"x": F32}),
        layer("cat", "aten.cat.default", "movement", {"h": F16, "g": F32}),
        layer("t", "aten.t.default", "movement", {"p_w": F32}),
        layer("mm", "aten.mm.default", inputs={"cat": F32, "t": F32}),
    )
    dtypes, decided = run(info, {})
    assert dtypes == {"h": F16, "g": F32, "cat": F32, "t": F32, "mm": F32}
    assert all(d.reason == "" for d in decided.values())


def test_movement_on_parameters_end_to_end():
    model = MovementOnParams().eval()
    inputs = MovementOnParams.example_inputs()
    prog = mixprec.compile(model, inputs, enable_autocast=True)
    assert {r.precision for r in prog.report.layers} == {BF16}
    summary = prog.report.summary
    assert summary["casts_inserted"] == 2  # the input in, the float output back to fp32
    assert summary["param_bytes_after"] * 2 == summary["param_bytes_before"]
    y, count = prog(*inputs)
    y_ref, _ = model(*inputs)
    torch.testing.assert_close(y, y_ref, atol=0.1, rtol=0.02)
    assert count.dtype == torch.int64


def test_returned_view_of_an_input_end_to_end():
    class ViewAndLinear(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x):
            v = x.view(2, 8)
            return v, self.fc(v)

    x = torch.randn(2, 4, 2)
    prog = mixprec.compile(ViewAndLinear().eval(), (x,), enable_autocast=True)
    v, _ = prog(x)
    assert torch.equal(v, x.view(2, 8))
