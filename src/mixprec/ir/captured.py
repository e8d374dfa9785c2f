"""The captured model: captured (``export.py``), normalised and analysed once, and a weak hold on its capture.

:class:`CapturedModel` is what every tool built on mixprec starts from — compile, the
configurator, the search and the debugger's fp32 reference. It runs capture ->
``WorkProgram.from_exported`` -> ``normalize`` -> ``analyze`` once and keeps what they give: the
ExportedProgram as captured, the normalised base WorkProgram (never rewritten: a plan is realised
on a copy, ``rewrite.pipeline.realise``; the fp32 reference likewise, ``rewrite.pipeline.reference``),
its GraphInfo, CallSignature and output dtypes, and the example inputs with fresh copies of them
(a model may write into its inputs). Before, each tool wrote those four steps itself, and each
built the fp32 reference its own way.

ir/ is an early stage of the data flow: this module knows nothing of calibration, plans or
rewriting (dependencies point one way, DESIGN.md); later stages take the object as an argument.

:class:`WeakCapture`: the captured ExportedProgram reads the user's own fp32 parameters (shared,
not copied). If the compiled program held it strongly, those fp32 weights would stay alive as
long as the program does — a user who compiles to bf16 and drops the fp32 model would keep paying
for both. So the compiled program keeps the captured graph and signature, but only weak
references to the parameter and buffer tensors: while the user's model lives, the captured
program can be rebuilt exactly; once its tensors are gone, :meth:`WeakCapture.get` returns None
and the debugger falls back to recomputing the mixed program in fp32 from its own weights.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram

from .call_signature import CallSignature, flat_user_inputs
from .export import as_input_kwargs, as_input_tuple, capture
from .graph_info import GraphInfo, analyze
from .normalize import normalize
from .work_program import WorkProgram


class CapturedModel:
    """A model captured, normalised and analysed once, with its example inputs.

    ``model``: an nn.Module (captured in eval mode) or an ExportedProgram (taken as it is).
    ``phase``: optional ``phase(name)`` context manager (compile times "capture" and "normalize").
    Nothing the user passed is mutated: the base WorkProgram holds private copies of the tensors
    the graph writes (ir/written_state.py), and the example inputs are copied for every run. The
    nn.Module itself is held weakly (its parameters are read by the captured program anyway).
    """

    def __init__(
        self, model, args=(), kwargs: dict | None = None, *, dynamic_shapes=None,
        phase: Callable[[str], contextlib.AbstractContextManager] | None = None,
    ):
        phase = phase or (lambda name: contextlib.nullcontext())
        # a weak hold: a search caches this object (searching/cache.py) and must not keep the model alive
        self._module = weakref.ref(model) if isinstance(model, torch.nn.Module) else None
        self.args: tuple = as_input_tuple(args)
        self.kwargs: dict = as_input_kwargs(kwargs)
        with phase("capture"):
            self.exported: ExportedProgram = capture(
                model, self.args, dynamic_shapes=dynamic_shapes, kwargs=self.kwargs
            )
            self.signature: CallSignature | None = CallSignature.of(self.exported, model)
        with phase("normalize"):
            # the tensors the graph writes (a counter, a KV cache) get private copies here: nothing below
            # writes the user's model, and reset_state() starts each run from the captured state
            base = WorkProgram.from_exported(self.exported)
            normalize(base)
            self.info: GraphInfo = analyze(base.graph)
        self.base: WorkProgram = base  # normalised; realise plans on base.copy(), never on it
        self.output_dtypes: tuple = base.user_output_dtypes()  # by position; None for a non-tensor output

    @property
    def model(self):
        """The nn.Module captured (None once the user freed it), or the ExportedProgram given."""
        return self._module() if self._module is not None else self.exported

    @property
    def computes_in_fp32(self) -> bool:
        """True when the capture is its own fp32 reference (no layer or cast in another dtype)."""
        return all(node.precision in (torch.float32, torch.float64) for node in self.info.values())

    def fresh(self) -> tuple[tuple, dict]:
        """(args, kwargs): a copy of the example inputs' tensors (a model may write into its inputs)."""
        return pytree.tree_map(lambda v: v.clone() if isinstance(v, torch.Tensor) else v, (self.args, self.kwargs))

    def flat_inputs(self, *, fresh: bool = True) -> list:
        """The example inputs as the captured program's placeholders take them (copies unless ``fresh=False``)."""
        args, kwargs = self.fresh() if fresh else (self.args, self.kwargs)
        return flat_user_inputs(self.exported, args, kwargs)

    def reset_state(self) -> None:
        """Put the tensors the graph writes back to their captured values (every run starts from them)."""
        self.base.reset_state()


# ExportedProgram's constructor arguments that are attributes of the same name
_SHARED_PARTS = ("graph_signature", "state_dict", "range_constraints", "module_call_graph", "constants", "verifiers")


def program_parts(ep: ExportedProgram, **replaced) -> dict:
    """The arguments that rebuild ``ep`` as ``ExportedProgram(**parts)`` (without its sample inputs),
    with ``replaced`` ones swapped in: the weak hold below and ``mixprec.save`` rebuild programs so."""
    parts = {name: getattr(ep, name) for name in _SHARED_PARTS}
    return {**parts, "root": ep.graph_module, "graph": ep.graph, "example_inputs": None, **replaced}


class WeakCapture:
    def __init__(self, ep: ExportedProgram):
        self._parts = program_parts(ep, state_dict=None)  # the state only weakly, below
        self._state = {}
        for name, tensor in ep.state_dict.items():
            try:
                self._state[name] = weakref.ref(tensor)
            except TypeError:  # a tensor type without weak references: hold the program strongly instead
                self._state = None
                self._strong = ep
                return
        self._strong = None

    def get(self) -> ExportedProgram | None:
        """The captured program, or None once the user's tensors it read have been freed."""
        if self._strong is not None:
            return self._strong
        state = {name: ref() for name, ref in self._state.items()}
        if any(t is None for t in state.values()):
            return None
        return ExportedProgram(**{**self._parts, "state_dict": state})
