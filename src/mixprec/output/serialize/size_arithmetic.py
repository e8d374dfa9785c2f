"""Size arithmetic in a loaded program (``operator``/``math``/``torch.sym_*`` on plain numbers), run by the
load-time fake run (``propagation.py``) and kept inside torch's sizes: a chain of squarings reaches 2**(2**40) in
forty nodes, so a power or a shift by more than 64 is refused before it is computed, and any result beyond 2**63.
"""

from __future__ import annotations

import operator

import torch.utils._pytree as pytree

from ...errors import FileFormatError

MAX_SIZE = 1 << 63
_SIZE_FUNCTIONS_CHECKED_BEFORE = {operator.pow: 64, operator.lshift: 64}


def evaluate(node, target, args, kwargs):
    """``operator``/``math``/``torch.sym_*`` on plain numbers, kept inside torch's sizes."""
    bound = _SIZE_FUNCTIONS_CHECKED_BEFORE.get(target)
    if bound is not None and len(args) == 2 and isinstance(args[1], (int, float)):
        base, amount = args
        if abs(amount) > bound and not (target is operator.pow and isinstance(base, (int, float))
                                        and abs(base) <= 1):  # fmt: skip
            raise FileFormatError(
                f"the program's node {node.name!r} raises to a power or shifts by {str(amount)[:20]}; sizes stay "
                "below 2**63."
            )
    try:
        result = target(*args, **kwargs)
    except (ArithmeticError, ValueError, TypeError) as e:
        raise FileFormatError(
            f"the program's size arithmetic at node {node.name!r} fails ({type(e).__name__}: {e})."
        ) from None
    for value in pytree.tree_leaves(result):
        if isinstance(value, int) and abs(value) > MAX_SIZE:
            raise FileFormatError(
                f"the program's size arithmetic at node {node.name!r} leaves torch's sizes (2**63)."
            )
    return result
