"""The eager backend: run the rewritten graph op by op with PyTorch's own kernels."""

from __future__ import annotations

from . import register_backend
from .guard import install


@register_backend("eager")
def build(exported_program, settings):
    module = exported_program.module()
    install(module, getattr(settings, "runtime_guard", None))  # runtime_guard="warn"|"raise": mixprec/guard.py
    return module
