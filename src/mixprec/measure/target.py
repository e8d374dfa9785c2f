"""What a measurement holds for: the backend, the device, the machine and the library versions it ran on.

A cost measured on one CPU says nothing about another (flags are not speed: DESIGN.md's CPU facts), nor across a
torch or OpenVINO release (their kernels change), nor at another thread count. So every measurement is kept under
its :class:`Target`: backend, device, CPU model and a digest of its flags (or the accelerator's name), torch's
version and CPU capability, OpenVINO's version for the openvino backend, and torch's thread count.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import platform

import torch

_CPUINFO_BYTES = 1 << 16  # /proc/cpuinfo's first processor is a few KB; nothing past this is read


@dataclasses.dataclass(frozen=True)
class Target:
    backend: str  # "eager", "inductor", "openvino"
    device: str  # "cpu", "cuda:0"
    machine: str  # the CPU's model name (or the accelerator's name)
    flags: str  # digest of the CPU's flags and torch's CPU capability ("" on an accelerator)
    torch: str
    openvino: str | None  # for the openvino backend: its version
    threads: int  # torch's intra-op threads when measured

    def key(self) -> str:
        """The target as one line of text: the cost cache's key (``cost_file.py``)."""
        return "|".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self))

    def describe(self) -> str:
        ov = f", openvino {self.openvino}" if self.openvino else ""
        return (f"{self.backend} on {self.device} ({self.machine}), torch {self.torch}{ov}, "
                f"{self.threads} thread(s)")


def target_of(backend: str | None, device) -> Target:
    """The target of a measurement made now for ``backend`` (None: eager) on ``device``."""
    backend = backend or "eager"
    device = torch.device(device)
    if device.type == "cpu":
        model, flags = _cpu()
        where = "cpu"
    else:
        name = getattr(getattr(torch, device.type, None), "get_device_name", None)
        model = name(device) if name is not None else device.type
        flags, where = "", str(device)
    openvino = _version("openvino") if backend == "openvino" else None
    return Target(backend, where, model, flags, torch.__version__, openvino, torch.get_num_threads())


@functools.lru_cache(maxsize=1)
def _cpu() -> tuple[str, str]:
    """(model name, digest of flags + torch's CPU capability) of this CPU."""
    model, flags = "", ""
    try:
        with open("/proc/cpuinfo", "rb") as fh:
            text = fh.read(_CPUINFO_BYTES).decode("utf-8", "replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        name, _, value = line.partition(":")
        name = name.strip()
        if name == "model name" and not model:
            model = value.strip()
        elif name in ("flags", "Features") and not flags:
            flags = " ".join(sorted(value.split()))
    model = model or f"{platform.machine()} {platform.processor()}".strip()
    capability = torch.backends.cpu.get_cpu_capability()
    digest = hashlib.sha256(f"{flags}|{capability}".encode()).hexdigest()[:16]
    return model[:200], f"{capability}:{digest}"


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None
