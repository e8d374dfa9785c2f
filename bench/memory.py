"""Peak memory (issue 8): during mixprec.compile, and during one forward of each variant.

    python bench/memory.py [--models transformer_layer,cnn,bert_base,gpt2_small,vit_base]

Every measurement runs in a fresh Python process (peaks are per process). Linux keeps the
process's peak resident set in VmHWM; writing 5 to /proc/self/clear_refs resets it, so a step's
peak above the memory held before it is VmHWM after the step minus VmRSS before it.
Compile: the peak above the process with the model loaded (after one warm-up torch.export, so
that the library's one-time set-up is not counted), against the fp32 parameter bytes and one bf16
copy (the bar: no more than one low-precision copy). Forward: the peak of one call
above the memory held before it (activations and temporaries; weights cast on the fly by
torch.autocast count here).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from harness import machine, stamp, table  # noqa: E402

CHILD = r"""
import copy, json, sys, torch
sys.path.insert(0, {here!r})
from models import MODELS
import mixprec

def status(key):
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key):
                return int(line.split()[1]) * 1024

def peak_of(fn):
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    before = status("VmRSS:")
    result = fn()
    return status("VmHWM:") - before, result

torch.set_num_threads(2)
torch.manual_seed(0)
kwargs = {{"batch": {batch}}} if {batch} and {name!r} not in ("transformer_layer", "cnn") else {{}}
model, inputs = MODELS[{name!r}](**kwargs)
variant = {variant!r}
out = {{"fp32_param_bytes": sum(p.numel() * p.element_size() for p in model.parameters())}}
if variant.startswith("mixprec"):
    torch.export.export(model, inputs)  # one-time library set-up (code caches, ~40 MB) is not compile's holding
    out["compile_peak"], prog = peak_of(lambda: mixprec.compile(model, inputs, enable_autocast=True))
    del model  # the user's fp32 model may go once compiled; the program holds what it needs
    run = lambda: prog(*inputs)
elif variant == "torch.autocast bf16":
    def run():
        with torch.autocast(inputs[0].device.type, dtype=torch.bfloat16):
            return model(*inputs)
elif variant == ".to(bfloat16)":
    model = model.to(torch.bfloat16)
    inputs = tuple(t.bfloat16() if t.is_floating_point() else t for t in inputs)
    run = lambda: model(*inputs)
else:
    run = lambda: model(*inputs)
with torch.inference_mode():
    run()  # warm-up: one-time allocations are not the forward's
    out["forward_peak"], _ = peak_of(run)
out["resident_after"] = status("VmRSS:")
print(json.dumps(out))
"""

VARIANTS = ("fp32 eager", "torch.autocast bf16", ".to(bfloat16)", "mixprec eager")


def measure(name: str, variant: str, batch: int | None = None) -> dict:
    code = CHILD.format(here=str(HERE), name=name, variant=variant, batch=batch or 0)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="transformer_layer,cnn,bert_base,gpt2_small,vit_base")
    parser.add_argument("--batch", type=int, default=None, help="example batch size for the transformers models")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    print(f"{stamp()}  {machine()}")
    print(f"command: python bench/{Path(__file__).name} {' '.join(sys.argv[1:])}")
    mb = 2**20
    rows = []
    for name in args.models.split(","):
        for variant in args.variants.split(","):
            m = measure(name, variant, args.batch)
            row = {"model": name, "variant": variant, "forward peak MB": m["forward_peak"] / mb,
                   "resident after MB": m["resident_after"] / mb}
            if "compile_peak" in m:
                row["compile peak MB"] = m["compile_peak"] / mb
                row["fp32 params MB"] = m["fp32_param_bytes"] / mb
                row["compile peak / one bf16 copy"] = m["compile_peak"] / (m["fp32_param_bytes"] / 2)
            rows.append(row)
            print(table(rows[-1:], list(row)))
            sys.stdout.flush()
    print()
    print(table(rows, ["model", "variant", "forward peak MB", "resident after MB", "compile peak MB", "fp32 params MB",
                       "compile peak / one bf16 copy"]))


if __name__ == "__main__":
    main()
