"""The graph runner: runs a lifted program node by node like eager PyTorch, holding only live values,
feeding placeholders from the signature, returning only user outputs, and telling its observers."""

import copy

import pytest
import torch
from models import ConvNet, ThreeLinears, TiedEmbedding

from mixprec.errors import UnsupportedModelError
from mixprec.ir.call_signature import flat_user_inputs
from mixprec.ir.export import capture
from mixprec.ir.runner import GraphRunner, Observer, failing_node, lifted_inputs, run_user_outputs
from mixprec.ir.work_program import WorkProgram


class Counter(torch.nn.Module):
    """Writes a buffer (a functional graph returns the new value as a BUFFER_MUTATION output before the
    user outputs) and returns two user outputs."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, x):
        self.calls.add_(1)
        y = self.fc(x)
        return torch.relu(y), y * self.calls

    @staticmethod
    def example_inputs():
        return (torch.randn(2, 4),)


class Recorder(Observer):
    def __init__(self):
        self.events = []

    def before(self, node, args, kwargs):
        self.events.append(("before", node.name, args))

    def after(self, node, value):
        self.events.append(("after", node.name, value))


def _eager(model, inputs):
    with torch.no_grad():
        return copy.deepcopy(model)(*inputs)  # a copy: the model's own buffers stay as captured


def test_runs_like_eager_and_frees_dead_values():
    model, inputs = ConvNet().eval(), ConvNet.example_inputs()
    ep = capture(model, inputs)
    runner = GraphRunner(ep)
    most_alive, result = 0, None
    for node, value in runner.steps(flat_user_inputs(ep, inputs, {})):
        most_alive = max(most_alive, sum(1 for n in runner.env if n.op != "placeholder"))
        if node.op == "output":
            result = value
    torch.testing.assert_close(result[0], _eager(model, inputs), atol=0, rtol=0)
    assert most_alive <= 2  # a chain holds its current value, never every intermediate
    assert not runner.env  # nothing is kept once the output ran


def test_user_outputs_only_for_an_exported_and_a_work_program():
    model, inputs = Counter().eval(), Counter.example_inputs()
    ep = capture(model, inputs).run_decompositions({})  # functional: the buffer's new value is an output
    kinds = [spec.kind.name for spec in ep.graph_signature.output_specs]
    assert kinds[0] == "BUFFER_MUTATION" and kinds.count("USER_OUTPUT") == 2  # what must be filtered
    expected = _eager(model, inputs)
    user = flat_user_inputs(ep, inputs, {})
    for program in (ep, WorkProgram.from_exported(ep)):
        outputs = GraphRunner(program).run(user)
        assert len(outputs) == 2
        for got, want in zip(outputs, expected):
            torch.testing.assert_close(got, want, atol=0, rtol=0)
    work = WorkProgram.from_exported(ep)
    torch.testing.assert_close(run_user_outputs(work, user)[1], expected[1], atol=0, rtol=0)


def test_placeholders_are_fed_from_the_signature():
    model, inputs = TiedEmbedding().eval(), TiedEmbedding.example_inputs()
    ep = capture(model, inputs)
    recorder = Recorder()
    outputs = GraphRunner(ep, observers=[recorder]).run(flat_user_inputs(ep, inputs, {}))
    embedding = next(e for e in recorder.events if e[0] == "before" and "embedding" in e[1])
    assert embedding[2][0] is ep.state_dict["embed.weight"] and torch.equal(embedding[2][1], inputs[0])
    expected = _eager(model, inputs)
    torch.testing.assert_close(outputs, [expected["logits"], expected["argmax"]], atol=0, rtol=0)


def test_observers_see_every_node_in_order_and_the_values_eager_computes():
    model, inputs = ThreeLinears().eval(), ThreeLinears.example_inputs()
    ep = capture(model, inputs)
    recorder = Recorder()
    GraphRunner(ep, observers=[recorder]).run(flat_user_inputs(ep, inputs, {}))
    nodes = [n.name for n in ep.graph.nodes]
    assert [name for kind, name, _ in recorder.events if kind == "after"] == nodes
    calls = [n.name for n in ep.graph.nodes if n.op == "call_function"]
    assert [name for kind, name, _ in recorder.events if kind == "before"] == calls
    after = {name: value for kind, name, value in recorder.events if kind == "after"}
    with torch.no_grad():
        first = model.linear1(inputs[0])
    torch.testing.assert_close(after["linear"], first, atol=0, rtol=0)  # the first layer's value
    torch.testing.assert_close(after["output"][0], _eager(model, inputs), atol=0, rtol=0)


def test_a_runner_runs_many_inputs():
    model = ThreeLinears().eval()
    ep = capture(model, ThreeLinears.example_inputs())
    runner = GraphRunner(ep)
    for scale in (1.0, -3.0):
        x = torch.randn(1, 10) * scale
        torch.testing.assert_close(runner.run([x]), [_eager(model, (x,))], atol=0, rtol=0)


def test_the_failing_node_is_the_layer_eager_fails_in():
    model, inputs = ThreeLinears().eval(), ThreeLinears.example_inputs()
    ep = capture(model, inputs)
    bad = (inputs[0].double(),)
    with pytest.raises(RuntimeError) as eager:
        _eager(model, bad)
    node, error = failing_node(ep, bad, {})
    assert node is not None and node.name == "linear"  # the first Linear, as in eager
    assert type(error) is type(eager.value) and str(error).splitlines()[0] == str(eager.value).splitlines()[0]
    assert failing_node(ep, inputs, {}) == (None, None)


def test_a_failed_observer_may_name_the_layer_in_its_own_error():
    class Naming(Observer):
        def failed(self, node, error):
            raise ValueError(f"fails at {node.name}") from error

    ep = capture(ThreeLinears().eval(), ThreeLinears.example_inputs())
    with pytest.raises(ValueError, match="fails at linear") as info:
        GraphRunner(ep, observers=[Naming()]).run([torch.randn(1, 10).double()])
    assert isinstance(info.value.__cause__, RuntimeError)


def test_an_observer_error_is_not_a_failing_node():
    class Broken(Observer):
        def after(self, node, value):
            if node.name == "linear_1":
                raise KeyError("observer")

    located = []

    class Locate(Observer):
        def failed(self, node, error):
            located.append(node)

    ep = capture(ThreeLinears().eval(), ThreeLinears.example_inputs())
    with pytest.raises(KeyError):
        GraphRunner(ep, observers=[Locate(), Broken()]).run([torch.randn(1, 10)])
    assert located == []


def test_missing_user_input_is_a_clear_error():
    model, inputs = ConvNet().eval(), ConvNet.example_inputs()
    ep = capture(model, inputs)
    with pytest.raises(UnsupportedModelError, match="more inputs than were given"):
        lifted_inputs(ep.graph_signature.input_specs, ep.state_dict, ep.constants, [])
    with pytest.raises(UnsupportedModelError, match="more inputs than were given"):
        GraphRunner(ep).run([])
