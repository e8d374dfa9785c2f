"""The eager backend: run the rewritten graph op by op with PyTorch's own kernels."""

from __future__ import annotations

from . import register_backend


@register_backend("eager")
def build(exported_program, settings):
    return exported_program.module()
