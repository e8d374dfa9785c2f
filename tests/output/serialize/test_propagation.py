"""The fake run at load: a file whose shapes, views or memory are not what a mixprec program's are is refused at
load, not at its first call (and nothing real is allocated on the way)."""

from __future__ import annotations

import resource
import types

import pytest
import torch
from models import ThreeLinears

import mixprec
from mixprec.errors import FileFormatError
from mixprec.output.serialize import propagation

from . import crafting


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> dict[str, bytes]:
    prog = mixprec.compile(ThreeLinears().eval(), ThreeLinears.example_inputs())
    path = tmp_path_factory.mktemp("saved") / "ok.mixprec.pt2"
    mixprec.save(prog, path)
    return crafting.members(path)


class Scale(torch.nn.Module):
    """Shape-generic: any input size runs, so only the recorded sizes decide what a backend would make."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.tensor(2.0))

    def forward(self, x):
        return x * self.weight


@pytest.fixture(scope="module")
def scale(tmp_path_factory) -> dict[str, bytes]:
    prog = mixprec.compile(Scale().eval(), (torch.randn(4, 4),))
    path = tmp_path_factory.mktemp("saved") / "scale.mixprec.pt2"
    mixprec.save(prog, path)
    return crafting.members(path)


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_a_graph_allocating_2_to_the_40_elements_is_refused_at_load(original, tmp_path):
    def edit(doc):
        crafting.prepend_node(doc, "huge", "torch.ops.aten.zeros.default", [[1 << 20, 1 << 20]],
                              {"dtype": {"dtype": "float32"}})  # fmt: skip

    path = tmp_path / "alloc.mixprec.pt2"
    crafting.write(path, crafting.edit_graph(original, edit))
    before = _rss_mib()
    with pytest.raises(mixprec.FileFormatError, match="4.1e\\+03 GiB|would use"):
        mixprec.load(path)
    assert _rss_mib() - before < 256


def test_a_view_past_a_weights_storage_is_refused_at_load(original, tmp_path):
    def edit(doc):
        weight = crafting.first_parameter(doc)
        crafting.prepend_node(doc, "outside", "torch.ops.aten.as_strided.default",
                              [{"node": weight}, [1000, 1000], [1000, 1]])  # fmt: skip

    path = tmp_path / "view.mixprec.pt2"
    crafting.write(path, crafting.edit_graph(original, edit))
    with pytest.raises(mixprec.FileFormatError, match="views 4000000 bytes of a storage that holds 400"):
        mixprec.load(path)
    # the payload is live: torch refuses the view only when it runs on real data
    with pytest.raises(RuntimeError, match="out of bounds for storage"):
        torch.ops.aten.as_strided.default(torch.zeros(10, 10), [1000, 1000], [1000, 1])


@pytest.mark.parametrize(
    "target, args",
    [("_operator.pow", [3, 10**13]), ("_operator.lshift", [1, 10**6]), ("_operator.mul", [1 << 62, 1 << 62])],
    ids=["pow", "lshift", "mul"],
)
def test_size_arithmetic_in_the_file_stays_within_torch_sizes(original, tmp_path, target, args):
    """The reader computes every node's value itself: size arithmetic from the file is bounded as it runs."""
    path = tmp_path / "arith.mixprec.pt2"
    crafting.write(path, crafting.edit_graph(original, lambda doc: crafting.prepend_node(doc, "n", target, args)))
    with pytest.raises(mixprec.FileFormatError, match="power or shifts|leaves torch's sizes"):
        mixprec.load(path)


@pytest.mark.parametrize("side", [1 << 15, 1 << 20])
def test_inputs_are_never_materialised_beyond_what_the_file_stores(scale, tmp_path, side):
    def edit(doc):
        (described,) = doc["inputs"].values()
        described["tensor"]["shape"] = [side, side]

    crafted = crafting.set_backend(crafting.edit_graph(scale, edit), "inductor")
    path = tmp_path / "big-input.mixprec.pt2"
    crafting.write(path, crafted)
    before = _rss_mib()
    for backend in (None, "inductor"):
        with pytest.raises(mixprec.FileFormatError, match="inputs take .* bytes at their recorded sizes"):
            mixprec.load(path, backend=backend)
    assert _rss_mib() - before < 256


