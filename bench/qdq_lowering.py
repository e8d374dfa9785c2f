"""Inductor and the per-channel weight dequantize: ATen ops (issue 21's ATEN table) or the custom op (before)?

Issue 21 made one quantize/dequantize lowering table per target (src/mixprec/backends/lowering/qdq.py). Before
it, the inductor backend spelled only the per-tensor quantize/dequantize as ATen ops and left
``mixprec.dequantize_per_channel`` (int8 weights at use) as a custom op, which inductor runs as an opaque
eager call; the ATEN table spells all three. This measures both on the inductor backend, in one process,
interleaved (medians), and checks that the outputs are bit for bit the same:

  act int8:   x -> [Linear(W) int8 activations + int8 weights] x 4 (signed inputs: fake quantization)
  relu-net:   the same with ReLUs (layers 2-4 on oneDNN's int8 kernel, no weight dequantize left there)
  w-only:     [Linear(W) with int8 weights, float32 activations] x 4

Run: PYTHONPATH=src python bench/qdq_lowering.py [--width 512] [--rows 64] [--rounds 200] [--threads 1]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import warnings
from pathlib import Path
from types import MappingProxyType

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import interleaved, machine, stamp, table  # noqa: E402

import mixprec  # noqa: E402
from mixprec.backends.lowering import qdq  # noqa: E402
from mixprec.ir.passes import PassResult  # noqa: E402

# the test models (tests/models.py; bench/models.py has the same module name)
_spec = importlib.util.spec_from_file_location("test_models", Path(__file__).resolve().parents[1] / "tests" / "models.py")
_models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_models)
ReluNet = _models.ReluNet

CHANNEL = torch.ops.mixprec.dequantize_per_channel.default
BEFORE = qdq.Table("aten_before", MappingProxyType({k: v for k, v in qdq.ATEN.rules.items() if k is not CHANNEL}))


def compile_with(table, model, x, plan):
    """The inductor backend with ``table`` in place of the ATEN table."""
    run = qdq.QDQ_ATEN.run
    object.__setattr__(qdq.QDQ_ATEN, "run", lambda module: PassResult(bool(qdq.lower(module, table).lowered)))
    try:
        return mixprec.compile(model, (x,), plan=plan, backend="inductor")
    finally:
        object.__setattr__(qdq.QDQ_ATEN, "run", run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    print(f"{stamp()}\n{machine()}\nthreads: {args.threads}, width {args.width}, rows {args.rows}, "
          f"rounds {args.rounds}\n")
    rows = []
    cases = [
        ("act int8", dict(relu_in=False, relu=False), torch.int8),
        ("relu-net", dict(relu_in=False), torch.int8),
        ("w-only", dict(relu_in=False), torch.float32),
    ]
    for name, shape, activation in cases:
        torch.manual_seed(0)
        model = ReluNet(args.width, layers=4, **shape).eval()
        x = torch.randn(args.rows, args.width)
        configurator = mixprec.MixedPrecisionConfigurator(model)
        configurator.set_precision(torch.nn.Linear, activation=activation, param=torch.int8)
        plan = configurator.apply((x,))
        progs = {"ATen ops (ATEN table)": compile_with(qdq.ATEN, model, x, plan),
                 "custom op (before)": compile_with(BEFORE, model, x, plan)}
        with torch.inference_mode():
            outs = {k: p(x) for k, p in progs.items()}
        times = interleaved({k: (lambda p=p: p(x)) for k, p in progs.items()}, rounds=args.rounds)
        base = times["custom op (before)"]
        same = torch.equal(*outs.values())
        for variant, seconds in times.items():
            rows.append({"model": name, "per-channel dequantize": variant, "ms": seconds * 1e3,
                         "x before": base / seconds, "outputs identical": same})
    print(table(rows, ["model", "per-channel dequantize", "ms", "x before", "outputs identical"]))


if __name__ == "__main__":
    main()
