"""Decisions made from measured speed on this machine and backend:

* weak typing (``use_explicit_typing=False``): each free layer's time in each enabled dtype and the casts between
  them (``layer_timing.py``), the assignment of least total time (``assignment.py``, ``source.py``) and the
  whole-program check against the uniform plans (``choose.py``);
* autocast's speed check (``speed.py``): whether the low type is faster than fp32 for the model's shape classes
  (``shape_class.py``), else autocast lowers nothing;
* the int8 gate (``int8_speed.py``, ``int8_calls.py``): on eager and inductor, int8 layers whose class int8 is not
  faster for stay fp32.

How things are timed, and the cost model that keeps the numbers (per backend, device, CPU and library versions,
optionally on disk), are ``mixprec.measure``'s. This package times programs that rewrite/ and backends/ build, so it
comes after them in the package order although it runs before planning.
"""
