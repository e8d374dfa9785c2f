"""Autocast rules: small, stateless classes that keep a layer in fp32 and say why.

A rule is a frozen class with ``match(node, ctx) -> Decision | None``: ``node`` is the
layer's :class:`~mixprec.ir.graph_info.NodeInfo`, ``ctx`` a :class:`RuleContext` holding the
settings and the facts about the whole graph (calibration statistics, stored tensors,
reduction depths). A rule returns a :class:`Decision` to keep the layer in high
precision, or None when it has nothing against lowering it. Nothing is stored on a
rule between calls (ModelOpt's node classifier kept the last tensor it looked at on the
rule object; here everything a reason needs goes into the Decision).

Rules register by name, in the order they are consulted; the autocast source
(``plan/sources/autocast_rules.py``) keeps a layer in fp32 when any rule matches and reports every
matching rule's reason.
"""

from __future__ import annotations

from .base import ConstantValue, Decision, RuleContext, get_rule, known_rules, register_rule, rules_for

__all__ = ["ConstantValue", "Decision", "RuleContext", "get_rule", "known_rules", "register_rule", "rules_for"]

# the rule modules register themselves, in this order
from . import exclude, fixed, ranges, reduction, stream, intent, stored, speed  # noqa: E402,F401,I001
