"""mixprec.search over fp32 / bf16 / int8 at OpenVINO bf16's error (issue 22): the chosen mix, its error, its speed.

    PYTHONPATH=src python bench/search_int8.py [--models bert,resnet50] [--layers 2] [--rounds 5] [--nncf] [--bounds]

Models and data are bench/int8_nncf.py's (random-weight transformers configs: ``bert`` = BertModel with BERT-base
widths and ``--layers`` layers on 2 x 128 tokens, ``resnet50`` = ResNetModel with ResNet-50's config on 2 x 3 x
224 x 224; 4 seeded calibration batches, 2 the searches evaluate on, 2 held out). Error = rel-L2 against fp32 eager
over the 2 held-out batches, which no search sees (issue 34: a plan's error on new inputs, not on its own eval data);
the budget is OpenVINO's error on the same held-out batches.

The budget is OpenVINO's bf16 default's error: OpenVINO's default on this CPU when it runs bf16
(``INFERENCE_PRECISION_HINT`` bf16: a CPU with avx512_bf16 or AMX); on a CPU without bf16 OpenVINO runs f32 and
its error says nothing about bf16, so the budget is then the error of mixprec's all-bf16 autocast program (torch's
bf16 numerics; on the issue's avx512_bf16 machine the two agree within 2%: BERT 4.9e-3 / 4.9e-3, ResNet-50
9.6e-3 / 9.8e-3) — the script prints which.

Rows: fp32 eager; OpenVINO default; mixprec.search with ``low_precision_type=("int8", "bf16")`` and
``backend="openvino"`` (the fastest mix by the cost model measured on this machine, ``searching/latency.py``),
its plan compiled with backend openvino; the same with ``low_precision_type="int8"`` (as many FLOPs in int8 as
the budget allows: speed plays no part in that search); optionally (``--nncf``) NNCF's
``quantize_with_accuracy_control`` on the same calibration/validation data with the same budget (max_drop on a
validation metric of -rel-L2). Times: median ms per call over interleaved rounds on held-out batch 0.

``--bounds`` (issue 34): what int8 costs in error before any activation is quantized -- the error of every
Linear/Conv weight rounded to bf16, and to int8 per output channel, in fp32 eager, as a multiple of the budget --
and a timed row (models with Linears) of every Linear at int8 weights with OpenVINO's dynamic int8 activations in
groups of 64, bf16 elsewhere: int8's fastest form on OpenVINO with the least error int8 activations allow.

The CPU flags are printed first. On a CPU without VNNI/avx512_bf16 (the AVX2 machines) int8 and bf16 are not fast
in any runtime — mixprec's int8 layers run as float fake quantization, OpenVINO's bf16 as f32 — so the times say
nothing about int8/bf16 hardware there; run the script on a VNNI CPU for the speed bars of issues 22 and 34.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import sys
import time
import warnings
from pathlib import Path

import torch

from rounding import rtn_model  # bench/rounding.py (before int8_nncf.py takes bench/ off sys.path)

_HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("bench_int8_nncf", _HERE / "int8_nncf.py")
peers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(peers)  # also takes bench/ off sys.path (its openvino.py would shadow the package)
harness = peers.harness
SEARCH_EVAL, TEST = 2, 2  # the searches' eval batches; held-out batches no search sees (errors and times)


def _runs_bf16(compiled) -> bool:
    try:
        hint = str(compiled.get_property("INFERENCE_PRECISION_HINT")).lower()  # "<Type: 'bfloat16'>" in 2026.4
        return "bf16" in hint or "bfloat16" in hint
    except Exception:  # noqa: BLE001 (an older OpenVINO without the property)
        return False


def _mix(result) -> str:
    groups = len(result.groups)
    chosen = result.chosen
    if not chosen.lowered:
        return f"all {groups} groups fp32"
    return f"{chosen.mix_text()} of {groups} groups; {chosen.low_precision_flops_fraction:.0%} of FLOPs low"


def _nncf_accuracy_control(model, calibration, seen, budget, references, nncf, ov):
    """NNCF's accuracy-aware PTQ: quantize, then revert the most harmful layers until the drop is within max_drop
    (validated on the searches' eval batches ``seen`` and their fp32 ``references``)."""
    example = seen[0]
    ov_model = ov.convert_model(model, example_input=example)

    def transform(batch):
        return [t.numpy() for t in batch]

    def validate(compiled, items) -> float:  # higher is better: -rel-L2 over the validation items
        outs = [torch.from_numpy(compiled([a for a in item])[0]) for item in items]
        return -peers.rel_l2(outs, references)

    quantized = nncf.quantize_with_accuracy_control(
        ov_model, nncf.Dataset(calibration, transform), nncf.Dataset(seen, transform), validate,
        max_drop=budget, drop_type=nncf.DropType.ABSOLUTE, subset_size=len(calibration) * 64,
    )
    return peers._ov_call(ov.Core().compile_model(quantized, "CPU"))


def _bf16_weights(model):
    """A copy of ``model`` with every Linear/Conv weight rounded to bfloat16, computed in float32."""
    rounded = copy.deepcopy(model)
    for module in rounded.modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d)):
            module.weight.data = module.weight.data.to(torch.bfloat16).float()
    return rounded