def test_the_footprint_of_a_real_program(original, tmp_path):
    path = tmp_path / "ok.mixprec.pt2"
    crafting.write(path, original)
    prog = mixprec.load(path)
    footprint = propagation.check(prog.exported_program, stored_input_bytes=40)
    assert footprint.weight_bytes == (10 * 10 + 10 + 30 * 10 + 30 + 40 * 30 + 40) * 4
    assert footprint.input_bytes == 10 * 4
    assert footprint.peak_bytes == (30 + 40) * 4  # linear_1 and linear_2's outputs at once, linear's freed
    assert footprint.budget == propagation.MULTIPLE * (footprint.weight_bytes + 40) + propagation.FLOOR


def _run_with_one_node(target, *args):
    run = propagation._Run(None, None)
    node = types.SimpleNamespace(name="n", meta={})
    return run._size_arithmetic(node, target, args, {})


@pytest.mark.parametrize(
    "target, args",
    [(pow := __import__("operator").pow, (3, 10**13)), (__import__("operator").lshift, (1, 10**6)),
     (__import__("operator").mul, (1 << 40, 1 << 40))],  # fmt: skip
)
def test_size_arithmetic_stays_within_torch_sizes(target, args):
    with pytest.raises(FileFormatError, match="2\\*\\*63|power or shifts"):
        _run_with_one_node(target, *args)


def test_size_arithmetic_of_real_sizes_passes():
    import operator

    assert _run_with_one_node(operator.mul, 128, 768) == 98304
    assert _run_with_one_node(operator.pow, 64, 2) == 4096
    assert _run_with_one_node(operator.floordiv, 7, 2) == 3


class Selected(torch.nn.Module):
    """A data-dependent size: nonzero's row count is known only at run time (at most the input's 6 rows)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x, y):
        rows = torch.nonzero(y > 0).squeeze(1)
        return self.linear(x)[rows].sum(0)


def test_data_dependent_sizes_are_counted_at_their_upper_bound(tmp_path):
    model = Selected().eval()
    x, y = torch.randn(6, 8), torch.randn(6)
    prog = mixprec.compile(model, (x, y))
    mixprec.save(prog, tmp_path / "selected.mixprec.pt2")
    loaded = mixprec.load(tmp_path / "selected.mixprec.pt2")
    torch.testing.assert_close(loaded(x, y), model(x, y))
    footprint = propagation.check(loaded.exported_program, stored_input_bytes=6 * 8 * 4 + 6 * 4)
    # linear's [6, 8] float32 result and the selected rows' [6, 8] (at the bound 6) alive together, plus indices
    assert footprint.peak_bytes >= 2 * 6 * 8 * 4


class _Loops:
    """One module per loop operator whose body allocates 4 GiB per turn and returns a few floats."""

    class While(torch.nn.Module):
        def forward(self, i, x):
            from torch._higher_order_ops.while_loop import while_loop

            return while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, x + torch.zeros(1 << 30).sum()), (i, x))

    class Scan(torch.nn.Module):
        def forward(self, init, xs):
            from torch._higher_order_ops.scan import scan

            return scan(lambda c, x: (c + x, (c * x).clone() + torch.zeros(1 << 30).sum()), init, xs)

    class Map(torch.nn.Module):
        def forward(self, xs, y):
            from torch._higher_order_ops.map import map as loop_map

            return loop_map(lambda x, y: x + y + torch.zeros(1 << 30).sum(), xs, y)


@pytest.mark.parametrize(
    "module, inputs",
    [(_Loops.While(), (torch.tensor(0), torch.randn(4))), (_Loops.Scan(), (torch.zeros(3), torch.randn(5, 3))),
     (_Loops.Map(), (torch.randn(5, 3), torch.randn(3)))],  # fmt: skip
)
def test_what_one_turn_of_a_loop_body_allocates_is_counted(module, inputs):
    program = torch.export.export(module, inputs)
    with pytest.raises(FileFormatError, match="would use 4 GiB"):
        propagation.check(program, stored_input_bytes=sum(t.nbytes for t in inputs))


def test_a_loop_with_an_ordinary_body_passes():
    class Add(torch.nn.Module):
        def forward(self, xs, y):
            from torch._higher_order_ops.map import map as loop_map

            return loop_map(lambda x, y: x + y, xs, y)

    xs, y = torch.randn(5, 3), torch.randn(3)
    footprint = propagation.check(torch.export.export(Add(), (xs, y)), stored_input_bytes=xs.nbytes + y.nbytes)
    assert footprint.peak_bytes == 5 * 3 * 4 + 3 * 4  # the map's output and one turn's row
