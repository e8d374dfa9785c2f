"""The layered drawing of the graph: ranks follow edges, nodes never overlap, large graphs stay fast."""

import time

from mixprec.output.report import Report
from mixprec.output.report.drawing import GAP_X, MAX_EDGES, MAX_NODES, MAX_REACH, layout, render_svg


def _graph(nodes, edges):
    return {"nodes": nodes, "edges": edges}


def _node(name, kind="compute", dtype="float32", op="linear"):
    return {"name": name, "kind": kind, "op": op, "dtype": dtype, "role": None, "module": f"m.{name}"}


def _transformer_like(blocks: int):
    """input -> per block: q,k,v (parallel) -> attention -> view/permute (movement) -> out -> add (residual) ..."""
    nodes, edges = [_node("x", "input", op="input")], []
    prev = 0
    for b in range(blocks):
        start = len(nodes)
        nodes += [_node(f"q{b}"), _node(f"k{b}"), _node(f"v{b}")]
        edges += [[prev, start], [prev, start + 1], [prev, start + 2]]
        nodes.append(_node(f"sdpa{b}", dtype="bfloat16", op="scaled_dot_product_attention"))
        edges += [[start, start + 3], [start + 1, start + 3], [start + 2, start + 3]]
        nodes += [_node(f"view{b}", "movement", op="view"), _node(f"perm{b}", "movement", op="permute")]
        edges += [[start + 3, start + 4], [start + 4, start + 5]]
        nodes.append(_node(f"cast{b}", "cast", dtype="bfloat16", op="_to_copy"))
        edges.append([start + 5, start + 6])
        nodes.append(_node(f"out{b}", dtype="bfloat16"))
        edges.append([start + 6, start + 7])
        nodes.append(_node(f"add{b}", op="add"))
        edges += [[start + 7, start + 8], [prev, start + 8]]
        prev = start + 8
    nodes.append(_node("output", "output", dtype=None, op="output"))
    edges.append([prev, len(nodes) - 1])
    return _graph(nodes, edges)


def test_ranks_follow_edges_and_movement_is_collapsed():
    lay = layout(_transformer_like(3), [])
    assert lay.collapsed == 6  # view and permute of each block
    for a, b in lay.edges:
        assert lay.boxes[a].rank < lay.boxes[b].rank
    assert lay.boxes[-1].kind == "output" and lay.boxes[-1].rank == lay.ranks - 1
    # the collapsed view/permute chain connects attention straight to the cast
    names = [(lay.boxes[a].name, lay.boxes[b].name) for a, b in lay.edges]
    assert ("sdpa0", "cast0") in names


def test_no_two_nodes_of_a_rank_overlap():
    lay = layout(_transformer_like(4), [])
    rows = {}
    for box in lay.boxes:
        rows.setdefault(box.rank, []).append(box)
    assert max(len(r) for r in rows.values()) == 3  # q, k, v side by side
    for row in rows.values():
        row.sort(key=lambda b: b.x)
        for left, right in zip(row, row[1:]):
            assert right.x - left.x >= (left.width + right.width) / 2 + GAP_X - 1e-6


def test_a_chain_is_drawn_straight():
    nodes = [_node("x", "input", op="input")] + [_node(f"l{i}") for i in range(5)] + [_node("o", "output", None)]
    edges = [[i, i + 1] for i in range(6)]
    lay = layout(_graph(nodes, edges), [])
    assert len({round(b.x, 6) for b in lay.boxes}) == 1


def test_large_graphs_lay_out_quickly():
    graph = _transformer_like(40)  # ~400 nodes, as many as a 12-layer BERT has layers and casts
    start = time.perf_counter()
    svg = render_svg(layout(graph, []))
    assert time.perf_counter() - start < 5.0
    assert svg.count('<g class="node ') == len(graph["nodes"]) - 80


# --- graphs read from a file: the drawing is bounded whatever they hold (issue 31, item 11) -------------------


def _fan(n: int):
    """Layer j reads a data-movement node that reads every earlier layer (through a chain of them): drawn naively,
    n^2/2 connections (a 462 KB graph made a 2.7 GB page)."""
    nodes, edges = [], []
    for j in range(n):
        nodes += [_node(f"s{j}"), _node(f"h{j}", "movement", op="view")]
        edges.append([2 * j, 2 * j + 1])
        if j:
            edges += [[2 * j - 1, 2 * j + 1], [2 * j - 1, 2 * j]]
    return _graph(nodes, edges)


def test_a_node_reading_many_layers_through_collapsed_nodes_draws_a_bounded_number_of_connections():
    lay = layout(_fan(600), [])
    assert len(lay.boxes) == 600
    into: dict[int, int] = {}
    for _, b in lay.edges:
        into[b] = into.get(b, 0) + 1
    assert max(into.values()) == MAX_REACH and len(lay.edges) <= MAX_EDGES
    assert [a for a, b in lay.edges if b == 599] == list(range(599 - MAX_REACH, 599))  # the nearest are drawn


def test_a_graph_larger_than_the_caps_is_drawn_in_part_and_the_page_says_so():
    count = MAX_NODES + 500
    nodes = [_node("x", "input", op="input")] + [_node(f"l{i}") for i in range(count)]
    graph = _graph(nodes, [[i, i + 1] for i in range(count)])
    lay = layout(graph, [])
    assert len(lay.boxes) == MAX_NODES and lay.left_out == count + 1 - MAX_NODES
    page = Report([], {"layers_by_precision": {}}, graph).to_html()
    assert f"too large to draw whole: {lay.left_out:,} later nodes" in page
    assert page.count('<g class="node ') == MAX_NODES
    small = Report([], {"layers_by_precision": {}}, _transformer_like(3)).to_html()
    assert "too large" not in small


def test_a_long_chain_is_ordered_in_linear_time():
    """The barycenter sweeps recomputed every rank's positions for each rank: quadratic in a chain's length
    (7.1 s of CPU for this chain before, 0.04 s after; CPU time, so other processes do not count)."""
    nodes = [_node(f"l{i}") for i in range(MAX_NODES)]
    graph = _graph(nodes, [[i, i + 1] for i in range(MAX_NODES - 1)])
    start = time.process_time()
    lay = layout(graph, [])
    assert time.process_time() - start < 2.0 and lay.ranks == MAX_NODES
