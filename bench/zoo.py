"""mixprec's autocast against torch.autocast on transformers architectures and trained models (issues 12, 20).

    python bench/zoo.py [--only NAME[,NAME]] [--dtypes bf16,fp16] [--no-8l] [--no-low-emb]
    python bench/zoo.py --draws 12 [--batch 16] [--only ...] [--dtypes ...]     # median over input draws
    python bench/zoo.py --speed [--only crepe,minilm,llama-massive] [--rounds 7]  # eager speed

(``--no-low-emb`` also lets the script run against a mixprec without ``autocast_low_precision_embeddings``,
to measure the code before issue 12.) The models are in bench/zoo_models.py: small random configs of
``transformers`` architectures, the Llama-8L shape, and trained models from PyPI wheels (CREPE, MiniLM)
plus a Llama with massive activations injected (tests/trained.py).

Table mode, for each model and low type (bf16, fp16), on one input draw (batch 2):

* the main output (logits or last hidden state) of the fp32 model on these inputs is the reference;
* ``mixprec``: ``mixprec.compile(enable_autocast=True, autocast_low_precision_type=low)`` calibrated on
  the same inputs; its rel-L2 error against the reference;
* ``torch.autocast``: the fp32 model run under ``torch.autocast("cpu", dtype=low)``; its rel-L2 error;
* ratio = mixprec / torch.autocast (the bar: <= 1.1);
* low-precision share of the matmul/conv FLOPs: mixprec's from its report; torch.autocast's measured
  by a dispatch mode that counts the FLOPs of mm/bmm/addmm/baddbmm/convolution/attention calls by dtype
  while the model runs under torch.autocast;
* parameter bytes: fp32 model, mixprec's program, and (bf16 rows) mixprec with
  ``autocast_low_precision_embeddings=True`` (embedding tables stored in the low type);
* for the trained models, their own task metric for mixprec and torch.autocast against fp32 (CREPE: the
  decoded pitch in cents; MiniLM: cosine similarities and nearest neighbours; Llama: top-1 tokens).

``--draws N``: a single small draw's ratio varies by +-20 %, so each model is compiled once (calibrated on
draw 0, batch ``--batch``) and measured on N input draws (seeds 0..N-1, the same batch); the table gives the
median, smallest and largest ratio and the median errors. Default models: issue 20's list (ViT, ConvNeXt,
DETR, Swin, SegFormer, BERT, GPT-2, Llama, Qwen3, Gemma2, T5, Whisper, CLIP and the trained models).

``--speed``: eager time per call of the fp32 model, the model under torch.autocast and the mixprec program
(eager backend), interleaved rounds, medians (bench/harness.py), with the CPU's bf16/fp16 flags: on a CPU
without avx512_bf16/AMX PyTorch emulates bf16, so the figures only mean something on a bf16 CPU.
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).parent))
import transformers  # noqa: E402
from harness import cpu_flags, interleaved, machine, stamp, table  # noqa: E402
from zoo_models import DRAW_MODELS, MODELS, TASKS, TRAINED  # noqa: E402

import mixprec  # noqa: E402
from mixprec.output.numerics import output_errors  # noqa: E402

LOW = {"bf16": torch.bfloat16, "fp16": torch.float16}
NAME = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def main_output(out) -> torch.Tensor:
    for key in ("logits", "logits_per_image", "last_hidden_state"):
        value = getattr(out, key, None) if not isinstance(out, dict) else out.get(key)
        if isinstance(value, torch.Tensor):
            return value
    leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return leaves[0]


def _flops(name, args, out) -> int:
    """Multiply-add FLOPs (2 per MAC) of one matmul/conv/attention call, or 0 for other ops."""
    if name in ("mm", "bmm"):
        return 2 * out.numel() * args[0].shape[-1]
    if name in ("addmm", "baddbmm"):
        return 2 * out.numel() * args[1].shape[-1]
    if name in ("convolution", "_convolution"):
        weight = args[1]
        transposed = bool(args[6]) if len(args) > 6 else False
        return 2 * (args[0].numel() if transposed else out.numel()) * weight[0].numel()
    if name.startswith("_scaled_dot_product"):
        q, k, v = args[:3]
        return 2 * q.shape[:-2].numel() * q.shape[-2] * k.shape[-2] * (q.shape[-1] + v.shape[-1])
    return 0


class LowFlops(TorchDispatchMode):
    """FLOPs of the matmul/conv/attention kernels a forward runs, by the dtype they run in."""

    def __init__(self):
        super().__init__()
        self.by_dtype: dict[torch.dtype, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.name().split("::")[-1].split(".")[0]
        first = out[0] if isinstance(out, (tuple, list)) else out
        flops = _flops(name, args, first) if isinstance(first, torch.Tensor) else 0
        if flops:
            dtype = next(t.dtype for t in args if isinstance(t, torch.Tensor) and t.is_floating_point())
            self.by_dtype[dtype] = self.by_dtype.get(dtype, 0) + flops
        return out


class _Positional(torch.nn.Module):
    """forward(*tensors) -> model(**{names: tensors}, **constants): keyword inputs as positional tensors."""

    def __init__(self, model, names, constants):
        super().__init__()
        self.model, self.names, self.constants = model, names, constants

    def forward(self, *tensors):
        return main_output(self.model(**dict(zip(self.names, tensors)), **self.constants))


def autocast_run(model, args, kwargs, low):
    counter = LowFlops()
    with torch.no_grad(), torch.autocast("cpu", dtype=low), counter:
        out = main_output(model(*args, **kwargs))
    total = sum(counter.by_dtype.values())
    share = counter.by_dtype.get(low, 0) / total if total else float("nan")
    return out, share


def positional(model, args, kwargs):
    """The model with its keyword tensors as positional inputs, and those inputs."""
    names = list(inspect.signature(model.forward).parameters)[: len(args)]
    tensors = {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
    wrapped = _Positional(model, names + list(tensors), {k: v for k, v in kwargs.items() if k not in tensors}).eval()
    return wrapped, tuple(args) + tuple(tensors.values())


def build(name, batch=None, seed=0):
    """(model as positional, inputs) of a zoo model; the weights depend on torch.manual_seed(0) only."""
    torch.manual_seed(0)
    model, args, kwargs = MODELS[name](**({} if batch is None else {"batch": batch}), seed=seed)
    return positional(model.eval(), args, kwargs)


def inputs_of(name, batch, seed):
    """Only the inputs of a draw (the model is built again: its weights are the same, the cost is small)."""
    return build(name, batch, seed)[1]


def param_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def run_one(name, dtypes, rows, low_emb=True):
    model, args = build(name)
    with torch.no_grad():
        ref = main_output(model(*args)).float()
    for low in dtypes:
        start = time.perf_counter()
        prog = mixprec.compile(model, args, enable_autocast=True, autocast_low_precision_type=low)
        with torch.no_grad():
            got = main_output(prog(*args)).float()
        s = prog.report.summary
        mine = output_errors(got, ref)["rel_l2_error"]
        auto_out, auto_share = autocast_run(model, args, {}, low)
        theirs = output_errors(auto_out.float(), ref)["rel_l2_error"]
        row = {
            "model": name, "low": NAME[low],
            "mixprec rel-L2": mine, "torch.autocast rel-L2": theirs, "ratio": mine / theirs if theirs else float("nan"),
            "low FLOP share mixprec": s["low_precision_flops_fraction"], "low FLOP share autocast": auto_share,
            "param MB fp32": param_bytes(model) / 1e6, "param MB mixprec": s["param_bytes_after"] / 1e6,
        }
        if low == torch.bfloat16 and low_emb and name not in TRAINED:
            lowemb = mixprec.compile(model, args, enable_autocast=True, autocast_low_precision_type=low,
                                     autocast_low_precision_embeddings=True)
            with torch.no_grad():
                e = output_errors(main_output(lowemb(*args)).float(), ref)["rel_l2_error"]
            row["param MB low emb"] = lowemb.report.summary["param_bytes_after"] / 1e6
            row["rel-L2 low emb"] = e
        else:
            row["param MB low emb"] = ""
            row["rel-L2 low emb"] = ""
        if name in TASKS:
            row["task mixprec"] = TASKS[name](got, ref)
            row["task torch.autocast"] = TASKS[name](auto_out.float(), ref)
            row["kept fp32 (matmul/conv)"] = _kept(prog)
        row["s"] = time.perf_counter() - start
        rows.append(row)
        print(table([row], list(row)).splitlines()[-1], flush=True)


def _kept(prog) -> str:
    kept = [r for r in prog.report.layers if r.flops and r.precision == torch.float32]
    return "; ".join(f"{r.module or r.name}: {r.reason}" for r in kept) or "none"


def run_draws(name, dtypes, rows, draws, batch):
    """One compile per model and type (calibrated on draw 0), errors on ``draws`` input draws."""
    model, args = build(name, batch, 0)
    draw_inputs = [args] + [inputs_of(name, batch, seed) for seed in range(1, draws)]
    refs = []
    with torch.no_grad():
        for x in draw_inputs:
            refs.append(main_output(model(*x)).float())
    for low in dtypes:
        start = time.perf_counter()
        prog = mixprec.compile(model, args, enable_autocast=True, autocast_low_precision_type=low)
        mine, theirs, shares = [], [], []
        for x, ref in zip(draw_inputs, refs):
            with torch.no_grad():
                got = main_output(prog(*x)).float()
            auto_out, share = autocast_run(model, x, {}, low)
            mine.append(output_errors(got, ref)["rel_l2_error"])
            theirs.append(output_errors(auto_out.float(), ref)["rel_l2_error"])
            shares.append(share)
        ratios = [a / b if b else float("nan") for a, b in zip(mine, theirs)]
        row = {
            "model": name, "low": NAME[low], "draws": draws, "batch": int(next(iter(args)).shape[0]),
            "median ratio": statistics.median(ratios), "min ratio": min(ratios), "max ratio": max(ratios),
            "median rel-L2 mixprec": statistics.median(mine), "median rel-L2 torch.autocast": statistics.median(theirs),
            "low FLOP share mixprec": prog.report.summary["low_precision_flops_fraction"],
            "low FLOP share autocast": statistics.median(shares),
            "s": time.perf_counter() - start,
        }
        rows.append(row)
        print(table([row], list(row)).splitlines()[-1], flush=True)



def run_speed(name, dtypes, rows, rounds, batch):
    model, args = build(name, batch, 0)
    for low in dtypes:
        prog = mixprec.compile(model, args, enable_autocast=True, autocast_low_precision_type=low)

        def autocast_call(low=low):
            with torch.autocast("cpu", dtype=low):
                return model(*args)

        times = interleaved({"fp32": lambda: model(*args), "torch.autocast": autocast_call,
                             "mixprec": lambda: prog(*args)}, rounds=rounds, warmup=1)
        row = {
            "model": name, "low": NAME[low], "batch": int(args[0].shape[0]),
            "fp32 ms": times["fp32"] * 1e3, "torch.autocast ms": times["torch.autocast"] * 1e3,
            "mixprec ms": times["mixprec"] * 1e3,
            "mixprec speedup vs fp32": times["fp32"] / times["mixprec"],
            "torch.autocast speedup vs fp32": times["fp32"] / times["torch.autocast"],
            "mixprec / torch.autocast time": times["mixprec"] / times["torch.autocast"],
            "low FLOP share mixprec": prog.report.summary["low_precision_flops_fraction"],
        }
        rows.append(row)
        print(table([row], list(row)).splitlines()[-1], flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="")
    parser.add_argument("--dtypes", default="bf16,fp16")
    parser.add_argument("--no-8l", action="store_true")
    parser.add_argument("--no-low-emb", action="store_true", help="skip the low-precision-embeddings variant")
    parser.add_argument("--draws", type=int, default=0, help="median over this many input draws (issue 20)")
    parser.add_argument("--batch", type=int, default=16, help="batch of each draw (--draws, --speed)")
    parser.add_argument("--speed", action="store_true", help="eager time per call: fp32, torch.autocast, mixprec")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds (--speed)")
    opts = parser.parse_args()
    torch.set_num_threads(2)
    warnings.simplefilter("ignore")
    transformers.logging.set_verbosity_error()
    dtypes = [LOW[d] for d in opts.dtypes.split(",")]
    if opts.only:
        names = opts.only.split(",")
    elif opts.draws:
        names = list(DRAW_MODELS)
    elif opts.speed:
        names = list(TRAINED)
    else:
        names = [n for n in MODELS if not (opts.no_8l and n == "llama-8L")]
    print(f"{stamp()}  {machine()}")
    print(cpu_flags())
    print(f"command: python bench/zoo.py {' '.join(sys.argv[1:])}".rstrip())
    rows, failed = [], []
    for name in names:
        try:
            if opts.speed:
                run_speed(name, dtypes, rows, opts.rounds, opts.batch)
            elif opts.draws:
                run_draws(name, dtypes, rows, opts.draws, opts.batch)
            else:
                run_one(name, dtypes, rows, low_emb=not opts.no_low_emb)
        except Exception as e:  # a model the bench cannot run: say so, go on
            failed.append((name, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))
            traceback.print_exc(limit=3)
    print()
    if rows:
        columns = list(dict.fromkeys(c for r in rows for c in r))
        print(table(rows, columns))
        key = "median ratio" if opts.draws else "ratio"
        if not opts.speed:
            worst = max(r[key] for r in rows)
            over = [f"{r['model']}/{r['low']}" for r in rows if not r[key] <= 1.1]
            fewer = [f"{r['model']}/{r['low']}" for r in rows
                     if r["low FLOP share mixprec"] < r["low FLOP share autocast"] - 1e-9]
            print(f"\n{len({r['model'] for r in rows})} models; worst {key} {worst:.3g}; {key} > 1.1: {over or 'none'}; "
                  f"lower FLOP share than torch.autocast: {fewer or 'none'}")
    for name, why in failed:
        print(f"FAILED {name}: {why}")


if __name__ == "__main__":
    main()
