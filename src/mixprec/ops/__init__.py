"""Operators: the custom ops (markers, int8 Q/DQ), one name per op, and the one op table."""

from . import custom  # noqa: F401  (registers torch.ops.mixprec.*)
