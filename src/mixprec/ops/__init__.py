"""Operators: the custom ops (markers, int8 Q/DQ, weight-only), one name per op, the one op table, and the kernel
boundary: each op's declaration of what its kernel takes and allocates (``kernels.py``)."""

from . import aten_kernels, bounds, custom, weight_only  # noqa: F401  (register torch.ops.mixprec.* and declarations)
