"""Eval batches of any batch and sequence size: which program runs each, for every trial.

A captured program has its sizes baked in (``view(x, [2, 8, 2, 32])``), but eval data comes in the shapes a loader
yields: another batch size, a ragged last batch, an HF collator padding each batch to its own longest sequence; the
search must measure the plan on exactly those batches, as running the model (and the plan's program) on them does.

How: the search plans on one capture, at the example inputs' shapes (so its plans name nodes as
``compile(model, inputs, plan=...)`` does), and a batch that capture does not take runs on a capture that does —
``calibrate/batch_graphs.OtherShapes``, the captures compile's calibration makes: one with ``Dim.AUTO`` dimensions,
and an exact-shape capture for a batch it does not take (a size-1 dimension torch specialises). A trial's plan is
carried onto such a capture through their node alignment (the lowered layers requested by name, the planner filling
in the rest), so every batch runs the same layers in the same dtypes at its own sizes; each such program is realised
when a batch first needs it, once per trial.

Batches that give forward parameters the example inputs left to their defaults (a collator's ``attention_mask``
beside ``(input_ids,)``) run on captures of the model called with those keywords too (``BatchSizes.keyed``), so the
metric, the fp32 reference and the search's calibration (``BatchSizes.route``) are those of the user's calls; a key
forward does not take is refused with the name meant (``CallSignature``). On Ray every capture travels to the
workers (``distributed.py``).

Why not the alternatives: padding every batch to one shape changes the values (attention over pad positions,
statistics over padded rows); a dynamic capture as *the* capture renames nodes (size nodes shift fx's numbering), so
its plans would not be compile's; one exact-shape capture per distinct shape costs a capture per batch for
collator-padded data and a realisation per batch per trial, where the dynamic capture serves them all.
"""

from __future__ import annotations

import dataclasses
import inspect
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
        self._keyed: dict[tuple, CalibrationGraph] = {}  # (extra keys, shapes) -> a capture of that call

    def calls(self, batches, what: str) -> list[Call]:
        """Each batch as a call in the captured structure (or a keyed capture's), its capture made now: a batch
        that can never run (an unknown or misspelt key, a wrong count, rank or dtype of inputs, sizes torch cannot
        capture) is a CalibrationError naming it, as in compile's calibration."""
        out = []
        for index, batch in enumerate(batches):
            call = self.arranged(batch, f"{what} batch {index}")
            self.graph(call, f"{what} batch {index}")
            out.append(call)
        return out

    def extra_keys(self, call) -> tuple[str, ...]:
        """The keywords of ``call`` that name forward parameters the capture took at their defaults (module
        docstring); () when the model cannot be captured again or its forward is unknown."""
        signature = self.captured.signature
        if not isinstance(call, Call) or self.other is None or signature is None or signature.forward is None:
            return ()
        parameters = signature.forward.parameters
        plain = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        captured = set(signature.parameter_names())
        return tuple(sorted(
            name for name, value in call.kwargs.items()
            if name not in captured and name in parameters and parameters[name].kind in plain
            and not signature._is_default(name, value)
        ))

    def arranged(self, batch, where: str) -> Call:
        """``batch`` as a call in the structure of the capture that runs it."""
        extra = self.extra_keys(batch)
        if not extra:
            return arrange(batch, where, self.captured.signature)
        rest = Call(batch.args, {k: v for k, v in batch.kwargs.items() if k not in extra})
        rest = arrange(rest, where, self.captured.signature)  # a misspelt key refused here
        call = Call(rest.args, {**rest.kwargs, **{name: batch.kwargs[name] for name in extra}})
        return arrange(call, where, self.keyed(call, extra, where).captured.signature)

    def route(self, batch, where: str) -> tuple[Call, CalibrationGraph | None]:
        """A calibration batch as its call and the capture that runs it (None: the example-shape one), for
        ``calibrate.statistics.collect``, which takes this object as its ``other_shapes``."""
        call = self.arranged(batch, where)
        return call, self.graph(call, where)

    @property
    def captures(self) -> int:
        """How many times the model was captured again (for other sizes or keywords)."""
        return (self.other.captures if self.other is not None else 0) + sum(1 for g in self._keyed.values() if g)

    def keyed(self, call: Call, extra: tuple[str, ...], where: str) -> CalibrationGraph:
        """The capture of the model called as ``call`` (with the ``extra`` keywords), made on first use: one with
        every input dimension ``Dim.AUTO`` for all the sizes torch lets it take (a collator pads each batch to its
        own length), else one at the call's exact shapes (as ``batch_graphs.OtherShapes`` does)."""
        tensors = call.tensors()
        dynamic = self._keyed.get((extra, None))
        if dynamic is None:
            dynamic = self._keyed[(extra, None)] = self._capture(call, extra, where, dynamic=True) or False
        if dynamic and dynamic.fits(tensors):
            return dynamic
        key = (extra, tuple((tuple(t.shape), t.dtype) for t in tensors))
        graph = self._keyed.get(key)
        if graph is None:
            graph = self._keyed[key] = self._capture(call, extra, where, dynamic=False)
        return graph

    def _capture(self, call: Call, extra: tuple[str, ...], where: str, *, dynamic: bool) -> CalibrationGraph | None:
        from torch.export import Dim, ShapesCollection

        from ..calibrate.batch_graphs import align
        from ..ir.export import export

        shapes = None
        if dynamic:
            shapes = ShapesCollection()
            for tensor in call.tensors():
                if tensor.dim() > 0:  # sizes 0 and 1 torch would specialise anyway (and warn): left static
                    shapes[tensor] = {axis: Dim.AUTO for axis in range(tensor.dim()) if tensor.shape[axis] > 1}
        try:
            ep = export(self.captured.model, tuple(call.args), dict(call.kwargs), dynamic_shapes=shapes)
        except Exception as e:  # torch could not capture the model called so
            if dynamic:
                return None
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise CalibrationError(
                f"{where} gives {', '.join(extra)}, which the example inputs left to forward's defaults, and the "
                f"model cannot be captured called with them ({reason}); leave them out of the batches or add "
                "them to the example inputs."
            ) from e
        captured = CapturedModel(ep)
        return CalibrationGraph(captured, align(captured.base, self.captured.base))

    def other_graphs(self) -> list[tuple[tuple[str, ...], CalibrationGraph]]:
        """Every capture a batch seen so far runs on but the example-shape one, each once, with the keywords that
        pick it: () for a capture of other sizes, in the order :meth:`graph` tries them, else a keyed capture's extra
        keywords (what a Ray worker rebuilds: ``worker.OtherCaptures`` routes each call as :meth:`graph` does)."""
        return [((), graph) for graph in self._held.values()] + [
            (key[0], graph) for key, graph in self._keyed.items() if graph
        ]

    def graph(self, call: Call, where: str = "this call") -> CalibrationGraph | None:
        """The capture that runs ``call``: None for the example-shape one."""
        extra = self.extra_keys(call)
        if extra:
            return self.keyed(call, extra, where)
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
        call = self._sizes.arranged(Call(args, kwargs), "this call")  # keywords as forward's
        graph = self._sizes.graph(call)
        key = None if graph is None else id(graph)
        program = self._programs.get(key)
        if program is None:
            program = self._programs[key] = self._build(graph)
        return program(*call.args, **call.kwargs)
