"""Symbolic sizes from a file, accepted only when evaluating them is cheap by construction.

torch.export writes a symbolic size as sympy's ``srepr`` (``Mul(Integer(4), Symbol('s77', positive=True,
integer=True))``) and ``torch.export.load`` gives that text to ``sympy.sympify``, which parses it with Python's
grammar and evaluates it. sympy computes integer arithmetic exactly, so ``9**9**9**9`` or ``Pow(Integer(3),
Integer(10**13))`` never finishes, and later torch substitutes each symbol's hint (a size up to 2**63) into the
expressions it reasons about. A grammar of allowed names (the first round of these checks) keeps code out but not
arithmetic, so this module bounds the arithmetic:

* the text is parsed by Python's own parser (:mod:`ast`, nothing is evaluated), the grammar sympify uses, and only
  calls of sympy's and torch's size functions, symbol names, literals, arithmetic, comparison and boolean operators
  are accepted (no attributes, subscripts, lambdas, comprehensions; no ``^``, which sympify turns into ``**``);
* literals are bounded: integers below 2**64, floats finite doubles, ``Float`` precision at most 1024 bits;
* every subexpression gets an upper bound on the bits of any value it can take (a symbol is a size: 64 bits;
  ``a*b``: bits(a) + bits(b); ``a+b``: max + 1; ``a**k``: bits(a) * k), and an exponent or shift amount must be a
  literal of at most :data:`MAX_EXPONENT`. Any bound above :data:`MAX_BITS` is refused. With at most
  :data:`MAX_LENGTH` characters, :data:`MAX_DEPTH` levels and every value under 2**MAX_BITS, evaluating an
  accepted expression, with any hints, is a few thousand operations on numbers of at most 4096 bits: microseconds,
  whatever the file says.

The same bounds apply to the symbol names of ``range_constraints`` (torch counts unbacked symbols up to the largest
index it reads there: ``u99999999999999`` would be a loop of 10**14 steps), their bounds and the hints of sizes.
"""

from __future__ import annotations

import ast
import math
import re

from ...errors import FileFormatError

MAX_LENGTH = 10_000  # characters of one expression; torch writes < 500 for real programs
MAX_DEPTH = 64  # levels of nesting; torch writes < 15
MAX_BITS = 4096  # bound on any value an expression can take: 2**4096
MAX_EXPONENT = 64  # largest literal exponent / shift amount
MAX_INTEGER = 1 << 64  # integer literals
SIZE_BITS = 64  # a symbol stands for a size or index: |value| < 2**63
MAX_SIZE = 1 << 63

# torch's shape symbols: s77, u3, zuf0, ... (the index at most 6 digits: torch loops up to it, see above)
SYMBOL = re.compile(r"^[a-z]{1,4}\d{1,6}$")

# Functions by how they bound their value; every name sympify may see (torch's size functions, as torch's
# deserializer lists them, and the names sympy's printers write).
_ADDITIVE = frozenset(
    {"Add", "Max", "Min", "Abs", "Piecewise", "ExprCondPair", "Tuple", "Where", "Eq", "Ne", "Lt", "Le", "Gt", "Ge",
     "Equality", "Unequality", "StrictLessThan", "LessThan", "StrictGreaterThan", "GreaterThan", "And", "Or", "Not",
     "floor", "ceiling", "sqrt", "FloorToInt", "CeilToInt", "TruncToFloat", "TruncToInt", "RoundToInt", "ToFloat",
     "Identity", "RShift", "Mod", "PythonMod"}
)  # fmt: skip
_MULTIPLICATIVE = frozenset(
    {"Mul", "FloorDiv", "CleanDiv", "CeilDiv", "IntTrueDiv", "FloatTrueDiv", "ModularIndexing",
     "IsNonOverlappingAndDenseIndicator"}
)  # fmt: skip
_POWERS = frozenset({"Pow", "PowByNatural", "FloatPow"})  # (base, literal exponent)
_LITERAL_SECOND = frozenset({"LShift", "RoundDecimal"})  # (value, literal amount)
_LITERALS = frozenset({"Integer", "Rational", "Float"})
_SYMBOLS = frozenset({"Symbol", "Dummy"})
_CONSTANTS = frozenset(
    {"true", "false", "oo", "zoo", "nan", "Infinity", "NegativeInfinity", "NaN", "ComplexInfinity", "Half", "One",
     "Zero", "NegativeOne", "BooleanTrue", "BooleanFalse", "True", "False", "None"}
)  # fmt: skip
_ASSUMPTIONS = frozenset(
    {"positive", "negative", "nonnegative", "nonpositive", "integer", "real", "finite", "infinite", "even", "odd",
     "zero", "nonzero", "commutative", "rational"}
)  # fmt: skip
FUNCTIONS = _ADDITIVE | _MULTIPLICATIVE | _POWERS | _LITERAL_SECOND | _LITERALS | _SYMBOLS

