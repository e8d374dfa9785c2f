"""Where a W4A16 decode step spends its time on OpenVINO: mixprec's program vs NNCF INT4_SYM g128 (issue 32).

OpenVINO's per-layer counters (PERF_COUNT) of one decode step, per kind of layer (FullyConnected layers by weight
shape and element type), for: mixprec W4A16 openvino (``compile_for_generation(bf16 copy, weights="int4",
group_size=128, backend="openvino")``, lm_head int8), optionally the same with the int4 pattern before issue 32's
i4 change (``--old``: u4 constants and a Subtract of the zero point 8), and the NNCF INT4_SYM g128 model of
bench/weight_only.py with OpenVINO's defaults (dynamic quantization of the activations: W4A8 kernels) and without.

The CPU plugin reports each layer's average over every inference of the request so far (the prompt's included), so
a decode step is taken by differencing totals (average * calls): NNCF's between the prefill and LONG - SHORT decode
steps later; mixprec's (the runner's calls counted) from generate() with SHORT, LONG, SHORT new tokens — (second -
first) minus (third - second) leaves LONG - SHORT decode steps. Rounds interleaved, medians, 1 thread, load printed.

    PYTHONPATH=src:DIR python bench/weight_only_ov_profile.py [--layers 8] [--rounds 5] [--old]

(DIR: nncf installed beside the venv, as bench/weight_only.py says.)
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import tempfile
import warnings

import torch

import weight_only as wb  # bench/weight_only.py (it drops bench/ from sys.path again: import it first)

import numpy as np  # noqa: E402
import openvino as ov  # noqa: E402

import mixprec.backends.openvino.compressed as compressed  # noqa: E402
import mixprec.backends.openvino.runner as runner  # noqa: E402

SHORT, LONG = 4, 36


def kinds(compiled) -> dict:
    """node name -> its kind: FullyConnected layers by weight shape and type, the others by layer type."""
    out = {}
    for op in compiled.get_runtime_model().get_ordered_ops():
        kind = op.get_rt_info()["layerType"].astype(str)
        if kind.startswith("FullyConnected"):
            kind = f"FC {op.input(1).get_partial_shape()} {op.input(1).get_element_type().get_type_name()}"
        out[op.get_friendly_name()] = kind
    return out


def totals(request, calls: int, names: dict) -> dict:
    """µs per kind over the request's ``calls`` inferences so far."""
    out = collections.defaultdict(float)
    for p in request.get_profiling_info():
        if p.status == p.Status.EXECUTED:
            out[names.get(p.node_name, p.node_type)] += p.real_time.total_seconds() * 1e6 * calls
    return out


def minus(a: dict, b: dict) -> dict:
    return {k: a.get(k, 0) - b.get(k, 0) for k in set(a) | set(b)}


def mixprec_step(model, ids, length):
    """A function -> µs per kind of one decode step of mixprec's W4A16 program on OpenVINO."""
    lm = mixprec_program(model, ids, length)
    rn = next(m for m in lm.modules() if hasattr(m, "compiled_model"))
    calls, forward, names = [0], rn.forward, kinds(rn.compiled_model)

    def counted(*args, **kwargs):
        calls[0] += 1
        return forward(*args, **kwargs)

    rn.forward = counted

    def generate(new):
        lm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                    do_sample=False, pad_token_id=0)
        request = rn._idle.get()  # the stateful runner's one request
        rn._idle.put(request)
        return totals(request, calls[0], names), calls[0]

    def step():
        (t1, c1), (t2, c2), (t3, c3) = generate(SHORT), generate(LONG), generate(SHORT)
        steps = (c2 - c1) - (c3 - c2)
        return {k: v / steps for k, v in minus(minus(t2, t1), minus(t3, t2)).items()}

    return step


def mixprec_program(model, ids, length):
    bf16 = wb.cast_copy(model, torch.bfloat16)
    return wb.mixprec.hf.compile_for_generation(bf16, ids, static_cache=True, max_cache_len=length, max_length=length,
                                                weights="int4", group_size=wb.GROUP, backend="openvino")


