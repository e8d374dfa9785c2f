"""Mapping a call as the user writes it onto the call a program was captured with.

``torch.export`` fixes the structure of a program's inputs: which arguments came
positionally, which by keyword (and in what order), and which were left to their
defaults. Its own module rejects any other spelling of the same call ("Ran into a kwarg
keyword mismatch"), so a program compiled with ``(input_ids, attention_mask)`` could not
be called as ``prog(input_ids=..., attention_mask=...)`` — which is how transformers'
``generate()``, its pipelines and HF collators (dict batches) call a model.

:class:`CallSignature` knows the captured structure (from the ExportedProgram's own
``module_call_graph``: argument names and the kwargs' keys) and, when the program was
compiled from an ``nn.Module`` in this process, the model's ``forward`` signature (so
arguments passed with their default values are accepted too). :meth:`arrange` binds a
call to those names and returns it in the captured structure; anything that does not fit
raises the error type the caller asks for (``InputMismatchError`` at call time,
``CalibrationError`` for calibration batches), naming the parameter. A keyword the program does
not take is refused, never dropped (at call time an ``UnexpectedKeywordError``, which is both a
``ConfigError`` and an ``InputMismatchError``); one the model's forward takes but the capture
left to its default is accepted only with that default value, which is what the program computes.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Mapping

import torch
import torch.utils._pytree as pytree

from types import MappingProxyType

from ..errors import InputMismatchError, UnexpectedKeywordError, did_you_mean

_SIMPLE = (bool, int, float, str, type(None), torch.dtype, torch.device)

# the error for a keyword the program does not take, by the error a caller asks for (others: that error itself)
_KEYWORD_ERRORS = MappingProxyType({InputMismatchError: UnexpectedKeywordError})


@dataclasses.dataclass(frozen=True)
class CallSignature:
    positional: tuple[str, ...]  # names of the arguments captured positionally, in order
    keywords: tuple[str, ...]  # names of the arguments captured as keywords, in the capture's order
    forward: inspect.Signature | None = None  # the model's forward (None for a program loaded from a file)

    @classmethod
    def of(cls, exported_program, model=None) -> "CallSignature | None":
        """The signature of ``exported_program``'s call; None when torch did not record the names."""
        entry = exported_program.module_call_graph[0].signature if exported_program.module_call_graph else None
        if entry is None or entry.in_spec is None:
            return None
        names = list(getattr(entry, "forward_arg_names", None) or ())
        args_spec, kwargs_spec = _children(entry.in_spec)
        if args_spec is None:
            return None
        keywords = tuple(kwargs_spec.context) if kwargs_spec is not None and kwargs_spec.context else ()
        count = args_spec.num_children
        if len(names) != count + len(keywords):
            return None
        forward = None
        if isinstance(model, torch.nn.Module):
            try:
                forward = inspect.signature(model.forward)
            except (TypeError, ValueError):
                forward = None
        return cls(tuple(names[:count]), keywords, forward)

    def parameter_names(self) -> tuple[str, ...]:
        return self.positional + self.keywords

    def arrange(self, args: tuple, kwargs: Mapping, *, error=InputMismatchError, where: str = "this call") -> tuple[tuple, dict]:
        """``(args, kwargs)`` of a call, rearranged into the captured structure; ``where`` names the call in
        errors ("calibration batch 3")."""
        if len(args) == len(self.positional):  # the common cases: called as captured, or every argument by name
            if not kwargs and not self.keywords:
                return tuple(args), {}
            if len(kwargs) == len(self.keywords) and kwargs.keys() == self._keyword_set:
                return tuple(args), {name: kwargs[name] for name in self.keywords}
        elif not args and len(kwargs) == len(self._names_by_keyword) and kwargs.keys() == self._names_by_keyword:
            return tuple(kwargs[name] for name in self.positional), {name: kwargs[name] for name in self.keywords}
        unknown = _KEYWORD_ERRORS.get(error, error)
        named = self._bind(args, kwargs, error, unknown, where)
        captured = set(self.positional + self.keywords)
        for name, value in named.items():  # first what the program cannot take (often a misspelt name)
            if name not in captured and not self._is_default(name, value):
                raise unknown(
                    f"{where} gives argument '{name}', which the program was compiled without (the model's default "
                    f"was used when it was captured); leave '{name}' out, or compile again with it in the example "
                    f"inputs (the program takes {self._describe()})."
                )
        for name in self.positional + self.keywords:
            if name not in named:
                raise error(
                    f"{where} does not give argument '{name}', which the program was compiled with; pass it "
                    f"(the program takes {self._describe()})."
                )
        out_args = tuple(named[name] for name in self.positional)
        out_kwargs = {name: named[name] for name in self.keywords}
        return out_args, out_kwargs

    @functools.cached_property
    def _keyword_set(self) -> frozenset:
        return frozenset(self.keywords)

    @functools.cached_property
    def _names_by_keyword(self) -> frozenset:
        """Every captured name, when each can be given by keyword (the model's forward takes it so); else empty."""
        names = frozenset(self.positional + self.keywords)
        if self.forward is not None:
            by_keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
            parameters = self.forward.parameters
            if any(name not in parameters or parameters[name].kind not in by_keyword for name in self.positional):
                return frozenset()
        return names

    def _bind(self, args, kwargs, error, unknown, where) -> dict:
        if self.forward is not None and not _has_var_positional(self.forward):
            parameters = self.forward.parameters
            var_keyword = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters.values())
            for name in kwargs:  # name an unknown (often misspelt) keyword before anything else
                if name in parameters or var_keyword and name in self.keywords:
                    continue
                # a name **kwargs would swallow ('input_id' in a dict batch) is no argument either
                what = "is not a parameter of the model's forward" if var_keyword else (
                    f"the model's forward{self.forward} does not take"
                )
                raise unknown(
                    f"{where} gives argument '{name}', which {what}{did_you_mean(name, self._names())}; the program "
                    f"takes {self._describe()}."
                )
            try:
                bound = self.forward.bind(*args, **kwargs)
            except TypeError as e:
                raise error(f"{where} does not fit the model's forward{self.forward}: {e}.") from None
            named = {}
            for name, value in bound.arguments.items():
                kind = self.forward.parameters[name].kind
                if kind == inspect.Parameter.VAR_KEYWORD:
                    named.update(value)
                else:
                    named[name] = value
            return named
        known = self.parameter_names()
        if len(args) > len(self.positional):
            raise error(
                f"{where} gives {len(args)} positional argument(s); the program takes {len(self.positional)} "
                f"({', '.join(self.positional) or 'none'}) and the others by keyword: {self._describe()}."
            )
        named = dict(zip(self.positional, args))
        for name, value in kwargs.items():
            if name in named:
                raise error(f"{where} gives argument '{name}' twice (positionally and by keyword).")
            if name not in known:
                raise unknown(
                    f"{where} gives argument '{name}', which the program does not take{did_you_mean(name, known)}; "
                    f"it takes {self._describe()}."
                )
            named[name] = value
        return named

    def _names(self) -> list[str]:
        """The names a misspelt argument is matched against: the captured ones and forward's own."""
        names = list(self.parameter_names())
        if self.forward is not None:
            kinds = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
            names += [n for n, p in self.forward.parameters.items() if p.kind not in kinds and n not in names]
        return names

    def _is_default(self, name: str, value) -> bool:
        if self.forward is None:
            return False
        parameter = self.forward.parameters.get(name)
        if parameter is None or parameter.default is inspect.Parameter.empty:
            return False
        default = parameter.default
        if value is default:
            return True
        return isinstance(value, _SIMPLE) and isinstance(default, _SIMPLE) and type(value) is type(default) and value == default

    def _describe(self) -> str:
        parts = list(self.positional) + [f"{k}=" for k in self.keywords]
        return "(" + ", ".join(parts) + ")"