_BINARY = {
    ast.Add: "add", ast.Sub: "add", ast.Mult: "mul", ast.Div: "mul", ast.FloorDiv: "mul", ast.Mod: "add",
    ast.Pow: "pow", ast.LShift: "lshift", ast.RShift: "add", ast.BitAnd: "add", ast.BitOr: "add",
}  # fmt: skip
_UNARY = (ast.USub, ast.UAdd, ast.Not, ast.Invert)
_COMPARE = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_NUMBER = re.compile(r"^[-+]?(\d{1,400}(\.\d{0,400})?|\.\d{1,400})([eE][-+]?\d{1,3})?$")


def check(text) -> None:
    """Refuse ``text`` (FileFormatError) unless it is size arithmetic whose every value is below 2**MAX_BITS."""
    if not isinstance(text, str) or len(text) > MAX_LENGTH:
        raise FileFormatError("a shape expression in the program is not a string of reasonable length.")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise _refused(text, f"it does not parse ({type(e).__name__})") from None
    bits = _bits(tree.body, text)
    if bits > MAX_BITS:  # pragma: no cover - _bits refuses on the way
        raise _refused(text, "its values can exceed 2**4096")


def check_hint(value, what: str = "a size hint") -> None:
    """A hint (torch's example value of a symbolic size) or a range bound: a plain number below 2**63, or None."""
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int) and -MAX_SIZE <= value <= MAX_SIZE:
        return
    if isinstance(value, float) and (math.isfinite(value) and abs(value) <= MAX_SIZE or math.isinf(value)):
        return
    raise FileFormatError(f"the program holds {what} {str(value)[:40]!r}, which is not a size.")


def check_range_constraints(constraints) -> None:
    """``range_constraints``: {symbol name: {"min_val": bound, "max_val": bound}} with bounded names and bounds."""
    if not isinstance(constraints, dict):
        raise FileFormatError("the program's models/model.json is damaged (range_constraints is not an object).")
    for name, bounds in constraints.items():
        if not SYMBOL.match(name):
            raise FileFormatError(f"the program constrains the range of {name[:40]!r}, which is not a shape symbol.")
        if not isinstance(bounds, dict) or not set(bounds) <= {"min_val", "max_val"}:
            raise FileFormatError(f"the program's range of {name!r} is damaged.")
        for key in ("min_val", "max_val"):
            check_hint(bounds.get(key), f"a bound of {name!r}")


def _refused(text: str, why: str) -> FileFormatError:
    return FileFormatError(
        f"the program holds a shape expression mixprec will not evaluate: {text[:80]!r} ({why}). Shape expressions "
        "are size arithmetic with bounded numbers; load files only from mixprec.save."
    )


def _bits(root: ast.AST, text: str) -> int:
    """Upper bound on the bits of the value of ``root``; refuses what is not size arithmetic. Iterative (post-order):
    a long chain ``1+1+...`` is a deep tree."""
    done: dict[int, int] = {}
    stack = [(root, 1, False)]
    while stack:
        node, depth, expanded = stack.pop()
        if depth > MAX_DEPTH:
            raise _refused(text, f"it nests more than {MAX_DEPTH} levels")
        children = _children(node, text)
        if not expanded and children:
            stack.append((node, depth, True))
            stack.extend((child, depth + 1, False) for child in children)
            continue
        bits = _node_bits(node, [done[id(c)] for c in children], text)
        if bits > MAX_BITS:
            raise _refused(text, "its values can exceed 2**4096")
        done[id(node)] = bits
    return done[id(root)]


