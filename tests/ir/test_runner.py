"""GraphRunner: runs a lifted program node by node like eager PyTorch, holding only live values."""

import pytest
import torch
from models import ConvNet, TiedEmbedding

from mixprec.errors import UnsupportedModelError
from mixprec.ir.capture import capture
from mixprec.ir.diagnose import flat_user_inputs
from mixprec.ir.runner import GraphRunner, lifted_inputs


def _runner(model, inputs):
    ep = capture(model, inputs)
    values = lifted_inputs(ep.graph_signature.input_specs, ep.state_dict, ep.constants, flat_user_inputs(ep, inputs, {}))
    return ep, GraphRunner(ep.graph_module, values)


def test_runs_like_eager_and_frees_dead_values():
    model, inputs = ConvNet().eval(), ConvNet.example_inputs()
    ep, runner = _runner(model, inputs)
    most_alive = 0
    result = None
    for node in runner.nodes:
        if node.op == "output":
            result = runner.inputs(node)[0][0]
            result = result[0] if isinstance(result, (tuple, list)) else result
        runner.run(node)
        most_alive = max(most_alive, sum(1 for n in runner.env if n.op != "placeholder"))
    with torch.no_grad():
        expected = model(*inputs)
    torch.testing.assert_close(result, expected, atol=0, rtol=0)
    assert most_alive <= 2  # a chain holds its current value, never every intermediate
    assert not runner.env  # nothing is kept once the output ran


def test_inputs_are_the_values_a_node_reads():
    model, inputs = TiedEmbedding().eval(), TiedEmbedding.example_inputs()
    ep, runner = _runner(model, inputs)
    for node in runner.nodes:
        if node.op == "call_function" and "embedding" in str(node.target):
            args, _ = runner.inputs(node)
            assert args[0] is ep.state_dict["embed.weight"] and torch.equal(args[1], inputs[0])
            break
        runner.run(node)
    else:
        pytest.fail("no embedding node")


def test_missing_user_input_is_a_clear_error():
    model, inputs = ConvNet().eval(), ConvNet.example_inputs()
    ep = capture(model, inputs)
    with pytest.raises(UnsupportedModelError, match="more inputs than were given"):
        lifted_inputs(ep.graph_signature.input_specs, ep.state_dict, ep.constants, [])