def _bounds(model, held, references, budget, calibration, variants, notes, made):
    """Issue 34's bound: what int8 costs in error before any activation is quantized. Prints the error of the weights
    rounded to bf16 and to int8 (fp32 eager, every Linear/Conv) against the budget, and adds a timed row: every Linear
    with int8 weights, bf16 elsewhere, OpenVINO's dynamic int8 activations (group 64) -- int8's fastest form on
    OpenVINO for the Linears, with the least error int8 activations allow."""
    import mixprec

    with torch.no_grad():
        for to in ("bf16", "int8"):
            rounded = _bf16_weights(model) if to == "bf16" else rtn_model(model, 8, None)
            error = peers.rel_l2([rounded(*b) for b in held], references)
            print(f"  bound: {to} weights alone (fp32 eager) rel-L2 {error:.3g} = {error / budget:.2f}x the budget",
                  flush=True)
    if not any(isinstance(m, torch.nn.Linear) for m in model.modules()):
        return
    label = "bound: every Linear int8 weights + dynamic int8 activations (group 64), bf16 elsewhere, openvino"
    start = time.perf_counter()
    cfg = mixprec.MixedPrecisionConfigurator(model, held[0], calibration_dataloader=calibration)
    cfg.set_precision(model, activation="bf16")
    cfg.set_precision(torch.nn.Linear, activation="bf16", param={"weight": "int8"})
    variants[label] = mixprec.compile(model, held[0], plan=cfg.apply(), backend="openvino",
                                      weight_only_dynamic_activations=64)
    made[label] = time.perf_counter() - start
    notes[label] = "not a search: int8 at its most accurate and fastest on the Linears"


