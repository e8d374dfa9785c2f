"""No string from a file can change the code a backend generates: string arguments are reviewed words or safe text
(a file carries no node metadata at all: test_crafted.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from models import ThreeLinears

import mixprec
from mixprec.errors import FileFormatError
from mixprec.output.serialize import operators, strings

from . import crafting


def _all_allowed_string_operators():
    """(qualified name, argument names) of every ATen overload the allow-list accepts that takes a string."""
    found = []
    for schema in torch._C._jit_get_all_schemas():
        if not schema.name.startswith("aten::"):
            continue
        name, overload = schema.name[6:], schema.overload_name or "default"
        text = [a.name for a in schema.arguments if any(w in str(a.type) for w in ("str", "Dimname", "Any"))]
        if text and operators.allowed_target(f"torch.ops.aten.{name}.{overload}"):
            found.append((f"{name}.{overload}", text))
    return found


def test_every_allowed_operator_with_a_string_argument_is_reviewed():
    found = _all_allowed_string_operators()
    assert len(found) > 40  # gelu, div modes, pads, fft norms, ... are reviewed, not refused
    for qualified, arguments in found:
        base = strings._base(qualified.split(".")[0])
        for argument in arguments:
            assert argument in strings.CHOICES.get(base, {}) or argument in strings.TEXT.get(base, {}), qualified


@pytest.mark.parametrize(
    "target", ["_mixed_dtypes_linear.default", "_sparse_semi_structured_tile.default", "_test_string_default.default"]
)
def test_operators_with_unreviewed_strings_are_refused(target):
    assert not operators.allowed_target(f"torch.ops.aten.{target}")


def test_einsum_is_allowed_now_that_path_is_not_a_file_name():
    assert operators.allowed_target("torch.ops.aten.einsum.default")
    strings.check_value("einsum", "equation", "bij,bjk->bik")
    with pytest.raises(FileFormatError):
        strings.check_value("einsum", "equation", 'ij"); system("x')


@pytest.mark.parametrize(
    "name, argument, value",
    [
        ("gelu", "approximate", "tanh"),
        ("gelu_", "approximate", "none"),
        ("div", "rounding_mode", "floor"),
        ("div", "rounding_mode", None),
        ("pad", "mode", "reflect"),
        ("conv2d", "padding", "same"),
        ("_assert_scalar", "assert_msg", "Runtime assertion failed for expression u0 <= 6 on node 'le'"),
        ("_assert_async", "assert_msg", "index out of range: x < 6"),
    ],
)
def test_reviewed_values_pass(name, argument, value):
    strings.check_value(name, argument, value)


@pytest.mark.parametrize(
    "name, argument, value",
    [
        ("gelu", "approximate", "erf"),
        ("gelu", "approximate", None),
        ("pad", "mode", 'constant"; system("x'),
        ("_assert_async", "assert_msg", crafting.cpp_touch_message("/tmp/x")),
        ("_assert_async", "assert_msg", "ok */ code /* ok"),
        ("_assert_async", "assert_msg", "line\rbreak"),
        ("_assert_async", "assert_msg", "{0.__class__}"),
        ("_assert_async", "assert_msg", "back\\slash"),
        ("_assert_scalar", "assert_msg", "Runtime assertion failed for expression x on node 'a'; b'"),
        ("add", "other", "x"),
        ("gelu", "approximate", 1),
    ],
)
def test_other_values_are_refused(name, argument, value):
    with pytest.raises(FileFormatError, match="strings in a mixprec program"):
        strings.check_value(name, argument, value)


def test_strings_in_a_graph_torch_built_are_checked():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(torch.ops.aten.gelu.default, (x,), {"approximate": "tanh"}))
    strings.check_fx_node(list(graph.nodes)[1])
    bad = graph.call_function(torch.ops.aten._assert_async.msg, (x, 'a"); system("x'))
    with pytest.raises(FileFormatError):
        strings.check_fx_node(bad)
    with pytest.raises(FileFormatError):
        strings.check_fx_node(graph.call_function(torch.ops.aten.add.Tensor, (x, "x")))


# ---- the native code execution of issue 25, as a crafted file ----------------------------------------------------


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> dict[str, bytes]:
    prog = mixprec.compile(ThreeLinears().eval(), ThreeLinears.example_inputs())
    path = tmp_path_factory.mktemp("saved") / "ok.mixprec.pt2"
    mixprec.save(prog, path)
    return crafting.members(path)


_RAW_INDUCTOR = """
import sys, torch
def f(x):
    torch.ops.aten._assert_async.msg(x.sum() > -1e30, sys.argv[1])
    return x * 2
torch.compile(f, backend="inductor")(torch.randn(1, 10))
"""


def test_assert_message_with_cpp_is_refused_even_when_the_caller_asks_for_inductor(original, tmp_path):
    marker = tmp_path / "native-code-ran"
    crafted = crafting.set_backend(
        crafting.edit_graph(original, lambda d: crafting.add_assert_async(d, crafting.cpp_touch_message(marker))),
        "inductor",
    )
    path = tmp_path / "rce.mixprec.pt2"
    crafting.write(path, crafted)
    for backend in (None, "inductor", "eager"):
        with pytest.raises(mixprec.FileFormatError, match="assert_msg"):
            mixprec.load(path, backend=backend)
    assert not marker.exists()
    # the payload is live: inductor compiles the same operator's message into C++ that runs system() at the first
    # call (in a fresh process with its own inductor cache, so nothing is left behind)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor-cache")}
    run = subprocess.run([sys.executable, "-c", _RAW_INDUCTOR, crafting.cpp_touch_message(marker)],
                         capture_output=True, text=True, timeout=600, env=env)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert marker.exists(), "the crafted message does not exercise the danger it is meant to"


def test_the_same_program_with_a_plain_message_loads(original, tmp_path):
    crafted = crafting.edit_graph(original, lambda d: crafting.add_assert_async(d, "input is finite"))
    path = tmp_path / "assert.mixprec.pt2"
    crafting.write(path, crafted)
    (x,) = ThreeLinears.example_inputs()
    assert mixprec.load(path)(x).shape == (1, 40)


def test_strings_where_the_schema_wants_no_string_are_refused(original, tmp_path):
    def edit(doc):
        node = next(n for n in crafting.root(doc) if n["op"] == "call_function")
        node["args"][-1] = ["a", "b"]

    path = tmp_path / "strings.mixprec.pt2"
    crafting.write(path, crafting.edit_graph(original, edit))
    with pytest.raises(mixprec.FileFormatError, match="strings"):
        mixprec.load(path)
