"""The pass contract itself: GraphPass, rewrite_pass, PassResult and the fact tables.

(tests/rewrite/test_pipeline.py tests how the Pipeline uses the contract.) Expectations are sets of
facts worked out by hand from ``after = (facts - breaks) | ensures``.
"""

import dataclasses
from types import SimpleNamespace

import pytest

from mixprec.errors import InvariantError
from mixprec.ir.passes import (
    BACKEND_CHECKED, CHECKED, FACTS, GRAPH_CHECKED, INITIAL_FACTS, ORDERING, GraphPass, PassResult, backend_pass,
    facts_after, rewrite_pass,
)


def _noop(ctx):
    return PassResult(False)


# ---- facts ---------------------------------------------------------------------------------------------


def test_checked_and_ordering_facts_are_distinct_and_together_are_all_facts():
    assert not set(CHECKED) & set(ORDERING) and not (set(CHECKED) | set(ORDERING)) & set(BACKEND_CHECKED)
    assert FACTS == frozenset(CHECKED) | frozenset(ORDERING) | frozenset(BACKEND_CHECKED)
    assert INITIAL_FACTS <= frozenset(CHECKED)  # what holds on a normalised capture can be checked
    texts = list(CHECKED.values()) + list(ORDERING.values()) + list(BACKEND_CHECKED.values())
    assert all(isinstance(text, str) and text for text in texts)


def test_a_backend_checks_what_the_graph_alone_shows():
    """No plan there: structure and meta, and the backend facts; the plan's facts are not among them."""
    assert GRAPH_CHECKED == frozenset({"structure", "meta"}) | frozenset(BACKEND_CHECKED)
    assert not GRAPH_CHECKED & {"inputs_rounded", "layer_dtypes", "int8", "output_dtypes"}


def test_the_fact_tables_are_read_only():
    with pytest.raises(TypeError):
        CHECKED["new"] = "x"
    with pytest.raises(TypeError):
        ORDERING["new"] = "x"
    with pytest.raises(TypeError):
        BACKEND_CHECKED["new"] = "x"


# ---- PassResult and GraphPass ------------------------------------------------------------------------


def test_pass_result_is_frozen_and_compares_by_value():
    assert PassResult(True) == PassResult(True) and PassResult(True) != PassResult(False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        PassResult(True).changed = False


def test_a_pass_is_frozen_and_keeps_its_contract_as_frozensets():
    p = GraphPass("p", _noop, requires=["structure"], ensures={"layer_dtypes"}, breaks=("meta",))
    assert (p.requires, p.ensures, p.breaks) == (
        frozenset({"structure"}), frozenset({"layer_dtypes"}), frozenset({"meta"}),
    )  # fmt: skip
    assert all(isinstance(f, frozenset) for f in (p.requires, p.ensures, p.breaks))
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.requires = frozenset()


@pytest.mark.parametrize("field", ["requires", "ensures", "breaks"])
def test_an_unknown_fact_in_any_part_of_the_contract_is_refused_with_the_known_ones(field):
    message = rf"rewrite pass 'typo' {field} unknown fact\(s\) \['layer_dtype'\]"
    with pytest.raises(InvariantError, match=message) as info:
        GraphPass("typo", _noop, **{field: frozenset({"layer_dtype", "structure"})})
    for fact in FACTS:
        assert repr(fact) in str(info.value)


def test_calling_a_pass_runs_it_on_the_context_and_hands_back_its_result():
    seen = []

    def mark(ctx):
        seen.append(ctx)
        return PassResult(True)

    ctx = SimpleNamespace()
    assert GraphPass("mark", mark)(ctx) == PassResult(True)
    assert seen == [ctx]


@pytest.mark.parametrize("returned", [True, None, {"changed": False}])
def test_a_pass_that_returns_anything_but_a_pass_result_is_named(returned):
    bad = GraphPass("sloppy", lambda ctx: returned)
    message = rf"rewrite pass 'sloppy' returned {type(returned).__name__}, not a PassResult"
    with pytest.raises(InvariantError, match=message):
        bad(None)


def test_after_drops_what_a_pass_breaks_and_adds_what_it_ensures():
    p = GraphPass("p", _noop, ensures={"layer_dtypes"}, breaks={"meta", "output_dtypes"})
    before = frozenset({"structure", "meta", "output_dtypes"})
    assert p.after(before) == frozenset({"structure", "layer_dtypes"})
    assert p.after(frozenset()) == frozenset({"layer_dtypes"})


def test_a_fact_a_pass_both_breaks_and_ensures_holds_after_it():
    """It may break the fact while it runs; it re-establishes it before it returns."""
    p = GraphPass("p", _noop, ensures={"meta"}, breaks={"meta"})
    assert p.after(frozenset({"structure"})) == frozenset({"structure", "meta"})


def test_a_pass_that_declares_nothing_leaves_the_facts_as_they_were():
    facts = frozenset({"structure", "int8"})
    assert GraphPass("p", _noop).after(facts) == facts


# ---- rewrite_pass --------------------------------------------------------------------------------------


def test_rewrite_pass_names_the_pass_after_its_function_and_declares_its_contract():
    @rewrite_pass(requires={"structure"}, ensures={"output_dtypes"}, breaks={"meta"})
    def restore(ctx):
        return PassResult(ctx.changed)

    assert isinstance(restore, GraphPass)
    assert restore.name == "restore" and restore.run.__name__ == "restore"
    assert (restore.requires, restore.ensures, restore.breaks) == (
        frozenset({"structure"}), frozenset({"output_dtypes"}), frozenset({"meta"}),
    )  # fmt: skip
    assert restore(SimpleNamespace(changed=True)) == PassResult(True)


def test_rewrite_pass_takes_an_explicit_name_and_an_empty_contract():
    @rewrite_pass("layout")
    def lower(ctx):
        return PassResult(False)

    assert lower.name == "layout"
    assert lower.requires == lower.ensures == lower.breaks == frozenset()


def test_rewrite_pass_refuses_an_unknown_fact_when_the_function_is_declared():
    with pytest.raises(InvariantError, match="rewrite pass 'cast' requires unknown fact"):

        @rewrite_pass("cast", requires={"casts_inserted"})
        def cast(ctx):
            return PassResult(False)


# ---- backend_pass and facts_after ------------------------------------------------------------------------


def test_backend_pass_declares_a_backend_stage_pass_named_so_in_errors():
    @backend_pass("lower", requires={"int8"}, ensures={"qdq_lowered"}, breaks={"int8"})
    def lower(module):
        return None

    assert lower.stage == "backend" and lower.requires == frozenset({"int8"})
    with pytest.raises(InvariantError, match="backend pass 'lower' returned NoneType"):
        lower(None)
    with pytest.raises(InvariantError, match="backend pass 'typo' ensures unknown fact"):
        backend_pass("typo", ensures={"lowered"})(lambda module: PassResult(False))


def test_facts_after_follows_each_pass_and_names_the_first_unmet_requirement():
    a = GraphPass("a", _noop, ensures={"qdq_lowered"}, breaks={"int8"})
    b = GraphPass("b", _noop, requires={"int8"})
    start = frozenset({"structure", "int8"})
    assert facts_after((b, a), start) == [start, frozenset({"structure", "qdq_lowered"})]
    with pytest.raises(InvariantError, match=r"backend pass 'b' requires \['int8'\].*passes before it: a"):
        facts_after((a, b), start, stage="backend")
