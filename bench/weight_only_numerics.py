"""Weight-only int4 / int8 numerics against NNCF's, on the same weights (issue 32): logit rel-L2 vs fp32 and greedy
tokens equal to fp32's, for weight grids applied to the Linears of a Llama of TinyLlama-1.1B's widths (random weights,
``--layers`` layers) and computed in float32, so the weight grid is the only difference between rows.

Rows: mixprec's grids (``ops/weight_only.quantize_int4`` / ``quantize_int8`` as this tree has them, with and without
the scale search; "before": the [-7, 7] grid with s = max|w| / 7 that mixprec had), and NNCF's own weight-lowering
functions (``nncf.quantization.algorithms.weight_compression.weight_lowering``, the code ``compress_weights`` runs)
on the same tensors: INT4_SYM group 128 on the decoder Linears with NNCF's backup INT8_ASYM per channel on lm_head
and the embedding (``compress_weights``' defaults), and INT8_ASYM on every Linear. mixprec's rows put int8 symmetric
per channel on lm_head (``compile_for_generation``'s default) and leave the embedding float.
``--program`` adds the compiled W4A16 / W8A16 programs themselves (``mixprec.hf.compile_for_generation``, bf16
activations: the error includes bf16's).

    PYTHONPATH=src:/tmp/wbench-peers python bench/weight_only_numerics.py --layers 8 --new 16
    PYTHONPATH=src:/tmp/wbench-peers python bench/weight_only_numerics.py --task minilm,crepe

Measured 2026-11-27 (AMD EPYC, 2 cores shared with other jobs, OMP_NUM_THREADS=1, torch 2.13, NNCF 3.4.0), 8 layers,
prompt 128, 16 greedy tokens (before = main at 146ab14; the NNCF rows are NNCF's own functions on the same tensors)::

    weights                                                   logit rel-L2   tokens = fp32
    int4 before: [-7, 7], max|w|/7                            0.623          0%
    int4 16 levels (signed scale)                             0.574          0%
    int4 16 levels + scale search (INT4_SHRINKS, 6)           0.539          0%
    int4 16 levels + finer search (13 shrinks 1.0..0.7)       0.536          6%
    int4 default: search, bf16 scales, int8 lm_head default   0.538          0%
    NNCF INT4_SYM g128 (+ INT8_ASYM lm_head, embedding)       0.574          0%
    NNCF INT4_SYM g128 body, mixprec int8 lm_head             0.574          0%   (= mixprec 16 levels, exactly)
    int8 before: [-127, 127] per channel                      0.0509         50%
    int8 default (256 levels, bf16 scales)                    0.0493         56%
    int8 256 levels + scale search (1.0..0.8)                 0.0494         56%
    int8 asymmetric per channel                               0.0466         100%
    NNCF INT8_ASYM (all Linears + embedding)                  0.0536         100%
    --program: compile_for_generation W4A16 (bf16 activations)  0.535        0%   (bench/log: 0.623 before; 0.576
               OpenVINO + NNCF INT4_SYM g128, OpenVINO in bf16)
    --program: compile_for_generation W8A16 (bf16 activations)  0.0458       81%  (before 0.0554; NNCF INT8_ASYM 0.065)

    --task minilm,crepe (every Linear, group 128, float32 compute):
    minilm  int4 before            output rel-L2 0.354   cosine max |d| 0.17, nearest same 69%
    minilm  int4 16 levels         0.312                 cosine max |d| 0.12, nearest same 81%
    minilm  int4 default (search)  0.281                 cosine max |d| 0.096, nearest same 81%
    minilm  NNCF INT4_SYM g128     0.312                 cosine max |d| 0.12, nearest same 81%
    crepe   int4 before            0.0498                pitch max |d| 1.49 cents, argmax bins same 94%
    crepe   int4 16 levels         0.0434                pitch max |d| 1 cents, argmax bins same 94%
    crepe   int4 default (search)  0.0352                pitch max |d| 1.1 cents, argmax bins same 94%
    crepe   NNCF INT4_SYM g128     0.0434                pitch max |d| 1 cents, argmax bins same 94%
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harness import table  # noqa: E402
from models import tinyllama  # noqa: E402
import zoo_models  # noqa: E402,F401  (the trained MiniLM and CREPE; imported while bench/ is on the path)

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # bench/openvino.py would shadow openvino

import mixprec  # noqa: E402
import mixprec.hf  # noqa: E402
from mixprec.ops import weight_only as wo  # noqa: E402

GROUP = 128


# ---- weight grids: each maps a float weight [N, K] to its dequantized float32 values -------------------------------
def before_int4(w, group):
    """mixprec before: symmetric [-7, 7], s = max|w| / 7 per group."""
    g = wo.groups_of(w.float(), group)
    s = (g.abs().amax(-1, keepdim=True) / 7).clamp_min(1e-30)
    return (torch.clamp(torch.round(g / s), -7, 7) * s).reshape(w.shape)


def mixprec_int4(shrinks, scale_dtype=None):
    def grid(w, group):
        u, s, z = wo.quantize_int4(w, group, True, scale_dtype, shrinks)
        return wo.dequantize_int4(u, s.to(scale_dtype or torch.float32).float(), z)
    return grid


def mixprec_int8(shrinks=(1.0,), symmetric=True, scale_dtype=None):
    def grid(w, group):
        q, s, o = wo.quantize_int8(w, group, symmetric, scale_dtype, shrinks)
        return wo.dequantize_int8(q, s, o)
    return grid


def before_int8(w, group):
    """mixprec before: symmetric [-127, 127], s = max|w| / 127 per channel."""
    s = (w.float().abs().amax(-1, keepdim=True) / 127).clamp_min(1e-30)
    return torch.clamp(torch.round(w.float() / s), -127, 127) * s


def nncf_grid(mode_name, group=None):
    from nncf import CompressWeightsMode
    from nncf.quantization.algorithms.weight_compression.config import WeightCompressionConfig
    from nncf.quantization.algorithms.weight_compression.weight_lowering import integer_quantize_dequantize_weight
    from nncf.tensor import Tensor

    config = WeightCompressionConfig(mode=getattr(CompressWeightsMode, mode_name), group_size=group or -1)

    def grid(w, _group):
        out = integer_quantize_dequantize_weight(Tensor(w.detach().float()), config, reduction_axes=(1,))
        return out.data.reshape(w.shape).float()
    return grid


# ---- variants: which grid on which weights ------------------------------------------------------------------------
def body_names(model):
    return [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"]


def apply(model, original, body, head=None, embed=None, group=GROUP):
    """Load ``original`` then replace the decoder Linears' weights by ``body``'s grid (lm_head by ``head``'s, the
    embedding by ``embed``'s, each per channel)."""
    model.load_state_dict(original)
    with torch.no_grad():
        for name in body_names(model):
            module = model.get_submodule(name)
            module.weight.copy_(body(module.weight, group))
        if head is not None:
            model.lm_head.weight.copy_(head(model.lm_head.weight, None))
        if embed is not None:
            emb = model.get_input_embeddings().weight
            emb.copy_(embed(emb, None))


def run(model, ids, new):
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                             do_sample=False, pad_token_id=0)
    return logits, out[0, ids.shape[1]:].tolist()


