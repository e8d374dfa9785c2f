"""Candidate fixes, on hand-built graphs: which layers are tried, what each fix keeps in fp32, how findings rank
by a measured output error, and the code that applies a fix."""

import math

import pytest
import torch
from models import ThreeLinears

import mixprec
from mixprec.debugger import fixes
from mixprec.debugger.findings import combined, find
from mixprec.debugger.records import LayerComparison
from mixprec.ir.graph_info import GraphInfo, NodeInfo, TensorMeta
from mixprec.plan.precision_plan import NodePrecision, PrecisionPlan

F32, BF16 = torch.float32, torch.bfloat16


def _graph():
    """a -> add -> sub -> view -> out (graph output); a -> b. ``view`` is data movement; ``b`` is fp32."""

    def node(name, inputs, kind="compute", module="m"):
        return NodeInfo(name, f"aten.{name}.default", kind, module, "M", F32, dict.fromkeys(inputs, F32),
                        (TensorMeta((4,), F32),), 10 if kind == "compute" else 0)  # fmt: skip

    nodes = [node("a", ["x"]), node("add", ["a"]), node("sub", ["add"]), node("view", ["sub"], kind="movement"),
             node("out", ["view"]), node("b", ["a"])]  # fmt: skip
    nodes = {n.name: n for n in nodes}
    return GraphInfo(nodes, {}, outputs=frozenset({"out", "b"}))


def _plan(**fp32):
    return PrecisionPlan({n: NodePrecision(F32 if n in fp32 else BF16, None, "autocast_rule", "r")
                          for n in ("a", "add", "sub", "view", "out", "b")})  # fmt: skip


def _record(name, jump=0.0, new=0, precision=BF16, ref_absmax=1.0):
    return LayerComparison(name, f"aten.{name}.default", "m", "M", "compute", precision, "autocast_rule", 4, 0.1, 0.1,
                           1.0, ref_absmax, new, 0, new, 0.1 - jump, jump)  # fmt: skip


def _layers(**jumps):
    return [_record(n, jumps.get(n, 0.0), precision=F32 if n == "b" else BF16) for n in ("a", "add", "sub", "out", "b")]


def test_candidates_output_producers_then_jumps_each_alone_and_with_its_producers():
    info, plan = _graph(), _plan(b=1)
    found = fixes.candidates(_layers(sub=0.9, a=0.2), info, plan, 10)
    assert [(c.kind, c.record.name, c.layers) for c in found] == [
        ("output", "out", ("out",)),
        ("error_jump", "sub", ("sub", "view")),  # the view after sub only followed it: fp32 with it
        ("error_jump", "sub", ("add", "sub", "view")),
        ("error_jump", "a", ("a",)),
    ]
    assert len(fixes.candidates(_layers(sub=0.9, a=0.2), info, plan, 2)) == 2
    assert [c.layers for c in fixes.candidates(_layers(sub=0.9), info, plan, 10, variants=False)] == [
        ("out",), ("sub", "view")
    ]


def test_a_follower_with_another_low_producer_stays_as_planned():
    info = _graph()
    assert fixes.with_followers(["sub"], info, _plan()) == ("sub", "view")
    assert fixes.with_followers(["add"], info, _plan()) == ("add",)  # sub computes: not a follower
    assert fixes.output_producers(info, _plan()) == ["out", "b"]  # both leave the graph in low precision
    assert fixes.output_producers(info, _plan(b=1)) == ["out"]
    assert fixes.output_producers(info, _plan(out=1, b=1)) == []  # view is only followed through, never a producer


def test_the_first_nonfinite_is_tried_with_the_layers_that_cannot_hold_its_values():
    info, plan = _graph(), _plan()
    layers = [_record("a"), _record("add", new=4, ref_absmax=1e39), _record("sub", new=4, ref_absmax=5.0),
              _record("out", new=4, ref_absmax=2.0), _record("b")]  # fmt: skip
    found = fixes.candidates(layers, info, plan, 10)
    assert found[0].kind == found[1].kind == "nonfinite"
    # sub reads add's 1e39 (beyond bf16's 3.4e38): it overflows too; out reads sub's 5.0: it does not
    assert found[0].layers == ("add",) and found[1].layers == ("add", "sub", "view")


