"""The eager backend: run the rewritten graph op by op with PyTorch's own kernels."""

from __future__ import annotations

from . import register_backend
from .guard import install
from .int8_kernels import lower_int8_linears


@register_backend("eager")
def build(exported_program, settings):
    module = exported_program.module()
    lower_int8_linears(module)  # int8 layers with non-negative inputs on the int8 GEMM, same numerics
    install(module, getattr(settings, "runtime_guard", None))  # runtime_guard="warn"|"raise": guard.py
    return module
