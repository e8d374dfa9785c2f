"""The strings a loaded program may carry, so that none can change the source code a backend generates.

Where a program's strings go (read in torch 2.13's source):

* **operator arguments** (``gelu(approximate=...)``, ``div(rounding_mode=...)``, assertion messages, einsum
  equations). ATen's kernels compare them with fixed words or parse them as data. FX writes them into the module's
  Python source with ``repr()``, a safe literal. TorchInductor, however, pastes some of them into C++ unescaped:
  ``aten._assert_async.msg`` becomes ``throw std::runtime_error("{msg}")`` in a CPU kernel
  (``codegen/cpp.py``), ``_assert_scalar``'s message goes into ``std::runtime_error("Expected {msg} ...")`` under
  ``cpp_wrapper``, and with ``cpp_wrapper`` every string argument of an operator inductor calls as a fallback kernel
  becomes ``"{val}"`` (``cpp_wrapper_cpu.py``). A message ``a"), 0)); system("..."); ...`` is native code run
  during a load (issue 25). So an operator with a string argument is allowed only when :data:`CHOICES` or
  :data:`TEXT` reviews that argument, and its value must be one of the words the kernel accepts, or free text in
  :data:`SAFE_TEXT`: letters, digits, spaces and operator signs, no quote, backslash, control character, brace,
  ``#``, ``?`` or comment delimiter — text that cannot end a string literal or a comment in Python or C++, whatever
  a code generator does with it. Lists of strings and strings where the schema wants another type are refused.
* **node metadata** (``stack_trace``, ``nn_module_stack``, ...): a mixprec file carries none (``graph.py``).
* **names** (graph values, parameters, constants, arguments) become Python identifiers and attribute paths: each
  must be a plain identifier (:func:`is_identifier`) or dotted path (:func:`is_dotted_path`), checked where they
  are read (``graph_reader.py``, ``weights.py``); kernel and buffer names inductor derives from them are identifiers
  too.
"""

from __future__ import annotations

import re

from ...errors import FileFormatError

# Free text that cannot end a quoted literal or a comment in Python or C++: no quotes, backslash, newline or other
# control character, no ``?`` (trigraphs), ``#``, ``{}``/``$``/``@``/backtick (formatting and templating).
SAFE_TEXT = re.compile(r"^[A-Za-z0-9 _.,:;()\[\]<>=!+\-*/%&|~]{0,300}$")
_COMMENT_DELIMITERS = ("/*", "*/")
# torch.export's own assertion messages (fx/passes/runtime_assert.py): an expression and a node name.
ASSERTION = re.compile(
    r"^Runtime assertion failed for expression [A-Za-z0-9 _.,:;()\[\]<>=!+\-*/%&|~]{1,300} "
    r"on node '[A-Za-z_][A-Za-z0-9_]{0,200}'$"
)
_EQUATION = re.compile(r"^[A-Za-z.,\- >]{1,200}$")  # einsum: "bij,bjk->bik", "...ij,...jk"
_DOTTED_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]{0,100}$")

_PAD_MODES = frozenset({"constant", "reflect", "replicate", "circular"})
_FFT_NORMS = frozenset({None, "backward", "ortho", "forward"})
# Operator (name without the in-place underscore) -> argument -> the words its kernel accepts (None: not given).
CHOICES: dict[str, dict[str, frozenset]] = {
    "gelu": {"approximate": frozenset({"none", "tanh"})},
    "gelu_backward": {"approximate": frozenset({"none", "tanh"})},
    "div": {"rounding_mode": frozenset({None, "trunc", "floor"})},
    "divide": {"rounding_mode": frozenset({None, "trunc", "floor"})},
    "conv1d": {"padding": frozenset({"same", "valid"})},
    "conv2d": {"padding": frozenset({"same", "valid"})},
    "conv3d": {"padding": frozenset({"same", "valid"})},
    "_convolution_mode": {"padding": frozenset({"same", "valid"})},
    "pad": {"mode": _PAD_MODES},
    "stft": {"pad_mode": _PAD_MODES},
    "pad_sequence": {"padding_side": frozenset({"left", "right"})},
    "scatter": {"reduce": frozenset({"add", "multiply"})},
    "scatter_reduce": {"reduce": frozenset({"sum", "prod", "mean", "amax", "amin"})},
    "index_reduce": {"reduce": frozenset({"prod", "mean", "amax", "amin"})},
    "segment_reduce": {"reduce": frozenset({"max", "mean", "min", "sum", "prod"})},
    "searchsorted": {"side": frozenset({None, "left", "right"})},
    "meshgrid": {"indexing": frozenset({"ij", "xy"})},
    "quantile": {"interpolation": frozenset({"linear", "lower", "higher", "midpoint", "nearest"})},
    "nanquantile": {"interpolation": frozenset({"linear", "lower", "higher", "midpoint", "nearest"})},
    "linalg_norm": {"ord": frozenset({"fro", "nuc"})},
    "linalg_matrix_norm": {"ord": frozenset({"fro", "nuc"})},
    "linalg_cond": {"p": frozenset({"fro", "nuc"})},
    "linalg_eigh": {"UPLO": frozenset({"L", "U"})},
    "linalg_eigvalsh": {"UPLO": frozenset({"L", "U"})},
    "_linalg_eigh": {"UPLO": frozenset({"L", "U"})},
    "linalg_qr": {"mode": frozenset({"reduced", "complete", "r"})},
    "linalg_svd": {"driver": frozenset({None, "gesvd", "gesvdj", "gesvda"})},
    "linalg_svdvals": {"driver": frozenset({None, "gesvd", "gesvdj", "gesvda"})},
    "_linalg_svd": {"driver": frozenset({None, "gesvd", "gesvdj", "gesvda"})},
    "linalg_lstsq": {"driver": frozenset({None, "gels", "gelsy", "gelsd", "gelss"})},
    **{
        f"fft_{kind}": {"norm": _FFT_NORMS}
        for kind in ("fft", "fft2", "fftn", "ifft", "ifft2", "ifftn", "rfft", "rfft2", "rfftn", "irfft", "irfft2",
                     "irfftn", "hfft", "hfft2", "hfftn", "ihfft", "ihfft2", "ihfftn")
    },  # fmt: skip
}
# Operator -> argument -> the pattern free text must match.
TEXT: dict[str, dict[str, re.Pattern]] = {
    "_assert_scalar": {"assert_msg": ASSERTION},
    "_functional_assert_scalar": {"assert_msg": ASSERTION},
    "_assert_async": {"assert_msg": SAFE_TEXT},
    "_functional_assert_async": {"assert_msg": SAFE_TEXT},
    "einsum": {"equation": _EQUATION},
    "_linalg_check_errors": {"api_name": _DOTTED_NAME},
}
# Higher-order operators: position of a string argument -> the words allowed there.
HIGHER_ORDER_CHOICES: dict[str, dict[int, frozenset]] = {
    "wrap_with_autocast": {0: frozenset({"cpu", "cuda", "xpu", "mps", "hpu", "mtia"})},
}

