"""WorkProgram: a private, mutable copy of an ExportedProgram, and its signature helpers.

Programs are captured from the small models of tests/models.py; after each edit the program is
turned back into an ExportedProgram, run, and compared with eager PyTorch computing the same thing.
"""

import pytest
import torch
import torch.nn.functional as F
from models import ThreeLinears, TiedEmbedding
from torch import nn
from torch.export.graph_signature import InputKind, TensorArgument

from mixprec.ir.export import capture
from mixprec.ir.work_program import WorkProgram, stored_bytes

aten = torch.ops.aten


def _three():
    model = ThreeLinears().eval()
    (x,) = ThreeLinears.example_inputs()
    return model, x, capture(model, (x,))


def _run(work, *args):
    with torch.no_grad():
        return work.copy().to_exported().module()(*args)


def _eager(model, *args):
    with torch.no_grad():
        return model(*args)


def _node(work, name):
    return next(n for n in work.graph.nodes if n.name == name)


def _linear(work, weight_placeholder):
    return next(n for n in work.graph.nodes if n.target is aten.linear.default and n.args[1].name == weight_placeholder)


# ---- in and out ------------------------------------------------------------------------------------


def test_round_trip_computes_what_the_model_computes():
    model, x, ep = _three()
    torch.testing.assert_close(_run(WorkProgram.from_exported(ep), x), _eager(model, x), rtol=0, atol=0)


def test_edits_never_reach_the_users_program():
    model, x, ep = _three()
    graph_before, signature_before = str(ep.graph), str(ep.graph_signature)
    work = WorkProgram.from_exported(ep)
    x_node = work.user_input_nodes()[0]
    x_node.meta["edited"] = True
    linear = _linear(work, "p_linear1_weight")
    with work.graph.inserting_after(linear):
        relu = work.graph.call_function(aten.relu.default, (linear,))
    linear.replace_all_uses_with(relu, delete_user_cb=lambda user: user is not relu)
    work.input_specs[0].arg = TensorArgument(name="renamed")  # as passes do: a new argument, never edited
    work.state_dict["extra"] = torch.ones(1)
    assert str(ep.graph) == graph_before and str(ep.graph_signature) == signature_before
    assert all("edited" not in n.meta for n in ep.graph.nodes)
    assert "extra" not in ep.state_dict
    torch.testing.assert_close(ep.module()(x), _eager(model, x), rtol=0, atol=0)


def test_renaming_a_spec_argument_in_place_never_renames_the_users_program():
    """Specs are copied with their arguments: even an in-place edit stays in the copy (and in a copy of it)."""
    _, _, ep = _three()
    names = [s.arg.name for s in ep.graph_signature.input_specs + ep.graph_signature.output_specs]
    work = WorkProgram.from_exported(ep)
    other = work.copy()
    for program in (work, other):
        for spec in program.input_specs + program.output_specs:
            spec.arg.name = "renamed"
    assert [s.arg.name for s in ep.graph_signature.input_specs + ep.graph_signature.output_specs] == names
    assert other.input_specs[0].arg is not work.input_specs[0].arg


def test_a_copy_is_independent_but_shares_the_tensors():
    model, x, ep = _three()
    work = WorkProgram.from_exported(ep)
    other = work.copy()
    linear = _linear(other, "p_linear3_weight")
    with other.graph.inserting_after(linear):
        neg = other.graph.call_function(aten.neg.default, (linear,))
    neg.meta["val"] = linear.meta["val"]
    linear.replace_all_uses_with(neg, delete_user_cb=lambda user: user is not neg)
    other.sync_output_specs()
    expected = _eager(model, x)
    torch.testing.assert_close(_run(other, x), -expected, rtol=0, atol=0)
    torch.testing.assert_close(_run(work, x), expected, rtol=0, atol=0)
    assert other.state_dict["linear1.weight"] is work.state_dict["linear1.weight"]
    assert other.input_specs[0] is not work.input_specs[0]


def test_graph_module_follows_a_replaced_graph():
    _, x, ep = _three()
    work = WorkProgram.from_exported(ep)
    first = work.graph_module
    assert work.graph_module is first  # made once
    work.rebuild_graph({})
    assert work.graph_module is not first and work.graph_module.graph is work.graph


# ---- stored inputs --------------------------------------------------------------------------------------


