"""Weak typing: per-layer timings on this device, the cost model and the decisions it hands the planner, and
the whole-program check against uniform plans. It times programs that rewrite/ and backends/ build, so it
comes after them in the package order although it runs before planning.
"""
