"""Stage 2, calibration: streaming per-node statistics of the fp32 graph on calibration batches (an observer of
the graph runner), the one reader of calibration batches, graphs for batches of other shapes, int8 ranges.
"""
