"""Size arithmetic in a loaded program (``operator``/``math``/``torch.sym_*`` on plain numbers), run by the
load-time fake run (``propagation.py``) and kept inside torch's sizes: a chain of squarings reaches 2**(2**40) in
forty nodes, so a power or a shift by more than 64 is refused before it is computed, and any result beyond 2**63.
"""

from __future__ import annotations

import math
import operator

import torch
import torch.utils._pytree as pytree

from ...errors import FileFormatError

MAX_SIZE = 1 << 63
_SIZE_FUNCTIONS_CHECKED_BEFORE = {operator.pow: 64, operator.lshift: 64}


def hint_of(value):
    """A number, or a symbolic number's example value (None when it has none: a data-dependent size)."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        hint = value.node.hint
        if hint is None:
            return None
        return float(hint) if isinstance(value, torch.SymFloat) else int(hint)
    return value if isinstance(value, (int, float)) else None


def evaluate(node, target, args, kwargs):
    """``operator``/``math``/``torch.sym_*`` on numbers or symbolic sizes, kept inside torch's sizes: the one check
    of both fake runs of a load (the reader's, which fills every node's value, and propagation's memory count)."""
    bound = _SIZE_FUNCTIONS_CHECKED_BEFORE.get(target)
    if bound is not None and len(args) == 2:
        base, amount = hint_of(args[0]), hint_of(args[1])
        if amount is None or abs(amount) > bound and not (target is operator.pow and base is not None
                                                          and abs(base) <= 1):  # fmt: skip
            raise FileFormatError(
                f"the program's node {node.name!r} raises to a power or shifts by more than {bound}; sizes stay "
                "below 2**63."
            )
    try:
        result = target(*args, **kwargs)
    except (ArithmeticError, ValueError, TypeError) as e:
        raise FileFormatError(
            f"the program's size arithmetic at node {node.name!r} fails ({type(e).__name__}: {e})."
        ) from None
    for value in pytree.tree_leaves(result):
        number = hint_of(value)
        if isinstance(number, (int, float)) and not math.isnan(number) and abs(number) > MAX_SIZE:
            raise FileFormatError(
                f"the program's size arithmetic at node {node.name!r} leaves torch's sizes (2**63)."
            )
    return result