def _children(node: ast.AST, text: str) -> list:
    """The subexpressions whose bound ``node`` needs (literal arguments are read directly, not walked)."""
    if isinstance(node, ast.BinOp):
        if type(node.op) not in _BINARY:
            raise _refused(text, f"operator {type(node.op).__name__}")
        return [node.left] if _BINARY[type(node.op)] in ("pow", "lshift") else [node.left, node.right]
    if isinstance(node, ast.UnaryOp):
        if not isinstance(node.op, _UNARY):
            raise _refused(text, f"operator {type(node.op).__name__}")
        return [] if _literal_number(node) is not None else [node.operand]
    if isinstance(node, ast.Compare):
        if not all(isinstance(op, _COMPARE) for op in node.ops):
            raise _refused(text, "a comparison other than ==, !=, <, <=, >, >=")
        return [node.left, *node.comparators]
    if isinstance(node, ast.BoolOp):
        return list(node.values)
    if isinstance(node, ast.Tuple):
        return list(node.elts)
    if isinstance(node, ast.Call):
        name = node.func.id if isinstance(node.func, ast.Name) else None
        if name not in FUNCTIONS:
            raise _refused(text, f"the call of {ast.dump(node.func)[:40] if name is None else name!r}")
        if name in _LITERALS or name in _SYMBOLS:
            return []
        if any(isinstance(a, ast.Starred) for a in node.args) or node.keywords:
            raise _refused(text, f"{name} with keyword or starred arguments")
        if name in _POWERS or name in _LITERAL_SECOND:
            return list(node.args[:1])
        return list(node.args)
    if isinstance(node, (ast.Name, ast.Constant)):
        return []
    raise _refused(text, f"a {type(node).__name__}")


def _node_bits(node: ast.AST, child_bits: list[int], text: str) -> int:
    if isinstance(node, ast.Constant):
        return _constant_bits(node.value, text)
    if isinstance(node, ast.Name):
        if SYMBOL.match(node.id):
            return SIZE_BITS
        if node.id in _CONSTANTS:
            return 1
        raise _refused(text, f"the name {node.id!r}, neither a shape symbol nor a constant")
    if isinstance(node, ast.UnaryOp):
        literal = _literal_number(node)
        return _constant_bits(literal, text) if literal is not None else child_bits[0]
    if isinstance(node, ast.BinOp):
        kind = _BINARY[type(node.op)]
        if kind == "pow":
            return child_bits[0] * _literal_amount(node.right, text)
        if kind == "lshift":
            return child_bits[0] + _literal_amount(node.right, text)
        return sum(child_bits) + 1 if kind == "mul" else max(child_bits) + 1
    if isinstance(node, (ast.Compare, ast.BoolOp, ast.Tuple)):
        return _additive(child_bits)
    name = node.func.id  # an ast.Call of a known function (see _children)
    if name in _SYMBOLS:
        _check_symbol(node, text)
        return SIZE_BITS
    if name in _LITERALS:
        return _literal_call_bits(node, text)
    if name in _POWERS or name in _LITERAL_SECOND:
        if len(node.args) != 2:
            raise _refused(text, f"{name} takes two arguments")
        amount = _literal_amount(node.args[1], text)
        if name in _POWERS:
            return child_bits[0] * amount
        return child_bits[0] + amount if name == "LShift" else child_bits[0]
    if not child_bits:
        return 1
    return sum(child_bits) + 1 if name in _MULTIPLICATIVE else _additive(child_bits)


def _additive(child_bits: list[int]) -> int:
    return (max(child_bits) if child_bits else 1) + max(1, math.ceil(math.log2(len(child_bits) + 1)))


