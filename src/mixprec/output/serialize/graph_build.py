"""The half of ``graph_reader.py`` that builds: FX graphs, symbols, fake values and the graph signature (and the
vocabulary both halves share: names, symbols, devices, dtypes, argument values).

Everything here runs on fields ``graph_reader.py`` has already checked against the schema; what is checked here is
how they fit together (a signature naming the graph's inputs, symbols whose hints lie in their ranges, sizes that are
sizes). See ``graph_reader.py``'s docstring for what the reader guarantees.
"""

from __future__ import annotations

import re

import torch
from torch.utils._sympy.numbers import int_oo
from torch.export.graph_signature import (ConstantArgument, ExportGraphSignature, InputKind, InputSpec, OutputKind,
                                          OutputSpec, SymIntArgument, TensorArgument)  # fmt: skip

from ...dtypes import dtype_name
from ...errors import FileFormatError
from ...ops import kernels
from . import operators, size_arithmetic, strings
from .graph import LAYOUTS, MEMORY_FORMATS

MAX_SIZE = 1 << 62
_INFINITE = int_oo  # an unbounded range
_INPUT_KINDS = {"parameter": InputKind.PARAMETER, "buffer": InputKind.BUFFER, "constant": InputKind.CONSTANT_TENSOR,
                "user_input": InputKind.USER_INPUT}  # fmt: skip
# no "user_input_mutation" (graph.py writes it for a program that writes its inputs back: mixprec never makes one)
_OUTPUT_KINDS = {"user_output": OutputKind.USER_OUTPUT, "buffer_mutation": OutputKind.BUFFER_MUTATION}


NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,199}$")  # node, argument and signature names: plain identifiers
SYMBOL = re.compile(r"^s\d{1,6}$")  # a symbolic size (torch's backed size symbols)
DEVICE = re.compile(r"^(cpu|cuda|xpu|mps|meta)(:\d{1,3})?$")


def damaged(why: str) -> FileFormatError:
    return FileFormatError(f"the program's graph.json is damaged ({why}); load files only from mixprec.save.")


def dtype_of(name: str):
    dtype = getattr(torch, name, None) if re.match(r"^[a-z0-9_]{1,32}$", name) else None
    return dtype if isinstance(dtype, torch.dtype) and dtype_name(dtype) == name else None


def value_of(value, env: dict):
    """A checked argument as the Python value FX gets (node references resolved in ``env``)."""
    if isinstance(value, list):
        return [value_of(v, env) for v in value]
    if not isinstance(value, dict):
        return value
    ((tag, body),) = value.items()
    if tag == "node":
        return env[body]
    if tag == "tuple":
        return tuple(value_of(v, env) for v in body)
    if tag == "float":
        return float(body)
    if tag == "dtype":
        return dtype_of(body)
    if tag == "device":
        return torch.device(body)
    return LAYOUTS[body] if tag == "layout" else MEMORY_FORMATS[body]


# Allocations whose contents are whatever the allocator held (another tensor's data, freed memory): a program could
# return them. A file's are zero-filled (a ``zero_`` of the fresh tensor, which is dense: the whole storage), one of
# the contents ``empty`` allows. (``empty_strided`` and its kin, which leave gaps a view could read, are not loaded.)
_UNINITIALISED = frozenset({torch.ops.aten.empty.memory_format, torch.ops.aten.empty_like.default,
                            torch.ops.aten.new_empty.default})  # fmt: skip


def _zero_filled(graph: torch.fx.Graph) -> None:
    """Every uninitialised allocation of ``graph`` followed by a ``zero_`` that its users read instead (named by FX
    after the file's own names, which are all taken already)."""
    for node in [n for n in graph.nodes if n.op == "call_function" and n.target in _UNINITIALISED]:
        with graph.inserting_after(node):
            zeroed = graph.call_function(torch.ops.aten.zero_.default, (node,))
        node.replace_all_uses_with(zeroed, delete_user_cb=lambda user: user is not zeroed)


