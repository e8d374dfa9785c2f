"""Dtype-transparent nodes follow the dtypes around them, so casts do not ping-pong.

Followers are the nodes the default source decided (no stronger source had an opinion)
whose dtype changes no value:

* data movement (view, permute, cat, split/getitem, dropout, ...): exact in any dtype;
* casts that convert nothing as captured (``x.to(y.dtype)`` with both fp32): when their
  consumers agree on a dtype they convert to it (the model's own cast does the work, so no
  cast of mixprec's follows it);
* ops that read floats but produce no float tensor (comparisons, argmax, sizes).

How (a forward pass, then a backward pass for what only flexible values feed; ``getitem`` always takes its
producer's dtype): :func:`follow`'s docstring. Nothing changes where every producer keeps its captured dtype, so
strong typing reproduces eager PyTorch exactly.
"""

from __future__ import annotations

import torch

from ..dtypes import dtype_name, is_float
from ..ir.graph_info import GraphInfo, NodeInfo
from .input_contract import required_input_dtype
from .precision_plan import NodePrecision

_FOLLOW_SOURCES = ("default",)


def output_dtype(info: GraphInfo, plan: dict, producer: str, captured: torch.dtype) -> torch.dtype:
    """dtype a producer's output (of captured dtype ``captured``) has under the plan."""
    node = info.get(producer)
    decision = plan.get(producer)
    if node is None or decision is None or not is_float(captured):
        return captured
    if node.kind == "cast" or captured == node.precision:
        return decision.compute_dtype  # int8 layers compute (and hand on) fp32
    return captured


def transparent(node: NodeInfo) -> bool:
    """True for nodes whose dtype changes no value (see the module docstring)."""
    if node.kind == "movement":
        return True
    floats = [d for d in node.input_dtypes.values() if is_float(d)]
    if node.kind == "cast":
        return bool(floats) and all(d == node.precision for d in floats)
    return bool(floats) and not any(is_float(m.dtype) for m in node.outputs)


def follow(info: GraphInfo, decided: dict[str, NodePrecision]) -> None:
    """Update the followers' decisions in ``decided`` in place.

    Forward pass, in graph order: a follower takes the dtype its producers have under the
    plan. Graph inputs and stored tensors (directly or through other followers) are
    *flexible*: casting them costs the same anywhere, and stored tensors are converted once
    when the program is built (``cast_params``). So

    * known producers that agree decide (``linear[bf16] -> view`` gives a bf16 view);
    * known producers that disagree (``cat(fp32, bf16)``) give the dtype every consumer wants,
      when that is one of theirs, else the widest (lossless: no value is rounded); a flexible producer
      beside known ones counts with its captured dtype (CLIP's ``cat(class_embedding, patches[bf16])``
      feeding an fp32 addition stays fp32, as torch.autocast's promotion computes it, instead of
      rounding the class embedding to bf16);
    * a follower fed only by flexible values waits for the backward pass.

    Backward pass, in reverse graph order: a follower fed only by flexible values takes the
    dtype all its consumers want (``t(weight)`` before a bf16 ``mm`` becomes bf16, so the weight
    is stored in bf16 and no cast runs per call), else it keeps its captured dtype. A graph
    output counts as a consumer that wants the captured dtype: a view of an input that is also
    returned must not come back rounded.

    ``getitem`` always takes the dtype its producer gives the selected element (it selects,
    it cannot be cast). Nothing changes where every producer keeps its captured dtype, so
    strong typing reproduces eager PyTorch exactly.
    """
    _Follower(info, decided).run()


