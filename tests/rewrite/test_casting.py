"""rewrite/casting.py: making mixprec's cast nodes, re-typing meta, reading and retargeting casts.

On captured small models (run afterwards and compared with eager PyTorch doing the same rounding)
and on hand-built graphs of each ATen cast op set_cast_target knows.
"""

import pytest
import torch
from helpers import captured
from models import SeedExplicit, ThreeLinears
from torch._subclasses.fake_tensor import FakeTensor

from mixprec.ir.graph_info import META_ORIGIN, META_ROLE
from mixprec.rewrite.casting import (
    MIXPREC_CAST_ROLES,
    cast_of,
    cast_target_arg,
    first_compute_node,
    is_mixprec_cast,
    origin_name,
    retype_val,
    set_cast_target,
    short_name,
    tensor_dtype,
)

aten = torch.ops.aten


def _three():
    model = ThreeLinears().eval()
    (x,) = ThreeLinears.example_inputs()
    work, _ = captured(model, (x,))
    return model, x, work


def _linears(work):
    return [n for n in work.graph.nodes if n.target is aten.linear.default]


def _run(work, *args):
    with torch.no_grad():
        return work.copy().to_exported().module()(*args)


def _one_op_graph(target, args_of, kwargs=None, *, dtype=torch.float16):
    """x -> target(x, ...) -> output, with real-tensor 'val' meta (no fake mode)."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(2, 3)
    node = graph.call_function(target, args_of(x), kwargs or {})
    node.meta["val"] = torch.empty(2, 3, dtype=dtype)
    graph.output(node)
    return graph, node


# ---- names and dtypes ----------------------------------------------------------------------------------


def test_short_names_are_the_suffixes_of_made_nodes():
    assert [short_name(d) for d in (torch.bfloat16, torch.float16, torch.float32, torch.int8)] == [
        "bf16", "fp16", "fp32", "i8",
    ]  # fmt: skip


def test_tensor_dtype_is_the_dtype_of_a_single_tensor_value_only():
    _, _, work = _three()
    linear = _linears(work)[0]
    assert tensor_dtype(linear) == torch.float32
    graph = torch.fx.Graph()
    pair = graph.placeholder("pair")
    pair.meta["val"] = (torch.empty(1), torch.empty(1))
    bare = graph.placeholder("bare")
    assert tensor_dtype(pair) is None and tensor_dtype(bare) is None
    assert tensor_dtype(None) is None and tensor_dtype(3) is None


# ---- retype_val ------------------------------------------------------------------------------------------


def test_retype_val_converts_a_fake_tensor_within_its_own_fake_mode():
    _, _, work = _three()
    val = _linears(work)[0].meta["val"]
    assert isinstance(val, FakeTensor)
    new = retype_val(val, None, torch.bfloat16)
    assert isinstance(new, FakeTensor) and new.fake_mode is val.fake_mode
    assert (new.dtype, new.shape) == (torch.bfloat16, val.shape)
    assert val.dtype == torch.float32  # the old meta is not changed


def test_retype_val_converts_only_floats_of_the_old_dtype_and_keeps_containers():
    fp32, fp16, ids = torch.ones(2), torch.ones(2, dtype=torch.float16), torch.ones(2, dtype=torch.int64)
    out = retype_val((fp32, [fp16, ids], None), torch.float32, torch.bfloat16)
    assert isinstance(out, tuple) and isinstance(out[1], list) and out[2] is None
    assert out[0].dtype == torch.bfloat16
    assert out[1][0] is fp16 and out[1][1] is ids  # another float dtype, and integers: left alone
    every = retype_val([fp32, fp16, ids], None, torch.bfloat16)
    assert [t.dtype for t in every] == [torch.bfloat16, torch.bfloat16, torch.int64]
    assert retype_val(fp32, None, torch.float32) is fp32  # already that dtype: the same object
    assert retype_val("not a tensor", None, torch.bfloat16) == "not a tensor"


# ---- cast_of ---------------------------------------------------------------------------------------------


def test_a_graph_input_is_cast_after_the_last_placeholder_once_per_dtype():
    _, _, work = _three()
    graph = work.graph
    x = work.user_input_nodes()[0]
    first = first_compute_node(graph)
    cast = cast_of(graph, x, torch.bfloat16, role="io_cast")
    assert cast.name == "x_bf16" and cast.args == (x, torch.bfloat16) and cast.target is aten.to.dtype
    nodes = list(graph.nodes)
    assert cast.next is first and all(n.op == "placeholder" for n in nodes[: nodes.index(cast)])
    assert cast.meta[META_ROLE] == "io_cast" and cast.meta["val"].dtype == torch.bfloat16
    assert tuple(cast.meta["val"].shape) == (1, 10)
    assert cast_of(graph, x, torch.bfloat16, role="cast") is cast  # whichever pass asks: the one cast
    other = cast_of(graph, x, torch.float16, role="cast")
    assert other is not cast and other.name == "x_fp16"
    graph.lint()


def test_a_layer_output_is_cast_right_after_it_and_the_graph_computes_the_rounding():
    model, x, work = _three()
    linear1, linear2, _ = _linears(work)
    down = cast_of(work.graph, linear1, torch.bfloat16, role="cast")
    assert linear1.next is down and down.meta["nn_module_stack"] == linear1.meta["nn_module_stack"]
    up = cast_of(work.graph, down, torch.float32, role="cast")
    linear2.replace_input_with(linear1, up)
    work.graph.lint()
    with torch.no_grad():
        expected = model.linear3(model.linear2(model.linear1(x).bfloat16().float()))
    torch.testing.assert_close(_run(work, x), expected, rtol=0, atol=0)
    assert not torch.equal(expected, model(x))  # the rounding is visible: the test can tell


def test_a_cast_written_in_the_model_is_not_taken_for_mixprecs_own():
    work, _ = captured(SeedExplicit().eval(), SeedExplicit.example_inputs())
    linear1 = _linears(work)[0]
    (code_cast,) = [u for u in linear1.users if u.target is aten.to.dtype]
    assert not is_mixprec_cast(code_cast)
    cast = cast_of(work.graph, linear1, torch.float16, role="cast")
    assert cast is not code_cast and is_mixprec_cast(cast)


# ---- reading casts ----------------------------------------------------------------------------------------


def test_is_mixprec_cast_goes_by_the_role_mixprec_gave_the_node():
    graph, node = _one_op_graph(aten.to.dtype, lambda x: (x, torch.float16))
    assert not is_mixprec_cast(node)
    for role in MIXPREC_CAST_ROLES:
        node.meta[META_ROLE] = role
        assert is_mixprec_cast(node)
    for role in ("autocast_cast", "layout", "quant", "dequant"):
        node.meta[META_ROLE] = role
        assert not is_mixprec_cast(node)
    x = next(iter(graph.nodes))
    x.meta[META_ROLE] = "cast"
    assert not is_mixprec_cast(x)  # a placeholder is never a cast


def test_origin_name_looks_through_casts_and_layout_nodes_to_the_captured_value():
    graph = torch.fx.Graph()
    w = graph.placeholder("p_w_bf16")
    cast = graph.call_function(aten.to.dtype, (w, torch.float32))
    cast.meta[META_ROLE] = "param_cast"
    layout = graph.call_function(aten.contiguous.default, (cast,))
    layout.meta[META_ROLE] = "layout"
    user_cast = graph.call_function(aten.to.dtype, (layout, torch.float16))  # the model's own cast: a value
    assert origin_name(layout) == "p_w_bf16"
    w.meta[META_ORIGIN] = "p_w"  # a stored copy names the placeholder it was made from
    assert origin_name(layout) == "p_w" and origin_name(cast) == "p_w" and origin_name(w) == "p_w"
    assert origin_name(user_cast) == user_cast.name


def test_cast_target_arg_reads_the_dtype_the_cast_produces():
    _, node = _one_op_graph(aten.to.dtype, lambda x: (x, torch.float16))
    assert cast_target_arg(node) == torch.float16
    node.meta["val"] = [torch.empty(1)]
    assert cast_target_arg(node) is None


# ---- set_cast_target: each ATen cast spelling, run afterwards -------------------------------------------


CASTS = {
    "to.dtype": (aten.to.dtype, lambda x: (x, torch.float16), None),
    "to.device": (aten.to.device, lambda x: (x, torch.device("cpu"), torch.float16), None),
    "_to_copy": (aten._to_copy.default, lambda x: (x,), {"dtype": torch.float16, "layout": torch.strided}),
    "to.dtype_layout": (aten.to.dtype_layout, lambda x: (x,), {"dtype": torch.float16, "device": torch.device("cpu")}),
}


@pytest.mark.parametrize("spelling", sorted(CASTS))
def test_set_cast_target_retargets_each_spelling_and_keeps_its_other_arguments(spelling):
    target, args_of, kwargs = CASTS[spelling]
    graph, node = _one_op_graph(target, args_of, kwargs)
    other_args = [a for a in node.args[1:] if not isinstance(a, torch.dtype)]
    other_kwargs = {k: v for k, v in node.kwargs.items() if k != "dtype"}
    set_cast_target(node, torch.bfloat16)
    assert node.target is target
    assert [a for a in node.args[1:] if not isinstance(a, torch.dtype)] == other_args
    assert {k: v for k, v in node.kwargs.items() if k != "dtype"} == other_kwargs
    assert node.meta["val"].dtype == torch.bfloat16 and cast_target_arg(node) == torch.bfloat16
    x = torch.randn(2, 3)
    out = torch.fx.GraphModule(torch.nn.Module(), graph)(x)
    assert out.dtype == torch.bfloat16 and torch.equal(out, x.to(torch.bfloat16))


@pytest.mark.parametrize("target", [aten.type_as.default, aten.to.other])
def test_a_cast_that_takes_its_dtype_from_another_tensor_is_spelled_out(target):
    graph = torch.fx.Graph()
    x, like = graph.placeholder("x"), graph.placeholder("like")
    node = graph.call_function(target, (x, like))
    node.meta["val"] = torch.empty(2, 3, dtype=torch.float64)
    graph.output(node)
    set_cast_target(node, torch.bfloat16)
    assert node.target is aten.to.dtype and node.args == (x, torch.bfloat16) and node.kwargs == {}
    assert node.meta["val"].dtype == torch.bfloat16
    value = torch.randn(2, 3)
    out = torch.fx.GraphModule(torch.nn.Module(), graph)(value, torch.zeros(1, dtype=torch.float64))
    assert torch.equal(out, value.to(torch.bfloat16))
