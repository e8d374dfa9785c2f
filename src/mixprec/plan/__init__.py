"""Stage 3, planning: a PrecisionPlan filled by the sources strongest first (sources/), the autocast rules
each next to the facts it reads (rules/), data movement following its neighbours, and the input contract
of a decision. Nothing here changes a graph.
"""
