"""Naming operators: one canonical string per op, and user spellings resolved to it.

Canonical names are ``str(OpOverload)`` ("aten.linear.default"); a packet name
("aten.flatten") stands for all of its overloads. Users may write
``torch.ops.aten.flatten.using_ints`` (object or string), ``"aten.flatten.using_ints"``,
``"aten.flatten"`` or ``"flatten"``.
"""

from __future__ import annotations

import difflib

import torch

from ..errors import ConfigError


def op_name(target) -> str:
    """Canonical name of a graph node's target: 'aten.linear.default', 'getitem', ..."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    if isinstance(target, torch._ops.OpOverloadPacket):
        return str(target)
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"higher_order.{target.name()}"
    return getattr(target, "__name__", str(target))


def packet_name(name: str) -> str:
    """'aten.flatten.using_ints' -> 'aten.flatten'; names without an overload part stay as they are."""
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) >= 3 else name


def op_matches(name: str, wanted: frozenset[str]) -> str | None:
    """The entry of ``wanted`` that names this op (overload or its packet), or None."""
    if name in wanted:
        return name
    packet = packet_name(name)
    return packet if packet in wanted else None


def resolve_op_name(op, *, what: str) -> str:
    """Turn any user spelling of an op into its canonical name, or raise ConfigError."""
    if isinstance(op, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(op)
    if not isinstance(op, str):
        raise ConfigError(f"{what} holds {op!r}, which is neither an op (torch.ops.aten.X) nor an op name.")
    text = op.strip().removeprefix("torch.ops.")
    parts = text.split(".")
    if len(parts) == 1:
        parts = ["aten", parts[0]]
    if len(parts) not in (2, 3):
        raise ConfigError(f"{what}: {op!r} is not an op name; write e.g. 'aten.flatten.using_ints' or 'flatten'.")
    namespace, name = parts[0], parts[1]
    try:
        packet = getattr(getattr(torch.ops, namespace), name)
    except (AttributeError, RuntimeError):
        packet = None
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        hint = _near_miss(namespace, name)
        raise ConfigError(
            f"{what}: {op!r} names no operator" + (f" (did you mean {hint}?)" if hint else "")
            + "; write e.g. 'aten.flatten.using_ints', 'aten.flatten' or 'flatten'."
        )
    if len(parts) == 2:
        return str(packet)
    overloads = packet.overloads()
    if parts[2] not in overloads:
        raise ConfigError(
            f"{what}: {op!r} names no overload of {packet}; its overloads are: {', '.join(overloads)}."
        )
    return str(getattr(packet, parts[2]))


def _near_miss(namespace: str, name: str) -> str | None:
    if namespace != "aten":
        return None
    try:
        names = [n for n in dir(torch.ops.aten) if not n.startswith("_")]
    except RuntimeError:
        return None
    close = difflib.get_close_matches(name, names, n=1)
    return f"'aten.{close[0]}'" if close else None