def _children(in_spec):
    """The (args, kwargs) child specs of a call's input TreeSpec."""
    try:
        count = in_spec.num_children
    except AttributeError:
        return None, None
    if count != 2:
        return None, None
    child = in_spec.child if hasattr(in_spec, "child") else (lambda i: in_spec.children_specs[i])
    return child(0), child(1)


def _has_var_positional(signature: inspect.Signature) -> bool:
    return any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in signature.parameters.values())


def arrange_or_pass(signature: CallSignature | None, args: tuple, kwargs: Mapping, **options) -> tuple[tuple, dict]:
    """``signature.arrange`` when the names are known, else the call as given."""
    if signature is None:
        return tuple(args), dict(kwargs)
    return signature.arrange(args, kwargs, **options)


def capture_keywords(program) -> tuple[str, ...]:
    """The names of the inputs ``program`` (an ExportedProgram) was captured with as keywords, in the capture's
    order: the order their values take among the placeholders."""
    in_spec = _in_spec(program)
    if in_spec is None:
        return ()
    _, kwargs_spec = _children(in_spec)
    return tuple(kwargs_spec.context) if kwargs_spec is not None and kwargs_spec.context else ()


def flat_user_inputs(program, args: tuple, kwargs: dict) -> list:
    """The user inputs of an ExportedProgram as its placeholders take them (keyword order of the capture)."""
    if kwargs:
        keys = capture_keywords(program)
        if set(keys) == set(kwargs):
            kwargs = {k: kwargs[k] for k in keys}
    return pytree.tree_leaves((args, kwargs))


def _in_spec(program):
    """The input TreeSpec of ``program``'s call (``ExportedProgram.call_spec.in_spec`` without building that
    property's NamedTuple class on every read)."""
    graph = program.module_call_graph
    return graph[0].signature.in_spec if graph and graph[0].signature is not None else None
