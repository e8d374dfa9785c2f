"""Reading a report from a file: every field is checked, and every refusal is a FileFormatError naming it."""

import copy
import json
import warnings

import pytest
from models import SeedExplicit

import mixprec
from mixprec.cli import main
from mixprec.output.report import Report


@pytest.fixture(scope="module")
def data():
    report = mixprec.compile(SeedExplicit().eval(), SeedExplicit.example_inputs()).report
    return json.loads(report.to_json())


def _set(path, value):
    def edit(d):
        *parents, last = path
        for key in parents:
            d = d[key]
        if value is _DELETE:
            del d[last]
        else:
            d[last] = value

    return edit


_DELETE = object()
# (what is damaged, the edit, what the message names)
DAMAGED = [
    ("string flops", _set(("layers", 0, "flops"), "200"), "'flops' must be a non-negative integer"),
    ("negative flops", _set(("layers", 0, "flops"), -1), "'flops'"),
    ("boolean flops", _set(("layers", 0, "flops"), True), "'flops'"),
    ("kind outside the vocabulary", _set(("layers", 0, "kind"), 'compute" onclick="x'), "'kind' must be one of"),
    ("name not a string", _set(("layers", 0, "name"), ["linear"]), "'name' must be a string"),
    ("reason missing", _set(("layers", 0, "reason"), _DELETE), "'reason' is missing"),
    ("unknown layer field", _set(("layers", 0, "script"), 1), "unknown field 'script'"),
    ("precision a module name", _set(("layers", 0, "precision"), "_inductor"), "'precision' is not a torch dtype"),
    ("precision not a string", _set(("layers", 0, "precision"), 3), "'precision' must be a string"),
    ("input dtypes not a list", _set(("layers", 0, "input_dtypes"), "float32"), "'input_dtypes' must be a list"),
    ("tensor shape of text", _set(("layers", 0, "inputs", 0, "shape"), ["1"]), "'inputs.shape'"),
    ("tensor with more fields", _set(("layers", 0, "inputs", 0, "x"), 1), "'inputs' must have exactly"),
    ("in_graph as text", _set(("layers", 0, "in_graph"), "yes"), "'in_graph' must be true or false"),
    ("timings nested", _set(("layers", 0, "timings"), {"bfloat16": {"op_ms": [1]}}), "'timings.bfloat16.op_ms'"),
    ("layer not an object", _set(("layers", 0), "linear"), "'layer' must be an object"),
    ("summary layers missing", _set(("summary", "layers"), _DELETE), "'layers' is missing"),
    ("summary layers as text", _set(("summary", "layers"), "<script>alert(1)</script>"), "'layers' must be a"),
    ("casts as text", _set(("summary", "casts_inserted"), "<script>"), "'casts_inserted'"),
    ("layers by precision", _set(("summary", "layers_by_precision"), {"float32": "2"}), "layers_by_precision"),
    ("precision key not a dtype", _set(("summary", "layers_by_precision"), {"<b>": 2}), "layers_by_precision"),
    ("fraction out of range", _set(("summary", "low_precision_flops_fraction"), 7), "between 0 and 1"),
    ("error as text", _set(("summary", "max_abs_error"), "0.1"), "'max_abs_error' must be a number"),
    ("weights not a string", _set(("layers", 0, "weights"), {"bits": 4}), "'weights' must be a string"),
    ("parameter bytes as text", _set(("summary", "parameter_bytes_by_precision"), {"int4": "1 MB"}),
     "parameter_bytes_by_precision.int4"),
    ("compile seconds as text", _set(("summary", "compile_seconds", "capture"), "1s"), "compile_seconds.capture"),
    ("summary not an object", _set(("summary",), []), "'summary' must be an object"),
    ("node kind outside the vocabulary", _set(("graph", "nodes", 1, "kind"), "x"), "graph node 1: 'kind'"),
    ("node dtype not a dtype", _set(("graph", "nodes", 1, "dtype"), 'x"><script>'), "graph node 1: 'dtype'"),
    ("node without a field", _set(("graph", "nodes", 1, "role"), _DELETE), "graph node 1: it must have"),
    ("edge to nowhere", _set(("graph", "edges", 0), [0, 10_000]), "names a node it does not have"),
    ("edge of text", _set(("graph", "edges", 0), ["0", 1]), "'edges'"),
    ("edge of three", _set(("graph", "edges", 0), [0, 1, 2]), "pair of node positions"),
    ("graph with more fields", _set(("graph", "script"), 1), "exactly the fields nodes and edges"),
    ("layers not a list", _set(("layers",), {}), "must hold 'layers' (a list)"),
]


@pytest.mark.parametrize("what, edit, message", DAMAGED, ids=[d[0] for d in DAMAGED])
def test_every_damaged_field_is_a_file_format_error_naming_it(data, what, edit, message):
    damaged = copy.deepcopy(data)
    edit(damaged)
    with pytest.raises(mixprec.FileFormatError) as caught:
        Report.from_dict(damaged)
    assert message in str(caught.value)


def test_a_report_that_mixprec_wrote_reads_back_whole(data):
    report = Report.from_dict(copy.deepcopy(data))
    assert json.loads(report.to_json()) == data


@pytest.mark.parametrize("name", ["has_cuda", "_inductor", "__getattr__"])
def test_a_dtype_name_in_a_file_is_looked_up_never_resolved_through_torch(data, name):
    """``getattr(torch, name)`` runs torch's module ``__getattr__``: it imports a lazy submodule ("_inductor")
    and calls a deprecated attribute's function ("has_cuda", with a warning)."""
    damaged = copy.deepcopy(data)
    damaged["layers"][0]["precision"] = name
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(mixprec.FileFormatError, match="'precision' is not a torch dtype name"):
            Report.from_dict(damaged)
    assert not caught, [str(w.message) for w in caught]


@pytest.mark.parametrize("what, edit, message", [DAMAGED[0], DAMAGED[15]], ids=["string flops", "summary damaged"])
def test_the_command_refuses_a_damaged_report_with_exit_2_and_no_traceback(data, tmp_path, capsys, what, edit, message):
    damaged = copy.deepcopy(data)
    edit(damaged)
    path = tmp_path / "report.json"
    path.write_text(json.dumps(damaged))
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and message in " ".join(err.split())