def run_model(name, layers, rounds, nncf, ov, with_nncf, bounds=False):
    import mixprec

    peers.HELD_OUT = SEARCH_EVAL + TEST  # the model builders make CALIBRATION + HELD_OUT seeded batches
    model, batches = peers.MODELS[name](layers)
    calibration = batches[: peers.CALIBRATION]
    seen, held = batches[peers.CALIBRATION: peers.CALIBRATION + SEARCH_EVAL], batches[peers.CALIBRATION + SEARCH_EVAL:]
    with torch.no_grad():
        references = [model(*b) for b in held]
    variants, notes, made = {"fp32 eager": model}, {}, {}

    core = ov.Core()
    start = time.perf_counter()
    default = core.compile_model(ov.convert_model(model, example_input=held[0]), "CPU")
    variants["OpenVINO default"] = peers._ov_call(default)
    made["OpenVINO default"] = time.perf_counter() - start
    with torch.no_grad():
        ov_error = peers.rel_l2([variants["OpenVINO default"](*b) for b in held], references)
    if _runs_bf16(default):
        budget, source = ov_error, "OpenVINO default (runs bf16 here)"
    else:
        bf16 = mixprec.compile(model, held[0], enable_autocast=True, autocast_low_precision_type="bf16",
                               autocast_calibration_dataloader=calibration)
        with torch.no_grad():
            budget = peers.rel_l2([bf16(*b) for b in held], references)
        source = "mixprec all-bf16 autocast (OpenVINO default runs f32 on this CPU)"
    print(f"{name}: budget rel-L2 {budget:.3g} from {source}; OpenVINO default's own error {ov_error:.3g}", flush=True)

    for label, lows in (("mixprec.search int8+bf16 (fastest mix), openvino", ("int8", "bf16")),
                        ("mixprec.search int8 (most FLOPs), openvino", "int8")):
        start = time.perf_counter()
        result = mixprec.search(model, seen[0], low_precision_type=lows, tolerance=budget, eval_dataloader=seen,
                                calibration_dataloader=calibration, backend="openvino", cache=False)
        searched = time.perf_counter() - start
        variants[label] = mixprec.compile(model, held[0], plan=result.plan, backend="openvino")
        made[label] = searched
        notes[label] = f"{_mix(result)}; {result.trials} trials"
        print(f"  {label}: {notes[label]}, search {searched:.0f} s", flush=True)
        if isinstance(lows, tuple):
            from mixprec.searching import latency

            costs = latency.flop_costs("openvino", (torch.int8, torch.bfloat16), torch.device("cpu"))
            print("  cost model (openvino, x fp32 per class): " + ", ".join(
                f"{k} {str(d).removeprefix('torch.')} {costs.speedup(k, d):.2f}x"
                for k in latency.KINDS for d in (torch.int8, torch.bfloat16)), flush=True)

    if bounds:
        _bounds(model, held, references, budget, calibration, variants, notes, made)

    if with_nncf:
        label = "NNCF quantize_with_accuracy_control, OpenVINO"
        start = time.perf_counter()
        try:
            with torch.no_grad():
                seen_references = [model(*b) for b in seen]
            variants[label] = _nncf_accuracy_control(model, calibration, seen, budget, seen_references, nncf, ov)
            made[label] = time.perf_counter() - start
        except Exception as e:  # noqa: BLE001 (a peer's failure is reported, not fatal)
            print(f"  {label} failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)

    with torch.no_grad():
        errors = {v: peers.rel_l2([fn(*b) for b in held], references) for v, fn in variants.items()}
    times = harness.interleaved({v: (lambda fn=fn: fn(*held[0])) for v, fn in variants.items()}, rounds=rounds,
                                warmup=1)
    fp32 = times["fp32 eager"]
    return [{"model": name, "variant": v, "rel-L2 vs fp32": errors[v], "within budget": errors[v] <= budget * 1.000001,
             "ms": times[v] * 1e3, "x fp32 eager": fp32 / times[v],
             "x OpenVINO default": times["OpenVINO default"] / times[v], "build s": made.get(v, 0.0),
             "mix": notes.get(v, "")} for v in variants]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="bert,resnet50")
    parser.add_argument("--layers", type=int, default=2, help="transformer layers of bert (random weights)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--nncf", action="store_true", help="add NNCF's quantize_with_accuracy_control as a peer")
    parser.add_argument("--bounds", action="store_true",
                        help="issue 34's bound: the error of int8 (and bf16) weight rounding alone against the "
                             "budget, and a timed row of every Linear at int8 weights + OpenVINO's dynamic int8 "
                             "activations")
    args = parser.parse_args(argv)
    try:
        import openvino as ov
    except ImportError as e:
        print(f"bench/search_int8.py needs OpenVINO: pip install openvino ({e})", file=sys.stderr)
        return 2
    nncf = None
    if args.nncf:
        try:
            import nncf
        except ImportError as e:
            print(f"--nncf needs NNCF: pip install nncf ({e})", file=sys.stderr)
            return 2
    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("nncf").setLevel(logging.ERROR)
    from mixprec.backends.lowering import cpu

    print(f"# mixprec.search over fp32/bf16/int8 at OpenVINO bf16's error, {harness.stamp()}")
    print(f"machine: {harness.machine()}")
    print(f"int8 dot product (VNNI/AMX) per mixprec.backends.lowering.cpu: {cpu.has_int8_dot_product()}")
    print(f"openvino {ov.__version__}" + (f", nncf {nncf.__version__}" if nncf else "")
          + "; command: python bench/search_int8.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    columns = ["model", "variant", "rel-L2 vs fp32", "within budget", "ms", "x fp32 eager", "x OpenVINO default",
               "build s", "mix"]
    for name in args.models.split(","):
        rows = run_model(name.strip(), args.layers, args.rounds, nncf, ov, args.nncf, args.bounds)
        print(harness.table(rows, columns), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
