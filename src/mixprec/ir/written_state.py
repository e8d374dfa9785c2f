"""The stored tensors a program writes when it runs (a step counter, a static KV cache).

``torch.export`` (training IR) keeps in-place ops such as ``aten.add_`` on a buffer, or
``index_copy_`` into a view of a cache, in the graph, and the captured program reads the
user's own tensors. Every run of such a graph — calibration, the fp32 reference, the
compiled program's run for the report, weak typing's timings, the debugger — would then
write into the user's model (a counter buffer ended at 2 after ``compile``), and each run
would start from a different state (so an all-fp32 program reported a rel-L2 error of
0.46 against its own reference).

So: every :class:`~mixprec.ir.work_program.WorkProgram` gives the tensors its graph writes their
own copy (:func:`detach_written`), which nothing of the user's shares; the values as
captured are kept, and :meth:`WrittenState.restore` puts them back before each run on
example inputs. The compiled program owns its copy: its calls update that copy, never
the user's model.

Which tensors are written is read from the ops' schemas (an argument whose alias
annotation is a write, ``Tensor(a!)``), followed back through view ops (whose outputs
alias their inputs) to the placeholder they view.
"""

from __future__ import annotations

import contextlib

import torch
from torch.export.graph_signature import InputKind

_STORED = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


def written_placeholders(graph: torch.fx.Graph) -> set[str]:
    """Names of the placeholders whose tensors some node writes in place (directly or through a view)."""
    written: set[str] = set()
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        schema = getattr(node.target, "_schema", None)
        if schema is None:
            continue
        for index, argument in enumerate(schema.arguments):
            alias = argument.alias_info
            if alias is None or not alias.is_write:
                continue
            value = node.args[index] if index < len(node.args) else node.kwargs.get(argument.name)
            for source in _viewed(value):
                written.add(source.name)
    return written


def _viewed(value) -> list[torch.fx.Node]:
    """The placeholders a value (a node, or a list of nodes) is, or is a view of."""
    out = []
    stack = list(value) if isinstance(value, (list, tuple)) else [value]
    seen = set()
    while stack:
        node = stack.pop()
        if not isinstance(node, torch.fx.Node) or node in seen:
            continue
        seen.add(node)
        if node.op == "placeholder":
            out.append(node)
            continue
        if node.op == "call_function" and _returns_alias(node.target) and node.args:
            stack.append(node.args[0])
        elif node.op == "call_function" and getattr(node.target, "__name__", "") == "getitem" and node.args:
            stack.append(node.args[0])
    return out


def _returns_alias(target) -> bool:
    schema = getattr(target, "_schema", None)
    if schema is None or not schema.returns:
        return False
    return any(r.alias_info is not None for r in schema.returns)


class WrittenState:
    """The written stored tensors of one program (by signature target) and their values as captured."""

    def __init__(self, captured: dict[str, torch.Tensor]):
        self._captured = captured  # target -> clone of the value when captured (never written)

    @property
    def targets(self) -> frozenset[str]:
        return frozenset(self._captured)

    def __bool__(self) -> bool:
        return bool(self._captured)

    def restore(self, *tables: dict) -> None:
        """Copy the captured values back into the tensors ``tables`` (state_dict, constants) hold now."""
        if not self._captured:
            return
        with torch.no_grad():
            for target, value in self._captured.items():
                for table in tables:
                    tensor = table.get(target)
                    if isinstance(tensor, torch.Tensor) and tensor.shape == value.shape:
                        tensor.copy_(value)


def detach_written(graph: torch.fx.Graph, input_specs, state_dict: dict, constants: dict) -> WrittenState:
    """Give every stored tensor the graph writes a private copy (in ``state_dict``/``constants``, which
    are the caller's own dicts) and return the captured values."""
    names = written_placeholders(graph)
    captured: dict[str, torch.Tensor] = {}
    for spec in input_specs:
        if spec.kind not in _STORED or getattr(spec.arg, "name", None) not in names:
            continue
        table = state_dict if spec.target in state_dict else constants
        tensor = table.get(spec.target)
        if not isinstance(tensor, torch.Tensor) or spec.target in captured:
            continue
        with torch.no_grad():
            table[spec.target] = _clone(tensor)
            captured[spec.target] = _clone(tensor)
    return WrittenState(captured)


def _clone(tensor: torch.Tensor) -> torch.Tensor:
    copy = tensor.detach().clone()
    if isinstance(tensor, torch.nn.Parameter):
        return torch.nn.Parameter(copy, requires_grad=tensor.requires_grad)
    return copy


@contextlib.contextmanager
def preserved(tensors):
    """Run a block and put ``tensors`` back to their values before it (for runs on a program's own state)."""
    tensors = [t for t in tensors if isinstance(t, torch.Tensor)]
    with torch.no_grad():
        saved = [t.detach().clone() for t in tensors]
    try:
        yield
    finally:
        with torch.no_grad():
            for t, value in zip(tensors, saved):
                t.copy_(value)


def written_tensors(exported_program) -> list[torch.Tensor]:
    """The tensors of an ExportedProgram that its graph writes (parameters, buffers, constants)."""
    names = written_placeholders(exported_program.graph)
    out = []
    for spec in exported_program.graph_signature.input_specs:
        if spec.kind in _STORED and getattr(spec.arg, "name", None) in names:
            table = exported_program.state_dict if spec.target in exported_program.state_dict else exported_program.constants
            tensor = table.get(spec.target)
            if isinstance(tensor, torch.Tensor):
                out.append(tensor)
    return out
