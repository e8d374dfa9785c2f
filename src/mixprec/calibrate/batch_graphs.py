"""Graphs for batches whose sizes the captured graph does not take.

A captured graph has its sizes baked in (``view(x, [8, 12, 4, 8])``), so it cannot run a batch of 3,
a ragged last batch or a batch padded to another sequence length. Users have calibration data in
exactly those shapes (a ``DataLoader`` with its own batch size, an HF collator padding each batch to
its longest sequence), and calibration only needs statistics, not the program: so mixprec captures
the model once more for those batches and keeps the program as compiled.

* First, one capture of the model with every input dimension ``Dim.AUTO`` (torch keeps static what
  must be, e.g. a hidden size tied to a weight): one graph for all batch and sequence sizes it allows.
* A batch that graph does not take either (a size-1 dimension torch specialises, a size outside its
  range): a capture at that batch's exact shapes, kept for later batches of the same shapes (a few at most).

Each graph is normalised like the captured one (autocast regions and markers made explicit), so it
computes the same values. Its nodes are mapped onto the captured graph's nodes by aligning the two
sequences of compute nodes — (module path, op) in graph order, with ``difflib`` — because node names
differ between captures (a dynamic graph has extra size nodes, which shifts fx's numbering). A node left
unmatched keeps the statistics of the batches the captured graph ran.

Only an ``nn.Module`` can be captured again; for an ExportedProgram, batches must fit it. The search uses
the same captures for its eval batches (``searching/shapes.py``): each graph keeps its ``CapturedModel``,
on which a trial's plan is realised for the batches of those sizes.
"""

from __future__ import annotations

import collections
import difflib
import logging
import types
import weakref

import torch
import torch.utils._pytree as pytree
from torch.export import Dim, ShapesCollection

from ..errors import CalibrationError
from ..ir.captured import CapturedModel
from ..ir.graph_info import module_of
from ..ir.input_check import input_specs_of, size_misfit
from ..ir.work_program import WorkProgram
from .batches import Call, mismatch, shape_text

log = logging.getLogger(__name__)

_MAX_STATIC = 4  # exact-shape captures kept (a dataloader has few distinct shapes that the dynamic one misses)


class CalibrationGraph:
    """A normalised capture for other batch shapes, and its node names mapped to the captured graph's."""

    def __init__(self, captured: CapturedModel, names: dict[str, str]):
        self.captured = captured  # the search realises its trial plans on it (searching/shapes.py)
        self.work = captured.base
        self.names = names  # this graph's node name -> captured graph's node name
        work = self.work
        view = types.SimpleNamespace(
            graph=work.graph,
            graph_signature=types.SimpleNamespace(input_specs=work.input_specs),
            range_constraints=work.range_constraints,
        )
        self.specs = input_specs_of(view)

    def fits(self, tensors: list[torch.Tensor]) -> bool:
        if len(tensors) != len(self.specs):
            return False
        return all(
            t.dim() == s.rank and t.dtype == s.dtype and size_misfit(t.shape, s.dims) is None
            for t, s in zip(tensors, self.specs)
        )


