"""The graph summary a report carries for its picture: nodes, kinds, casts and edges of the rewritten program."""

import torch
from models import SeedExplicit, TiedEmbedding

import mixprec


def _by_name(graph):
    return {n["name"]: i for i, n in enumerate(graph["nodes"])}


def test_nodes_and_edges_follow_the_program():
    prog = mixprec.compile(SeedExplicit().eval(), SeedExplicit.example_inputs())
    graph = prog.report.graph
    kinds = [n["kind"] for n in graph["nodes"]]
    assert kinds[0] == "input" and kinds[-1] == "output"
    assert kinds.count("input") == 1 and kinds.count("output") == 1
    index = _by_name(graph)
    edges = {tuple(e) for e in graph["edges"]}
    # every graph edge is a data dependency of the rewritten program (parameters left out)
    program_nodes = {n.name: n for n in prog.exported_program.graph.nodes}
    for src, dst in edges:
        a, b = graph["nodes"][src], graph["nodes"][dst]
        if b["kind"] != "output":
            assert program_nodes[a["name"]] in program_nodes[b["name"]].all_input_nodes
    linears = [r.name for r in prog.report.layers if r.op == "aten.linear.default"]
    assert [graph["nodes"][index[n]]["dtype"] for n in linears] == ["float32", "float16", "float32"]
    assert all(0 <= s < d < len(kinds) for s, d in edges)


def test_fp32_accumulation_casts_are_marked():
    model = torch.nn.Linear(8, 8).half().eval()
    prog = mixprec.compile(model, (torch.randn(2, 8).half(),), use_fp32_acc=True)
    roles = {n["role"] for n in prog.report.graph["nodes"] if n["kind"] == "cast"}
    assert "acc_cast" in roles


def test_integer_outputs_and_dict_outputs():
    prog = mixprec.compile(TiedEmbedding().eval(), TiedEmbedding.example_inputs())
    graph = prog.report.graph
    output = len(graph["nodes"]) - 1
    into_output = [graph["nodes"][s]["name"] for s, d in graph["edges"] if d == output]
    assert len(into_output) == 2  # logits and argmax
    assert graph["nodes"][0]["dtype"] == "int64"


def test_report_json_keeps_the_graph():
    prog = mixprec.compile(SeedExplicit().eval(), SeedExplicit.example_inputs())
    again = mixprec.Report.from_json(prog.report.to_json())
    assert again.graph == prog.report.graph and again == prog.report
