"""Normalisation: make every dtype decision of the captured graph explicit.

``torch.export`` keeps ``torch.autocast`` regions (and ``torch.no_grad`` regions) as
higher-order ops around a subgraph, and the casts autocast performs are implicit:
they happen in the dispatcher when the region runs. mixprec must see every layer and
every cast, so this pass inlines those regions and writes autocast's casts as
explicit ``aten.to.dtype`` nodes (:func:`normalize` shows a region before and after).
Afterwards the graph computes exactly what eager PyTorch computed, without any autocast
context, and each op receives exactly the dtypes it received in eager mode.

Which inputs autocast casts, and to what, is not guessed from a table: each inlined op
is run once on fake tensors under the same autocast contexts while a dispatch mode
records the casts the dispatcher makes (``autocast probe``).

It also drops ``aten._assert_tensor_metadata`` nodes: they assert the captured dtypes,
which mixed precision changes on purpose — and then the computation no output needs, which
those asserts (and eval-mode dropouts) kept alive, so that calibration, the plan and the
report see only what the program computes — reads precision-marker regions into node meta
before removing the markers (``strip_markers``), and gives a program that writes its own inputs
a copy of them to write (``input_writes.py``: the caller's tensors are never written).
"""

from __future__ import annotations

import contextlib
import logging
import operator

import torch
import torch.utils._pytree as pytree
from torch._guards import detect_fake_mode
from torch.utils._python_dispatch import TorchDispatchMode

from ..dtypes import is_float
from .fake_values import converted
from .graph_info import META_AUTOCAST, META_ROLE
from .input_writes import copy_written_inputs
from .marker_regions import strip_markers
from .passes import PassResult
from .work_program import WorkProgram

log = logging.getLogger(__name__)

_AUTOCAST_HOP = "wrap_with_autocast"
_GRAD_HOP = "wrap_with_set_grad_enabled"
_ASSERTS = ("aten._assert_tensor_metadata",)


def normalize(work: WorkProgram) -> PassResult:
    """Every dtype decision of ``work``'s graph made explicit, in place (module docstring). An autocast region,
    before::

        wrap = higher_order.wrap_with_autocast("cpu", bfloat16, True, False, submod, x, w, b)
        y = getitem(wrap, 0)                 # submod: linear(x, w, b)

    After::

        x_bf16 = aten.to.dtype(x, bfloat16)  # role "autocast_cast"
        w_bf16 = aten.to.dtype(w, bfloat16)
        b_bf16 = aten.to.dtype(b, bfloat16)
        y = aten.linear(x_bf16, w_bf16, b_bf16)   # meta: inside autocast(cpu, bfloat16)
    """
    changed = _strip_dtype_asserts(work.graph)
    changed |= work.drop_dead_code()  # without the asserts, what no output needs (work_program._is_impure)
    changed |= _inline_regions(work)
    changed |= strip_markers(work).changed
    changed |= copy_written_inputs(work)  # the caller's tensors are never written: the program writes a copy
    if changed:
        work.graph.lint()
    return PassResult(changed)


def _hop_name(node: torch.fx.Node) -> str | None:
    if node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator):
        return node.target.name()
    return None


def _strip_dtype_asserts(graph: torch.fx.Graph) -> bool:
    changed = False
    for node in list(graph.nodes):
        if node.op == "call_function" and str(node.target).startswith(_ASSERTS) and not node.users:
            graph.erase_node(node)
            changed = True
    return changed


def _inline_regions(work: WorkProgram) -> bool:
    graph = work.graph
    changed = False
    for node in list(graph.nodes):
        hop = _hop_name(node)
        if hop not in (_AUTOCAST_HOP, _GRAD_HOP):
            continue
        submod = getattr(work.root, node.args[_submod_index(hop)].target)
        outputs = _Inliner(graph, node).inline(submod, node, ())
        for user in list(node.users):
            if user.target is not operator.getitem:
                raise AssertionError(f"unexpected user {user} of region {node}")
            replacement = outputs[user.args[1]]
            user.replace_all_uses_with(replacement)
            work.rename_output(user, replacement)
            graph.erase_node(user)
        getattr_node = node.args[_submod_index(hop)]
        graph.erase_node(node)
        if not getattr_node.users:
            graph.erase_node(getattr_node)
        changed = True
    if changed:
        work.rebuild_graph(_inner_names(graph))
    work.sync_output_specs()
    return changed


