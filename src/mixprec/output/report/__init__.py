"""The report: records first (data), rendered into a table, JSON, layer information and HTML."""

from __future__ import annotations

import dataclasses
import json
import os

from ... import jsondoc
from ...errors import FileFormatError, did_you_mean
from ..numerics import output_errors  # re-exported for compiler.py, which builds the summary
from . import render
from .graph_shape import build_graph
from .reading import graph_fields, summary_fields
from .execution import Execution, computes_in_of, with_runs_as
from .records import LayerRecord, LayerTable, TensorRecord, build_records
from .summary import build_summary, for_records

_FORMAT = "mixprec.report"
_VERSION = 1

__all__ = [
    "Execution", "Report", "LayerRecord", "TensorRecord", "build_graph", "build_records", "build_summary",
    "computes_in_of", "output_errors", "with_runs_as",
]


@dataclasses.dataclass
class Report(LayerTable):
    layers: list[LayerRecord]
    summary: dict
    graph: dict | None = None  # the rewritten graph's nodes and edges (graph_shape.py), for the picture

    def __str__(self) -> str:
        return render.table(self.layers, self.summary)

    def __eq__(self, other) -> bool:
        if not isinstance(other, Report):
            return NotImplemented
        return self.layers == other.layers and jsondoc.same(self.summary, other.summary) and self.graph == other.graph

    def on_backend(self, runner, backend: str, program=None) -> "Report":
        """The report of this program as ``runner`` (built by ``backend``) runs it: ``runs_as`` and the FLOP
        shares follow what the runner computes (a program loaded on another backend or CPU runs otherwise
        than where it was compiled; ``program``: the ExportedProgram it runs, when the runner's own graph does not
        show it); the errors stay those measured when it was compiled."""
        graph = program.graph if program is not None else None
        layers = with_runs_as(self.layers, Execution.of(runner, backend, graph))
        if all(a is b for a, b in zip(layers, self.layers)):
            return self
        return Report(layers, for_records(self.summary, layers), self.graph)

    def layer_info(self) -> str:
        return render.layer_info(self.layers)

    def details(self, name: str) -> str:
        """Every field of one layer (by node name) in full: the table shortens some to fit 120 columns."""
        try:
            return render.details(self.layer(name))
        except KeyError:
            raise KeyError(
                f"the report has no layer '{name}'{did_you_mean(name, (r.name for r in self.layers))}"
            ) from None

    def to_dict(self) -> dict:
        """The JSON-friendly form (what :meth:`to_json` writes)."""
        data = {
            "format": _FORMAT,
            "version": _VERSION,
            "summary": self.summary,
            "layers": [r.to_dict() for r in self.layers],
        }
        if self.graph is not None:
            data["graph"] = self.graph
        return data

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str) -> "Report":
        return cls.from_dict(jsondoc.load(text, fmt=_FORMAT, version=_VERSION, what="report"))

    @classmethod
    def from_dict(cls, data) -> "Report":
        """The report from its JSON form, every field checked (``reading.py``): a field that is not what mixprec
        writes raises FileFormatError naming it (another format or version: ConfigError, as every document)."""
        jsondoc.check(data, fmt=_FORMAT, version=_VERSION, what="report")
        unknown = set(data) - {"format", "version", "summary", "layers", "graph"}
        if unknown or "layers" not in data or "summary" not in data or not isinstance(data["layers"], list):
            raise FileFormatError(
                "this mixprec report is incomplete or damaged: it must hold 'layers' (a list) and 'summary' "
                f"({'an unknown field' if unknown else 'missing'}). Write it again with mixprec."
            )
        layers = [LayerRecord.from_dict(d, index=i) for i, d in enumerate(data["layers"])]
        return cls(layers, summary_fields(data["summary"]), graph_fields(data.get("graph")))

    def to_html(self, title: str = "mixprec report", debug=None) -> str:
        """A self-contained page: the graph coloured by precision, the layer table, summary and error;
        with ``debug`` (a ``mixprec.debug`` result) also the per-layer comparison with fp32."""
        from .html import render_page

        return render_page(self, title=title, extra_sections=(debug.to_html(),) if debug is not None else ())

    def save_html(self, path, title: str = "mixprec report", debug=None) -> None:
        with open(os.fspath(path), "w", encoding="utf-8") as fh:
            fh.write(self.to_html(title=title, debug=debug))

