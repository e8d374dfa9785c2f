"""Repeated blocks drawn once: a 30-layer decoder is one layer in full and one box for the 29 that repeat it.

A transformer or a ResNet is a stack of numbered blocks (``model.layers.0`` ... ``model.layers.29``,
``encoder.layer.3``, ``layer1.1``). Drawn node by node, a 2-layer decoder was a 3000-pixel column
and a 30-layer one fifteen times that, every layer the same picture. Here the blocks of a stack
are compared: consecutive blocks with the same *signature* — the same ops, in the same order,
wired the same way inside the block, each in the same precision, kept or lowered by the same
kind of decision — are a run, and every block of a run after its first is drawn as one box
("model.layers.1–29, 29 blocks the same as model.layers.0"). A block that differs (a layer the
debugger's fix kept in fp32) breaks the run and is drawn in full, so the picture shows every
precision that occurs. The table below the graph lists every layer of every block as before.

A node's block is the module path up to its first numbered component. Casts mixprec inserted
carry no module; they belong to the block of the layers they feed (else of the layer they read),
so a block's signature includes the casts at its edges.
"""

from __future__ import annotations

import dataclasses
import heapq

MAX_RUNS = 32  # runs tried for collapsing, longest first


@dataclasses.dataclass(frozen=True)
class Run:
    """Blocks drawn as one box: ``blocks`` (module paths) repeat ``like`` (drawn in full)."""

    family: str  # "model.layers"
    like: str  # "model.layers.0"
    blocks: tuple[str, ...]  # ("model.layers.1", ..., "model.layers.29")

    @property
    def label(self) -> str:
        first, last = self.blocks[0], self.blocks[-1]
        return first if len(self.blocks) == 1 else f"{first}\u2013{last.rsplit('.', 1)[-1]}"


def block_of(module: str) -> tuple[str, str, int] | None:
    """'model.layers.3.self_attn' -> ('model.layers', 'model.layers.3', 3); None without a numbered part."""
    parts = module.split(".") if module else []
    for i, part in enumerate(parts):
        if i > 0 and part.isdigit():
            return ".".join(parts[:i]), ".".join(parts[: i + 1]), int(part)
    return None


def assign_blocks(boxes, edges) -> list[str | None]:
    """The block (module path) each box belongs to, or None (see the module docstring for casts)."""
    own = [block_of(b.module)[1] if b.kind in ("compute", "cast") and block_of(b.module) else None for b in boxes]
    succ: dict[int, list[int]] = {}
    pred: dict[int, list[int]] = {}
    for a, b in edges:
        succ.setdefault(a, []).append(b)
        pred.setdefault(b, []).append(a)
    out = list(own)
    for i, box in enumerate(boxes):
        if out[i] is None and box.kind == "cast" and not box.module:
            for near in (succ.get(i, ()), pred.get(i, ())):
                found = {own[j] for j in near if own[j] is not None}
                if len(found) == 1:
                    out[i] = found.pop()
                    break
    return out


def repeated_runs(boxes, edges, blocks: list[str | None], signature) -> list[Run]:
    """Runs of consecutive equal blocks (``signature(box, block)`` describes one box) of length 2 or more."""
    members: dict[str, list[int]] = {}
    for i, block in enumerate(blocks):
        if block is not None:
            members.setdefault(block, []).append(i)
    wiring: dict[int, list[int]] = {}
    position = {i: k for ids in members.values() for k, i in enumerate(ids)}
    for a, b in edges:
        if blocks[a] is not None and blocks[a] == blocks[b]:
            wiring.setdefault(b, []).append(position[a])
    sig = {
        block: tuple((signature(boxes[i], block), tuple(sorted(wiring.get(i, ())))) for i in ids)
        for block, ids in members.items()
    }
    families: dict[str, list[tuple[int, str]]] = {}
    for block in members:
        family, path, index = block_of(block)
        families.setdefault(family, []).append((index, path))
    runs = []
    for family, numbered in families.items():
        numbered.sort()
        start = 0
        for k in range(1, len(numbered) + 1):
            same = (
                k < len(numbered)
                and numbered[k][0] == numbered[k - 1][0] + 1
                and sig[numbered[k][1]] == sig[numbered[start][1]]
            )
            if not same:
                if k - start >= 2:
                    runs.append(Run(family, numbered[start][1], tuple(p for _, p in numbered[start + 1 : k])))
                start = k
    return runs


def collapse(boxes: list, edges: list[tuple[int, int]], blocks: list[str | None], runs: list[Run], make_box):
    """(boxes, edges, runs drawn): each run's blocks replaced by ``make_box(run, members)``, in topological order.

    A run whose box would sit on a cycle (a node outside the run both reads from it and feeds it) is
    left drawn in full, and so are the runs after the ``MAX_RUNS`` longest (a model has a few stacks;
    a graph from a file may claim thousands)."""
    kept = []
    group = list(range(len(boxes)))  # box -> the node it is drawn as
    tried = set(sorted(range(len(runs)), key=lambda k: -len(runs[k].blocks))[:MAX_RUNS])
    for run in (run for k, run in enumerate(runs) if k in tried):  # each trial is linear in boxes and edges
        members = set(run.blocks)
        inside = {i for i, b in enumerate(blocks) if b in members}
        trial = list(group)
        head = min(inside)
        for i in inside:
            trial[i] = head
        if _acyclic(len(boxes), [(trial[a], trial[b]) for a, b in edges if trial[a] != trial[b]]):
            group = trial
            kept.append((run, head, sorted(inside)))
    heads = {head: (run, members) for run, head, members in kept}
    index: dict[int, int] = {}
    out_boxes = []
    for i, box in enumerate(boxes):
        if group[i] != i:
            continue
        index[i] = len(out_boxes)
        out_boxes.append(make_box(*heads[i]) if i in heads else box)
    out_edges = sorted({(index[group[a]], index[group[b]]) for a, b in edges if group[a] != group[b]})
    order = _topological(len(out_boxes), out_edges)
    where = {old: new for new, old in enumerate(order)}
    return [out_boxes[i] for i in order], sorted((where[a], where[b]) for a, b in out_edges), [r for r, _, _ in kept]


def _acyclic(count: int, edges) -> bool:
    return len(_topological(count, edges)) == count


def _topological(count: int, edges) -> list[int]:
    """Kahn's order, smallest index first among the ready (so graph order is kept where it can be)."""
    succ: dict[int, set[int]] = {}
    indegree = [0] * count
    for a, b in set(edges):
        if b not in succ.setdefault(a, set()):
            succ[a].add(b)
            indegree[b] += 1
    ready = [i for i in range(count) if indegree[i] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j in succ.get(i, ()):
            indegree[j] -= 1
            if indegree[j] == 0:
                heapq.heappush(ready, j)
    return order
