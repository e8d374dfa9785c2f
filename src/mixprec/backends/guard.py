"""The run-time guard (``runtime_guard="warn"|"raise"``, a mixprec extension).

Autocast decides from calibration data. When the data a program later runs on is larger
than what calibration saw (calibrated on short prompts, run on long ones; calibrated on
normalised inputs, run on raw ones), a layer lowered to fp16 can overflow, and the output
is wrong without any error. The guard checks, at every call, the output of every
low-precision compute layer: its largest magnitude (one ``aminmax`` per layer, a single read
of the tensor, no temporary: far cheaper on CPU bf16 than ``linalg_vector_norm(x, inf)`` or
``abs().amax()``) must be finite and below half the low type's largest value (fp16: 32752;
``x*x`` of such a value already overflows). All layers' maxima are compared in one batched check
at the end of the call: one small reduction per lowered layer and one host synchronisation per
call (its cost: ``python -m bench run readme``; bench/log/2026-11.md, "Autocast against
torch.autocast on 27 transformers architectures").

The first failing layer is named with its module path, op and what was seen; "warn" issues a
:class:`~mixprec.MixedPrecisionWarning`, "raise" raises :class:`~mixprec.RuntimeGuardError`.

Works on the eager backend's ``GraphModule`` as a backend pass (:func:`guard_pass`, ``backends/lowering``):
nodes are added after the checked layers, the model's own nodes are not changed (:func:`install` shows the
graph before and after); the check node's role is "guard" (the verifier's fake-tensor re-run skips it: it
reads values, it has no dtype).
"""

from __future__ import annotations

import contextlib
import math
import warnings

import torch
from torch._guards import detect_fake_mode

from ..dtypes import LOW_PRECISION_FLOATS, dtype_name
from ..errors import MixedPrecisionWarning, RuntimeGuardError
from ..ir.graph_info import META_ROLE, analyze
from ..ir.passes import GraphPass, PassResult

MODES = ("warn", "raise")


class _Check:
    """The call-time check: a plain callable so the GraphModule's generated code can call it."""

    __name__ = "mixprec_runtime_guard"

    def __init__(self, labels: tuple[str, ...], limits: tuple[float, ...], mode: str):
        self.labels = labels
        self.limits = torch.tensor(limits, dtype=torch.float32)
        self.mode = mode

    def __call__(self, ranges) -> None:
        lows = torch.stack([r[0].float() for r in ranges])
        highs = torch.stack([r[1].float() for r in ranges])
        values = torch.maximum(-lows, highs)  # NaN propagates
        limits = self.limits.to(values.device)
        bad = ~(values < limits)  # NaN compares false: caught too
        if not bool(bad.any()):
            return
        index = int(bad.nonzero()[0, 0])
        value = float(values[index])
        if math.isfinite(value):
            seen = (f"values up to {value:.4g}, near its type's largest finite value "
                    f"(guard limit {float(limits[index]):.4g})")
        else:
            seen = "inf/NaN" if math.isnan(value) or math.isinf(value) else str(value)
        count = int(bad.sum())
        more = f" ({count - 1} more layer(s) after it too)" if count > 1 else ""
        message = (
            f"runtime guard: low-precision layer {self.labels[index]} produced {seen}{more}. The calibration data did "
            "not show values this large; keep the layer in fp32 (autocast_excluded_nodes or a plan entry) or "
            "calibrate on real-scale data (autocast_calibration_dataloader)."
        )
        if self.mode == "raise":
            raise RuntimeGuardError(message)
        warnings.warn(message, MixedPrecisionWarning, stacklevel=2)


def install(module: torch.fx.GraphModule, mode: str | None) -> int:
    """Add the checks to ``module`` in place (a GraphModule the backend just built); returns how many
    layers are checked. ``mode`` None leaves the module as it is. Before::

        linear = aten.linear(x_fp16, w_fp16)
        ...
        return (out,)

    After::

        linear = aten.linear(x_fp16, w_fp16)
        aminmax_default = aten.aminmax(linear)
        ...
        mixprec_runtime_guard((aminmax_default, ...))
        return (out,)
    """
    if mode is None:
        return 0
    graph = module.graph
    info = analyze(graph)
    checked = []
    for node in list(graph.nodes):
        layer = info.get(node.name)
        if layer is None or layer.kind != "compute" or len(layer.outputs) != 1 or not isinstance(
            node.meta.get("val"), torch.Tensor
        ):
            continue
        dtype = layer.outputs[0].dtype
        if dtype not in LOW_PRECISION_FLOATS:
            continue
        with graph.inserting_after(node):
            maximum = graph.call_function(torch.ops.aten.aminmax.default, (node,))
        maximum.meta["val"] = _fake_aminmax(node.meta["val"])
        details = ([f"module {layer.module}"] if layer.module else []) + [layer.op, dtype_name(dtype)]
        checked.append((maximum, f"{node.name} ({', '.join(details)})", torch.finfo(dtype).max / 2))
    if not checked:
        return 0
    output = next(n for n in graph.nodes if n.op == "output")
    check = _Check(tuple(c[1] for c in checked), tuple(c[2] for c in checked), mode)
    with graph.inserting_before(output):
        node = graph.call_function(check, (tuple(c[0] for c in checked),))
    node.meta.update({"val": None, META_ROLE: "guard"})
    module.recompile()
    return len(checked)


def _fake_aminmax(val):
    fake_mode = detect_fake_mode((val,))
    with fake_mode if fake_mode is not None else contextlib.nullcontext():
        return torch.ops.aten.aminmax.default(val)


def guard_pass(mode: str | None) -> GraphPass:
    """:func:`install` as a backend pass (``backends/lowering.run_passes``)."""
    return GraphPass("runtime_guard", lambda module: PassResult(install(module, mode) > 0), stage="backend")