def _constant_bits(value, text: str) -> int:
    if isinstance(value, bool) or value is None:
        return 1
    if isinstance(value, int):
        if abs(value) >= MAX_INTEGER:
            raise _refused(text, "an integer literal of 2**64 or more")
        return max(1, abs(value).bit_length())
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _refused(text, "a float literal that is not finite")
        return max(1, math.frexp(value)[1])
    raise _refused(text, f"a literal {type(value).__name__}")


def _literal_number(node: ast.AST):
    """The value of an int/float literal, possibly signed (``-1``, ``Integer(-1)``), else None. A loop, not a
    recursion: a crafted ``-----...1`` of thousands of signs that the parser accepts must not exhaust the stack.
    More than MAX_DEPTH signs are no literal: ``_bits`` walks them and refuses the nesting (sympy's parser, which
    torch would hand the text to, recurses once per sign)."""
    negate = False
    signs = 0
    while isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        signs += 1
        if signs > MAX_DEPTH:
            return None
        negate ^= isinstance(node.op, ast.USub)
        node = node.operand
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return -node.value if negate else node.value
    return None


def _literal_amount(node: ast.AST, text: str) -> int:
    """An exponent or shift: an int/float literal, ``Integer(k)``, ``Rational(p, q)`` or ``Float('x')`` with
    numerator at most MAX_EXPONENT in size; returns the bound it multiplies (or adds) bits by."""
    value = _literal_number(node)
    if value is None and isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _LITERALS:
        _literal_call_bits(node, text)
        args = [_literal_number(a) if not isinstance(a, ast.Constant) or not isinstance(a.value, str) else a.value
                for a in node.args]  # fmt: skip
        value = args[0] if args else None
        if isinstance(value, str):
            value = float(value)
    if value is None or not math.isfinite(value) or abs(value) > MAX_EXPONENT:
        raise _refused(text, f"an exponent or shift that is not a literal of at most {MAX_EXPONENT}")
    return max(1, math.ceil(abs(value)))


def _literal_call_bits(node: ast.Call, text: str) -> int:
    """``Integer(n)``, ``Rational(p, q)``, ``Float('1.5', precision=53)``: literal arguments only."""
    name = node.func.id
    keywords = {k.arg: k.value for k in node.keywords}
    if name == "Float":
        if set(keywords) - {"precision", "dps"} or len(node.args) != 1:
            raise _refused(text, "a Float other than Float('number', precision=N)")
        for value in keywords.values():
            precision = _literal_number(value)
            if not isinstance(precision, int) or not 1 <= precision <= 1024:
                raise _refused(text, "a Float precision outside 1..1024 bits")
        (arg,) = node.args
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            if not _NUMBER.match(arg.value):
                raise _refused(text, "a Float of text that is not a decimal number")
            return _constant_bits(float(arg.value), text)
        value = _literal_number(arg)
        if value is None:
            raise _refused(text, "a Float of something other than a literal")
        return _constant_bits(float(value), text)
    if keywords or not 1 <= len(node.args) <= (1 if name == "Integer" else 2):
        raise _refused(text, f"{name} with other than literal arguments")
    bits = 0
    for arg in node.args:
        value = _literal_number(arg)
        if not isinstance(value, int):
            raise _refused(text, f"{name} of something other than an integer literal")
        bits += _constant_bits(value, text)
    return bits


def _check_symbol(node: ast.Call, text: str) -> None:
    """``Symbol('s77', positive=True, integer=True)``: a shape symbol's name and assumption keywords."""
    if len(node.args) != 1 or not isinstance(node.args[0], ast.Constant) or not isinstance(node.args[0].value, str):
        raise _refused(text, "a Symbol without a quoted name")
    if not SYMBOL.match(node.args[0].value):
        raise _refused(text, f"the symbol {node.args[0].value[:20]!r}, which is not a shape symbol")
    for keyword in node.keywords:
        value = keyword.value
        if keyword.arg not in _ASSUMPTIONS or not (isinstance(value, ast.Constant) and isinstance(value.value, bool)):
            raise _refused(text, "a Symbol assumption other than name=True/False")
