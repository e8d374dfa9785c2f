"""int8 linear layers on oneDNN's int8 GEMM: is it exact here, and is it faster than fp32? (issue 14)

Part 1, the kernel (``torch.ops.onednn.qlinear_pointwise``, u8 activations with a zero point, s8
per-channel weights packed by ``qlinear_prepack``) against fp32 ``F.linear`` at M x K x N, and its
error against exact integer arithmetic (fp64 of the same int8 grid values):
  (a) the full signed activation grid [-127, 127] (zero point 128), s8 weights [-127, 127];
  (b) 7-bit activations [0, 127] (zero point 0) — what a non-negative input quantizes to.
Without VNNI the kernel adds pairs of u8*s8 products in int16 (vpmaddubsw) and saturates in (a).

Part 2, whole programs through ``mixprec.compile`` (configurator: every Linear at activation int8,
today's int8 numerics) on the eager and inductor backends vs the fp32 model in eager PyTorch (and
the fp32 model compiled by mixprec on inductor), plus
today's fake quantization (the rewritten ExportedProgram's own module, as the eager backend ran it
before this lowering) for reference:
  relu-net:       x -> [Linear(1024) + ReLU] x 4      (layer 1 reads the signed input: stays fake quant)
  relu-in:        x -> ReLU -> [Linear(1024) + ReLU] x 4   (every layer's input is non-negative)
  plain:          x -> Linear(1024) x 4               (signed inputs everywhere: nothing lowered)
Also the error of each program vs fp32 eager, vs today's fake quantization, and vs "exact sums": today's
program with every linear summed in fp64 and rounded once (the int8 grid, the same scales, exact sums).
A float32 rounding difference moves an element to the neighbouring grid point when the next quantization
meets it near a rounding boundary, so the comparisons count the elements that differ.

Part 3 (``--region``, issue 34), a transformer's MLP region: [Linear(768, 3072) + GELU + Linear(3072, 768)] x 2 on
2x128 tokens and on 1 token, every Linear int8 (signed inputs: on the kernel with VNNI), on eager, inductor and
OpenVINO vs fp32 eager, interleaved; then where the time goes (torch.profiler, 3 calls): the int8 GEMM
(onednn::qlinear_pointwise), the custom op's own overhead, the input quantization (div, round, add, clamp, the
conversion to u8, and the smoothing multiplication: "elementwise"), the rest. Programs are compiled with int8_require_speedup=False
(the int8 layers themselves are timed, not the speed gate's choice).

Run: PYTHONPATH=src python bench/int8_kernels.py [--rows 1024] [--rounds 15] [--threads 2] [--region]
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import interleaved, machine, stamp, table  # noqa: E402

# bench/ (this script's directory, first on sys.path) holds an openvino.py that would shadow the openvino package
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import mixprec  # noqa: E402
from mixprec.backends.lowering import onednn  # noqa: E402
from mixprec.ops.quant import UINT8_7BIT, quantize  # noqa: E402

# the test models (tests/models.py; bench/models.py has the same module name)
_spec = importlib.util.spec_from_file_location("test_models", Path(__file__).resolve().parents[1] / "tests" / "models.py")
_test_models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_test_models)
ReluNet = _test_models.ReluNet


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def kernel_part(m: int, k: int, n: int, rounds: int) -> None:
    print(f"\n### Kernel: {m}x{k} @ {k}x{n}, int8 qlinear_pointwise vs fp32 F.linear")
    gen = torch.Generator().manual_seed(0)
    w_q = torch.randint(-127, 128, (n, k), generator=gen).to(torch.int8)
    w_scales = torch.rand(n, generator=gen) * 0.01 + 0.001
    x_scale = 0.02
    zero_points = torch.zeros(n, dtype=torch.int64)
    bias = torch.randn(n, generator=gen)
    packed = torch.ops.onednn.qlinear_prepack(w_q, [m, k])

    def qlinear(u8, zp):
        return torch.ops.onednn.qlinear_pointwise(
            u8, x_scale, zp, packed, w_scales, zero_points, bias, 1.0, 0, torch.float32, "none", [], ""
        )

    def exact(q_int):  # fp64 of the int8 grid: exact integer sums, scaled once
        return (q_int.double() @ w_q.double().t()) * x_scale * w_scales.double()[None, :] + bias.double()

    signed = torch.randint(-127, 128, (m, k), generator=gen)
    seven = torch.randint(0, 128, (m, k), generator=gen)
    u8_signed = (signed + 128).to(torch.uint8)
    u8_seven = seven.to(torch.uint8)
    x_f = seven.float() * x_scale
    w_f = w_q.float() * w_scales[:, None]
    err_signed = rel_l2(qlinear(u8_signed, 128), exact(signed))
    err_seven = rel_l2(qlinear(u8_seven, 0), exact(seven))
    err_fp32 = rel_l2(torch.nn.functional.linear(x_f, w_f, bias), exact(seven))
    # signed activations exactly, as two 7-bit GEMMs: q = max(q, 0) - max(-q, 0), both in [0, 127]
    no_bias = torch.zeros(n)
    q_pos, q_neg = signed.clamp(min=0).to(torch.uint8), (-signed).clamp(min=0).to(torch.uint8)

    def two_gemms():
        neg = torch.ops.onednn.qlinear_pointwise(
            q_neg, x_scale, 0, packed, w_scales, zero_points, no_bias, 1.0, 0, torch.float32, "none", [], ""
        )
        return qlinear(q_pos, 0).sub_(neg)

    err_two = rel_l2(two_gemms(), exact(signed))
    times = interleaved(
        {
            "fp32 F.linear": lambda: torch.nn.functional.linear(x_f, w_f, bias),
            "int8 qlinear (7-bit act)": lambda: qlinear(u8_seven, 0),
            "int8 quantize + qlinear": lambda: qlinear(quantize(x_f, x_scale, UINT8_7BIT), 0),
            "int8 signed as two 7-bit GEMMs": two_gemms,
        },
        rounds=rounds,
    )
    base = times["fp32 F.linear"]
    rows = [{"variant": name, "ms": t * 1e3, "vs fp32": f"{base / t:.2f}x"} for name, t in times.items()]
    print(table(rows, ["variant", "ms", "vs fp32"]))
    print(f"rel-L2 vs exact integer arithmetic: (a) full signed grid, zp 128: {err_signed:.3g}; "
          f"(b) 7-bit activations, zp 0: {err_seven:.3g}; fp32 F.linear on (b)'s grid values: {err_fp32:.3g}; "
          f"(a) as two 7-bit GEMMs: {err_two:.3g}")


class _ExactSums(torch.fx.Interpreter):
    """Runs today's fake-quant program with every linear summed in fp64 and rounded once to float32:
    the program on the int8 grid with exact integer sums (the reference an int8 kernel should meet)."""

    def call_function(self, target, args, kwargs):
        if target is torch.ops.aten.linear.default:
            x, w, *rest = args
            b = rest[0] if rest else None
            return torch.nn.functional.linear(x.double(), w.double(), None if b is None else b.double()).float()
        return super().call_function(target, args, kwargs)


def grid_steps_off(out: torch.Tensor, ref: torch.Tensor) -> str:
    """Share of output elements that differ from the fp64-sum reference (each by one grid step at most)."""
    return f"{float((out != ref).double().mean()):.2%}"


def program_part(rows_: int, width: int, layers: int, rounds: int) -> None:
    print(f"\n### Whole programs: {layers} x Linear({width}), input {rows_}x{width}, configurator activation=int8")
    torch.manual_seed(0)
    x = torch.randn(rows_, width)
    out_rows = []
    for name, model in (
        ("relu-net", ReluNet(width, layers, relu_in=False)),
        ("relu-in", ReluNet(width, layers, relu_in=True)),
        ("plain", ReluNet(width, layers, relu_in=False, relu=False)),
    ):
        model.eval()
        cfg = mixprec.MixedPrecisionConfigurator(model)
        cfg.set_precision(torch.nn.Linear, activation="int8")
        plan = cfg.apply((x,))
        eager = mixprec.compile(model, (x,), plan=plan, backend="eager", int8_require_speedup=False)
        inductor = mixprec.compile(model, (x,), plan=plan, backend="inductor", int8_require_speedup=False)
        fp32_inductor = mixprec.compile(model, (x,), backend="inductor")  # the same layers in fp32, fused
        fake = eager.exported_program.module()  # today's fake quantization, op by op
        lowered = sum(
            1 for node in eager.runner.graph.nodes if node.target is torch.ops.mixprec_kernels.linear_u8s8.default
        ) if hasattr(eager, "runner") else "?"
        with torch.inference_mode():
            ref32 = model(x)
            ref_fake = fake(x)
            outs = {"eager": eager(x), "inductor": inductor(x)}
            exact = _ExactSums(fake).run(x)
        times = interleaved(
            {
                "fp32 eager": lambda: model(x),
                "fp32 mixprec inductor": lambda: fp32_inductor(x),
                "int8 fake quant (today)": lambda: fake(x),
                "int8 mixprec eager": lambda: eager(x),
                "int8 mixprec inductor": lambda: inductor(x),
            },
            rounds=rounds,
        )
        base = times["fp32 eager"]
        for variant, t in times.items():
            row = {"model": name, "lowered": f"{lowered}/{layers}", "variant": variant, "ms": t * 1e3,
                   "vs fp32 eager": f"{base / t:.2f}x"}
            key = variant.rsplit(" ", 1)[-1] if variant.startswith("int8 mixprec") else None
            if key in outs:
                row["rel-L2 vs fake quant"] = f"{rel_l2(outs[key], ref_fake):.2g}"
                row["rel-L2 vs exact sums"] = f"{rel_l2(outs[key], exact):.2g}"
                row["elements off exact"] = grid_steps_off(outs[key], exact)
                row["rel-L2 vs fp32"] = f"{rel_l2(outs[key], ref32):.2g}"
            elif variant.startswith("int8 fake"):
                row["rel-L2 vs exact sums"] = f"{rel_l2(ref_fake, exact):.2g}"
                row["elements off exact"] = grid_steps_off(ref_fake, exact)
                row["rel-L2 vs fp32"] = f"{rel_l2(ref_fake, ref32):.2g}"
            out_rows.append(row)
    print(table(out_rows, ["model", "lowered", "variant", "ms", "vs fp32 eager", "rel-L2 vs fake quant",
                           "rel-L2 vs exact sums", "elements off exact", "rel-L2 vs fp32"]))


class MLPRegion(torch.nn.Module):
    """[Linear(768, 3072) + GELU + Linear(3072, 768)] x 2: a BERT-base MLP twice."""

    def __init__(self, width: int = 768, hidden: int = 3072):
        super().__init__()
        self.fcs = torch.nn.ModuleList(
            torch.nn.Linear(*shape) for _ in range(2) for shape in ((width, hidden), (hidden, width)))

    def forward(self, x):
        for i, fc in enumerate(self.fcs):
            x = fc(x)
            x = torch.nn.functional.gelu(x) if i % 2 == 0 else x
        return x


# profiler row -> category of the split
# (int8: the input's quantization, smoothing multiplication and u8 conversion; fp32: addmm's bias copy)
_ELEMENTWISE = "elementwise (div, round, add, clamp, mul, copy_)"
_SPLIT = {"onednn::qlinear_pointwise": "int8 GEMM", "mixprec_kernels::linear_u8s8": "custom op overhead",
          "aten::addmm": "fp32 GEMM", "aten::gelu": "gelu",
          **{f"aten::{op}": _ELEMENTWISE for op in ("div", "round", "add", "clamp", "mul", "copy_")}}


def profile_split(call, calls: int = 3) -> dict[str, float]:
    """ms per call by category (``_SPLIT``; self CPU time, the custom op's own time less the GEMM it calls)."""
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            call()
    split: dict[str, float] = {}
    for row in prof.key_averages():
        if row.key.startswith(("## Call CompiledFxGraph", "Torch-Compiled Region")):
            key = "inductor kernels (fused quantize, gelu) + wrappers"
        else:
            key = _SPLIT.get(row.key, "other")
        split[key] = split.get(key, 0.0) + row.self_cpu_time_total / 1e3 / calls
    return split


def region_part(rounds: int) -> None:
    for tokens in ((2, 128), (1, 1)):
        print(f"\n### MLP region, 768 -> 3072 -> 768 x 2, input {tokens[0]}x{tokens[1]}x768, every Linear int8")
        torch.manual_seed(0)
        model, x = MLPRegion().eval(), torch.randn(*tokens, 768)
        cfg = mixprec.MixedPrecisionConfigurator(model)
        cfg.set_precision(torch.nn.Linear, activation="int8")
        plan = cfg.apply((x,))
        variants = {"fp32 eager": model, "fp32 mixprec inductor": mixprec.compile(model, (x,), backend="inductor")}
        for backend in ("eager", "inductor") + (("openvino",) if importlib.util.find_spec("openvino") else ()):
            variants[f"int8 {backend}"] = mixprec.compile(model, (x,), plan=plan, backend=backend,
                                                          int8_require_speedup=False)
        times = interleaved({k: (lambda f=f: f(x)) for k, f in variants.items()}, rounds=rounds)
        print(f"load average {os.getloadavg()}")
        base = times["fp32 eager"]
        print(table([{"variant": k, "ms": t * 1e3, "vs fp32 eager": f"{base / t:.2f}x"} for k, t in times.items()],
                    ["variant", "ms", "vs fp32 eager"]))
        for name in ("fp32 eager", "int8 eager", "int8 inductor"):
            split = profile_split(lambda f=variants[name]: f(x))
            print(f"{name}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in sorted(split.items(), key=lambda kv: -kv[1])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-kernel", action="store_true")
    parser.add_argument("--region", action="store_true", help="only part 3: the MLP region and its profile")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING)
    print(f"{stamp()}\n{machine()}\nint8 kernels available: {onednn.is_available()}")
    if not onednn.is_available():
        print("this torch build has no oneDNN int8 linear kernels: nothing to measure")
        return
    if args.region:
        region_part(args.rounds)
        return
    if not args.skip_kernel:
        kernel_part(args.rows, args.width, args.width, args.rounds)
    program_part(args.rows, args.width, args.layers, args.rounds)


if __name__ == "__main__":
    main()
