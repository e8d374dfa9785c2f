"""WorkProgram: a private, mutable copy of an ExportedProgram that passes rewrite.

An ExportedProgram is a graph plus a signature (which placeholder is which
parameter/buffer/constant/user input) plus the tensors behind the signature. Passes
need all three: inserting a stored bf16 copy of a weight touches the graph, the
signature and the state. WorkProgram keeps them together, copies them away from the
user's program on the way in (the user's ExportedProgram is never mutated) and turns
them back into an ExportedProgram on the way out.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import (
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputKind,
    OutputSpec,
    TensorArgument,
)

from . import unlift
from .written_state import WrittenState, detach_written

STORED_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


@dataclasses.dataclass
class WorkProgram:
    root: torch.nn.Module  # holds the submodules the graph's get_attr nodes name (the captured module)
    fx_graph: torch.fx.Graph
    input_specs: list[InputSpec]
    output_specs: list[OutputSpec]
    state_dict: dict[str, torch.Tensor]
    constants: dict[str, Any]
    range_constraints: dict
    module_call_graph: list
    example_inputs: Any
    verifiers: list
    # the stored tensors the graph writes in place: private copies, and their values as captured
    written: WrittenState = dataclasses.field(default_factory=lambda: WrittenState({}), repr=False, compare=False)
    _graph_module: torch.fx.GraphModule | None = dataclasses.field(default=None, repr=False, compare=False)
    _spec_index: dict | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def graph(self) -> torch.fx.Graph:
        return self.fx_graph

    @property
    def graph_module(self) -> torch.fx.GraphModule:
        """A GraphModule over the graph, made when first needed (making one generates and compiles its
        Python code: the copies passes work on do not pay for that)."""
        if self._graph_module is None or self._graph_module.graph is not self.fx_graph:
            self._graph_module = torch.fx.GraphModule(self.root, self.fx_graph)
        return self._graph_module

    # ---- conversion ---------------------------------------------------------------------------
    @classmethod
    def from_exported(cls, ep: ExportedProgram) -> "WorkProgram":
        """Copy the graph (nodes and meta dicts, not tensors) so that passes never touch ``ep``."""
        sig = ep.graph_signature
        work = cls(
            root=ep.graph_module,
            fx_graph=_copy_graph(ep.graph),
            input_specs=[_spec_copy(s) for s in sig.input_specs],
            output_specs=[_spec_copy(s) for s in sig.output_specs],
            state_dict=dict(ep.state_dict),
            constants=dict(ep.constants),
            range_constraints=dict(ep.range_constraints),
            module_call_graph=list(ep.module_call_graph),
            example_inputs=ep.example_inputs,
            verifiers=list(ep.verifiers),
        )
        work.sync_input_specs()  # fx renames placeholders that shadow builtins ("input" -> "input_1")
        work.sync_output_specs()
        # a graph that writes its buffers (a counter, a KV cache) must never write the user's tensors
        work.written = detach_written(work.fx_graph, work.input_specs, work.state_dict, work.constants)
        return work

    def reset_state(self) -> None:
        """Put the tensors the graph writes back to their captured values (before a run on example inputs:
        every run starts from the model's state)."""
        self.written.restore(self.state_dict, self.constants)

    def copy(self) -> "WorkProgram":
        """An independent copy: passes on it leave this one as it is (tensors are shared, never mutated)."""
        return dataclasses.replace(
            self,
            fx_graph=_copy_graph(self.fx_graph),
            _graph_module=None,
            _spec_index=None,
            input_specs=[_spec_copy(s) for s in self.input_specs],
            output_specs=[_spec_copy(s) for s in self.output_specs],
            state_dict=dict(self.state_dict),
            constants=dict(self.constants),
            module_call_graph=list(self.module_call_graph),
        )

    def stored_bytes(self) -> int:
        """Bytes of parameters, buffers and constant tensors (a tensor shared under two names counted once)."""
        return stored_bytes(self.state_dict, self.constants)

    def drop_dead_code(self) -> bool:
        """Erase the nodes no output needs, and the stored tensors then unread; returns whether any went."""
        changed = self.fx_graph.eliminate_dead_code(is_impure_node=_is_impure)
        return self._drop_unused_stored_inputs() or changed

    def to_exported(self) -> ExportedProgram:
        self.drop_dead_code()
        # ExportedProgram makes the GraphModule (copying only the submodules the graph uses): one code
        # generation for the graph, where building one here first and passing it made two
        return ExportedProgram(
            root=self.root,
            graph=self.fx_graph,
            graph_signature=ExportGraphSignature(self.input_specs, self.output_specs),
            state_dict=self.state_dict,
            range_constraints=self.range_constraints,
            module_call_graph=self.module_call_graph,
            example_inputs=self.example_inputs,
            constants=self.constants,
            verifiers=self.verifiers,
        )

    def runnable(self) -> torch.fx.GraphModule:
        """The module that runs this program (``ir/unlift.py``: one code generation, no ExportedProgram built)."""
        self.drop_dead_code()
        signature = self.module_call_graph[0].signature if self.module_call_graph else None
        module = unlift.runnable(self.root, self.fx_graph, self.input_specs, self.output_specs, self.state_dict,
                                 self.constants, signature)
        return module if module is not None else self.to_exported().module()

    def rebuild_graph(self, names: dict[torch.fx.Node, str]) -> None:
        """Copy the graph into a fresh one, giving the nodes in ``names`` those names.

        torch.fx never frees a name once used, so a node can only take the name of an erased node
        in a new graph. The names must not be held by other live nodes.
        """
        graph = torch.fx.Graph()
        graph._codegen = self.graph._codegen
        env: dict[torch.fx.Node, torch.fx.Node] = {}
        for node in self.graph.nodes:
            if node in names:
                node.name = names[node]
            env[node] = graph.node_copy(node, lambda n: env[n])
            env[node].meta = node.meta
        self.fx_graph = graph
        self.sync_input_specs()
        self.sync_output_specs()

    def _drop_unused_stored_inputs(self) -> bool:
        """Stored tensors nothing reads (export keeps one placeholder per name of a tied weight, and a
        weight whose consumers all read a converted copy) are dropped: the program should not hold them."""
        mutated = {s.target for s in self.output_specs if s.kind in (OutputKind.BUFFER_MUTATION, OutputKind.PARAMETER_MUTATION)}
        dropped = []
        for node in self.placeholders():
            spec = self.input_spec_of(node)
            if spec is None or spec.kind not in STORED_KINDS or node.users or spec.target in mutated:
                continue
            self.graph.erase_node(node)
            dropped.append(spec)
        if not dropped:
            return False
        gone = {id(s) for s in dropped}
        self.input_specs[:] = [s for s in self.input_specs if id(s) not in gone]
        self._spec_index = None
        kept = {s.target for s in self.input_specs}
        for spec in dropped:
            if spec.target not in kept:
                (self.state_dict if spec.target in self.state_dict else self.constants).pop(spec.target, None)
        return True

    # ---- signature access ---------------------------------------------------------------------
    def placeholders(self) -> list[torch.fx.Node]:
        return [n for n in self.graph.nodes if n.op == "placeholder"]

    def input_spec_of(self, node: torch.fx.Node) -> InputSpec | None:
        """The signature entry of a placeholder (an index: big models have thousands of them)."""
        spec = self._spec_index.get(node.name) if self._spec_index is not None else None
        if spec is None or spec.arg.name != node.name:  # not indexed yet, or stale: index again
            self._spec_index = {s.arg.name: s for s in self.input_specs if isinstance(s.arg, TensorArgument)}
            spec = self._spec_index.get(node.name)
        return spec

    def user_input_nodes(self) -> list[torch.fx.Node]:
        kinds = {spec.arg.name: spec.kind for spec in self.input_specs if hasattr(spec.arg, "name")}
        return [n for n in self.placeholders() if kinds.get(n.name) == InputKind.USER_INPUT]

    def stored_tensor(self, spec: InputSpec) -> torch.Tensor:
        """The tensor behind a parameter/buffer/constant placeholder."""
        if spec.kind == InputKind.PARAMETER or (spec.kind == InputKind.BUFFER and spec.persistent):
            return self.state_dict[spec.target]
        return self.constants[spec.target]

    def set_stored_tensor(self, spec: InputSpec, value: torch.Tensor) -> None:
        if spec.kind == InputKind.PARAMETER or (spec.kind == InputKind.BUFFER and spec.persistent):
            self.state_dict[spec.target] = value
        else:
            self.constants[spec.target] = value

    def add_stored_input(self, like: InputSpec, target: str, value: torch.Tensor, name: str) -> torch.fx.Node:
        """Add a placeholder holding a new stored tensor of the same kind as ``like``.

        Placeholders must stay in signature order (stored inputs before user inputs), so the
        new one is inserted right after ``like``'s placeholder.
        """
        anchor = next(n for n in self.placeholders() if n.name == like.arg.name)
        with self.graph.inserting_after(anchor):
            node = self.graph.placeholder(name)
        node.meta = {k: v for k, v in anchor.meta.items() if k != "val"}
        spec = InputSpec(kind=like.kind, arg=TensorArgument(name=node.name), target=target, persistent=like.persistent)
        self.input_specs.insert(self.input_specs.index(like) + 1, spec)
        self._spec_index = None
        self.set_stored_tensor(spec, value)
        return node

    def remove_stored_input(self, node: torch.fx.Node) -> None:
        """Drop a parameter/buffer/constant placeholder nothing reads any more (and its tensor,
        unless another placeholder holds the same target)."""
        spec = self.input_spec_of(node)
        if node.users or spec is None or spec.kind not in STORED_KINDS:
            raise ValueError(f"{node.name} is not an unused stored input")
        self.graph.erase_node(node)
        self.input_specs.remove(spec)
        self._spec_index = None
        if not any(s.target == spec.target and s.kind == spec.kind for s in self.input_specs):
            store = self.constants
            if spec.kind == InputKind.PARAMETER or (spec.kind == InputKind.BUFFER and spec.persistent):
                store = self.state_dict
            store.pop(spec.target, None)

    def user_output_nodes(self) -> list[tuple[int, torch.fx.Node | Any]]:
        """(position among user outputs, value in the output node) for every user output."""
        values = self.graph.output_node().args[0]
        out = []
        position = 0
        for spec, value in zip(self.output_specs, values):
            if spec.kind == OutputKind.USER_OUTPUT:
                out.append((position, value))
                position += 1
        return out

    def user_output_dtypes(self) -> tuple:
        """dtype of every user output that is a single tensor (None for anything else), by position."""
        out = []
        for _, value in self.user_output_nodes():
            val = value.meta.get("val") if isinstance(value, torch.fx.Node) else None
            out.append(val.dtype if isinstance(val, torch.Tensor) else None)
        return tuple(out)

    def rename_output(self, old: torch.fx.Node, new: torch.fx.Node) -> None:
        """Keep output specs pointing at the right node after an output value is replaced."""
        for spec in self.output_specs:
            if isinstance(spec.arg, TensorArgument) and spec.arg.name == old.name:
                spec.arg = TensorArgument(name=new.name)

    def sync_output_specs(self) -> None:
        """Re-derive output spec argument names from the output node (after passes replaced values)."""
        values = self.graph.output_node().args[0]
        for spec, value in zip(self.output_specs, values):
            if isinstance(spec.arg, TensorArgument) and isinstance(value, torch.fx.Node):
                spec.arg = TensorArgument(name=value.name)

    def sync_input_specs(self) -> None:
        """Re-derive input spec names after placeholders were renamed."""
        nodes = self.placeholders()
        for spec, node in zip(self.input_specs, nodes):
            if isinstance(spec.arg, TensorArgument) and spec.arg.name != node.name:
                spec.arg = TensorArgument(name=node.name)
        self._spec_index = None


def _copy_graph(source: torch.fx.Graph) -> torch.fx.Graph:
    graph = torch.fx.Graph()
    graph._codegen = copy.deepcopy(source._codegen)
    value_map: dict = {}
    out = graph.graph_copy(source, value_map)
    graph.output(out)
    for old, new in value_map.items():  # node_copy shares meta dicts; give each node its own
        new.meta = dict(old.meta)
    graph.output_node().meta = dict(source.output_node().meta)
    return graph


def stored_bytes(state_dict, constants) -> int:
    """Bytes of the tensors in a program's state (a tensor shared under two names counted once)."""
    seen = set()
    total = 0
    for tensor in list(state_dict.values()) + list(constants.values()):
        if not isinstance(tensor, torch.Tensor):
            continue
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tensor.dtype, tuple(tensor.shape))
        if key in seen:
            continue
        seen.add(key)
        total += tensor.numel() * tensor.element_size()
    return total


