"""Operators: the custom ops (markers, int8 Q/DQ, weight-only), one name per op, the one op table, and the kernel
boundary: each op's declaration of what its kernel takes and allocates (``kernels.py``)."""

# register torch.ops.mixprec.*, their declarations and the weight formats' handlers
from . import aten_kernels, bounds, custom, weight_only  # noqa: F401
from . import weight_nf4, weight_mxfp4, weight_fp8  # noqa: F401  (after int8 / int4: the registry's order)
