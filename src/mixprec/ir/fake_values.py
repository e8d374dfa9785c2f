"""The fake value ("val" meta) a node has after a dtype conversion, made without running an op.

Every pass that inserts a cast must give the new node the fake tensor ``val.to(dtype)`` would make. Running
``.to`` under the capture's FakeTensorMode costs 0.4-3 ms (the fake mode's dispatch and its cache lookup),
and a compile of BERT-base inserts ~570 of them: a quarter of a second of nothing. A dtype conversion changes
no shape, and ``_to_copy``'s memory format rule (``preserve_format``: the input's strides when it is
non-overlapping and dense, else contiguous) is what ``empty_like`` applies to a meta tensor, so the value is
built from metadata in ~30 us. Values with symbolic sizes (``dynamic_shapes``) keep the dispatch: their sizes
belong to the mode's shape environment.
"""

from __future__ import annotations

import contextlib

import torch
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensor


def converted(val: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What ``val.to(dtype)`` gives for a node's fake value (or a real tensor), as a value of the same mode."""
    if isinstance(val, FakeTensor) and _static(val):
        if _dense(val):  # preserve_format keeps a dense layout's strides as they are (size-1 dims' included)
            meta = torch.empty_strided(val.shape, val.stride(), dtype=dtype, device="meta")
        else:  # empty_like's rule (a meta kernel in Python: 0.2 ms, most of this function's time)
            meta = torch.empty_like(torch.empty_strided(val.shape, val.stride(), dtype=val.dtype, device="meta"),
                                    dtype=dtype)
        out = FakeTensor(val.fake_mode, meta, val.device)
        if val.requires_grad and torch.is_grad_enabled():  # as ``.to`` would record it
            out.requires_grad_(True)
        return out
    fake_mode = detect_fake_mode((val,))
    with fake_mode if fake_mode is not None else contextlib.nullcontext():
        return val.to(dtype)


def _dense(val: torch.Tensor) -> bool:
    """Contiguous or channels-last contiguous: non-overlapping and dense, decided by two C++ checks."""
    if val.is_contiguous():
        return True
    if val.dim() == 4:
        return val.is_contiguous(memory_format=torch.channels_last)
    return val.dim() == 5 and val.is_contiguous(memory_format=torch.channels_last_3d)


def _static(val: torch.Tensor) -> bool:
    return all(isinstance(s, int) for s in (*val.shape, *val.stride(), val.storage_offset()))
