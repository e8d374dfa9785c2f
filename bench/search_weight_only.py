"""Issue 32's bar: "a three-type search (w4a16, w8a16, bf16) within a budget has <= the error of NNCF's ratio mix
at the same weight bytes".

Model: a Llama with TinyLlama-1.1B's widths and 4 layers (bench/weight_only.py's small shape: hidden 2048, SwiGLU
5632, GQA 32/4 heads, vocab 32000, untied lm_head; random weights, ``torch.manual_seed(0)``, ``use_cache=False`` so
the output is the logits), or smaller widths by the options (``--hidden`` ...) for a quick run.

Data: token-id batches of ``--tokens`` tokens (default 8: a decoder's steps, so the search costs the Linears in the
decode shape, ``searching/latency.py``): ``--eval`` batches the search measures on (and NNCF calibrates on), and
``--test`` other batches both are scored on: rel-L2 of the logits against fp32.

1. ``mixprec.search(model, ids, low_precision_type=("w4a16", "w8a16", "bf16"), tolerance=T)`` for each ``--tolerance``;
   its plan compiled (``compile(plan=...)``) and run on the test batches.
2. NNCF's ``compress_weights(mode=INT4_SYM, group_size=128, ratio=r, dataset=eval batches)`` on a copy of the
   PyTorch model (NNCF's defaults otherwise: lm_head INT8_ASYM, the ratio over the other Linears, layers ranked by
   its data-aware sensitivity; the embeddings kept float like the search's, or INT8_ASYM with --nncf-embeddings), with ``r`` chosen so that its Linear weight bytes equal the
   search plan's (clamped to 0..1: NNCF mixes int4 and int8 only, so a plan that keeps bf16/fp32 layers can weigh
   more than NNCF's ratio 0).

Weight bytes: of the Linear layers (embeddings left out on both sides: NNCF stores them int8, the search may lower
the gather to bf16), counted per layer from its shape and type: int4 N*K/2 + one fp16/bf16 scale (and zero, for the
search's kernel layout) per group of 128; int8 N*K + per-channel scale (+ zero point for NNCF's asymmetric int8);
bf16 2NK; fp32 4NK. Which type NNCF gave a layer is read off its compressed weight (uint8 of N*K/2 or N*K bytes).

Needs NNCF (not in the project's venv): ``pip install --target DIR nncf`` and ``--nncf-path DIR`` (appended to
sys.path, after the venv's packages).

    PYTHONPATH=src python bench/search_weight_only.py [--layers 4] [--tolerance 0.05 0.1 0.2] [--nncf-path DIR]
    PYTHONPATH=src python bench/search_weight_only.py --kernels   # the weight-only kernels on fp32 vs bf16 rows

Measured 2026-11-27 (AMD EPYC, avx512_bf16, 2 cores shared with other jobs, OMP_NUM_THREADS=1, NNCF 3.4.0, torch
2.13): the search's plan has less logit error than NNCF's ratio mix at (slightly less than) the same bytes::

    4 layers, TinyLlama widths (241.7M Linear weights), --tolerance 0.1 0.05:
    tolerance  search error  bytes        w4/w8/bf16/fp32  NNCF ratio  NNCF error  bytes        int4/int8
    0.1        9.06e-02      219,500,544  7/22/0/0         0.263       2.19e-01    222,649,088  6/23
    0.05       4.63e-02      235,993,600  3/26/0/0         0.070       7.61e-02    237,932,288  2/27
    (search 160 s and 138 s; cost model in the decode shape: w4a16 3.27x, w8a16 2.16x, bf16 1.32x fp32)

    --layers 2 --hidden 1024 --intermediate 2816 --heads 16 --kv-heads 4 --vocab 8000 (30.7M Linear weights):
    0.05       2.92e-02      30,172,288   2/13/0/0         0.059       8.40e-02    30,304,704   1/14
    0.1        9.67e-02      26,103,936   5/10/0/0         0.429       1.82e-01    26,994,112   4/11
    0.2        1.56e-01      21,754,368   7/8/0/0          0.826       2.17e-01    22,778,560   7/8
    (NNCF with every layer int8 on this shape: 2.21e-02 at 30,815,680 bytes)

Random weights, not a trained model: the errors are larger than a trained Llama's, and which layers int4 hurts
most is the random draw's; the comparison is like for like (same model, data, bytes).
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import sys
import time

# bench/openvino.py would shadow the openvino package NNCF imports: this directory off the path
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import torch  # noqa: E402

import mixprec  # noqa: E402
from mixprec.dtypes import dtype_name  # noqa: E402  (names the weight-only types too: "w4a16")

GROUP = 128


def llama(args):
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        max_position_embeddings=256, tie_word_embeddings=False, use_cache=False,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def batches(args, count: int, seed: int) -> list:
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, args.vocab, (1, args.tokens), generator=generator),) for _ in range(count)]


def rel_l2(run, model, data) -> float:
    err = ref = 0.0
    with torch.no_grad():
        for args in data:
            got, expected = run(*args).logits.double(), model(*args).logits.double()
            err += (got - expected).pow(2).sum().item()
            ref += expected.pow(2).sum().item()
    return math.sqrt(err / ref)


def layer_bytes(kind: str, n: int, k: int) -> int:
    groups = n * math.ceil(k / GROUP)
    return {
        "w4a16": n * k // 2 + groups * 2 * 2,  # the int4 kernel's scales and zeros, bf16
        "w8a16": n * k + n * 2,  # symmetric, one bf16 scale per output channel
        "nncf_int4": n * k // 2 + groups * 2,  # INT4_SYM: one fp16 scale per group
        "nncf_int8": n * k + n * (2 + 1),  # INT8_ASYM: fp16 scale and uint8 zero point per channel
        "bfloat16": 2 * n * k,
        "float32": 4 * n * k,
    }[kind]


def linears(model) -> dict:
    return {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


def search_point(model, eval_data, test_data, tolerance):
    start = time.perf_counter()
    result = mixprec.search(model, eval_data[0], low_precision_type=("w4a16", "w8a16", "bf16"), tolerance=tolerance,
                            eval_dataloader=eval_data, cache=False, progress_stream=sys.stderr)
    seconds = time.perf_counter() - start
    program = mixprec.compile(model, eval_data[0], plan=result.plan)
    types = {g.module: dtype_name(g.precision) for g in result.groups if g.op == "aten.linear.default"}
    modules = linears(model)
    nbytes = sum(layer_bytes(types.get(name, "float32"), *m.weight.shape) for name, m in modules.items())
    counts = {t: sum(1 for v in types.values() if v == t) for t in ("w4a16", "w8a16", "bfloat16", "float32")}
    counts["float32"] += sum(1 for name in modules if name not in types)
    return dict(error=rel_l2(program, model, test_data), bytes=nbytes, counts=counts, seconds=seconds,
                eval_error=result.chosen.metric, speed=result.speed_text())


def nncf_ratio_for(model, target_bytes: int) -> float:
    """The ratio whose int4/int8 mix (by parameters, lm_head int8) weighs ``target_bytes``, clamped to 0..1."""
    modules = linears(model)
    head = "lm_head"
    fixed = layer_bytes("nncf_int8", *modules[head].weight.shape)
    int8 = sum(layer_bytes("nncf_int8", *m.weight.shape) for name, m in modules.items() if name != head)
    int4 = sum(layer_bytes("nncf_int4", *m.weight.shape) for name, m in modules.items() if name != head)
    # not 0: NNCF 3.4 takes ratio=0 as 1 (measured here: every layer int4), 1e-6 gives every layer int8
    return min(1.0, max(1e-6, (fixed + int8 - target_bytes) / (int8 - int4)))


def nncf_point(model, eval_data, test_data, ratio, embeddings=False):
    import nncf

    # embeddings kept float (the bytes compared are the Linears'; the search leaves the gather's table as it is)
    # unless --nncf-embeddings: NNCF's default, int8 embeddings, which adds their error to NNCF's
    ignored = None if embeddings else nncf.IgnoredScope(types=["embedding"], validate=False)
    compressed = nncf.compress_weights(copy.deepcopy(model), mode=nncf.CompressWeightsMode.INT4_SYM,
                                       group_size=GROUP, ratio=ratio, dataset=nncf.Dataset([a[0] for a in eval_data]),
                                       ignored_scope=ignored)
    counts = {"int4": 0, "int8": 0}
    nbytes = 0
    for name, m in linears(compressed).items():
        n, k = linears(model)[name].weight.shape
        kind = "int4" if m.weight.numel() * 2 == n * k else "int8"
        counts[kind] += 1
        nbytes += layer_bytes(f"nncf_{kind}", n, k)
    return dict(error=rel_l2(compressed, model, test_data), bytes=nbytes, counts=counts)


def kernels(rounds: int = 7):
    """One row through a Linear: dense vs the weight-only kernels, on fp32 and on bf16 rows (ms, median of ``rounds``
    interleaved rounds, each the mean of 10 calls). Shapes: 2048x2048 (a q/o projection: 4 MB of int8, which stays
    in this CPU's caches between calls) and 32000x2048 (TinyLlama's lm_head: 65 MB of int8, read from memory), where
    GB/s = the weight's bytes / time. "int8 as 2x int4": an int8 weight (per-channel scale s) split in two int4
    halves, q = 16 hi + lo (hi in [-8, 7] with scale 16 s, lo in [0, 15] with scale s and zero 8 s): the same bytes
    read by two int4 kernel calls, the results added (two bf16 roundings instead of one)."""
    def split(q, scales, dtype, group=256):
        n, k = q.shape
        wide = q.to(torch.int32)
        halves = []
        for codes, scale, zero in (((wide >> 4) + 8, 16 * scales, 0 * scales), (wide & 15, scales, 8 * scales)):
            sz = torch.stack([scale, zero], -1)[None].expand(k // group, n, 2).to(dtype).contiguous()
            halves.append((torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.contiguous(), 1), group, sz))
        return halves

    def two_int4(x, halves):
        (hi, group, sz_hi), (lo, _, sz_lo) = halves
        return (torch.ops.aten._weight_int4pack_mm_for_cpu(x, hi, group, sz_hi)
                + torch.ops.aten._weight_int4pack_mm_for_cpu(x, lo, group, sz_lo))

    print(f"load {os.getloadavg()[0]:.1f}")
    for n, k in ((2048, 2048), (32000, 2048)):
        weight = torch.randn(n, k)
        q = torch.randint(-128, 128, (n, k), dtype=torch.int8)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.randint(0, 16, (n, k), dtype=torch.int32), 1)
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(1, k, dtype=dtype)
            scales = torch.rand(n, dtype=dtype)
            sz = torch.rand(k // GROUP, n, 2, dtype=dtype)
            halves = split(q, scales.float(), dtype)
            dense = weight.to(dtype)
            calls = {"dense": lambda: torch.nn.functional.linear(x, dense),
                     "int8pack": lambda: torch.ops.aten._weight_int8pack_mm(x, q, scales),
                     "int4pack": lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, GROUP, sz),
                     "int8 as 2x int4": lambda: two_int4(x, halves)}
            times = {name: [] for name in calls}
            for _ in range(rounds):
                for name, f in calls.items():
                    f()
                    start = time.perf_counter()
                    for _ in range(10):
                        f()
                    times[name].append((time.perf_counter() - start) / 10 * 1e3)
            nbytes = {"dense": n * k * dense.element_size(), "int8pack": n * k, "int4pack": n * k // 2,
                      "int8 as 2x int4": n * k}
            print(f"{n}x{k} {str(dtype):15} " + "  ".join(
                f"{name} {sorted(t)[len(t) // 2]:.3f} ms ({nbytes[name] / sorted(t)[len(t) // 2] / 1e6:.1f} GB/s)"
                for name, t in times.items()))
    print(f"load {os.getloadavg()[0]:.1f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=5632)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--eval", type=int, default=6)
    parser.add_argument("--test", type=int, default=4)
    parser.add_argument("--tolerance", type=float, nargs="+", default=[0.05, 0.1, 0.2])
    parser.add_argument("--nncf-path", default=None, help="a directory NNCF was pip-installed into (--target)")
    parser.add_argument("--nncf-embeddings", action="store_true", help="NNCF compresses the embeddings (int8) as by "
                        "default (else they stay float, as the search's plan keeps their storage)")
    parser.add_argument("--kernels", action="store_true", help="only time the weight-only kernels")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    if args.kernels:
        kernels()
        return
    if args.nncf_path:
        sys.path.append(args.nncf_path)
    model = llama(args)
    eval_data, test_data = batches(args, args.eval, 1), batches(args, args.test, 2)
    params = sum(m.weight.numel() for m in linears(model).values())
    print(f"Llama {args.layers} layers, hidden {args.hidden}, {params / 1e6:.1f}M Linear weights, "
          f"{args.eval} eval / {args.test} test batches of {args.tokens} tokens; rel-L2 of the logits on the test "
          "batches; Linear weight bytes")
    print(f"{'tolerance':>9}  {'search error':>12}  {'bytes':>11}  {'layers w4/w8/bf16/fp32':>22}  "
          f"{'NNCF ratio':>10}  {'NNCF error':>10}  {'bytes':>11}  {'int4/int8':>9}")
    for tolerance in args.tolerance:
        s = search_point(model, eval_data, test_data, tolerance)
        c = s["counts"]
        line = (f"{tolerance:>9g}  {s['error']:>12.4e}  {s['bytes']:>11,}  "
                f"{c['w4a16']:>5}/{c['w8a16']}/{c['bfloat16']}/{c['float32']:<10}")
        try:
            ratio = nncf_ratio_for(model, s["bytes"])
            n = nncf_point(model, eval_data, test_data, ratio, args.nncf_embeddings)
            line += (f"  {ratio:>10.3f}  {n['error']:>10.4e}  {n['bytes']:>11,}  "
                     f"{n['counts']['int4']:>4}/{n['counts']['int8']}")
        except ImportError:
            line += "  NNCF not installed (--nncf-path)"
        print(line, f"  [search {s['seconds']:.0f} s; {s['speed']}]", flush=True)


if __name__ == "__main__":
    main()
