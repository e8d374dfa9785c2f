"""What mixprec inserts reads a value when its layer would: after the model's in-place writes into it.

``torch.export`` keeps a model's in-place ops, so a value can change after it is made: ``r = relu(x);
r[:, :32].sub_(0.5); linear(r)``. The rewrite places a cast, a quantize or a smoothing multiply right after the value
it reads (one node serves every consumer: ``casting.cast_of``), which is before such a write: the layer would then
compute on the value as it was before the write, silently other numbers than the model.

:func:`reads_after_writes`, the rewrite's last pass, finds each chain of inserted nodes reading a value that an
in-place op may write (``ir/input_writes.writers``: schema aliases, shared storages, ops returning their input as
it is) with such a write between the chain's first node and its last consumer, and moves the chain to just before
its first consumer: it then reads the value the layer read. Where the chain's consumers lie on both sides of a write
(one cast read before it and after it), no single place reads the right value for both: the compile stops with an
:class:`UnsupportedModelError` naming the write, never computing other numbers.
"""

from __future__ import annotations

import torch

from ..errors import UnsupportedModelError
from ..ir.graph_info import META_ROLE
from ..ir.input_writes import writers
from ..ir.passes import PassResult, rewrite_pass
from .context import RewriteContext


def _inserted(node: torch.fx.Node) -> bool:
    """A node the rewrite made (a cast, quantize/dequantize, smoothing, layout copy), not one of the model's."""
    return node.op == "call_function" and node.meta.get(META_ROLE) not in (None, "autocast_cast")


def _chain(start: torch.fx.Node) -> tuple[list[torch.fx.Node], list[torch.fx.Node]]:
    """The inserted nodes reachable from ``start`` through inserted users, and the model's nodes reading them."""
    chain, consumers, todo = [], [], [start]
    while todo:
        node = todo.pop()
        if node in chain:
            continue
        chain.append(node)
        for user in node.users:
            if _inserted(user):
                todo.append(user)
            elif user not in consumers:
                consumers.append(user)
    return chain, consumers


# last: after every pass that inserts readers (fold_casts included: it may make a cast read an earlier value)
@rewrite_pass(requires={"int8", "params_stored", "fp32_accumulation", "output_dtypes"})
def reads_after_writes(ctx: RewriteContext) -> PassResult:
    graph = ctx.work.graph
    if not any(_writes(node) for node in graph.nodes):
        return PassResult(False)
    written = writers(graph)
    changed = False
    for node in list(graph.nodes):
        if not _inserted(node):
            continue
        for value in node.all_input_nodes:
            if _inserted(value) or value not in written:
                continue
            order = {n: i for i, n in enumerate(graph.nodes)}
            chain, consumers = _chain(node)
            consumers = [c for c in consumers if c.op != "output"] or consumers
            if not consumers:
                continue
            first = min(consumers, key=lambda n: order.get(n, len(order)))
            last = max(consumers, key=lambda n: order.get(n, len(order)))
            between = [w for w in written[value] if w not in chain and order[node] < order[w] < order.get(
                last, len(order))]
            if not between:
                continue
            split = [w for w in between if order[first] < order[w]]
            if split:
                raise UnsupportedModelError(
                    f"the model writes {value.name} in place ({split[0].name}: {split[0].target}) between two layers "
                    f"that read it ({first.name}, {last.name}) and mixprec converts it for both: no one place of the "
                    "conversion reads what each layer read. Write that update out of place (r = r - ...), or keep "
                    f"{first.name} and {last.name} in the same precision as {value.name}.")
            for member in sorted(chain, key=order.get):
                first.prepend(member)
            changed = True
    if changed:
        graph.lint()
    return PassResult(changed)


def _writes(node: torch.fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return node.op == "call_function" and schema is not None and schema.is_mutable