class OtherShapes:
    """Makes (and keeps) the graphs for other batch shapes of one captured model."""

    def __init__(self, model: torch.nn.Module, primary: WorkProgram, example_args: tuple, example_kwargs: dict):
        self._model = weakref.ref(model)  # a cached search study holds this: it must not keep the model alive
        self._primary = primary
        self._example = (example_args, example_kwargs)
        self._dynamic: CalibrationGraph | None | bool = None  # None: not tried; False: torch could not
        self._static: collections.OrderedDict = collections.OrderedDict()
        self.captures = 0  # how many times the model was captured again (the report says so)

    def graph_for(self, args: tuple, kwargs: dict, tensors: list[torch.Tensor]) -> CalibrationGraph:
        if self._dynamic is None:
            self._dynamic = self._capture(*self._example, dynamic=True) or False
        if self._dynamic and self._dynamic.fits(tensors):
            return self._dynamic
        key = tuple((tuple(t.shape), t.dtype) for t in tensors)
        graph = self._static.get(key)
        if graph is None:
            graph = self._capture(args, kwargs, dynamic=False)
            if graph is None:
                raise RuntimeError("torch.export could not capture the model for this batch's shapes")
            self._static[key] = graph
            if len(self._static) > _MAX_STATIC:
                self._static.popitem(last=False)
        else:
            self._static.move_to_end(key)
        return graph

    def graph_for_batch(
        self, call: Call, where: str, user_nodes: list[torch.fx.Node], *, error: type[Exception] = CalibrationError
    ) -> CalibrationGraph:
        """:meth:`graph_for` a batch (``where`` names it) that fits the captured inputs but for its sizes;
        ``error`` naming the input and torch's reason when the model cannot be captured for them."""
        tensors = call.tensors()
        try:
            return self.graph_for(call.args, call.kwargs, tensors)
        except Exception as e:  # torch could not capture the model for these sizes
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            shape = ""
            for position, (tensor, node) in enumerate(zip(tensors, user_nodes)):
                expected = node.meta.get("val")
                problem = mismatch(tensor, expected) if isinstance(expected, torch.Tensor) else None
                if problem:
                    where = f"{where}, input {position} ('{node.name}'): {problem}"
                    shape = f" The model was captured for shape {shape_text(expected)}."
                    break
            raise error(
                f"{where}; the model does not run at these sizes (torch.export could not capture it for them: "
                f"{reason}).{shape} Make the batches like the example inputs (batch and sequence sizes may differ; "
                "sizes the model's weights fix may not)."
            ) from e

    def _capture(self, args, kwargs, *, dynamic: bool) -> CalibrationGraph | None:
        from ..ir.export import export

        model = self._model()
        if model is None:
            raise RuntimeError("the model was freed; it cannot be captured for other batch sizes")
        shapes = None
        if dynamic:
            shapes = ShapesCollection()
            for leaf in pytree.tree_leaves((args, kwargs)):
                if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
                    # sizes 0 and 1 torch would specialise anyway (and warn): leave them static
                    shapes[leaf] = {axis: Dim.AUTO for axis in range(leaf.dim()) if leaf.shape[axis] > 1}
        try:
            ep = export(model, tuple(args), dict(kwargs), dynamic_shapes=shapes)
        except Exception as e:  # torch could not capture these shapes: the caller decides what to do
            if not dynamic:
                raise
            log.info("no dynamic calibration graph (%s); capturing per batch shape", str(e).splitlines()[0] if str(e) else e)
            return None
        self.captures += 1
        captured = CapturedModel(ep)  # normalised and analysed as the primary capture was
        return CalibrationGraph(captured, align(captured.base, self._primary))


def align(work: WorkProgram, primary: WorkProgram) -> dict[str, str]:
    """Node name in ``work`` -> name of the node doing the same thing in ``primary``."""
    a_nodes, a_tokens = _tokens(work)
    b_nodes, b_tokens = _tokens(primary)
    matcher = difflib.SequenceMatcher(None, a_tokens, b_tokens, autojunk=False)
    names = {}
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            names[a_nodes[block.a + k].name] = b_nodes[block.b + k].name
    return names


def _tokens(work: WorkProgram):
    nodes, tokens = [], []
    inputs = {node: position for position, node in enumerate(work.user_input_nodes())}
    for node in work.graph.nodes:
        if node.op == "placeholder":
            token = ("input", inputs[node]) if node in inputs else None
        elif node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) and not _is_size(node):
            token = (module_of(node)[0], str(node.target))
        else:
            token = None
        if token is not None:
            nodes.append(node)
            tokens.append(token)
    return nodes, tokens


def _is_size(node: torch.fx.Node) -> bool:
    val = node.meta.get("val")
    return not isinstance(val, torch.Tensor) and not (
        isinstance(val, (tuple, list)) and any(isinstance(v, torch.Tensor) for v in val)
    )
