"""The weight-only kernels' own ceiling at decode (issue 32's roofline bar): how many bytes of weights per second each
runtime's Linear kernels stream at one row, as a share of this machine's copy bandwidth.

A decode step is bound by memory only if its kernels can read weights as fast as memory delivers them. This script
times the Linears alone -- a stack of ``--pairs`` up/down projections of TinyLlama's MLP widths (2048 -> 5632 ->
2048, random weights, 0.18 B parameters at the default 8 pairs: larger than any cache; 24 pairs are about the ~1B
decoder's Linears) called on one row -- so no attention, sampling or Python loop is in the time.

Variants (those that install): fp32 and bf16 eager (PyTorch's GEMV); mixprec W8A16 / W4A16 (int4 symmetric, groups
of 128) on eager and on openvino, the openvino ones also with ``weight_only_dynamic_activations=32``; NNCF's
``compress_weights`` INT4_SYM g128 / INT8_ASYM of the same stack, run by OpenVINO with its defaults. In INT4_SYM mode
NNCF keeps the stack's last Linear INT8_ASYM (its rule for an lm_head) and its bytes are counted as int4's here, so
its GiB/s is understated by about 6% at 8 pairs.

Bytes per call are the weights each type stores (int4: N*K/2 + an fp16 scale per group of 128; int8: N*K + a scale
per row; bf16 2NK; fp32 4NK). GiB/s = bytes / median time. "of copy" divides it by a copy of a 1 GiB buffer at the
same thread count, bench/weight_only.py's roofline bandwidth. A decode of a whole model reaches at most about that
share of its roofline.

On the shared 2-core VM the copy moves with the neighbours and the page size: 21-29 GiB/s with 4 KiB pages in
four runs, and 50.7 then 28.1 GiB/s in two runs with ``THP_MEM_ALLOC_ENABLE=1`` (torch's large tensors in
transparent huge pages). Compare the shares within one run.

    OMP_NUM_THREADS=N PYTHONPATH=src:DIR python bench/weight_only_ceiling.py [--threads N] [--pairs 8] [--rounds 7]

(DIR: nncf installed beside the venv, as bench/weight_only.py says; without it the NNCF rows are left out.)
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

import torch

import harness  # bench/harness.py
import weight_only as wb  # bench/weight_only.py (it drops bench/ from sys.path again: import it first)

import mixprec  # noqa: E402

HIDDEN, INTERMEDIATE, GROUP = 2048, 5632, 128


def stack(pairs: int) -> torch.nn.Module:
    torch.manual_seed(0)
    layers = []
    for _ in range(pairs):
        layers += [torch.nn.Linear(HIDDEN, INTERMEDIATE, bias=False), torch.nn.Linear(INTERMEDIATE, HIDDEN, bias=False)]
    return torch.nn.Sequential(*layers).eval()


def weight_bytes(model, kind: str) -> int:
    total = 0
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            n, k = m.weight.shape
            total += {"fp32": 4 * n * k, "bf16": 2 * n * k, "int8": n * k + 4 * n,
                      "int4": n * k // 2 + 2 * n * (k // GROUP)}[kind]
    return total


def mixprec_variant(model, x, bits: str, backend: str, dynamic=None):
    cfg = mixprec.MixedPrecisionConfigurator(model, x)
    cfg.set_precision(model, activation="bf16")
    options = {"group_size": GROUP} if bits == "int4" else {}
    cfg.set_precision(torch.nn.Linear, activation="bf16", param={"weight": bits}, **options)
    extra = {"weight_only_dynamic_activations": dynamic} if dynamic else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = mixprec.compile(model, x, plan=cfg.apply(), backend=backend, **extra)
    return lambda: program(x)


def nncf_variant(model, x, mode: str):
    import openvino as ov

    compress = wb.nncf_compress(mode, GROUP if mode == "INT4_SYM" else None)  # bench/weight_only.py's
    compressed = compress(ov.convert_model(model, example_input=(x,)))
    compiled = ov.Core().compile_model(compressed, "CPU", {"INFERENCE_NUM_THREADS": torch.get_num_threads()})
    request = compiled.create_infer_request()
    array = x.numpy()
    return lambda: request.infer([array])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"# weight-only kernels at one row: bytes streamed vs the copy bandwidth, {harness.stamp()}")
    print(f"machine: {harness.machine()}; threads {torch.get_num_threads()} (torch and OpenVINO); load average "
          f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print("command: python bench/weight_only_ceiling.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    copy_bw, _ = wb.memory_bandwidth(1.0)
    pages = "huge pages (THP_MEM_ALLOC_ENABLE=1)" if os.environ.get("THP_MEM_ALLOC_ENABLE") == "1" else "4 KiB pages"
    print(f"copy bandwidth at {torch.get_num_threads()} thread(s): {copy_bw / 2**30:.1f} GiB/s; torch allocates in "
          f"{pages}", flush=True)

    model = stack(args.pairs)
    x = torch.randn(1, HIDDEN)
    bf16 = stack(args.pairs).to(torch.bfloat16)  # the same seeded weights
    xb = x.to(torch.bfloat16)
    variants, kinds = {}, {}

    def add(name, kind, build):
        try:
            variants[name] = build()
            kinds[name] = kind
        except ImportError as e:
            print(f"{name}: left out ({e})", flush=True)

    with torch.no_grad():
        add("fp32 eager", "fp32", lambda: (lambda: model(x)))
        add("bf16 eager", "bf16", lambda: (lambda: bf16(xb)))
        add("mixprec W8A16 eager", "int8", lambda: mixprec_variant(model, x, "int8", "eager"))
        add("mixprec W4A16 eager", "int4", lambda: mixprec_variant(model, x, "int4", "eager"))
        add("mixprec W8A16 openvino", "int8", lambda: mixprec_variant(model, x, "int8", "openvino"))
        add("mixprec W4A16 openvino", "int4", lambda: mixprec_variant(model, x, "int4", "openvino"))
        add("mixprec W8A16 openvino dynamic", "int8", lambda: mixprec_variant(model, x, "int8", "openvino", 32))
        add("mixprec W4A16 openvino dynamic", "int4", lambda: mixprec_variant(model, x, "int4", "openvino", 32))
        add("openvino+nncf INT8_ASYM", "int8", lambda: nncf_variant(model, x, "INT8_ASYM"))
        add("openvino+nncf INT4_SYM g128", "int4", lambda: nncf_variant(model, x, "INT4_SYM"))
        times = harness.interleaved(variants, rounds=args.rounds, warmup=2)
    rows = []
    for name, seconds in times.items():
        size = weight_bytes(model, kinds[name])
        rows.append({"variant": name, "weights MiB": size / 2**20, "ms per call": seconds * 1e3,
                     "GiB/s": size / seconds / 2**30, "of copy": f"{size / seconds / copy_bw:.0%}",
                     "x fp32 eager": times["fp32 eager"] / seconds})
    print(harness.table(rows, ["variant", "weights MiB", "ms per call", "GiB/s", "of copy", "x fp32 eager"]))
    print(f"load average at the end {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