class Builder:
    def __init__(self, mode, shape_env):
        self.mode, self.shape_env = mode, shape_env
        self.by_name: dict[str, object] = {}  # symbol name -> SymInt
        self.bounds: dict = {}  # sympy symbol -> (min, max)

    # ---- graphs -----------------------------------------------------------------------------------------------

    def modules(self, graphs: list[list[dict]]) -> list[torch.fx.GraphModule]:
        """One GraphModule per parsed graph, bodies first (a body is always a later graph)."""
        built: dict[int, torch.fx.GraphModule] = {}
        for index in range(len(graphs) - 1, -1, -1):
            graph, holder, env = torch.fx.Graph(), torch.nn.Module(), {}
            for record in graphs[index]:
                op, name = record["op"], record["name"]
                if op == "placeholder":
                    node = graph.create_node("placeholder", name, name=name)
                elif op == "get_attr":
                    body = record["target"]["subgraph"]
                    attribute = f"subgraph_{body}"  # named here, never by the file
                    holder.add_module(attribute, built[body])
                    node = graph.create_node("get_attr", attribute, name=name)
                elif op == "call_function":
                    args = tuple(value_of(a, env) for a in record["args"])
                    kwargs = {k: value_of(v, env) for k, v in record["kwargs"].items()}
                    node = graph.create_node("call_function", operators.resolve(record["target"]), args, kwargs,
                                             name=name)  # fmt: skip
                    if "module_stack" in record:  # checked text (graph_reader._module_stack_ok)
                        node.meta["nn_module_stack"] = {k: (path, kind) for k, path, kind in record["module_stack"]}
                else:
                    (result,) = record["args"] if len(record["args"]) == 1 else (None,)
                    if len(record["args"]) != 1 or record["kwargs"]:
                        raise damaged(f"graph {index}'s output does not take one value")
                    node = graph.output(value_of(result, env))
                    continue
                if node.name != name:  # FX renamed it (a builtin's name, a clash): not a name FX can paste as is
                    raise damaged(f"the node name {name!r} is not one FX uses as is")
                env[name] = node
            _zero_filled(graph)
            try:
                built[index] = torch.fx.GraphModule(holder, graph)
            except Exception as e:  # FX's code generation on checked names and values
                raise damaged(f"graph {index} cannot be built ({type(e).__name__}: {str(e)[:200]})") from None
        return [built[i] for i in range(len(graphs))]

    # ---- symbols and inputs -----------------------------------------------------------------------------------

    def symbols(self, symbols) -> None:
        import sympy

        if not isinstance(symbols, dict) or len(symbols) > 10_000:
            raise damaged("symbols is not an object of reasonable size")
        for name, record in symbols.items():
            if not SYMBOL.match(name) or not isinstance(record, dict) or set(record) != {"hint", "min", "max"}:
                raise damaged(f"the symbol {name[:20]!r} is not a size symbol with a hint and a range")
            hint, low, high = record["hint"], record["min"], record["max"]
            if not all(type(n) is int for n in (hint, low)) or not (high is None or type(high) is int):
                raise damaged(f"the symbol {name!r}'s hint and range are not integers")
            if not 0 <= low <= hint < MAX_SIZE or high is not None and not hint <= high < 1 << 63:
                raise damaged(f"the symbol {name!r}'s hint is not a size inside its range")
            symbol = sympy.Symbol(name, integer=True, positive=True)
            self.shape_env.add_backed_var_to_val(symbol, hint)
            upper = _INFINITE if high is None else high
            self.shape_env.constrain_symbol_range(symbol, compiler_min=low, compiler_max=upper)
            self.by_name[name] = self.shape_env.create_symintnode(symbol, hint=hint)
            self.bounds[symbol] = (low, high)

    def size(self, value, what: str):
        if type(value) is int and 0 <= value < MAX_SIZE:
            return value
        if isinstance(value, str) and value in self.by_name:
            return self.by_name[value]
        raise damaged(f"{what} has a size that is neither a size nor a declared symbol")

    def placeholders(self, graph, signature, described, state, constants) -> list:
        if not isinstance(described, dict):
            raise damaged("inputs is not an object")
        nodes = [n for n in graph.nodes if n.op == "placeholder"]
        values = []
        for node, spec in zip(nodes, signature.input_specs):
            if spec.kind == InputKind.USER_INPUT:
                if node.name not in described:
                    raise damaged(f"the input {node.name!r} is not described")
                value = self.inputvalue_of(described[node.name], node.name)
            else:
                store = state if spec.target in state else constants
                value = self.mode.from_tensor(store[spec.target], static_shapes=True)
            node.meta["val"] = value
            values.append(value)
        if set(described) != {s.arg.name for s in signature.input_specs if s.kind == InputKind.USER_INPUT}:
            raise damaged("inputs describes other values than the program's inputs")
        return values

    def inputvalue_of(self, record, name: str):
        if not isinstance(record, dict) or len(record) != 1:
            raise damaged(f"the input {name!r} is not described by one tagged value")
        ((kind, body),) = record.items()
        if kind == "value" and (body is None or isinstance(body, (bool, int, str)) or type(body) is float):
            return body
        if kind == "symint":
            return self.size(body, f"the input {name!r}")
        fields = {"dtype", "shape", "device", "requires_grad", "memory_format", "strides"}
        if kind != "tensor" or not isinstance(body, dict) or set(body) != fields:
            raise damaged(f"the input {name!r} is not a described tensor or value")
        dtype = dtype_of(body["dtype"]) if isinstance(body["dtype"], str) else None
        shape, strides, layout = body["shape"], body["strides"], body["memory_format"]
        if dtype is None or not isinstance(body["device"], str) or not DEVICE.match(body["device"]):
            raise damaged(f"the input {name!r} has no known dtype or device")
        if not isinstance(shape, list) or len(shape) > 64 or not isinstance(body["requires_grad"], bool):
            raise damaged(f"the input {name!r}'s shape is not a list of at most 64 sizes")
        sizes = [self.size(s, f"the input {name!r}") for s in shape]
        device = torch.device(body["device"])
        if layout in ("contiguous_format", "channels_last") and strides is None:
            if layout == "channels_last" and len(sizes) != 4:
                raise damaged(f"the input {name!r} is channels_last but not 4-dimensional")
            return torch.empty(sizes, dtype=dtype, device=device, memory_format=getattr(torch, layout))
        if layout is not None or not isinstance(strides, list) or len(strides) != len(sizes):
            raise damaged(f"the input {name!r}'s strides do not match its sizes")
        steps = [s for s in strides if type(s) is int and 0 <= s < MAX_SIZE]
        if len(steps) != len(strides):
            raise damaged(f"the input {name!r}'s strides are not sizes")
        return torch.empty_strided(sizes, steps, dtype=dtype, device=device)

    def ranges(self) -> dict:
        from torch.fx.experimental.symbolic_shapes import symbol_is_type
        from torch.utils._sympy.symbol import SymT
        from torch.utils._sympy.value_ranges import ValueRanges

        ranges = {symbol: ValueRanges(low, _INFINITE if high is None else high)
                  for symbol, (low, high) in self.bounds.items()}  # fmt: skip
        for symbol, bounds in self.shape_env.var_to_range.items():
            if symbol_is_type(symbol, SymT.UNBACKED_INT) and symbol not in ranges:
                ranges[symbol] = bounds
        return ranges

    # ---- values: the graph run on fake tensors ----------------------------------------------------------------

    def run(self, module, inputs: list):
        """Run ``module``'s graph on fake ``inputs``, recording each node's value in ``node.meta["val"]``."""
        env = {}
        placeholders = iter(inputs)
        for node in module.graph.nodes:
            if node.op == "placeholder":
                value = next(placeholders, None)
                node.meta["val"] = value
            elif node.op == "get_attr":
                value = getattr(module, node.target)
            elif node.op == "output":
                return torch.fx.node.map_arg(node.args[0], lambda n: env[n])
            else:
                args = torch.fx.node.map_arg(node.args, lambda n: env[n])
                kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
                value = self.call(node, args, kwargs)
                node.meta["val"] = value
            env[node] = value
        return None

    def call(self, node, args, kwargs):
        target = node.target
        if isinstance(target, torch._ops.HigherOrderOperator):
            bodies = {"cond": ((1, 3), (2, 3)), "wrap_with_set_grad_enabled": ((1, None),),
                      "wrap_with_autocast": ((4, None),)}.get(target.name(), ())  # fmt: skip
            for position, operands in bodies:  # fill the bodies' values: the operands they are called with
                body = args[position] if position < len(args) else None
                if isinstance(body, torch.fx.GraphModule):
                    given = args[operands] if operands is not None else args[position + 1 :]
                    self.run(body, list(given) if isinstance(given, (list, tuple)) else [])
        elif not isinstance(target, torch._ops.OpOverload):
            return self.size_arithmetic(node, target, args, kwargs)
        try:
            declaration = kernels.declaration_of(target)
            if declaration is not None and not declaration.entry_checks:  # no check of mixprec's at the call
                kernels.check(declaration, kernels.bind(target, args, kwargs), static=True)
            return target(*args, **kwargs)
        except kernels.OperandError as e:  # what the operator's declaration refuses (ops/kernels.py)
            raise FileFormatError(f"the program's node {node.name!r} ({str(target)[:80]}) cannot run on what the file "
                                  f"gives it: {e}") from None  # fmt: skip
        except FileFormatError:
            raise
        except Exception as e:  # torch refuses the arguments or sizes the file gives this operator
            raise FileFormatError(
                f"the program's node {node.name!r} ({str(target)[:80]}) cannot run on what the file gives it "
                f"({type(e).__name__}: {(str(e).strip().splitlines() or ['no message'])[0][:200]})."
            ) from None

    def size_arithmetic(self, node, target, args, kwargs):
        return size_arithmetic.evaluate(node, target, args, kwargs)


