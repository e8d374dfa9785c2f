"""The benchmark suite (issue 8): mixprec against the ways people run a model in bf16 on this CPU.

    python bench/suite.py [--models transformer_layer,cnn,bert_base,gpt2_small,vit_base] [--rounds N]
                          [--no-compile] [--json out.json]

Variants, all timed inside one process, interleaved round-robin, medians of --rounds rounds:
  fp32 eager · torch.autocast("cpu", bfloat16) eager · the whole model .to(bfloat16) ·
  mixprec autocast bf16 (eager backend) · mixprec autocast bf16 (inductor backend) ·
  torch.compile of the fp32 model · torch.compile of the .to(bfloat16) model.
Also "mixprec eager, bf16 outputs": keep_io_types=False, returning what the last layer computes (as
torch.autocast does) instead of converting outputs back to the model's fp32.
Figures: latency, speedup over fp32 eager, rel-L2 error against fp32 eager (all float outputs, fp64),
parameter bytes, and mixprec's compile time split into its phases. Peak memory: bench/memory.py.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch
import torch.utils._pytree as pytree

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from harness import interleaved, machine, stamp, table  # noqa: E402
from models import MODELS  # noqa: E402

import mixprec  # noqa: E402
from mixprec.output.numerics import output_errors  # noqa: E402


def param_bytes(module: torch.nn.Module) -> int:
    """Bytes of parameters and buffers, a tensor shared under two names (tied weights) counted once."""
    from mixprec.ir.work_program import stored_bytes

    return stored_bytes(module.state_dict(), {})


def run(name: str, rounds: int, with_compile: bool) -> dict:
    torch.manual_seed(0)
    model, inputs = MODELS[name]()
    low = copy.deepcopy(model).to(torch.bfloat16)
    low_inputs = pytree.tree_map(lambda t: t.bfloat16() if isinstance(t, torch.Tensor) and t.is_floating_point() else t, inputs)

    def autocast():
        with torch.autocast(inputs[0].device.type, dtype=torch.bfloat16):
            return model(*inputs)

    timings = {}
    start = time.perf_counter()
    prog = mixprec.compile(model, inputs, enable_autocast=True)
    timings["mixprec eager"] = time.perf_counter() - start
    prog_low_out = mixprec.compile(model, inputs, enable_autocast=True, keep_io_types=False)
    variants = {
        "fp32 eager": lambda: model(*inputs),
        "torch.autocast bf16": autocast,
        ".to(bfloat16)": lambda: low(*low_inputs),
        "mixprec eager": lambda: prog(*inputs),
        "mixprec eager, bf16 outputs": lambda: prog_low_out(*inputs),
    }
    if with_compile:
        start = time.perf_counter()
        prog_ind = mixprec.compile(model, inputs, enable_autocast=True, backend="inductor")
        timings["mixprec inductor"] = time.perf_counter() - start
        compiled_fp32 = torch.compile(model)
        compiled_low = torch.compile(low)
        with torch.inference_mode():
            for label, fn in (("torch.compile fp32", lambda: compiled_fp32(*inputs)),
                              ("torch.compile bf16", lambda: compiled_low(*low_inputs))):
                start = time.perf_counter()
                fn()
                timings[label] = time.perf_counter() - start
        variants.update({
            "mixprec inductor": lambda: prog_ind(*inputs),
            "torch.compile fp32": lambda: compiled_fp32(*inputs),
            "torch.compile bf16": lambda: compiled_low(*low_inputs),
        })
    with torch.inference_mode():
        reference = model(*inputs)
        outputs = {label: fn() for label, fn in variants.items()}
    latency = interleaved(variants, rounds=rounds)
    sizes = {
        "fp32 eager": param_bytes(model), "torch.autocast bf16": param_bytes(model), ".to(bfloat16)": param_bytes(low),
        "mixprec eager": prog.report.summary["param_bytes_after"], "mixprec inductor": prog.report.summary["param_bytes_after"],
        "mixprec eager, bf16 outputs": prog_low_out.report.summary["param_bytes_after"],
        "torch.compile fp32": param_bytes(model), "torch.compile bf16": param_bytes(low),
    }
    rows = []
    for label in variants:
        rows.append({
            "variant": label,
            "latency ms": latency[label] * 1e3,
            "speedup vs fp32": latency["fp32 eager"] / latency[label],
            "rel-L2 vs fp32": output_errors(outputs[label], reference)["rel_l2_error"],
            "param MB": sizes[label] / 2**20,
            "compile s": timings.get(label, ""),
        })
    return {
        "model": name,
        "rows": rows,
        "mixprec": {k: prog.report.summary[k] for k in ("layers_by_precision", "low_precision_flops_fraction",
                                                           "casts_inserted", "compile_seconds")},
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-compile", action="store_true", help="skip the inductor / torch.compile variants")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{stamp()}  {machine()}")
    print(f"command: python bench/{Path(__file__).name} {' '.join(sys.argv[1:])}")
    results = []
    for name in args.models.split(","):
        result = run(name, args.rounds, not args.no_compile)
        results.append(result)
        print(f"\n### {name}  (medians of {args.rounds} interleaved rounds)")
        print(table(result["rows"], ["variant", "latency ms", "speedup vs fp32", "rel-L2 vs fp32", "param MB",
                                     "compile s"]))
        m = result["mixprec"]
        print(f"mixprec: {m['layers_by_precision']}, low-precision FLOP share {m['low_precision_flops_fraction']:.3f}, "
              f"casts {m['casts_inserted']}, compile phases (s): "
              + ", ".join(f"{k} {v:.3f}" for k, v in m["compile_seconds"].items()))
        sys.stdout.flush()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