def test_findings_rank_by_the_measured_output_error_and_the_helpful_ones_combine():
    info, plan = _graph(), _plan(b=1)
    errors = {("out",): 0.5, ("sub", "view"): 0.95, ("add", "sub", "view"): 0.2, ("a",): 0.999}
    measured = []

    def measure(layers):
        measured.append(layers)
        if layers in errors:
            return errors[layers], 1.0, 0.5
        return 0.1, 1.0, 0.4  # the combination

    found = find(_layers(sub=0.9, a=0.2), info, plan, limit=10, measure=measure, before=1.0)
    assert [(f.layer, f.fix.layers, f.helps) for f in found] == [
        ("sub", ("add", "sub", "view"), True),  # the larger fix: 0.2 against 0.95 alone
        ("out", ("out",), True),
        ("a", ("a",), False),  # 0.1% lower: no effect
    ]
    assert found[0].fix.compute == ("add", "sub") and found[0].fix.rel_l2_error == 0.2
    assert "# mixprec.debug measured 0.2" in found[0].fix.code
    together = combined(found, info, measure, 1.0, lambda layers, rel: "code")
    assert together.layers == ("add", "sub", "view", "out") and together.rel_l2_error == 0.1 and together.helps


def test_a_larger_fix_is_chosen_only_when_it_does_clearly_better():
    info, plan = _graph(), _plan(b=1)
    errors = {("out",): 0.5, ("sub", "view"): 0.3, ("add", "sub", "view"): 0.298}
    (first, *_) = find(_layers(sub=0.9), info, plan, limit=3, measure=lambda k: (errors[k], 1.0, 0.5), before=1.0)
    assert first.fix.layers == ("sub", "view")


def test_helps_needs_one_percent_or_a_finite_error_where_there_was_none():
    assert fixes.helps(1.0, 0.98) and not fixes.helps(1.0, 0.995) and not fixes.helps(1.0, 1.2)
    assert fixes.helps(math.inf, 0.5) and not fixes.helps(math.inf, math.inf) and not fixes.helps(1.0, None)


def test_fix_code_carries_the_settings_the_program_needs_and_runs():
    code = fixes.fix_code(("linear",), plan_of="prog.plan", call="model, inputs",
                          settings={"keep_io_types": False, "backend": "eager", "enable_autocast": True},
                          measured=0.25)  # fmt: skip
    assert "mixprec.compile(model, inputs, plan=plan, keep_io_types=False)" in code
    assert "enable_autocast" not in code  # the plan decides every layer
    assert code.endswith("# mixprec.debug measured 0.25")
    long = fixes.fix_code(tuple(f"layer_{i}" for i in range(12)), plan_of="found.plan", call="model, inputs",
                          settings={}, measured=None)  # fmt: skip
    assert max(len(line) for line in long.splitlines()) < 100
    model, inputs = ThreeLinears().eval(), ThreeLinears.example_inputs()
    prog = mixprec.compile(model, inputs, keep_io_types=False, plan=PrecisionPlan(
        {n: NodePrecision(BF16) for n in ("linear", "linear_1", "linear_2")}))  # fmt: skip
    namespace = {"prog": prog, "model": model, "inputs": inputs}
    exec(fixes.fix_code(("linear_1",), plan_of="prog.plan", call="model, inputs", settings=prog.settings,  # noqa: S102
                        measured=None), namespace)  # fmt: skip
    fixed = namespace["prog"]
    assert fixed.plan["linear_1"].precision == F32 and fixed.plan["linear"].precision == BF16
    assert fixed.settings["keep_io_types"] is False


@pytest.mark.parametrize("fixes_", [1.5, True, "3"])
def test_fixes_must_be_a_count(fixes_):
    model, inputs = ThreeLinears().eval(), ThreeLinears.example_inputs()
    with pytest.raises(mixprec.ConfigError, match="fixes must be a count"):
        mixprec.debug(model, inputs, fixes=fixes_)


@pytest.mark.parametrize("count", [1, 12])  # one line, and one name a line
def test_fix_code_quotes_any_name_as_a_python_literal(count):
    """The code is printed to be pasted: a name from a file closing its quote would run what follows."""
    import ast

    hostile = 'x", __import__("os").system("touch pwned"), "\\\n\x1b[2J\u202e'
    names = tuple(f"{hostile}{i}" for i in range(count))
    code = fixes.fix_code(names, plan_of="prog.plan", call="model, inputs", settings={}, measured=None)
    calls = [n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Call)]
    assert not any(getattr(c.func, "id", None) == "__import__" for c in calls)
    (listed,) = [n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.List)]
    assert ast.literal_eval(listed) == list(names)