# ---- the graph signature ------------------------------------------------------------------------------------


def build_signature(record, graph, state: dict, constants: dict) -> ExportGraphSignature:
    if not isinstance(record, dict) or set(record) != {"inputs", "outputs"}:
        raise damaged("the signature is not an object of inputs and outputs")
    placeholders = [n.name for n in graph.nodes if n.op == "placeholder"]
    inputs, outputs = record["inputs"], record["outputs"]
    if not isinstance(inputs, list) or [i.get("name") if isinstance(i, dict) else None for i in inputs] != placeholders:
        raise damaged("the signature's inputs are not the graph's inputs in order")
    if not isinstance(outputs, list):
        raise damaged("the signature's outputs are not a list")
    input_specs = []
    for entry in inputs:
        fields = {"kind", "arg", "name", "target", "persistent"}
        if set(entry) - {"value"} != fields or not isinstance(entry["kind"], str) or entry["kind"] not in _INPUT_KINDS:
            raise damaged("an input of the signature is not one mixprec writes")
        kind, target = _INPUT_KINDS[entry["kind"]], entry["target"]
        if kind == InputKind.USER_INPUT:
            if target is not None or entry["persistent"] is not None:
                raise damaged("a user input of the signature has a target")
        else:
            store = state if kind == InputKind.PARAMETER or entry["persistent"] is True else constants
            if not isinstance(target, str) or target not in store or entry["arg"] != "tensor":
                raise damaged(f"the signature reads a weight {str(target)[:80]!r} the file does not store")
            if kind == InputKind.BUFFER and not isinstance(entry["persistent"], bool):
                raise damaged("a buffer of the signature is neither persistent nor not")
            if kind == InputKind.PARAMETER and not isinstance(state[target], torch.nn.Parameter):
                raise damaged(f"the signature's parameter {target!r} is not stored as a parameter")
        input_specs.append(InputSpec(kind, _argument(entry), target, entry["persistent"]))
    output_specs = []
    for entry in outputs:
        if (not isinstance(entry, dict) or set(entry) - {"value"} != {"kind", "arg", "name", "target"}
                or not isinstance(entry["kind"], str) or entry["kind"] not in _OUTPUT_KINDS):  # fmt: skip
            raise damaged("an output of the signature is not one mixprec writes")
        target = entry["target"]
        dotted = isinstance(target, str) and strings.is_dotted_path(target) and len(target) < 1000
        if target is not None and not dotted:
            raise damaged("an output of the signature has a target that is not a dotted name")
        output_specs.append(OutputSpec(_OUTPUT_KINDS[entry["kind"]], _argument(entry), target))
    return ExportGraphSignature(input_specs=input_specs, output_specs=output_specs)


def _argument(entry):
    name, arg = entry["name"], entry["arg"]
    constant = arg == "constant" and name == ""  # a constant output (None, 3, "a" beside tensors): torch names it ""
    if not isinstance(name, str) or not (constant or NAME.match(name)):
        raise damaged("an input or output of the signature has a name that is not a plain identifier")
    if arg == "tensor" and "value" not in entry:
        return TensorArgument(name=name)
    if arg == "symint" and "value" not in entry:
        return SymIntArgument(name=name)
    value = entry.get("value")
    if arg == "constant" and (value is None or isinstance(value, (bool, int, str)) or type(value) is float):
        return ConstantArgument(name=name, value=value)
    raise damaged("an input or output of the signature is not a tensor, size or constant")