def test_a_stored_input_replaced_by_a_new_one_is_dropped_on_the_way_out():
    """What parameter casting does: a layer reads a converted copy; the original is unused."""
    model, x, ep = _three()
    work = WorkProgram.from_exported(ep)
    old = _node(work, "p_linear2_weight")
    like = work.input_spec_of(old)
    doubled = nn.Parameter(model.linear2.weight.detach() * 2, requires_grad=False)
    new = work.add_stored_input(like, "linear2.weight_x2", doubled, "p_linear2_weight_x2")
    new.meta["val"] = old.meta["val"]  # the caller gives the new placeholder its value's meta
    old.replace_all_uses_with(new)
    out = work.to_exported()
    assert "linear2.weight" not in out.state_dict and out.state_dict["linear2.weight_x2"] is doubled
    assert [s.target for s in out.graph_signature.input_specs if s.target and "linear2.weight" in s.target] == [
        "linear2.weight_x2"
    ]
    with torch.no_grad():
        h = model.linear1(x)
        expected = model.linear3(F.linear(h, doubled, model.linear2.bias))
        torch.testing.assert_close(out.module()(x), expected, rtol=0, atol=0)


def test_add_stored_input_keeps_signature_order_and_the_kind_of_its_model():
    _, _, ep = _three()
    work = WorkProgram.from_exported(ep)
    like = work.input_spec_of(_node(work, "p_linear1_weight"))
    new = work.add_stored_input(like, "copy", torch.zeros(10, 10), "p_copy")
    names = [n.name for n in work.placeholders()]
    assert names[names.index("p_linear1_weight") + 1] == "p_copy"
    specs = [s.arg.name for s in work.input_specs]
    assert specs == names  # placeholders and specs in the same order
    spec = work.input_spec_of(new)
    assert spec.kind == InputKind.PARAMETER and spec.target == "copy" and "val" not in new.meta
    assert work.stored_tensor(spec) is work.state_dict["copy"]


