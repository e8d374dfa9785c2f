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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="bert,vit")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
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
    for name in args.models.split(","):
        rows = run_model(name.strip(), args.layers, args.rounds, nncf, ov)
        print(harness.table(rows, ["model", "variant", "converts", "pins", "inference precision", "rel-L2 vs fp32",
                                   "ms", "x mixprec int8"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
