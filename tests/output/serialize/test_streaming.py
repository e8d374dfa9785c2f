"""Save and load stream (issue 11, item 6): no second copy of the weights in memory.

Peak memory is the process's RSS high-water mark (VmHWM, reset through /proc/self/clear_refs just before the
call): tensors live outside Python's allocator, so tracemalloc would not see a copy of them.
"""

from __future__ import annotations

import gc

import pytest
import torch

import mixprec


def _status(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(key)


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def _can_measure() -> bool:
    try:
        _reset_peak()
        _status("VmHWM")
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _can_measure(), reason="needs Linux /proc/self/clear_refs (CI runs on Linux)")
def test_save_and_load_hold_no_second_copy(tmp_path):
    model = torch.nn.Linear(4096, 4096).eval()  # 64 MiB of weights
    prog = mixprec.compile(model, (torch.randn(2, 4096),))
    del model
    path = tmp_path / "big.mixprec.pt2"
    gc.collect()
    before = _status("VmRSS")
    _reset_peak()
    mixprec.save(prog, path)
    save_extra = _status("VmHWM") - before
    size = path.stat().st_size
    del prog
    gc.collect()
    _reset_peak()
    loaded = mixprec.load(path)
    load_extra = _status("VmHWM") - _status("VmRSS")  # the loaded weights are the result, not extra
    assert loaded.exported_program.state_dict["weight"].shape == (4096, 4096)
    # before streaming: save held the archive twice (BytesIO + getvalue) and load held the file's bytes
    assert save_extra < 0.1 * size, f"save took {save_extra / 2**20:.1f} MiB extra for a {size / 2**20:.1f} MiB file"
    assert load_extra < 0.1 * size, f"load took {load_extra / 2**20:.1f} MiB extra for a {size / 2**20:.1f} MiB file"