def rel_l2(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def task_rows(trained: str):
    """The trained model's Linears (all of them, as bench/weight_only.py's "W4A32 g128 (Linear)" rows) on each int4
    grid, float32 compute: output rel-L2 and the task metric against fp32."""
    from zoo_models import MODELS, TASKS

    model, args_, kwargs = MODELS[trained](batch=16, seed=0)
    model = model.eval()
    with torch.no_grad():
        reference = model(*args_, **kwargs)
    reference = getattr(reference, "last_hidden_state", reference)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    grids = {"int4 before: [-7, 7], max|w|/7": before_int4, "int4 16 levels (signed scale)": mixprec_int4((1.0,)),
             "int4 default: 16 levels + scale search": mixprec_int4(wo.INT4_SHRINKS),
             "NNCF INT4_SYM g128 (weight lowering)": nncf_grid("INT4_SYM", GROUP)}
    rows = []
    for label, grid in grids.items():
        model.load_state_dict(original)
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, torch.nn.Linear):
                    k = module.weight.shape[1]
                    module.weight.copy_(grid(module.weight, GROUP if k % GROUP == 0 else None))
            out = model(*args_, **kwargs)
        out = getattr(out, "last_hidden_state", out)
        rows.append({"model": trained, "weights": label, "output rel-L2": rel_l2(out.float(), reference.float()),
                     "task metric vs fp32": TASKS[trained](out.float(), reference.float())})
        print(rows[-1], flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=16)
    parser.add_argument("--only", default="", help="row names separated by \";\" (default: all)")
    parser.add_argument("--program", action="store_true", help="also the compiled bf16 W4A16 / W8A16 programs")
    parser.add_argument("--task", default="", help="instead: trained models' task metrics (minilm,crepe)")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if args.task:
        rows = [r for name in args.task.split(",") for r in task_rows(name)]
        print(f"\n### Trained weights, every Linear's weights on each int4 grid (group {GROUP}), float32 compute")
        print(table(rows, ["model", "weights", "output rel-L2", "task metric vs fp32"]))
        return
    model = tinyllama(args.layers)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(0, model.config.vocab_size, (1, args.prompt), generator=torch.Generator().manual_seed(1))
    ref_logits, ref_tokens = run(model, ids, args.new)
    m8, bf = mixprec_int8(), torch.bfloat16
    rows = {
        "int4 before: [-7, 7], max|w|/7": dict(body=before_int4, head=before_int8),
        "int4 16 levels (signed scale)": dict(body=mixprec_int4((1.0,)), head=m8),
        "int4 16 levels + scale search": dict(body=mixprec_int4(wo.INT4_SHRINKS), head=m8),
        "int4 16 levels + finer search (13 shrinks 1.0..0.7)": dict(
            body=mixprec_int4(tuple(1 - 0.025 * i for i in range(13))), head=m8),
        "int4 16 levels + scale search, bf16 scales": dict(body=mixprec_int4(wo.INT4_SHRINKS, bf), head=m8),
        "int4 default (bf16 scales), lm_head int8 default": dict(body=mixprec_int4(wo.INT4_SHRINKS, bf),
                                                                 head=mixprec_int8(wo.INT8_SHRINKS, True, bf)),
        "NNCF INT4_SYM g128 (+ INT8_ASYM lm_head, embedding)": dict(body=nncf_grid("INT4_SYM", GROUP),
                                                                   head=nncf_grid("INT8_ASYM"),
                                                                   embed=nncf_grid("INT8_ASYM")),
        "NNCF INT4_SYM g128 body, mixprec int8 lm_head": dict(body=nncf_grid("INT4_SYM", GROUP), head=m8),
        "int8 before: [-127, 127] per channel": dict(body=before_int8, head=before_int8, group=None),
        "int8 default (256 levels, bf16 scales)": dict(body=mixprec_int8(wo.INT8_SHRINKS, True, bf),
                                                       head=mixprec_int8(wo.INT8_SHRINKS, True, bf), group=None),
        "int8 256 levels + scale search (1.0..0.8)": dict(body=mixprec_int8((1.0, 0.95, 0.9, 0.85, 0.8)),
                                                          head=mixprec_int8((1.0, 0.95, 0.9, 0.85, 0.8)), group=None),
        "int8 asymmetric per channel": dict(body=mixprec_int8((1.0,), False), head=mixprec_int8((1.0,), False),
                                            group=None),
        "NNCF INT8_ASYM (all Linears + embedding)": dict(body=nncf_grid("INT8_ASYM"), head=nncf_grid("INT8_ASYM"),
                                                        embed=nncf_grid("INT8_ASYM"), group=None),
    }
    wanted = [r for r in args.only.split(";") if r] or list(rows)
    results = []
    for name in wanted:
        begin = time.perf_counter()
        try:
            apply(model, original, **rows[name])
        except ImportError as e:
            results.append({"weights": name, "note": f"not run: {e}"})
            continue
        seconds = time.perf_counter() - begin
        logits, tokens = run(model, ids, args.new)
        same = sum(a == b for a, b in zip(tokens, ref_tokens)) / len(ref_tokens)
        results.append({"weights": name, "logit rel-L2": rel_l2(logits, ref_logits), "tokens = fp32": f"{same:.0%}",
                        "grid s": seconds})
        print(results[-1], flush=True)
    if args.program:
        model.load_state_dict(original)
        for bits in ("int4", "int8"):
            lm = mixprec.hf.compile_for_generation(model.to(torch.bfloat16), ids, static_cache=True,
                                                   max_cache_len=args.prompt + args.new + 2,
                                                   max_length=args.prompt + args.new + 2, weights=bits,
                                                   group_size=GROUP)
            logits, tokens = run(lm, ids, args.new)
            same = sum(a == b for a, b in zip(tokens, ref_tokens)) / len(ref_tokens)
            results.append({"weights": f"program W{bits[3]}A16 (bf16 activations)",
                            "logit rel-L2": rel_l2(logits, ref_logits), "tokens = fp32": f"{same:.0%}"})
            print(results[-1], flush=True)
            del lm
            model = model.float()
    print(f"\n### Llama, TinyLlama widths, {args.layers} layers, random weights: prompt {args.prompt}, {args.new} "
          f"greedy tokens; float32 compute; load {os.getloadavg()[0]:.1f}")
    print(table(results, ["weights", "logit rel-L2", "tokens = fp32", "grid s", "note"]))


if __name__ == "__main__":
    main()
