"""Eval batches of any batch and sequence size: which program runs each, for every trial.

A captured program has its sizes baked in (``view(x, [2, 8, 2, 32])``), but eval data comes in
the shapes a loader yields: another batch size, a ragged last batch, an HF collator padding each
batch to its own longest sequence. The search must measure the plan on exactly those batches,
so that its metric is what running the model (and the plan's program) on each batch gives.

How: the search plans on one capture, at the example inputs' shapes (so its plans name nodes as
``compile(model, inputs, plan=...)`` does), and a batch that capture does not take runs on a capture
that does — ``calibrate/batch_graphs.OtherShapes``, the same captures compile's calibration makes:
one capture with ``Dim.AUTO`` dimensions for every size torch lets it take, and an exact-shape
capture for a batch it does not (a size-1 dimension torch specialises). A trial's plan is carried
onto such a capture through their node alignment: the lowered layers are requested by their
names there and the planner fills in the rest as it does on the example capture, so every batch
runs the same layers in the same dtypes at its own sizes. Each of those programs is realised
when a batch first needs it, once per trial.

Why not the alternatives: padding every batch to one shape changes the values (attention over
pad positions, statistics over padded rows); a dynamic capture as *the* capture renames nodes
(size nodes shift fx's numbering), so its plans would not be compile's; one exact-shape capture
per distinct shape costs a capture per batch for collator-padded data (every batch its own
length) and a realisation per batch per trial, where the dynamic capture serves them all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import torch

from ..calibrate.batch_graphs import CalibrationGraph, OtherShapes
from ..calibrate.batches import Call, arrange, fit
from ..errors import CalibrationError
from ..ir.captured import CapturedModel
from ..plan import planner
from ..plan.options import PlanningOptions
from ..plan.precision_plan import PrecisionPlan


class BatchSizes:
    """The captures a search's batches run on: the example-shape one and those for other sizes."""

    def __init__(self, captured: CapturedModel):
        self.captured = captured
        self.user_nodes = captured.base.user_input_nodes()
        model = captured.model
        # an ExportedProgram cannot be captured again: batches must fit it (as for compile's calibration)
        module = isinstance(model, torch.nn.Module)
        self.other = OtherShapes(model, captured.base, *captured.fresh()) if module else None
        self._held: dict[int, CalibrationGraph] = {}  # the graphs the eval batches need (OtherShapes may evict)

    def calls(self, batches, what: str) -> list[Call]:
        """Each batch as a call in the captured structure, its capture made now: a batch that can never run
        (an unknown or misspelt key, a wrong count, rank or dtype of inputs, sizes torch cannot capture) is
        a CalibrationError naming it, as in compile's calibration."""
        out = []
        for index, batch in enumerate(batches):
            call = arrange(batch, f"{what} batch {index}", self.captured.signature)
            self.graph(call, f"{what} batch {index}")
            out.append(call)
        return out

    def other_sizes_used(self) -> bool:
        """Whether a batch seen so far runs on another capture than the example-shape one."""
        return bool(self._held)

    def graph(self, call: Call, where: str = "this call") -> CalibrationGraph | None:
        """The capture that runs ``call``: None for the example-shape one."""
        if fit(call, self.user_nodes, where, resizable=self.other is not None) is not None:
            return None
        tensors = call.tensors()
        for graph in self._held.values():
            if graph.fits(tensors):
                return graph
        graph = self.other.graph_for_batch(call, where, self.user_nodes)
        self._held[id(graph)] = graph
        return graph

    def program(self, build: Callable[[CalibrationGraph | None], torch.nn.Module]) -> torch.nn.Module:
        """One trial's program for every size: ``build(graph)`` makes it on a capture (None: the example's)."""
        return _Sized(self, build)


def carried_plan(graph: CalibrationGraph, requests: PrecisionPlan, int8_ranges: Mapping | None) -> PrecisionPlan:
    """The plan of ``requests`` (by the example capture's node names) on another capture: the same layers
    requested by their names there, the rest filled in by the planner as compile fills it in."""
    own = {primary: name for name, primary in graph.names.items()}
    missing = [name for name in requests if name not in own]
    if missing:
        raise CalibrationError(
            f"the model's graph at these batch sizes has no counterpart of layer(s) {', '.join(missing[:3])}, so the "
            "search cannot measure its plan on them; give eval batches of the example inputs' sizes."
        )
    carried = PrecisionPlan({own[name]: _renamed(requests[name], own) for name in requests},
                            policy=requests.policy)
    ranges = {own[name]: r for name, r in (int8_ranges or {}).items() if name in own}
    return planner.build_plan(graph.captured.info, PlanningOptions(plan=carried), int8_ranges=ranges)


def _renamed(decision, own: Mapping[str, str]):
    """An int8 request's boundary values named as on the other capture (a float request as it is)."""
    spec = decision.int8
    if spec is None:
        return decision
    missing = [name for name, _ in spec.inputs if name not in own]
    if missing:
        raise CalibrationError(
            f"the model's graph at these batch sizes has no counterpart of value(s) {', '.join(missing[:3])} that an "
            "int8 layer quantizes, so the search cannot measure its plan on them; give eval batches of the example "
            "inputs' sizes."
        )
    inputs = tuple((own[name], r) for name, r in spec.inputs)
    grids = tuple((own[name], g) for name, g in spec.grids)
    smoothing = tuple((own[name], s) for name, s in spec.smoothing)
    return dataclasses.replace(decision, int8=dataclasses.replace(spec, inputs=inputs, grids=grids,
                                                                  smoothing=smoothing))


class _Sized(torch.nn.Module):
    """Runs each call on the program built for its sizes (built when first needed)."""

    def __init__(self, sizes: BatchSizes, build: Callable):
        super().__init__()
        self._sizes = sizes
        self._build = build
        self._programs: dict[int | None, torch.nn.Module] = {}

    def forward(self, *args, **kwargs):
        call = arrange(Call(args, kwargs), "this call", self._sizes.captured.signature)  # keywords as forward's
        graph = self._sizes.graph(call)
        key = None if graph is None else id(graph)
        program = self._programs.get(key)
        if program is None:
            program = self._programs[key] = self._build(graph)
        return program(*call.args, **call.kwargs)
