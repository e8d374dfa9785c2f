"""A weak hold on the program as captured, for ``mixprec.debug``'s fp32 reference.

The captured ExportedProgram reads the user's own fp32 parameters (shared, not copied). If
the compiled program held it strongly, those fp32 weights would stay alive as long as the
program does — a user who compiles to bf16 and drops the fp32 model would keep paying for
both. So the compiled program keeps the captured graph and signature, but only weak
references to the parameter and buffer tensors: while the user's model lives, the captured
program can be rebuilt exactly; once its tensors are gone, :meth:`get` returns None and the
debugger falls back to recomputing the mixed program in fp32 from its own weights.
"""

from __future__ import annotations

import weakref

from torch.export import ExportedProgram


class WeakCapture:
    def __init__(self, ep: ExportedProgram):
        self._parts = dict(
            root=ep.graph_module,
            graph=ep.graph,
            graph_signature=ep.graph_signature,
            range_constraints=ep.range_constraints,
            module_call_graph=ep.module_call_graph,
            example_inputs=None,
            constants=ep.constants,
            verifiers=ep.verifiers,
        )
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
        return ExportedProgram(state_dict=state, **self._parts)
