"""Mixed int8/bf16 plans on OpenVINO against int8 alone and NNCF (issue 22): Converts handed over, error, time.

    PYTHONPATH=src python bench/mixed_int8_bf16.py [--models bert,vit] [--layers 2] [--rounds 5]

Models and data are bench/int8_nncf.py's (random-weight transformers configs at BERT-base / ViT-base widths,
``--layers`` layers; 4 calibration batches, 2 held-out ones; rel-L2 against fp32 eager over the held-out ones).

Rows, one interleaved timing run per model (``harness.interleaved``, median ms on held-out batch 0):

* ``NNCF int8 PTQ`` — ``nncf.quantize`` of OpenVINO's f32 model, compiled with OpenVINO's defaults (bf16 inference
  precision where the CPU has bf16): NNCF's models run their non-int8 layers in bf16 that way;
* ``mixprec int8`` — the configurator's plan: every nn.Linear/nn.Conv2d int8, the rest fp32;
* ``mixprec int8 + bf16 elsewhere`` — the same plus ``set_precision(model, "bf16")`` first (the rest bf16), in the
  form the backend now hands OpenVINO (``backends/openvino/float_form.py``: f32 graph, bf16 inference precision);
* ``... stated types (before)`` — the same plan with the float form turned off: the program's types as stated,
  f32 inference precision (the backend before this change).

``converts``: Converts between float types on run-time values in the ``openvino.Model`` handed to
``compile_model`` (``float_form.float_converts``; weights' Converts are not counted). ``pins``: operations pinned
to f32. The speed bar (mixed >= int8 alone) is judged on a CPU with avx512_bf16 + VNNI; on a CPU without them
(the script prints the flags) OpenVINO runs bf16 as f32 and mixprec's int8 layers as float fake quantization, so
the times say nothing about it there — only the Convert counts and the errors do.

``--costs``: instead of the table, on BERT (``--layers``, 1 calibration batch) with the mixed plan, (a) what the
OpenVINO backend's compile spends on the float form — the whole compile, ``float_form`` (of which the IR
save/read that makes the pins real) and each ``compile_model`` — and (b) the graph the inductor backend hands
TorchInductor (``backends/lowering``'s passes on the program, as ``InductorRunner`` runs them): int8 linears on
oneDNN's kernel by output dtype and by zero point (128: a signed input handed over as q + 128) and the casts
float32 -> bf16 left after int8 layers, on this CPU and with the CPU checks forced to a VNNI CPU (native bf16 or
not), and (c) one BERT-base Linear on this CPU, per call (interleaved medians, ``--rounds``): oneDNN's kernel on a
signed activation (quantize to q + 128, ``linear_u8s8`` with zero point 128) against the fake quantization the
layer keeps without VNNI (quantize/dequantize, dequantize of the int8 weight, float32 GEMM) and fp32
``F.linear``, op by op in eager, and the same ``nn.Linear`` compiled by mixprec on inductor: fp32, int8 on this CPU
(fake quantization), int8 with the CPU check forced to VNNI (the kernel); ratios against the int8 inductor
program as this CPU runs it. Without VNNI the kernel's u8 x s8 pair sums saturate on such data, so that timing is
indicative only (a kernel that computes the wrong sums), and the lowering does not use it there.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import warnings
from pathlib import Path

import torch
from torch import nn

_HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("bench_int8_nncf", _HERE / "int8_nncf.py")
peers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(peers)  # also takes bench/ off sys.path (its openvino.py would shadow the package)
harness = peers.harness


def _plan(model, calibration, *, bf16):
    import mixprec

    cfg = mixprec.MixedPrecisionConfigurator(model)
    if bf16:
        cfg.set_precision(model, activation="bf16")
    for kind in (nn.Linear, nn.Conv2d):
        if any(isinstance(m, kind) for m in model.modules()):
            cfg.set_precision(kind, activation="int8")
    return cfg.apply(tuple(torch.cat(parts) for parts in zip(*calibration)))


def _runner(prog):
    from mixprec.backends.openvino.runner import OpenVINORunner

    return next(m for m in prog.modules() if isinstance(m, OpenVINORunner))


def run_model(name, layers, rounds, nncf, ov):
    import mixprec
    from mixprec.backends.openvino import float_form as ff
    from mixprec.backends.openvino import runner as ov_runner

    model, batches = peers.MODELS[name](layers)
    calibration, held = batches[:peers.CALIBRATION], batches[peers.CALIBRATION:]
    example = held[0]
    with torch.no_grad():
        references = [model(*b) for b in held]
    core = ov.Core()
    dataset = nncf.Dataset(calibration, lambda batch: [t.numpy() for t in batch])
    quantized = nncf.quantize(ov.convert_model(model, example_input=example), dataset,
                              subset_size=peers.CALIBRATION * 64)
    variants = {"fp32 eager": model, "NNCF int8 PTQ": peers._ov_call(core.compile_model(quantized, "CPU"))}
    facts = {"NNCF int8 PTQ": (len(ff.float_converts(quantized)), 0, str(core.compile_model(quantized, "CPU")
                                                                         .get_property("INFERENCE_PRECISION_HINT")))}
    int8_plan, mixed_plan = _plan(model, calibration, bf16=False), _plan(model, calibration, bf16=True)
    for label, plan, form in (("mixprec int8", int8_plan, True), ("mixprec int8 + bf16 elsewhere", mixed_plan, True),
                              ("mixprec int8 + bf16 elsewhere, stated types (before)", mixed_plan, False)):
        real = ov_runner.float_form
        if not form:
            ov_runner.float_form = lambda *a, **k: None
        try:
            prog = mixprec.compile(model, example, plan=plan, backend="openvino")
        finally:
            ov_runner.float_form = real
        runner = _runner(prog)
        compiled = runner.compiled_model
        facts[label] = (len(ff.float_converts(runner.converted_model)), len(ff.pinned_ops(runner.converted_model)),
                        str(compiled.get_property("INFERENCE_PRECISION_HINT")))
        variants[label] = prog
    with torch.no_grad():
        errors = {v: peers.rel_l2([fn(*b) for b in held], references) for v, fn in variants.items()}
    times = harness.interleaved({v: (lambda fn=fn: fn(*example)) for v, fn in variants.items()}, rounds=rounds,
                                warmup=1)
    base = times["mixprec int8"]
    rows = []
    for v in variants:
        converts, pins, hint = facts.get(v, ("-", "-", "-"))
        rows.append({"model": name, "variant": v, "converts": converts, "pins": pins, "inference precision": hint,
                     "rel-L2 vs fp32": errors[v], "ms": times[v] * 1e3, "x mixprec int8": base / times[v]})
    return rows


def _one_linear_programs(model, x) -> dict:
    """nn.Linear compiled by mixprec on inductor: fp32, int8 as this CPU runs it (fake quantization of a signed
    input without VNNI), int8 with the CPU check forced to VNNI (the kernel, zero point 128)."""
    import mixprec
    from mixprec.backends.lowering import cpu
    from mixprec.backends.lowering.onednn import KERNEL

    cfg = mixprec.MixedPrecisionConfigurator(model)
    cfg.set_precision(torch.nn.Linear, activation="int8")
    plan = cfg.apply((x,))
    progs = {"fp32": mixprec.compile(model, (x,), backend="inductor"),
             "int8 this CPU": mixprec.compile(model, (x,), plan=plan, backend="inductor")}
    real = cpu.has_int8_dot_product
    cpu.has_int8_dot_product = lambda: True
    try:
        progs["int8 forced VNNI"] = mixprec.compile(model, (x,), plan=plan, backend="inductor")
    finally:
        cpu.has_int8_dot_product = real
    expected = {"fp32": 0, "int8 this CPU": int(cpu.has_int8_dot_product()), "int8 forced VNNI": 1}
    for name, prog in progs.items():
        kernels = sum(node.target is KERNEL for node in prog.runner.module.graph.nodes)
        assert kernels == expected[name], f"{name}: {kernels} layers on the kernel, expected {expected[name]}"
    return progs


def layer_times(rounds: int, rows: int = 1024, shapes=((768, 768), (768, 3072), (3072, 768))) -> None:
    """(c): per-call time of one BERT-base Linear (8 x 128 tokens) on the kernel vs its fake quantization."""
    from mixprec.backends.lowering import onednn
    from mixprec.ops.quant import UINT8_SHIFTED, quantize, quantize_weight

    mixprec_ops = torch.ops.mixprec
    for k, n in shapes:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(rows, k, generator=gen)
        weight, bias = torch.randn(n, k, generator=gen) / k**0.5, torch.randn(n, generator=gen) * 0.1
        w_q, w_scales = quantize_weight(weight)
        s = float(x.abs().max()) / 127
        handle, packed = onednn.pack_weight(w_q)
        w_dq = mixprec_ops.dequantize_per_channel(w_q, w_scales, 0, torch.float32)

        def fake(with_weight):
            x_dq = mixprec_ops.dequantize_per_tensor(mixprec_ops.quantize_per_tensor(x, s), s, torch.float32)
            w = mixprec_ops.dequantize_per_channel(w_q, w_scales, 0, torch.float32) if with_weight else w_dq
            return torch.nn.functional.linear(x_dq, w, bias)

        u = quantize(x, s, UINT8_SHIFTED)
        progs = _one_linear_programs(torch.nn.Linear(k, n).eval(), x)
        times = harness.interleaved({
            **{f"inductor program: {name}": (lambda p=p: p(x)) for name, p in progs.items()},
            "fp32 F.linear": lambda: torch.nn.functional.linear(x, weight, bias),
            "fake quant (program: + weight dequantize)": lambda: fake(True),
            "fake quant (weight dequantized once)": lambda: fake(False),
            "kernel, zp 128 (+ quantize to q + 128)": lambda: onednn.KERNEL(
                quantize(x, s, UINT8_SHIFTED), s, w_scales, bias, handle, torch.float32, 128),
            "kernel, zp 128 (alone)": lambda: onednn.KERNEL(u, s, w_scales, bias, handle, torch.float32, 128),
        }, rounds=rounds)
        base = times["inductor program: int8 this CPU"]
        print(f"one Linear {rows}x{k} -> {n}, this CPU: " + "; ".join(
            f"{name} {t * 1e3:.2f} ms ({base / t:.2f}x)" for name, t in times.items()))
        del packed


def costs(layers, ov, rounds=15) -> None:
    import time

    import mixprec
    from mixprec.backends.lowering import cpu, run_passes
    from mixprec.backends.lowering.onednn import KERNEL
    from mixprec.backends.lowering.qdq import INT8_LINEARS, QDQ_ATEN
    from mixprec.backends.openvino import float_form as ff
    from mixprec.backends.openvino import runner as ov_runner

    model, batches = peers.MODELS["bert"](layers)
    plan = _plan(model, batches[:1], bf16=True)
    weights = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    spent = {"float_form": 0.0, "IR save/read": 0.0, "compile_model": []}
    real = {"form": ov_runner.float_form, "ir": ff._through_ir, "compile": ov_runner._compile_model}

    def timed(key, fn):
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                took = time.perf_counter() - start
                spent[key].append(took) if isinstance(spent[key], list) else spent.__setitem__(key, spent[key] + took)
        return run

    ov_runner.float_form, ff._through_ir = timed("float_form", real["form"]), timed("IR save/read", real["ir"])
    ov_runner._compile_model = timed("compile_model", real["compile"])
    try:
        start = time.perf_counter()
        prog = mixprec.compile(model, batches[0], plan=plan, backend="openvino")
        total = time.perf_counter() - start
    finally:
        ov_runner.float_form, ff._through_ir, ov_runner._compile_model = real["form"], real["ir"], real["compile"]
    runner = _runner(prog)
    print(f"OpenVINO, BERT-base widths x {layers} layers ({weights:.0f} MiB fp32 weights), mixed plan: form "
          f"'{runner.form}'; compile {total:.1f} s; float_form {spent['float_form']:.2f} s, of which IR save/read "
          f"{spent['IR save/read']:.2f} s; compile_model " + ", ".join(f"{t:.2f} s" for t in spent["compile_model"]))

    def inductor_graph():
        module = prog.exported_program.module()
        run_passes(module, (INT8_LINEARS, QDQ_ATEN))
        kernels = [n.args for n in module.graph.nodes if n.target is KERNEL]
        casts = [n for n in module.graph.nodes if n.target is torch.ops.aten.to.dtype and n.args[1] is torch.bfloat16
                 and n.args[0].target in (KERNEL, torch.ops.aten.linear.default)]
        linears = sum(1 for n in prog.exported_program.graph.nodes if n.target is torch.ops.aten.linear.default)
        bf16 = sum(k[5] is torch.bfloat16 for k in kernels)
        signed = sum(k[6] == 128 for k in kernels)
        return (f"int8 linears {linears}, on oneDNN's kernel {len(kernels)} (signed inputs, zero point 128: {signed}; "
                f"writing bf16: {bf16}), casts f32 -> bf16 after them {len(casts)}")

    print(f"inductor, this CPU: {inductor_graph()}")
    real_cpu = cpu.has_int8_dot_product, cpu.has_native_bf16
    try:
        cpu.has_int8_dot_product = lambda: True
        print(f"inductor, CPU checks forced to VNNI (no native bf16): {inductor_graph()}")
        cpu.has_native_bf16 = lambda: True
        print(f"inductor, CPU checks forced to VNNI + avx512_bf16: {inductor_graph()}")
    finally:
        cpu.has_int8_dot_product, cpu.has_native_bf16 = real_cpu
    layer_times(rounds)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="bert,vit")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--costs", action="store_true", help="compile-time cost of the float form; inductor graph")
    args = parser.parse_args(argv)
    try:
        import nncf
        import openvino as ov
    except ImportError as e:
        print(f"bench/mixed_int8_bf16.py needs NNCF and OpenVINO as peers: pip install nncf openvino ({e})",
              file=sys.stderr)
        return 2
    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("nncf").setLevel(logging.ERROR)
    from mixprec.backends.lowering import cpu

    print(f"# mixed int8/bf16 on OpenVINO: mixprec vs int8 alone vs NNCF, {harness.stamp()}")
    print(f"machine: {harness.machine()}")
    print(f"OpenVINO capabilities: {ov.Core().get_property('CPU', 'OPTIMIZATION_CAPABILITIES')}; int8 dot product "
          f"(VNNI/AMX) per mixprec.backends.lowering.cpu: {cpu.has_int8_dot_product()}")
    print(f"nncf {nncf.__version__}, openvino {ov.__version__}; command: python bench/mixed_int8_bf16.py "
          + " ".join(argv if argv is not None else sys.argv[1:]))
    if args.costs:
        costs(args.layers, ov, args.rounds)
        return 0
    for name in args.models.split(","):
        rows = run_model(name.strip(), args.layers, args.rounds, nncf, ov)
        print(harness.table(rows, ["model", "variant", "converts", "pins", "inference precision", "rel-L2 vs fp32",
                                   "ms", "x mixprec int8"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
