"""Rule-based autocast (API.md §1 mode 2): gather what the rules need, once per compile.

``prepare`` turns the rule options (``plan/options.RuleOptions``) and the captured graph into a
:class:`~mixprec.plan.rules.RuleContext`:

* the low type (``autocast_low_precision_type``, or bf16 on CPU / fp16 on CUDA);
* calibration statistics of every node (``calibrate.statistics.calibrate``, run once by the caller)
  on the calibration dataloader or, when there is none, on the example inputs: they are real-scale data
  the user already has, unlike the random [-1, 1] data ModelOpt calibrates on by default,
  which misses the overflows real inputs cause;
* the stored tensors (parameters, buffers, lifted constants) with their absmax, followed
  through data-movement views (``t(weight)``), and the float scalars layers are called with;
* the depth of reduction of every layer (from shapes, no data needed);
* the layers that cannot run in the low type (the op fixes its output dtype), found by
  running each candidate op once on fake tensors in the low type.
* the code's fp32 intent (``plan/rules/intent.py``: what torch.autocast would run in fp32 because the
  code cast to fp32, asked for ``dtype=torch.float32``, disabled autocast, or looked up an
  embedding), the periodic functions and their arguments, and the additive mask input of each
  fused attention (which the IO-range rule judges as a mask);
* the include settings, which the autocast source applies over the rules (``sources/autocast_rules.py``).

It also warns about settings that do nothing here: exclusion or include patterns or ops that
match no layer (with near misses), layers both included and excluded, and fp16 on a CPU.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import warnings
from types import MappingProxyType

import torch
import torch.utils._pytree as pytree
from torch._guards import detect_fake_mode
from torch.export.graph_signature import InputKind

from ..calibrate.statistics import Calibration
from ..dtypes import cpu_runs_bf16_fast, default_low_precision, dtype_name, is_float
from ..errors import MixedPrecisionWarning
from ..ir.fake_values import converted
from ..ir.graph_info import GraphInfo
from ..ir.work_program import STORED_KINDS, WorkProgram
from ..ops.names import op_matches
from .options import RuleOptions
from .rules import ConstantValue, RuleContext
from .rules.intent import angle_layers, fp32_intent
from .rules.reduction import reduction_depth
from .rules.stored import stored_values
from .rules.stream import residual_stream
from .sources.autocast_rules import lowerable

_KIND_LABEL = {InputKind.PARAMETER: "parameter", InputKind.BUFFER: "buffer", InputKind.CONSTANT_TENSOR: "constant"}


@dataclasses.dataclass(frozen=True)
class Prepared:
    context: RuleContext
    calibration: Calibration


def prepare(
    work: WorkProgram, info: GraphInfo, config: RuleOptions, example_args: tuple, calibration: Calibration,
    *, warn_slow: bool = True,
) -> Prepared:
    """``example_args``: the flat user inputs of the example (their device is the program's);
    ``calibration``: the statistics of the one calibration (``calibrate.statistics.calibrate``: the loader's
    batches of any form and size, or the example inputs), which compile and search run before planning.
    ``warn_slow=False``: the caller measures the low type's speed itself (``weak_typing/speed.py``) and warns then."""
    device = device_of(work, example_args)
    low = config.low_precision_type or default_low_precision(device)
    if warn_slow and slow_on_cpu(low, device):
        warn_slow_on_cpu(low, stacklevel=5)  # compile (the user's line) -> _calibrate -> prepare -> here
    _warn_unmatched(info, config)
    nodes = {n.name: n for n in work.graph.nodes}
    constants = _constants(work, info)
    context = RuleContext(
        low=low,
        max_output_threshold=config.max_output_threshold,
        max_depth_of_reduction=config.max_depth_of_reduction,
        excluded_nodes=config.excluded_nodes,
        excluded_ops=config.excluded_ops,
        stats=calibration.stats,
        constants=MappingProxyType(constants),
        scalars=MappingProxyType(_scalars(nodes, info)),
        reduction_depths=MappingProxyType(_reduction_depths(nodes, info)),
        unlowerable=MappingProxyType(_unlowerable(nodes, info, low)),
        residual_stream=MappingProxyType(residual_stream(work.graph, info) if config.keep_residual_stream else {}),
        fp32_intent=MappingProxyType(fp32_intent(work.graph, info, embeddings=not config.low_precision_embeddings)),
        stored_values=MappingProxyType(stored_values(work.graph, info, _stored_labels(work, constants))),
        angles=MappingProxyType(angle_layers(work.graph, info)),
        attention_masks=MappingProxyType(_attention_masks(nodes, info)),
        included_nodes=config.included_nodes,
        included_ops=config.included_ops,
    )
    return Prepared(context, calibration)


def device_of(work: WorkProgram, example_args: tuple) -> torch.device:
    for leaf in pytree.tree_leaves(example_args):
        if isinstance(leaf, torch.Tensor):
            return leaf.device
    for spec in work.input_specs:
        if spec.kind in STORED_KINDS:
            return work.stored_tensor(spec).device
    return torch.device("cpu")


# Why a low type is slow on this CPU, by dtype: the numerics are still the low type's, so compiling is
# allowed (useful to preview a GPU or bf16-CPU deployment), but the user should know.
_SLOW_ON_CPU = MappingProxyType({
    # The CPU's flags are not the question: this project's CPUs report avx512_fp16 and PyTorch's
    # fp16 kernels are still 5-30x slower than fp32 there (most ops convert to fp32 and back).
    torch.float16: "PyTorch's CPU float16 kernels are emulated for most ops and run several times slower than "
    "float32, even on CPUs that report avx512_fp16. The numerics are those of fp16 (useful to preview a GPU "
    "deployment); for speed on a CPU use bfloat16 (the default there).",
    # bf16 is the CPU default because it is fast where oneDNN has bf16 kernels (AVX-512, AMX); on an
    # AVX2-only CPU PyTorch emulates it and a bf16 matmul measured 65.7x the fp32 time.
    torch.bfloat16: "this CPU has no bf16 kernels (PyTorch's oneDNN reports no bf16 support: no AVX-512 or AMX), "
    "so PyTorch emulates bfloat16 and bf16 layers run many times slower than float32. The numerics are those of "
    "bf16 (useful to preview a deployment on a bf16 CPU or GPU); for speed on this CPU keep float32 (compile "
    "without enable_autocast).",
})


def slow_on_cpu(low: torch.dtype, device: torch.device) -> bool:
    """Whether PyTorch's kernels emulate ``low`` on this CPU (fp16 always; bf16 without oneDNN's bf16)."""
    return device.type == "cpu" and (low == torch.float16 or (low == torch.bfloat16 and not cpu_runs_bf16_fast()))


def warn_slow_on_cpu(low: torch.dtype, *, stacklevel: int) -> None:
    """``stacklevel``: the frames from here up to the user's compile call."""
    warnings.warn(
        f"autocast_low_precision_type={dtype_name(low)} on a CPU: {_SLOW_ON_CPU[low]}", MixedPrecisionWarning,
        stacklevel=stacklevel,
    )


def _warn_unmatched(info: GraphInfo, config: RuleOptions) -> None:
    modules = sorted({n.module for n in info.values() if n.module})
    names = list(info)
    for setting in ("excluded_nodes", "included_nodes"):
        for pattern in getattr(config, setting):
            if not (any(pattern.match(m) for m in modules) or any(pattern.match(n) for n in names)):
                _warn_matches_nothing(
                    f"{RuleOptions.keyword(setting)} pattern '{pattern.pattern}' matches no layer's module path or node name",
                    pattern.pattern.strip("^$"), modules + names, 0.5,
                    "it is applied with re.match, e.g. '^encoder\\.layers\\.0\\.' or '^linear2$'",
                )
    ops = sorted({n.op for n in info.values()})
    for setting in ("excluded_ops", "included_ops"):
        for op in sorted(getattr(config, setting)):
            if not any(op_matches(name, frozenset({op})) for name in ops):
                _warn_matches_nothing(
                    f"{RuleOptions.keyword(setting)} names '{op}', which no layer of this model uses", op, ops, 0.6,
                    "the report's 'op' column lists the ops the model runs",
                )
    _warn_included_and_excluded(info, config)


def _warn_matches_nothing(what: str, wanted: str, known: list[str], cutoff: float, hint: str) -> None:
    near = difflib.get_close_matches(wanted, known, n=3, cutoff=cutoff)
    warnings.warn(
        what + (f" (near misses: {', '.join(repr(n) for n in near)})" if near else "") + f"; {hint}.",
        MixedPrecisionWarning,
        stacklevel=6,  # the user's compile call, through _calibrate and prepare
    )


def _warn_included_and_excluded(info: GraphInfo, config: RuleOptions) -> None:
    """A layer named by an include and an exclude stays fp32 (the exclude wins); say which patterns collide."""
    if not (config.included_nodes or config.included_ops):
        return
    clashes: dict[tuple[str, str], list[str]] = {}
    for name, node in info.items():
        inc = _named_by(node, config.included_nodes, config.included_ops)
        exc = _named_by(node, config.excluded_nodes, config.excluded_ops)
        if inc is not None and exc is not None:
            clashes.setdefault((inc, exc), []).append(name)
    for (inc, exc), layers in clashes.items():
        shown = ", ".join(layers[:5]) + (f" and {len(layers) - 5} more" if len(layers) > 5 else "")
        warnings.warn(
            f"{shown} {'is' if len(layers) == 1 else 'are'} both included by {inc} and excluded by {exc}; "
            "the exclusion wins and they stay float32. Narrow one of the two patterns.",
            MixedPrecisionWarning,
            stacklevel=6,  # the user's compile call, through _calibrate and prepare
        )


def _named_by(node, patterns, ops) -> str | None:
    for pattern in patterns:
        if pattern.match(node.module) or pattern.match(node.name):
            return f"pattern '{pattern.pattern}'"
    hit = op_matches(node.op, ops) if ops else None
    return f"op '{hit}'" if hit is not None else None


def _finite_absmax(tensor: torch.Tensor) -> float:
    if tensor.numel() == 0:
        return 0.0
    with torch.no_grad():
        lo, hi = torch.aminmax(tensor.detach())
        lo, hi = float(lo), float(hi)
        if math.isfinite(lo) and math.isfinite(hi):
            return max(abs(lo), abs(hi))
        finite = tensor[torch.isfinite(tensor)]
        return float(finite.abs().max()) if finite.numel() else 0.0


def _constants(work: WorkProgram, info: GraphInfo) -> dict[str, ConstantValue]:
    """Stored float tensors by placeholder name, and data-movement views of them by node name."""
    out: dict[str, ConstantValue] = {}
    for node in work.placeholders():
        spec = work.input_spec_of(node)
        if spec is None or spec.kind not in STORED_KINDS:
            continue
        tensor = work.stored_tensor(spec)
        if isinstance(tensor, torch.Tensor) and is_float(tensor.dtype):
            out[node.name] = ConstantValue(f"{_KIND_LABEL[spec.kind]} '{spec.target}'", _finite_absmax(tensor))
    for name, node in info.items():
        if node.kind != "movement":
            continue
        floats = [p for p, d in node.input_dtypes.items() if is_float(d)]
        if floats and all(p in out for p in floats):
            biggest = max((out[p] for p in floats), key=lambda c: c.absmax)
            out[name] = biggest
    return out


def _stored_labels(work: WorkProgram, constants: dict[str, ConstantValue]) -> dict[str, str]:
    """Stored placeholders (float or not: an integer index buffer is stored too) -> how the report names them."""
    out = {}
    for node in work.placeholders():
        spec = work.input_spec_of(node)
        if spec is not None and spec.kind in STORED_KINDS:
            out[node.name] = constants[node.name].label if node.name in constants else (
                f"{_KIND_LABEL[spec.kind]} '{spec.target}'")
    return out


def _scalars(nodes: dict, info: GraphInfo) -> dict[str, tuple[float, ...]]:
    out = {}
    for name in info:
        node = nodes[name]
        values = [
            v
            for v in pytree.tree_leaves((node.args, node.kwargs))
            if isinstance(v, float) and math.isfinite(v)
        ]
        if values:
            out[name] = tuple(values)
    return out


def _attention_masks(nodes: dict, info: GraphInfo) -> dict[str, str]:
    """Fused attention layer -> the name of its float ``attn_mask`` input (additive mask)."""
    out = {}
    for name, layer in info.items():
        if layer.packet != "aten.scaled_dot_product_attention":
            continue
        node = nodes[name]
        mask = node.args[3] if len(node.args) > 3 else node.kwargs.get("attn_mask")
        if isinstance(mask, torch.fx.Node) and is_float(layer.input_dtypes.get(mask.name, torch.bool)):
            out[name] = mask.name
    return out


def _reduction_depths(nodes: dict, info: GraphInfo) -> dict[str, int]:
    def shape_of(value):
        metas = info.tensor_meta.get(value.name, ()) if isinstance(value, torch.fx.Node) else ()
        return metas[0].shape if len(metas) == 1 else None

    out = {}
    for name in info:
        depth = reduction_depth(nodes[name], shape_of)
        if depth is not None:
            out[name] = depth
    return out


def _unlowerable(nodes: dict, info: GraphInfo, low: torch.dtype) -> dict[str, str]:
    """Candidate layers whose outputs do not all become ``low`` when their float inputs are ``low``."""
    out = {}
    seen: dict = {}  # the answer depends on the op, its argument dtypes and ranks and its other arguments
    for name, node_info in info.items():
        if node_info.kind != "compute" or node_info.precision != torch.float32 or not lowerable(node_info):
            continue
        key = _signature(nodes[name])
        if key is None or key not in seen:
            why = _probe(nodes[name], low)
            if key is not None:
                seen[key] = why
        else:
            why = seen[key]
        if why is not None:
            out[name] = why
    return out


def _signature(node: torch.fx.Node):
    """A hashable description of a call that decides its dtype behaviour (not its sizes), or None."""

    def describe(a):
        if isinstance(a, torch.fx.Node):
            val = a.meta.get("val")
            return ("tensor", val.dtype, val.dim()) if isinstance(val, torch.Tensor) else ("node", type(val).__name__)
        if isinstance(a, (list, tuple)):
            return tuple(describe(x) for x in a)
        if isinstance(a, (int, float, bool, str, type(None), torch.dtype, torch.device)):
            return a if not isinstance(a, float) or a == a else "nan"
        return ("other", type(a).__name__)

    try:
        key = (node.target, describe(node.args), tuple(sorted((k, describe(v)) for k, v in node.kwargs.items())))
        hash(key)
    except TypeError:
        return None
    return key


def _probe(node: torch.fx.Node, low: torch.dtype) -> str | None:
    vals = [n.meta.get("val") for n in node.all_input_nodes]
    fake_mode = detect_fake_mode(tuple(v for v in vals if isinstance(v, torch.Tensor)))
    if fake_mode is None:
        return None
    with fake_mode:

        def lowered(n):
            val = n.meta.get("val")
            if isinstance(val, torch.Tensor) and is_float(val.dtype):
                return converted(val, low)
            return val

        args = torch.fx.node.map_arg(node.args, lowered)
        kwargs = torch.fx.node.map_arg(node.kwargs, lowered)
        try:
            result = node.target(*args, **kwargs)
        except Exception as e:  # the op rejects low-precision inputs
            return f"the op rejects {dtype_name(low)} inputs ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
    produced = [t.dtype for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor) and is_float(t.dtype)]
    others = sorted({dtype_name(d) for d in produced if d != low})
    if others:
        return f"given {dtype_name(low)} inputs it still produces {', '.join(others)} (its arguments or definition fix that dtype)"
    return None
