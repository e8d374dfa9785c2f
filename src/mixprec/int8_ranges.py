"""(min, max) of chosen graph values over calibration data: the ranges of int8 quantization.

int8 regions without dynamic ranges (``start_setting_precision(x, torch.int8)``) and int8
requests of the configurator quantize with the range each value takes on calibration data
— the compile's ``autocast_calibration_dataloader`` or, without one, the example inputs.
The graph is run as captured (the model's own dtypes), op by op, and only the running
min/max of the requested values is kept, never the tensors.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

import torch
import torch.utils._pytree as pytree
from torch.export.graph_signature import InputKind

from .errors import CalibrationError
from .program import STORED_KINDS, WorkProgram

Range = tuple[float, float]


def calibration_batches(loader, example_inputs: tuple) -> Iterable[tuple]:
    """The batches to calibrate on: the loader's (a batch may be a tuple, a list or one tensor), else the example."""
    if loader is None:
        return [tuple(example_inputs)]
    return (tuple(b) if isinstance(b, (tuple, list)) else (b,) for b in loader)


def collect_ranges(work: WorkProgram, names: Collection[str], batches: Iterable[tuple]) -> dict[str, Range]:
    """Running (min, max) of the named nodes' values over every batch."""
    wanted = set(names)
    if not wanted:
        return {}
    missing = wanted - {n.name for n in work.graph.nodes}
    if missing:
        raise KeyError(f"no graph values named {sorted(missing)}")
    recorder = _Recorder(work.graph_module, wanted)
    count = 0
    with torch.no_grad():
        for batch in batches:
            recorder.run(*_flat_args(work, batch, count), enable_io_processing=False)
            count += 1
    if count == 0:
        raise CalibrationError("the calibration data holds no batches; give at least one input tuple.")
    return {name: recorder.ranges[name] for name in sorted(wanted)}


class _Recorder(torch.fx.Interpreter):
    def __init__(self, gm: torch.fx.GraphModule, wanted: set[str]):
        super().__init__(gm)
        self.wanted = wanted
        self.ranges: dict[str, Range] = {}

    def run_node(self, node):
        result = super().run_node(node)
        if node.name in self.wanted:
            if not isinstance(result, torch.Tensor) or not result.is_floating_point():
                raise CalibrationError(f"{node.name} does not hold one floating-point tensor; it has no int8 range.")
            finite = result.detach()[result.isfinite()]
            if finite.numel():
                lo, hi = finite.min().item(), finite.max().item()
                old = self.ranges.get(node.name)
                self.ranges[node.name] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))
            else:
                self.ranges.setdefault(node.name, (0.0, 0.0))
        return result


def _flat_args(work: WorkProgram, batch: tuple, index: int) -> list:
    leaves = pytree.tree_leaves(batch)
    n_user = sum(1 for s in work.input_specs if s.kind == InputKind.USER_INPUT)
    if len(leaves) != n_user:
        raise CalibrationError(
            f"calibration batch {index} holds {len(leaves)} input value(s); the model takes {n_user}. Each batch "
            "must be the tuple of forward's positional arguments, like the example inputs."
        )
    users = iter(leaves)
    args = []
    for spec in work.input_specs:
        if spec.kind in STORED_KINDS:
            args.append(work.stored_tensor(spec))
        elif spec.kind == InputKind.USER_INPUT:
            args.append(next(users))
        else:
            raise CalibrationError(f"mixprec cannot calibrate a program with {spec.kind.name} inputs.")
    return args