def nncf_step(model, ids, path, extra):
    """A function -> µs per kind of one decode step of NNCF's INT4_SYM g128 model (explicit KV cache)."""
    compiled = ov.Core().compile_model(wb.nncf_compress("INT4_SYM", wb.GROUP)(ov.Core().read_model(path)), "CPU",
                                       {"INFERENCE_NUM_THREADS": 1, "PERF_COUNT": True, **extra})
    request, names, calls = compiled.create_infer_request(), kinds(compiled), [0]
    layers = 2 * model.config.num_hidden_layers

    def step():
        past = [np.zeros(wb.kv_shape(model.config, 0), np.float32) for _ in range(layers)]
        prompt = ids.shape[1]
        result = request.infer([ids.numpy(), np.ones((1, prompt), np.int64), np.arange(prompt)[None], *past])
        calls[0] += 1
        before, position = totals(request, calls[0], names), ids.shape[1]
        for _ in range(LONG - SHORT):
            past, token = [result[i] for i in range(1, layers + 1)], int(result[0][0, -1].argmax())
            result = request.infer([np.array([[token]]), np.ones((1, position + 1), np.int64),
                                    np.array([[position]]), *past])
            calls[0] += 1
            position += 1
        return {k: v / (LONG - SHORT) for k, v in minus(totals(request, calls[0], names), before).items()}

    return step


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--old", action="store_true", help="also mixprec's int4 pattern before i4 (u4 + Subtract)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    runner.COMPILE_CONFIG = {**runner.COMPILE_CONFIG, "PERF_COUNT": True}
    runner.FLOAT_FORM_CONFIG = {**runner.FLOAT_FORM_CONFIG, "PERF_COUNT": True}
    print(wb.machine(), f"; load average at start {os.getloadavg()}", flush=True)
    model = wb.tinyllama(args.layers)
    ids = torch.randint(0, model.config.vocab_size, (1, 128), generator=torch.Generator().manual_seed(1))
    directory = tempfile.TemporaryDirectory()
    path = wb.convert_openvino(model, directory.name)
    steps = {}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        steps["mixprec W4A16 openvino"] = mixprec_step(model, ids, 128 + LONG + 2)
        if args.old:
            keep = compressed._all_equal
            compressed._all_equal = lambda node, value: False  # never i4: u4 and the Subtract of 8, as before
            steps["mixprec W4A16 openvino, u4 + Subtract"] = mixprec_step(model, ids, 128 + LONG + 2)
            compressed._all_equal = keep
        steps["openvino+nncf INT4_SYM g128"] = nncf_step(model, ids, path, {})
        steps["... no dynamic quantization"] = nncf_step(model, ids, path, wb.NO_DYNAMIC_QUANTIZATION)
        got = {name: [] for name in steps}
        for r in range(args.rounds):
            for name, step in steps.items():
                got[name].append(step())
            print(f"round {r} (load {os.getloadavg()[0]:.2f}): " + ", ".join(
                f"{name} {sum(got[name][-1].values()) / 1e3:.1f} ms" for name in got), flush=True)
    median = {name: {k: statistics.median(g.get(k, 0) for g in runs) for k in set().union(*runs)}
              for name, runs in got.items()}
    order = sorted(set().union(*median.values()), key=lambda k: -max(m.get(k, 0) for m in median.values()))
    print(f"\nµs per decode step (median of {args.rounds}, {args.layers} layers, 1 thread); kinds under 50 µs left "
          "out")
    print("| kind | " + " | ".join(median) + " |\n|---|" + "---|" * len(median))
    for kind in order:
        if max(m.get(kind, 0) for m in median.values()) >= 50:
            print(f"| {kind} | " + " | ".join(f"{m.get(kind, 0):.0f}" for m in median.values()) + " |")
    print("| total | " + " | ".join(f"{sum(m.values()):.0f}" for m in median.values()) + " |")
    print(f"load average at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
