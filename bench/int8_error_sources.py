"""Where mixprec's int8 error enters, and where NNCF puts its quantizers (issue 22, round two).

    PYTHONPATH=src python bench/int8_error_sources.py [--models resnet50,minilm] [--layers 2]

Same models, batches and error measure as ``bench/int8_nncf.py`` (it is loaded from there: 4 calibration batches,
rel-L2 vs fp32 eager over 2 held-out batches). Two tables:

1. **NNCF's quantizers** (``nncf.quantize`` defaults on the OpenVINO model): every FakeQuantize counted by the op
   that makes its input and the ops that read its output, with its number of levels — what NNCF quantizes and
   where (ResNet-50: convolution inputs and both inputs of each residual add; weights are int8 constants).
2. **Ablation of the round-one configurator plan** (every nn.Linear / nn.Conv2d int8, exits quantized, no
   smoothing: ``QuantPolicy(quantize_exits=True, smoothing_alpha=None)``), eager backend: the plan as it is;
   without the quantization of the modules' outputs; with only the outputs (and weights); weights only. With
   ``--per-module``: int8 activations for the Linears whose path ends with each given suffix, the other Linears
   weight-only int8 (which Linear inputs cost the most).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import importlib.util
import logging
import sys
import warnings
from pathlib import Path

import torch
from torch import nn

_spec = importlib.util.spec_from_file_location("bench_int8_nncf", Path(__file__).resolve().parent / "int8_nncf.py")
peer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(peer)  # also takes bench/ off sys.path (its openvino.py would shadow the package)


def nncf_census(model, batches):
    import nncf
    import openvino as ov

    calibration, example = batches[: peer.CALIBRATION], batches[peer.CALIBRATION]
    dataset = nncf.Dataset(calibration, lambda batch: [t.numpy() for t in batch])
    quantized = nncf.quantize(ov.convert_model(model, example_input=example), dataset,
                              subset_size=peer.CALIBRATION * 64)
    counts = collections.Counter()
    for node in quantized.get_ordered_ops():
        if node.get_type_name() != "FakeQuantize":
            continue
        source = node.input_value(0).get_node().get_type_name()
        readers = ", ".join(sorted(t.get_node().get_type_name() for t in node.output(0).get_target_inputs()))
        counts[(source, readers, node.get_attributes()["levels"])] += 1
    ops = collections.Counter(n.get_type_name() for n in quantized.get_ordered_ops())
    return counts, ops


def _plan(model, joined, policy, pick=None):
    import mixprec

    cfg = mixprec.MixedPrecisionConfigurator(model)
    if pick is None:
        for kind in (nn.Linear, nn.Conv2d):
            if any(isinstance(m, kind) for m in model.modules()):
                cfg.set_precision(kind, activation="int8")
    else:
        for path, module in model.named_modules():
            if isinstance(module, nn.Linear):
                if path.endswith(pick):
                    cfg.set_precision(module, activation="int8")
                else:
                    cfg.set_precision(module, activation="fp32", param="int8")
    return cfg.apply(joined, policy=policy)


def _strip(plan, **changes):
    from mixprec.plan.precision_plan import PrecisionPlan

    if changes.get("output", ...) is None:  # no output quantized: no output grid either
        changes["output_grid"] = None
    if "inputs" in changes and not changes["inputs"]:  # no inputs quantized: no input grids either
        changes["grids"] = ()
    nodes = {k: (dataclasses.replace(v, int8=dataclasses.replace(v.int8, **changes)) if v.int8 else v)
             for k, v in plan.items()}
    return PrecisionPlan(nodes, inputs=plan.inputs, outputs=plan.outputs)


def ablation(model, batches, per_module):
    import mixprec

    calibration, held = batches[: peer.CALIBRATION], batches[peer.CALIBRATION:]
    joined = tuple(torch.cat(parts) for parts in zip(*calibration))
    with torch.no_grad():
        references = [model(*b) for b in held]

    def error(plan):
        prog = mixprec.compile(model, held[0], plan=plan, backend="eager")
        with torch.no_grad():
            return peer.rel_l2([prog(*b) for b in held], references)

    round_one = mixprec.QuantPolicy(quantize_exits=True, smoothing_alpha=None)
    plan = _plan(model, joined, round_one)
    rows = [("round-one plan: inputs, outputs, weights", error(plan)),
            ("without the outputs' quantization", error(_strip(plan, output=None))),
            ("outputs and weights only", error(_strip(plan, inputs=()))),
            ("weights only", error(_strip(plan, inputs=(), output=None)))]
    for suffix in per_module:
        rows.append((f"int8 activations only for Linears '*{suffix}' (other Linears weight-only)",
                     error(_plan(model, joined, dataclasses.replace(round_one, quantize_exits=False), suffix))))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,minilm")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--per-module", default="", help="comma-separated Linear path suffixes (transformers)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    logging.getLogger("nncf").setLevel(logging.ERROR)
    print(f"# int8 error sources, {peer.harness.stamp()}")
    print(f"machine: {peer.harness.machine()}")
    print("command: python bench/int8_error_sources.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    suffixes = [s for s in args.per_module.split(",") if s]
    for name in args.models.split(","):
        model, batches = peer.MODELS[name](args.layers)
        counts, ops = nncf_census(model, batches)
        print(f"\n## {name}: NNCF's FakeQuantize nodes (defaults)\n")
        print("| count | input made by | read by | levels |\n|---|---|---|---|")
        for (source, readers, levels), n in counts.most_common():
            print(f"| {n} | {source} | {readers} | {levels} |")
        print(f"\nops of NNCF's model: {dict(ops)}")
        print(f"\n## {name}: where mixprec's int8 error enters (eager backend)\n")
        print("| plan | rel-L2 vs fp32 |\n|---|---|")
        for label, err in ablation(model, batches, suffixes if name != "resnet50" else []):
            print(f"| {label} | {err:.4g} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