def test_a_non_persistent_buffer_is_stored_with_the_constants():
    class WithMask(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("mask", torch.tril(torch.ones(3, 3)), persistent=False)
            self.register_buffer("gain", torch.full((3,), 2.0))

        def forward(self, x):
            return x * self.mask * self.gain

    ep = capture(WithMask(), (torch.randn(3, 3),))
    work = WorkProgram.from_exported(ep)
    mask_spec = work.input_spec_of(_node(work, "b_mask"))
    gain_spec = work.input_spec_of(_node(work, "b_gain"))
    work.set_stored_tensor(mask_spec, torch.ones(3, 3))
    work.set_stored_tensor(gain_spec, torch.ones(3))
    assert "mask" in work.constants and "mask" not in work.state_dict
    assert "gain" in work.state_dict and "gain" not in work.constants
    x = torch.randn(3, 3)
    torch.testing.assert_close(_run(work, x), x, rtol=0, atol=0)  # both replaced by ones
    new = work.add_stored_input(mask_spec, "mask_copy", torch.zeros(3, 3), "b_mask_copy")
    assert work.input_spec_of(new).persistent is False and "mask_copy" in work.constants


def test_remove_stored_input_refuses_used_nodes_and_user_inputs():
    _, _, ep = _three()
    work = WorkProgram.from_exported(ep)
    with pytest.raises(ValueError, match="p_linear1_weight is not an unused stored input"):
        work.remove_stored_input(_node(work, "p_linear1_weight"))
    x = work.user_input_nodes()[0]
    for user in list(x.users):
        user.replace_input_with(x, _node(work, "p_linear1_bias"))
    with pytest.raises(ValueError, match="not an unused stored input"):
        work.remove_stored_input(x)


def test_remove_stored_input_keeps_a_tensor_another_placeholder_still_holds():
    model, x, ep = _three()
    work = WorkProgram.from_exported(ep)
    old = _node(work, "p_linear1_weight")
    like = work.input_spec_of(old)
    again = work.add_stored_input(like, "linear1.weight", model.linear1.weight, "p_again")
    again.meta["val"] = old.meta["val"]
    old.replace_all_uses_with(again)
    work.remove_stored_input(old)
    assert "linear1.weight" in work.state_dict and "p_linear1_weight" not in [s.arg.name for s in work.input_specs]
    torch.testing.assert_close(_run(work, x), _eager(model, x), rtol=0, atol=0)
    bias = _node(work, "p_linear3_bias")
    linear3 = _linear(work, "p_linear3_weight")
    linear3.update_arg(2, None)
    work.remove_stored_input(bias)
    assert "linear3.bias" not in work.state_dict
    with torch.no_grad():
        h = model.linear2(model.linear1(x))
        torch.testing.assert_close(_run(work, x), F.linear(h, model.linear3.weight), rtol=0, atol=0)


def test_an_unused_placeholder_is_dropped_but_its_tensor_kept_while_another_placeholder_reads_it():
    model, x, ep = _three()
    work = WorkProgram.from_exported(ep)
    old = _node(work, "p_linear2_weight")
    again = work.add_stored_input(work.input_spec_of(old), "linear2.weight", model.linear2.weight, "p_again")
    again.meta["val"] = old.meta["val"]
    old.replace_all_uses_with(again)
    out = work.to_exported()
    names = [s.arg.name for s in out.graph_signature.input_specs]
    assert "p_again" in names and "p_linear2_weight" not in names
    assert out.state_dict["linear2.weight"] is model.linear2.weight
    with torch.no_grad():
        torch.testing.assert_close(out.module()(x), model(x), rtol=0, atol=0)


def test_stored_bytes_counts_a_tied_weight_once():
    work = WorkProgram.from_exported(capture(ThreeLinears().eval(), ThreeLinears.example_inputs()))
    assert work.stored_bytes() == (10 * 10 + 10 + 10 * 30 + 30 + 30 * 40 + 40) * 4
    tied = WorkProgram.from_exported(capture(TiedEmbedding().eval(), TiedEmbedding.example_inputs()))
    assert tied.stored_bytes() == (50 * 16 + 16 * 16 + 16) * 4  # embed.weight is head.weight


def test_stored_bytes_tells_views_of_one_storage_apart_and_skips_non_tensors():
    base = torch.zeros(8)
    state = {"a": base, "same": base.view(8), "half": base[4:], "bf16": torch.zeros(4, dtype=torch.bfloat16)}
    assert stored_bytes(state, {"obj": object()}) == 8 * 4 + 4 * 4 + 4 * 2


# ---- names and outputs ---------------------------------------------------------------------------------


def test_a_placeholder_renamed_by_fx_keeps_its_signature_entry():
    class Builtin(nn.Module):
        def forward(self, input):  # fx renames a placeholder that shadows a builtin: input -> input_1
            return input * 3

    x = torch.randn(2)
    work = WorkProgram.from_exported(capture(Builtin(), (x,)))
    (node,) = work.user_input_nodes()
    assert work.input_spec_of(node).kind == InputKind.USER_INPUT
    torch.testing.assert_close(_run(work, x), x * 3, rtol=0, atol=0)


def test_rebuild_graph_renames_nodes_and_the_signature_follows():
    model, x, ep = _three()
    work = WorkProgram.from_exported(ep)
    x_node = work.user_input_nodes()[0]
    work.input_spec_of(x_node)  # index the old name
    work.rebuild_graph({x_node: "tokens", _node(work, "p_linear1_weight"): "w1"})
    names = [n.name for n in work.placeholders()]
    assert "tokens" in names and "w1" in names and "x" not in names
    assert [s.arg.name for s in work.input_specs] == names
    assert work.input_spec_of(_node(work, "tokens")).kind == InputKind.USER_INPUT
    assert work.input_spec_of(_node(work, "w1")).target == "linear1.weight"
    torch.testing.assert_close(_run(work, x), _eager(model, x), rtol=0, atol=0)


def test_output_specs_follow_a_replaced_output_value():
    model, x, ep = _three()
    work = WorkProgram.from_exported(ep)
    (_, last), = work.user_output_nodes()
    with work.graph.inserting_after(last):
        relu = work.graph.call_function(aten.relu.default, (last,))
    relu.meta["val"] = last.meta["val"]
    work.graph.output_node().replace_input_with(last, relu)
    work.rename_output(last, relu)
    assert work.output_specs[0].arg.name == relu.name
    torch.testing.assert_close(_run(work, x), torch.relu(_eager(model, x)), rtol=0, atol=0)


def test_user_output_dtypes_are_by_position_with_none_for_non_tensors():
    class Outputs(nn.Module):
        def forward(self, x):
            return x * 2, x.argmax(-1), x.bfloat16(), [x + 1, x - 1]

    work = WorkProgram.from_exported(capture(Outputs(), (torch.randn(2, 3),)))
    assert work.user_output_dtypes() == (torch.float32, torch.int64, torch.bfloat16, torch.float32, torch.float32)
    assert [p for p, _ in work.user_output_nodes()] == [0, 1, 2, 3, 4]
