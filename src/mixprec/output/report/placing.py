"""Placing the boxes of the drawing (drawing.py): ranks, the order within each rank, x positions.

Each step is linear in the boxes and edges (times a few sweeps): a graph read from a file may be
large, and the page must be written in seconds whatever it holds.
"""

from __future__ import annotations


def assign_ranks(boxes: list, edges) -> None:
    """rank = longest path from the inputs; sources that are not inputs one rank above their first consumer."""
    succ: dict[int, list[int]] = {}
    pred: dict[int, list[int]] = {}
    for a, b in edges:
        succ.setdefault(a, []).append(b)
        pred.setdefault(b, []).append(a)
    for i, box in enumerate(boxes):
        box.rank = 1 + max((boxes[p].rank for p in pred.get(i, ())), default=-1)
    for i in reversed(range(len(boxes))):  # pull sources that are not inputs down to their consumers
        box = boxes[i]
        if box.kind != "input" and i not in pred and i in succ:
            box.rank = max(0, min(boxes[s].rank for s in succ[i]) - 1)
    last = max((b.rank for b in boxes if b.kind != "output"), default=-1)
    for box in boxes:
        if box.kind == "output":
            box.rank = last + 1


def order_ranks(boxes: list, edges, sweeps: int = 4) -> list[list[int]]:
    """The boxes of each rank in graph order, then ``sweeps`` barycenter sweeps down and up."""
    ranks: dict[int, list[int]] = {}
    for i, box in enumerate(boxes):
        ranks.setdefault(box.rank, []).append(i)
    order = [ranks.get(r, []) for r in range(1 + max(ranks, default=-1))]
    pred: dict[int, list[int]] = {}
    succ: dict[int, list[int]] = {}
    for a, b in edges:
        pred.setdefault(b, []).append(a)
        succ.setdefault(a, []).append(b)

    pos: dict[int, float] = {}

    def place(row: list[int]) -> None:  # a row's positions depend on its own order only
        for k, i in enumerate(row):
            pos[i] = k - (len(row) - 1) / 2

    for row in order:
        place(row)
    for sweep in range(sweeps):
        neighbours = pred if sweep % 2 == 0 else succ
        rows = range(1, len(order)) if sweep % 2 == 0 else range(len(order) - 2, -1, -1)
        for r in rows:
            order[r] = _by_barycenter(order[r], neighbours, pos)
            place(order[r])
    return order


def _by_barycenter(row: list[int], neighbours: dict[int, list[int]], pos: dict[int, float]) -> list[int]:
    """A rank's nodes sorted by the mean position of their neighbours (ties keep the current order)."""
    current = {i: k for k, i in enumerate(row)}

    def key(i):
        near = [pos[j] for j in neighbours.get(i, ()) if j in pos]
        return (sum(near) / len(near) if near else pos[i], current[i])

    return sorted(row, key=key)


def assign_x(boxes: list, edges, order: list[list[int]], step: float, gap: float) -> None:
    """Each box at the mean x of its predecessors, then pushed ``gap`` apart within its rank, re-centred."""
    pred: dict[int, list[int]] = {}
    for a, b in edges:
        pred.setdefault(b, []).append(a)
    for row in order:
        desired = []
        for k, i in enumerate(row):
            xs = [boxes[p].x for p in pred.get(i, ()) if boxes[p].rank < boxes[i].rank]
            desired.append(sum(xs) / len(xs) if xs else (k - (len(row) - 1) / 2) * step)
        placed = list(desired)
        for k in range(1, len(row)):
            space = (boxes[row[k - 1]].width + boxes[row[k]].width) / 2 + gap
            placed[k] = max(placed[k], placed[k - 1] + space)
        shift = (sum(desired) - sum(placed)) / len(row) if row else 0.0
        for k, i in enumerate(row):
            boxes[i].x = placed[k] + shift