class _Follower:
    def __init__(self, info: GraphInfo, decided: dict[str, NodePrecision]):
        self.info = info
        self.decided = decided
        self.followers = {
            name for name, node in info.items() if decided[name].source in _FOLLOW_SOURCES and transparent(node)
        }
        self.users: dict[str, list[str]] = {}
        for name, node in info.items():
            for producer in node.input_dtypes:
                self.users.setdefault(producer, []).append(name)
        self.flexible: set[str] = set()

    def run(self) -> None:
        order = [name for name in self.info if name in self.followers]
        for name in order:
            self._forward(name)
        for name in reversed(order):
            if name in self.flexible and self.info[name].op != "getitem":
                self._backward(name)
        for name in order:  # a getitem must match what its producer finally produces
            if self.info[name].op == "getitem":
                self._forward(name)

    def _floats(self, node: NodeInfo) -> list[tuple[str, torch.dtype]]:
        return [(p, d) for p, d in node.input_dtypes.items() if is_float(d)]

    def _forward(self, name: str) -> None:
        node = self.info[name]
        floats = self._floats(node)
        if not floats:
            return
        if node.op == "getitem":
            producer, captured = floats[0]
            if producer in self.flexible or producer not in self.info:
                self.flexible.add(name)
            self._set(name, output_dtype(self.info, self.decided, producer, captured), [producer], "follows its producer")
            return
        known = [(p, d) for p, d in floats if p in self.info and p not in self.flexible]
        if not known:
            self.flexible.add(name)
            return
        if node.kind == "cast":  # a cast in the code converts to what its consumers use: no second cast
            wants = self._wants(name, set())
            if len(wants) == 1:
                self._set(name, next(iter(wants)), self.users.get(name, [])[:3], "a cast in the code: converts to the dtype of")
                return
        planned = {p: output_dtype(self.info, self.decided, p, d) for p, d in known}
        if all(planned[p] == d for p, d in known):
            return  # nothing upstream changed: keep what the model computes
        # flexible producers beside known ones (cat(class_embedding, patches)) count with their own dtype, as type
        # promotion counts them under torch.autocast: otherwise the parameter is rounded to the low type on its way in
        dtypes = set(planned.values()) | {d for p, d in floats if p not in planned}
        if len(dtypes) == 1:
            dtype = dtypes.pop()
            why = "follows its producer" if len(planned) == 1 else "follows its producers"
        else:
            wants = self._wants(name, set())
            if len(wants) == 1 and next(iter(wants)) in dtypes:
                dtype = next(iter(wants))
                why = "producers disagree; takes the dtype its consumers use"
            else:
                dtype = _widest(dtypes)
                why = "producers disagree; takes the widest of their dtypes"
        self._set(name, dtype, list(planned), why)

    def _backward(self, name: str) -> None:
        wants = {self.info[name].precision} if name in self.info.outputs else set()
        responsible = []
        for user in self.users.get(name, ()):
            want = self._want(user, name)
            if want is not None:
                wants.add(want)
                responsible.append(user)
        if len(wants) == 1:
            self._set(name, wants.pop(), responsible, "reads only graph inputs or stored tensors; takes the dtype of")

    def _want(self, user: str, producer: str) -> torch.dtype | None:
        """The dtype ``user`` must receive ``producer`` in, under its current decision (None: it takes any)."""
        info = self.info[user]
        if info.kind == "cast" and user not in self.followers:
            return None
        captured = info.input_dtypes.get(producer)
        if not is_float(captured):
            return None
        return required_input_dtype(info, self.decided[user], producer, captured)

    def _wants(self, name: str, seen: set[str]) -> set[torch.dtype]:
        """dtypes the non-follower consumers of ``name`` need, looking through followers not yet decided."""
        out: set[torch.dtype] = {self.info[name].precision} if name in self.info.outputs else set()
        for user in self.users.get(name, ()):
            if user in seen:
                continue
            seen.add(user)
            if user in self.followers:
                out |= self._wants(user, seen)
                continue
            want = self._want(user, name)
            if want is not None:
                out.add(want)
        return out

    def _set(self, name: str, dtype: torch.dtype, responsible: list[str], why: str) -> None:
        old = self.decided[name]
        if dtype == old.precision:
            return
        source = "autocast_rule" if any(self.decided[r].source == "autocast_rule" for r in responsible) else old.source
        names = ", ".join(responsible[:3]) + (", ..." if len(responsible) > 3 else "")
        what = "data movement" if self.info[name].kind == "movement" else "dtype-transparent"
        reason = f"{what}: {why} {names} ({dtype_name(dtype)})" if names else f"{what}: {why} ({dtype_name(dtype)})"
        self.decided[name] = NodePrecision(dtype, None, source, reason, old.param_dtype)


def _widest(dtypes: set[torch.dtype]) -> torch.dtype:
    out = None
    for d in dtypes:
        out = d if out is None else torch.promote_types(out, d)
    return out
