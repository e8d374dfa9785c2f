"""The eager backend: run the rewritten graph op by op with PyTorch's own kernels.

Its graph passes (``backends/lowering``): int8 linear layers on oneDNN's int8 GEMM where this CPU computes it
exactly (non-negative inputs on every CPU, signed ones with VNNI/AMX; same numerics), then the run-time guard
when ``runtime_guard`` asks for it (``guard.py``), then those layers' input quantization in place
(``inplace.py``). The fake quantization of the other int8 layers runs as mixprec's custom ops, whose kernels compute
the arithmetic of ``ops/quant.py``.
"""

from __future__ import annotations

from ..ir import unlift
from .registry import register_backend
from .guard import guard_pass
from .lowering import run_passes
from .lowering.inplace import IN_PLACE_QUANTIZE
from .lowering.qdq import INT8_LINEARS
from .options import BackendOptions


@register_backend("eager")
def build(exported_program, options: BackendOptions | None = None):
    module = unlift.of_exported(exported_program)
    guard = guard_pass(options.runtime_guard if options is not None else None)
    run_passes(module, (INT8_LINEARS, guard, IN_PLACE_QUANTIZE))
    return module
