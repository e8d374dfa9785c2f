"""Repeated blocks drawn once: which boxes belong to a block, when blocks repeat, and the collapsed drawing."""

from mixprec.output.report.blocks import MAX_RUNS, block_of
from mixprec.output.report.drawing import layout, render_svg


def _node(name, module, kind="compute", dtype="bfloat16", op="linear", role=None):
    return {"name": name, "kind": kind, "op": op, "dtype": dtype, "role": role, "module": module}


def _decoder(layers: int, fp32_layer: int | None = None, probe: int | None = None):
    """input -> per layer: cast (inserted, no module) -> q -> act -> out, with a residual add -> head -> output.
    ``probe``: a node outside every block reads layer ``probe``'s add and feeds the next layer's q."""
    nodes, edges = [_node("x", "", "input", None, "input")], []
    prev = 0
    for i in range(layers):
        if i and i - 1 == probe:
            nodes.append(_node("probe", "probe", op="mul"))
            edges.append([prev, len(nodes) - 1])
        dtype = "float32" if i == fp32_layer else "bfloat16"
        start = len(nodes)
        nodes += [_node(f"cast{i}", "", "cast", dtype, "_to_copy", role="cast"),
                  _node(f"q{i}", f"model.layers.{i}.q", dtype=dtype),
                  _node(f"act{i}", f"model.layers.{i}.act", dtype=dtype, op="silu"),
                  _node(f"view{i}", f"model.layers.{i}", "movement", op="view"),
                  _node(f"add{i}", f"model.layers.{i}", dtype="float32", op="add")]  # fmt: skip
        edges += [[prev, start], [start, start + 1], [start + 1, start + 2], [start + 2, start + 3],
                  [start + 3, start + 4], [prev, start + 4]]  # fmt: skip
        if i and i - 1 == probe:
            edges.append([start - 1, start + 1])
        prev = start + 4
    nodes += [_node("head", "lm_head"), _node("output", "", "output", None, "output")]
    edges += [[prev, len(nodes) - 2], [len(nodes) - 2, len(nodes) - 1]]
    return {"nodes": nodes, "edges": edges}


def test_a_block_is_the_module_path_to_its_first_number():
    assert block_of("model.layers.12.self_attn.q_proj") == ("model.layers", "model.layers.12", 12)
    assert block_of("encoder.block.0.layer.1.SelfAttention") == ("encoder.block", "encoder.block.0", 0)
    assert block_of("layer1.1.conv2") == ("layer1", "layer1.1", 1)
    assert block_of("lm_head") is None and block_of("") is None and block_of("0.fc") is None


def test_repeated_blocks_are_one_box_and_the_first_is_drawn_in_full():
    lay = layout(_decoder(30), [])
    (box,) = [b for b in lay.boxes if b.kind == "blocks"]
    assert box.run.like == "model.layers.0" and box.run.blocks == tuple(f"model.layers.{i}" for i in range(1, 30))
    assert box.strip == ("bfloat16", "bfloat16", "float32")  # q, act, add of layer 0
    names = {b.name for b in lay.boxes}
    assert {"cast0", "q0", "act0", "add0", "head"} <= names and not names & {"q1", "q29", "cast5"}
    for a, b in lay.edges:
        assert lay.boxes[a].rank < lay.boxes[b].rank
    assert len(lay.boxes) == 1 + 4 + 1 + 2  # input, layer 0, the box, head and output
    full = layout(_decoder(30), [], repeats=False)
    assert len(full.boxes) == 1 + 4 * 30 + 2 and not full.runs
    assert 'data-kind="blocks"' in render_svg(lay) and "model.layers.1\u201329  \u00d729" in render_svg(lay)


def test_a_block_in_another_precision_breaks_the_run_and_is_drawn():
    lay = layout(_decoder(10, fp32_layer=4), [])
    runs = sorted((r.like, r.blocks[0], r.blocks[-1]) for r in lay.runs)
    # 0 | 1-3 repeat 0; 4 differs (fp32) and is drawn; 5 is drawn in full again; 6-9 repeat it
    assert runs == [("model.layers.0", "model.layers.1", "model.layers.3"),
                    ("model.layers.5", "model.layers.6", "model.layers.9")]  # fmt: skip
    names = {b.name for b in lay.boxes}
    assert {"q0", "q4", "cast4", "q5"} <= names and not names & {"q1", "q3", "q6", "q9"}
    two = layout(_decoder(2), [])
    assert [r.blocks for r in two.runs] == [("model.layers.1",)]  # two layers: the second is the box


def test_a_run_that_would_close_a_cycle_is_drawn_in_full():
    lay = layout(_decoder(4, probe=1), [])
    assert lay.runs == () and {"q1", "q2", "q3"} <= {b.name for b in lay.boxes}
    for a, b in lay.edges:
        assert lay.boxes[a].rank < lay.boxes[b].rank


def test_at_most_max_runs_runs_are_collapsed_the_longest_first():
    """Each run tried costs a pass over the graph: a graph from a file may claim thousands of stacks."""
    nodes, edges = [_node("x", "", "input", None, "input")], []
    for family in range(MAX_RUNS + 20):
        for block in range(3 if family < MAX_RUNS + 10 else 4):  # the last ten stacks are the longest
            nodes.append(_node(f"f{family}_{block}", f"stack{family}.{block}.q"))
            edges.append([len(nodes) - 2, len(nodes) - 1])
    lay = layout({"nodes": nodes, "edges": edges}, [])
    assert len(lay.runs) == MAX_RUNS
    assert sum(len(run.blocks) == 3 for run in lay.runs) == 10  # the 4-block stacks are all collapsed