def _inner_names(graph: torch.fx.Graph) -> dict[torch.fx.Node, str]:
    """Give inlined nodes the names they had inside their region where no other node holds them.

    (Copies get fresh names like ``linear_3``; the region's own ``linear_2`` reads better and is
    what export showed for it.)
    """
    inlined = [n for n in graph.nodes if "_mixprec_inlined" in n.meta]
    taken = {n.name for n in graph.nodes if "_mixprec_inlined" not in n.meta}
    names = {}
    for node in inlined:
        wanted = node.meta.pop("_mixprec_inlined")
        name = wanted if wanted not in taken else node.name
        suffix = 1
        while name in taken:
            name = f"{wanted}_{suffix}"
            suffix += 1
        taken.add(name)
        names[node] = name
    return names


def _submod_index(hop: str) -> int:
    return 4 if hop == _AUTOCAST_HOP else 1


class _Inliner:
    """Copies a region's subgraph before the region node, materialising autocast casts."""

    def __init__(self, graph: torch.fx.Graph, anchor: torch.fx.Node):
        self.graph = graph
        self.anchor = anchor

    def inline(self, submod: torch.fx.GraphModule, hop_node: torch.fx.Node, contexts: tuple, operands=None):
        hop = _hop_name(hop_node)
        if hop == _AUTOCAST_HOP:
            device_type, dtype, enabled, _cache = hop_node.args[:4]
            contexts = contexts + ((device_type, dtype, bool(enabled)),)
        if operands is None:
            operands = hop_node.args[_submod_index(hop) + 1 :]
        env: dict = {}
        placeholders = [n for n in submod.graph.nodes if n.op == "placeholder"]
        for ph, value in zip(placeholders, operands):
            env[ph] = value
        cast_cache: dict = {}
        for node in submod.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "get_attr":
                env[node] = getattr(submod, node.target)
                continue
            if node.op == "output":
                return [env[a] if isinstance(a, torch.fx.Node) else a for a in node.args[0]]
            inner = _hop_name(node)
            if inner in (_AUTOCAST_HOP, _GRAD_HOP):
                sub = env[node.args[_submod_index(inner)]]
                inner_operands = [env[a] if isinstance(a, torch.fx.Node) else a
                                  for a in node.args[_submod_index(inner) + 1 :]]
                env[node] = self.inline(sub, node, contexts, inner_operands)
                continue
            if node.target is operator.getitem and isinstance(env[node.args[0]], list):
                env[node] = env[node.args[0]][node.args[1]]
                continue
            if str(node.target).startswith(_ASSERTS):
                continue
            env[node] = self._copy(node, env, contexts, cast_cache)
        raise AssertionError("region subgraph without output")

    def _copy(self, node, env, contexts, cast_cache) -> torch.fx.Node:
        def lookup(n):
            return env[n]

        with self.graph.inserting_before(self.anchor):
            new = self.graph.node_copy(node, lookup)
        new.meta = dict(node.meta)
        new.meta["_mixprec_inlined"] = node.name
        if contexts:
            new.meta[META_AUTOCAST] = contexts
            casts = _autocast_casts(new, contexts)
            for inp, dtype in casts.items():
                key = (inp, dtype)
                if key not in cast_cache:
                    with self.graph.inserting_before(new):
                        cast = self.graph.call_function(torch.ops.aten.to.dtype, (inp, dtype))
                    cast.meta = _cast_meta(inp, dtype, new)
                    cast.meta[META_AUTOCAST] = contexts
                    cast_cache[key] = cast
                new.replace_input_with(inp, cast_cache[key])
        return new