_FREE_TEXT_TYPES = ("str", "Dimname", "Any")


def reviewed(name: str, schema) -> bool:
    """Whether every string-like argument of an ATen (or mixprec) operator ``name`` is in the reviewed lists.

    ``name`` is the operator's name (``gelu``, ``div_``); in-place variants share their functional twin's entry.
    """
    base = _base(name)
    for argument in schema.arguments:
        kind = str(argument.type)
        if not any(word in kind for word in _FREE_TEXT_TYPES):
            continue
        if kind not in ("str", "Optional[str]"):  # str[], Dimname, Any: nothing mixprec produces
            return False
        if argument.name not in CHOICES.get(base, {}) and argument.name not in TEXT.get(base, {}):
            return False
    return True


def check_value(name: str, argument: str, value) -> None:
    """A string (or None) given to argument ``argument`` of the ATen operator ``name``; FileFormatError unless the
    reviewed lists allow it."""
    base = _base(name)
    if value is None:
        allowed = CHOICES.get(base, {}).get(argument)
        if allowed is not None and None not in allowed:
            raise _refused(name, argument, value)
        return
    if not isinstance(value, str):
        raise _refused(name, argument, value)
    choices = CHOICES.get(base, {}).get(argument)
    if choices is not None:
        if value not in choices:
            raise _refused(name, argument, value)
        return
    pattern = TEXT.get(base, {}).get(argument)
    if pattern is None or not pattern.match(value) or any(d in value for d in _COMMENT_DELIMITERS):
        raise _refused(name, argument, value)


def check_fx_node(node) -> None:
    """The same check on a node of a graph torch built: every ``str`` among its arguments is reviewed."""
    import torch

    target = node.target
    args, kwargs = list(node.args), dict(node.kwargs)
    values = [(i, None, v) for i, v in enumerate(args)] + [(None, k, v) for k, v in kwargs.items()]
    for position, keyword, value in values:
        if isinstance(value, (list, tuple)) and any(isinstance(v, str) for v in value):
            raise FileFormatError(f"the program's node {node.name!r} passes a list of strings; mixprec refuses it.")
        if not isinstance(value, str):
            continue
        if isinstance(target, torch._ops.OpOverload):
            arguments = target._schema.arguments
            name = keyword if keyword is not None else (arguments[position].name if position < len(arguments) else "")
            check_value(target._schema.name.split("::")[-1], name, value)
        elif isinstance(target, torch._ops.HigherOrderOperator) and position is not None:
            _check_higher_order(target.name(), position, value)
        else:
            raise FileFormatError(f"the program's node {node.name!r} passes a string to {target!r}; refusing it.")


# Names: FX pastes them unescaped into the Python source it generates (attribute paths may hold list indices).
_DOTTED = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_]*|[0-9]+)(?:\.(?:[A-Za-z_][A-Za-z0-9_]*|[0-9]+))*(?:@\d+)?$|^$")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def is_identifier(value) -> bool:
    """A plain Python name (graph values, arguments, ``forward_arg_names``)."""
    return isinstance(value, str) and len(value) < 1000 and bool(_IDENTIFIER.match(value))


def is_dotted_path(value) -> bool:
    """A parameter, buffer, constant or submodule path: identifiers and indices joined by dots (or empty)."""
    return isinstance(value, str) and bool(_DOTTED.match(value))


def _check_higher_order(name: str, position: int, value) -> None:
    allowed = HIGHER_ORDER_CHOICES.get(name, {}).get(position)
    if allowed is None or value not in allowed:
        raise _refused(name, f"#{position}", value)


def _base(name: str) -> str:
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


def _refused(name: str, argument: str, value) -> FileFormatError:
    shown = repr(value)[:60] if isinstance(value, str) else type(value).__name__
    return FileFormatError(
        f"the program passes {shown} as {argument!r} of {name}; strings in a mixprec program are limited to the "
        "values torch's kernels accept and text that cannot reach generated code as code (serialize/strings.py), so "
        "mixprec refuses it."
    )
