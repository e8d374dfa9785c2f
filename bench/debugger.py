"""The debugger's first suggestion, pasted, and the report's readability (issue 23, items 4 and 5).

    PYTHONPATH=src python bench/debugger.py [--layers 30]

Runs on any revision of mixprec (run it with another tree's ``src`` on PYTHONPATH for the figures
before a change). Per case (a 2-layer Qwen2 from a random config in bf16 autocast, a model with
a planted bf16 cancellation, a ``--layers``-layer Llama for the cost of measuring fixes):

* the output rel-L2 error against fp32 of the compiled program (``report.summary``), bf16 autocast (the
  planted case with ``autocast_included_nodes=["^shift$"]``: a layer forced into bf16 that should not be);
* the first suggestion of ``mixprec.debug``: whether its code runs as pasted (exec in a namespace
  holding only ``prog``, ``model``, ``inputs`` — or ``found`` when the code names it), and the output
  error of the program it builds; for a revision whose suggestion does not run, the error of the
  program that does what it says (its layer in fp32 by a plan edit);
* the wall time of ``mixprec.debug``.

Then the text report (``print(prog.report)``): rows and widest line for three models, the widest
line of the debugger's text, and the height of the HTML report's graph (the SVG's height attribute)
for the 2-layer Qwen2 and a ``--layers``-layer Llama.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from harness import machine, stamp  # noqa: E402

import mixprec  # noqa: E402


def qwen2(layers=2):
    import transformers

    torch.manual_seed(0)
    config = transformers.Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      use_cache=False)  # fmt: skip
    return transformers.Qwen2ForCausalLM(config).eval(), (torch.randint(0, 256, (2, 16)),)


def llama(layers):
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                                      use_cache=False)  # fmt: skip
    return transformers.LlamaForCausalLM(config).eval(), (torch.randint(0, 32, (1, 8)),)


class Shift(nn.Module):
    def forward(self, x):
        return (x + 1000.0) - 1000.0


class Planted(nn.Module):
    """fc1 -> shift -> fc2 -> fc3; in bf16, shift rounds x + 1000 to steps of 8 and the subtraction shows it.
    (Autocast keeps shift fp32 by its range rule; the case forces it into bf16 with autocast_included_nodes.)"""

    def __init__(self):
        super().__init__()
        self.fc1, self.shift, self.fc2, self.fc3 = nn.Linear(32, 32), Shift(), nn.Linear(32, 32), nn.Linear(32, 8)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(self.shift(self.fc1(x)))))


def planted():
    torch.manual_seed(0)
    return Planted().eval(), (torch.randn(16, 32),)


def bert():
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, max_position_embeddings=32)  # fmt: skip
    return transformers.BertModel(config).eval(), (torch.randint(0, 100, (2, 16)),)


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                      nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(1))  # fmt: skip
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def convnet():
    torch.manual_seed(0)
    return ConvNet().eval(), (torch.randn(2, 3, 32, 32),)


def first_suggestion(model, inputs, prog):
    start = time.perf_counter()
    found = mixprec.debug(prog, inputs)
    seconds = time.perf_counter() - start
    culprit = found.culprit
    fix = getattr(culprit, "fix", None)
    if fix is not None:  # the code of the fix, as printed
        namespace = {"prog": prog, "model": model, "inputs": inputs, "found": found}
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # the code prints the error it gets
                exec(fix.code, namespace)  # noqa: S102 (the point: does the printed code run)
        except Exception as e:  # noqa: BLE001 (reported)
            return found, seconds, f"{type(e).__name__}: {e}", None, culprit.layer
        after = namespace["prog"].report.summary["rel_l2_error"]
        return found, seconds, "runs", after, ",".join(fix.compute or fix.layers)
    # an older debugger: a sentence holding a plan entry; paste its expression, then do what it says
    text = next((s for s in culprit.suggestions if "with_nodes" in s), "")
    expression = re.search(r"prog\.plan\.with_nodes\(\{.*?\}\)", text)
    pasted = "no code"
    if expression:
        try:
            exec(f"plan = {expression.group(0)}", {"prog": prog, "torch": torch})  # noqa: S102
            pasted = "runs"
        except Exception as e:  # noqa: BLE001 (reported)
            pasted = f"{type(e).__name__}: {e}"
    plan = prog.plan.with_nodes({culprit.layer: mixprec.NodePrecision(torch.float32, source="plan")})
    after = mixprec.compile(model, inputs, plan=plan).report.summary["rel_l2_error"]
    return found, seconds, pasted, after, culprit.layer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=30, help="layers of the Llama whose HTML graph is measured")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(2)
    print(stamp(), machine())
    print("mixprec from", Path(mixprec.__file__).parent)
    print("\n| case | output rel-L2 | first suggestion | pasted | rel-L2 after it | debug s |")
    print("|---|---|---|---|---|---|")
    debug_widths = []
    for name, build, settings in (
        ("Qwen2 2 layers, bf16 autocast", qwen2, {"enable_autocast": True}),
        ("planted cancellation, bf16 autocast", planted,
         {"enable_autocast": True, "autocast_included_nodes": ["^shift$"]}),  # fmt: skip
        (f"Llama {args.layers} layers, bf16 autocast", lambda: llama(args.layers), {"enable_autocast": True}),
    ):
        model, inputs = build()
        prog = mixprec.compile(model, inputs, **settings)
        found, seconds, pasted, after, layers = first_suggestion(model, inputs, prog)
        debug_widths.append(max(len(line) for line in str(found).splitlines()))
        before = prog.report.summary["rel_l2_error"]
        shown = f"{after:.3g}" if after is not None else "-"
        print(f"| {name} | {before:.3g} | {layers} in fp32 | {pasted[:60]} | {shown} | {seconds:.1f} |")
    print(f"\nwidest line of the debugger's text: {max(debug_widths)} characters")
    print("\n| model | report rows | widest line |")
    print("|---|---|---|")
    for name, build in (("Qwen2 2 layers", qwen2), ("BERT 2 layers", bert), ("ConvNet", convnet)):
        model, inputs = build()
        text = str(mixprec.compile(model, inputs, enable_autocast=True).report)
        print(f"| {name} | {len(text.splitlines())} | {max(len(line) for line in text.splitlines())} |")
    print("\n| model | HTML graph height px | width px |")
    print("|---|---|---|")
    for name, build in (("Qwen2 2 layers", qwen2), (f"Llama {args.layers} layers", lambda: llama(args.layers))):
        model, inputs = build()
        page = mixprec.compile(model, inputs, enable_autocast=True).report.to_html()
        svg = re.search(r'<svg id="graph"[^>]* width="(\d+)" height="(\d+)"', page)
        print(f"| {name} | {svg.group(2)} | {svg.group(1)} |")


if __name__ == "__main__":
    main()