def _cast_meta(inp: torch.fx.Node, dtype: torch.dtype, consumer: torch.fx.Node) -> dict:
    meta = {"val": converted(inp.meta["val"], dtype), META_ROLE: "autocast_cast"}
    for key in ("nn_module_stack", "stack_trace", "source_fn_stack"):
        if key in consumer.meta:
            meta[key] = consumer.meta[key]
    return meta


class _CastRecorder(TorchDispatchMode):
    def __init__(self, inputs: dict[int, torch.fx.Node]):
        super().__init__()
        self.inputs = inputs
        self.casts: dict[torch.fx.Node, torch.dtype] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and args and id(args[0]) in self.inputs:
            dtype = kwargs.get("dtype")
            if dtype is not None and dtype != args[0].dtype:
                self.casts.setdefault(self.inputs[id(args[0])], dtype)
        return func(*args, **kwargs)


def _autocast_casts(node: torch.fx.Node, contexts: tuple) -> dict[torch.fx.Node, torch.dtype]:
    """Which float inputs autocast converts for this op, and to which dtype."""
    tensor_inputs = [
        n for n in node.all_input_nodes if isinstance(n.meta.get("val"), torch.Tensor) and is_float(n.meta["val"].dtype)
    ]
    expected = node.meta.get("val")
    if not tensor_inputs or not isinstance(expected, torch.Tensor):
        return _fallback_casts(tensor_inputs, expected)
    vals = {id(n.meta["val"]): n for n in tensor_inputs}
    fake_mode = detect_fake_mode(tuple(n.meta["val"] for n in tensor_inputs))
    args = torch.fx.node.map_arg(node.args, lambda n: n.meta.get("val"))
    kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: n.meta.get("val"))
    try:
        with_autocast, _ = _probe(node.target, args, kwargs, vals, fake_mode, contexts)
        without_autocast, _ = _probe(node.target, args, kwargs, vals, fake_mode, ())
        # casts the op makes itself (x.float() calls _to_copy too) are not autocast's
        casts = {n: d for n, d in with_autocast.items() if without_autocast.get(n) != d}
        # check: with these casts written out, the op run without autocast gives autocast's result dtype
        result = _run_with_casts(node, args, kwargs, casts, fake_mode)
    except Exception as e:  # an op the probe cannot run on fake tensors: fall back to the output dtype
        log.debug("autocast probe failed for %s (%s); casting inputs to its output dtype", node.name, e)
        return _fallback_casts(tensor_inputs, expected)
    if not isinstance(result, torch.Tensor) or result.dtype != expected.dtype:
        # autocast acted inside a composite op's decomposition (einsum -> bmm); casting the op's inputs
        # to its output dtype gives the same values, since the decomposition only moves data first
        return _fallback_casts(tensor_inputs, expected)
    return casts


def _run_with_casts(node, args, kwargs, casts, fake_mode):
    by_val = {id(n.meta["val"]): d for n, d in casts.items()}
    with fake_mode if fake_mode is not None else contextlib.nullcontext():

        def convert(a):
            if isinstance(a, torch.Tensor) and id(a) in by_val:
                return a.to(by_val[id(a)])
            return a

        args2 = pytree.tree_map(convert, args)
        kwargs2 = pytree.tree_map(convert, kwargs)
        return node.target(*args2, **kwargs2)


def _probe(target, args, kwargs, vals, fake_mode, contexts):
    recorder = _CastRecorder(vals)
    with contextlib.ExitStack() as stack:
        if fake_mode is not None:
            stack.enter_context(fake_mode)
        for device_type, dtype, enabled in contexts:
            stack.enter_context(torch.autocast(device_type, dtype=dtype, enabled=enabled))
        stack.enter_context(recorder)
        result = target(*args, **kwargs)
    return recorder.casts, result


def _fallback_casts(tensor_inputs, expected) -> dict:
    if not isinstance(expected, torch.Tensor) or not is_float(expected.dtype):
        return {}
    return {n: expected.dtype for n in tensor_inputs if n.meta["val"].dtype != expected.dtype}
