"""The pass contract (modelled on torch.fx's PassBase/PassResult and its PassManager's checks).

It lives with the graph because every stage that changes graphs uses it: normalisation
(``normalize.py``, ``marker_regions.py`` here) returns :class:`PassResult`, every rewrite pass
(``rewrite/``) declares its contract with :func:`rewrite_pass`, and every graph pass a backend runs
before its compiler (``backends/lowering/``) with :func:`backend_pass`.

A rewrite pass takes the rewrite context (the WorkProgram, the GraphInfo of the captured graph, the
plan, the settings), changes the graph to realise part of the plan, and returns whether it changed
anything. Passes never re-derive a decision: everything they need is in the plan and the GraphInfo.
Each declares its contract in named **facts** about the graph: ``requires`` (must hold when it runs),
``ensures`` (hold once it has run), ``breaks`` (may be left broken until a later pass re-establishes
them: input rounding leaves consumers reading the rounded dtype until cast insertion adapts them).

The pipeline (``rewrite/pipeline.py``) checks when it is built that every pass's requirements are met
by the passes before it, and, with ``MIXPREC_VERIFY_EACH=1``, has the verifier check every fact that
holds after each pass — an :class:`~mixprec.errors.InvariantError` names the pass after which a fact
stopped holding. Facts in :data:`CHECKED` have a check in ``rewrite/verify.py``; the others record an
order that a pass's docstring explains (they cannot be checked on the graph alone).

A backend has no plan: its passes start from what the rewrite leaves (every rewrite fact), and its
verifier checks the facts the graph alone shows (:data:`GRAPH_CHECKED`); the rewrite facts that need the
plan become an order there (the oneDNN lowering requires ``int8``, the fake-quantization pattern, which
the quantize/dequantize lowering breaks).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import MappingProxyType

from ..errors import InvariantError


@dataclasses.dataclass(frozen=True)
class PassResult:
    """What a graph pass returns: whether it changed the graph (torch.fx's ``PassResult``)."""

    changed: bool


# fact -> what it means; the verifier checks these on the graph
CHECKED = MappingProxyType(
    {
        "structure": "the graph lints; mixprec's casts are float -> float, change the dtype, one per (tensor, dtype)",
        "inputs_rounded": "every model input the plan rounds is read only through its rounding cast",
        "layer_dtypes": "every layer computes in the plan's dtype and receives each float input in the dtype it needs",
        "int8": "int8 layers read their quantized inputs and int8 weights through quantize/dequantize",
        "weight_only": "weight-only int8/int4 layers read stored integer weights and scales of consistent shapes",
        "output_dtypes": "the graph outputs have the dtypes the plan and keep_io_types ask for",
        "meta": "the dtypes in node meta are what the ops produce (fake-tensor re-run: tests only)",
    }
)
# facts the verifier cannot check: the order a pass relies on
ORDERING = MappingProxyType(
    {
        "params_stored": "parameters, buffers and constants are stored in the dtype their consumers read",
        "fp32_accumulation": "layers with accumulate=fp32 compute on widened operands and round their result",
        "matmul_layout": "lowered matmul-class layers read contiguous inputs",
        "channels_last": "lowered 2-D convolutions read and store channels_last tensors",
    }
)
# facts of the backends' graph passes, checked on the graph alone (rewrite/verify.py: verify_lowered)
BACKEND_CHECKED = MappingProxyType(
    {
        "qdq_lowered": "no mixprec quantize/dequantize op is left: the runtime sees their arithmetic or its own "
        "quantization ops (OpenVINO converts no mixprec op; inductor fuses ATen ops, not custom ones)",
        "tensor_outputs": "the graph returns a flat tuple of tensors (OpenVINO's decoder takes nothing else)",
        "contiguous_state": "every stored tensor is contiguous (OpenVINO reads freed memory behind a strided one)",
    }
)
# what a backend's verifier can check: it has the graph and its state, not the plan
GRAPH_CHECKED = frozenset({"structure", "meta"}) | frozenset(BACKEND_CHECKED)
FACTS = frozenset(CHECKED) | frozenset(ORDERING) | frozenset(BACKEND_CHECKED)
# what holds on a normalised capture before any rewrite pass
INITIAL_FACTS = frozenset({"structure", "meta"})


@dataclasses.dataclass(frozen=True)
class GraphPass:
    """A graph pass with its contract; calling it runs the pass (``pass_(subject) -> PassResult``).

    ``stage`` says whose pass it is ("rewrite": it takes the rewrite context; "backend": the backend's
    module or program) and names it in errors."""

    name: str
    run: Callable
    requires: frozenset = frozenset()
    ensures: frozenset = frozenset()
    breaks: frozenset = frozenset()
    stage: str = "rewrite"

    def __post_init__(self):
        for field in ("requires", "ensures", "breaks"):
            value = frozenset(getattr(self, field))
            unknown = value - FACTS
            if unknown:
                raise InvariantError(
                    f"{self.stage} pass '{self.name}' {field} unknown fact(s) {sorted(unknown)}; known: {sorted(FACTS)}"
                )
            object.__setattr__(self, field, value)

    def __call__(self, subject) -> PassResult:
        result = self.run(subject)
        if not isinstance(result, PassResult):
            raise InvariantError(
                f"{self.stage} pass '{self.name}' returned {type(result).__name__}, not a PassResult"
            )
        return result

    def after(self, facts: frozenset) -> frozenset:
        """The facts that hold once this pass has run on a graph where ``facts`` held."""
        return (facts - self.breaks) | self.ensures


def facts_after(passes, initial: frozenset, *, stage: str = "rewrite") -> list[frozenset]:
    """The facts that hold after each of ``passes`` run in order from ``initial``; InvariantError names the
    first pass whose requirements no pass before it ensures."""
    facts = frozenset(initial)
    out = []
    for i, p in enumerate(passes):
        missing = p.requires - facts
        if missing:
            before = ", ".join(q.name for q in passes[:i]) or "none"
            raise InvariantError(
                f"{stage} pass '{p.name}' requires {sorted(missing)}, which no pass before it ensures "
                f"(passes before it: {before})"
            )
        facts = p.after(facts)
        out.append(facts)
    return out


def rewrite_pass(name: str | None = None, *, requires=(), ensures=(), breaks=()):
    """Declare a function ``fn(ctx) -> PassResult`` as a rewrite pass with its contract."""

    def declare(fn: Callable) -> GraphPass:
        return GraphPass(name or fn.__name__, fn, frozenset(requires), frozenset(ensures), frozenset(breaks))

    return declare


def backend_pass(name: str | None = None, *, requires=(), ensures=(), breaks=()):
    """Declare a function ``fn(subject) -> PassResult`` (subject: a backend's GraphModule or WorkProgram) as a
    backend graph pass with its contract."""

    def declare(fn: Callable) -> GraphPass:
        return GraphPass(
            name or fn.__name__, fn, frozenset(requires), frozenset(ensures), frozenset(breaks), stage="backend"
        )

    return declare