def _is_impure(node: torch.fx.Node) -> bool:
    if node.op in ("placeholder", "output"):
        return True
    rule = _DETERMINISTIC_WHEN.get(node.target) if node.op == "call_function" else None
    if rule is not None and rule(node):
        return False
    return node.is_impure()


def _argument(node: torch.fx.Node, index: int, name: str, default):
    return node.args[index] if len(node.args) > index else node.kwargs.get(name, default)


# Ops torch.fx keeps as impure because they *may* draw random numbers, with the arguments under which they
# do not: an inference graph's dropout (train=False) and attention without dropout are pure, and kept alive
# they keep whatever computes their inputs (a whole unused decoder behind its last eval-mode dropout).
# ``detach_`` writes only autograd metadata (transformers' caches detach the tensors they create lazily).
_DETERMINISTIC_WHEN = {
    torch.ops.aten.detach_.default: lambda n: True,
    torch.ops.aten.dropout.default: lambda n: not _argument(n, 2, "train", True) or _argument(n, 1, "p", 1.0) == 0,
    torch.ops.aten.scaled_dot_product_attention.default: lambda n: _argument(n, 4, "dropout_p", 0.0) == 0,
}


def _spec_copy(spec):
    """A copy of an input/output spec that shares nothing a pass may edit: its argument (the placeholder or
    output name) is copied too, so renaming it here never renames the program it came from."""
    spec = copy.copy(spec)
    spec.arg = copy.copy(spec.arg)
    return spec
