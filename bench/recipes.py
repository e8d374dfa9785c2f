"""Precision recipes of ``forward`` groups: ``RECIPES[name](ctx, case) -> Program``, once each (the peers' in
``peers.py``).

A recipe builds one variant from the group's model and data (``Context``): mixprec's own (``mixprec``: compile with
settings; ``configurator``: activation and weight formats per module kind; ``search``: at a budget another case
set; ``debug-fix``: the debugger's first suggestion, pasted) and PyTorch's (torch.autocast, a cast copy,
torch.compile). A peer that is not installed raises :class:`Missing`: the pipeline skips that case alone and says
why. ``Program.facts`` holds what the variant reports about itself (mixprec's report summary, OpenVINO's inference
precision, a search's trials and plan, weight bytes). The error against fp32 (``rel_l2``) and torch.autocast's
low-precision FLOP share (``LowFlops``) are measured here, once.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import io
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.utils._pytree as pytree
from torch import nn

from .models import Built, main_output


class Missing(Exception):
    """A peer this case needs is not installed: the case is skipped, the others run."""


def need(package: str):
    if importlib.util.find_spec(package) is None:
        raise Missing(f"{package} is not installed (a peer, not a mixprec dependency: pip install {package}, or "
                      f"PYTHONPATH=src:DIR with it installed in DIR)")
    if package == "nncf":
        import logging

        import nncf

        nncf.set_log_level(logging.ERROR)
        return nncf
    return __import__(package)


@dataclass
class Program:
    call: Callable  # call(*inputs) -> the main output
    facts: dict = field(default_factory=dict)


@dataclass
class Context:
    built: Built
    example: tuple
    calibration: list | None  # batches to calibrate on (None: the group asks for none, the example is used)
    search: list  # batches a search evaluates on
    held: list  # batches errors are measured on
    errors: dict  # label -> held-out error of the cases built so far
    programs: dict  # label -> Program of the cases built so far
    smoke: bool = False

    @property
    def module(self) -> nn.Module:
        return self.built.module

    def budget(self, spec) -> float:
        """A tolerance: a number, a case's label (its held-out error) or (label, factor)."""
        if isinstance(spec, (int, float)):
            return float(spec)
        label, factor = (spec, 1.0) if isinstance(spec, str) else spec
        if label not in self.errors:
            raise Missing(f"the budget's case {label!r} did not run")
        return self.errors[label] * factor


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _low_inputs(args, low):
    return pytree.tree_map(lambda t: t.to(low) if isinstance(t, torch.Tensor) and t.is_floating_point() else t, args)


def fp32(ctx, case):
    return Program(ctx.module)


def autocast(ctx, case):
    low = DTYPES[case.options.get("low", "bf16")]

    def call(*args):
        with torch.autocast("cpu", dtype=low):
            return ctx.module(*args)

    counter = LowFlops()
    with torch.no_grad(), torch.autocast("cpu", dtype=low), counter:
        ctx.module(*ctx.example)
    total = sum(counter.by_dtype.values())
    return Program(call, {"low_precision_flops_fraction": counter.by_dtype.get(low, 0) / total if total else None})


def cast(ctx, case):
    low = DTYPES[case.options["low"]]
    model = copy.deepcopy(ctx.module).to(low)
    return Program(lambda *args: model(*_low_inputs(args, low)).float(), {"weight bytes": linear_bytes(model)})


def torch_compile(ctx, case):
    low = DTYPES.get(case.options.get("low"))
    model = copy.deepcopy(ctx.module).to(low) if low else ctx.module
    compiled = torch.compile(model, backend="inductor")
    call = lambda *args: compiled(*(_low_inputs(args, low) if low else args)).float()  # noqa: E731
    with torch.no_grad():
        call(*ctx.example)  # compiles here: the build's time
    return Program(call)


def mixprec_(ctx, case, settings=None):
    import mixprec

    settings = dict(case.options if settings is None else settings)
    if "enabled_precisions" in settings:
        settings["enabled_precisions"] = {DTYPES[d] for d in settings["enabled_precisions"]}
    if (settings.get("enable_autocast") or settings.get("weight_rounding") == "data_aware") and ctx.calibration:
        settings.setdefault("autocast_calibration_dataloader", ctx.calibration)  # never the held-out example
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = mixprec.compile(ctx.module, ctx.example, backend=case.backend, **settings)
    return Program(program, program_facts(program))


def program_facts(program) -> dict:
    summary = program.report.summary
    keep = ("layers_by_precision", "low_precision_flops_fraction", "casts_inserted", "param_bytes_after", "runs_as",
            "accelerated_types", "compile_seconds")
    facts = {k: summary[k] for k in keep if k in summary}
    kept = sum(1 for r in program.report.layers if r.reason and "not faster" in r.reason)
    facts["kept fp32 by the speed check"] = kept
    runner = getattr(program, "runner", None)
    if hasattr(runner, "converted_model"):  # OpenVINO: the model handed over and what its plugin runs
        with contextlib.suppress(Exception):
            from mixprec.backends.openvino import float_form

            facts["float Converts handed to OpenVINO"] = len(float_form.float_converts(runner.converted_model))
            hint = runner.compiled_model.get_property("INFERENCE_PRECISION_HINT")
            facts["inference precision"] = precision_name(hint)
    if isinstance(getattr(runner, "module", None), torch.fx.GraphModule):  # inductor: the graph it hands over
        with contextlib.suppress(Exception):
            from mixprec.backends.lowering.onednn import KERNEL

            kernels = [n for n in runner.module.graph.nodes if n.target is KERNEL]
            facts["int8 Linears on oneDNN's kernel"] = len(kernels)
            facts["of them writing bf16"] = sum(n.args[5] is torch.bfloat16 for n in kernels)
    return facts


def precision_name(value) -> str:
    return value.get_type_name() if hasattr(value, "get_type_name") else str(value)


def stored_bytes(module, weights_only: bool = False) -> int:
    """Bytes a program stores but its embedding tables and norms (weights as stored, scales, zero points; with
    ``weights_only`` only tensors named weight or bias: a generate() program's KV cache is state too), each storage
    once; an OpenVINO program's from its ExportedProgram, whose constants OpenVINO holds as stored."""
    named = list(module.named_parameters()) + list(module.named_buffers())
    ep = getattr(module, "exported_program", None) or getattr(getattr(module, "program", None), "exported_program",
                                                                 None)
    if not named and ep is not None:
        named = list(ep.state_dict.items()) + [(n, t) for n, t in ep.constants.items() if isinstance(t, torch.Tensor)]
    seen, total = set(), 0
    for name, t in named:
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        wanted = not weights_only or "weight" in name or "bias" in name
        if wanted and "embed" not in name and "norm" not in name and key not in seen:
            seen.add(key)
            total += tensor_bytes(t)
    return total


def configurator(ctx, case):
    """``activation`` (and ``weight``, ``group_size``: a weight format) on every module of ``kinds``; ``rest``: the
    whole model first; ``policy``: QuantPolicy fields; ``compile``: compile's settings."""
    import mixprec

    o = case.options
    kinds = [getattr(nn, k) for k in o.get("kinds", ("Linear", "Conv2d"))]  # ("pending": read by the pipeline)
    cfg = mixprec.MixedPrecisionConfigurator(ctx.module, ctx.example, calibration_dataloader=ctx.calibration)
    if o.get("rest"):
        cfg.set_precision(ctx.module, activation=o["rest"])
    param = {"weight": o["weight"]} if o.get("weight") else None
    extra = {"group_size": o["group_size"]} if o.get("group_size") else {}
    for kind in kinds:
        if any(isinstance(m, kind) for m in ctx.module.modules()):
            cfg.set_precision(kind, activation=o["activation"], param=param, **extra)
    policy = mixprec.QuantPolicy(**o["policy"]) if o.get("policy") else None
    plan = cfg.apply(policy=policy)
    return mixprec_(ctx, case, {"plan": plan, **o.get("compile", {})})


def search(ctx, case):
    """mixprec.search at a budget (``budget``: a number or another case's error), its plan compiled on the case's
    backend. ``mixed_sizes``: the eval batches as dicts of mixed batch and sequence sizes (a collator's)."""
    import mixprec

    from .machine import measuring

    clock, _ = measuring()
    o = case.options
    tolerance = ctx.budget(o["budget"])
    eval_data = _mixed_sizes(ctx) if o.get("mixed_sizes") else ctx.search or None
    model = ctx.built.lm if o.get("mixed_sizes") else ctx.module  # dict batches name forward's arguments
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result, seconds = clock.timed(lambda: mixprec.search(
            model, ctx.example, low_precision_type=o["lows"], tolerance=tolerance, eval_dataloader=eval_data,
            calibration_dataloader=ctx.calibration, backend=case.backend, cache=False))
        if o.get("mixed_sizes"):
            compiled = mixprec.compile(model, ctx.example, plan=result.plan, backend=case.backend)
            program = Program(lambda *args: main_output(compiled(*args)), program_facts(compiled))
        else:
            program = mixprec_(ctx, case, {"plan": result.plan})
    chosen = result.chosen
    facts = {"search s": seconds, "tolerance": tolerance, "trials": result.trials, "groups": len(result.groups),
             "mix": chosen.mix_text() or "all fp32", "low FLOP share": chosen.low_precision_flops_fraction,
             "met": result.met, "speed-ups timed": result.speedups, "search metric": chosen.metric}
    won = getattr(result, "winner", None)  # the plan returned, measured as a whole program (issue 45)
    if won is not None:  # the facts describe the plan compiled here, not the budget phase's choice
        facts.update({"returned": won.name, "mix": ", ".join(f"{t} {s:.1%}" for t, s in won.mix.items() if s)
                      or "no FLOPs in low precision", "low FLOP share": won.low_precision_flops_fraction,
                      "search metric": won.metric,
                      "budget's plan": chosen.mix_text() or "all fp32"})
        facts["frontier"] = [f"{p.name} {p.seconds * 1e3:.4g} ms {p.metric:.3g}" if p.seconds is not None
                             else f"{p.name} fails" if p.failure else f"{p.name} {p.metric:.3g} (over budget, untimed)"
                             for p in result.frontier]
    if getattr(result, "phase_seconds", None):
        facts["phases"] = dict(result.phase_seconds)
    if o.get("mixed_sizes"):  # the metric the search reports = the plan compiled per batch, batch by batch
        facts["per-batch error"] = _per_batch_error(ctx, result.plan, eval_data)
    program.facts.update(facts)
    return program


def _mixed_sizes(ctx) -> list:
    names = ("input_ids", "attention_mask")
    out = []
    for i, (rows, length) in enumerate(((2, 8), (3, 12), (1, 5))):
        ids = ctx.built.batch(100 + i)[0][:1].repeat(rows, 2)[:, :length]
        mask = torch.ones_like(ids)
        mask[0, length // 2:] = 0
        out.append(dict(zip(names, (ids, mask))))
    return out


def _per_batch_error(ctx, plan, batches) -> float:
    import mixprec
    from mixprec.output.numerics import ErrorStats

    stats = ErrorStats()
    with torch.no_grad():
        for b in batches:
            inputs = tuple(b.values())
            stats.add(mixprec.compile(ctx.built.lm, inputs, plan=plan)(*inputs), ctx.built.lm(*inputs))
    return stats.rel_l2_error


def debug_fix(ctx, case):
    """The program after the debugger's first suggestion, its code run as printed."""
    import mixprec

    from .machine import measuring

    clock, _ = measuring()
    first = mixprec_(ctx, case)
    found, seconds = clock.timed(lambda: mixprec.debug(first.call, ctx.example))
    fix = getattr(found.culprit, "fix", None)
    facts = {"error before": first.call.report.summary["rel_l2_error"], "debug s": seconds,
             "widest line": max(len(line) for line in str(found).splitlines()),
             "report widest line": max(len(line) for line in str(first.call.report).splitlines())}
    if fix is None:
        raise Missing("the debugger made no suggestion with code here")
    namespace = {"prog": first.call, "model": ctx.module, "inputs": ctx.example, "found": found}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(fix.code, namespace)  # noqa: S102  (the point: the printed code runs as pasted)
    facts["fixed"] = ",".join(fix.compute or fix.layers)
    return Program(namespace["prog"], {**program_facts(namespace["prog"]), **facts})


RECIPES: dict[str, Callable] = {
    "fp32": fp32, "autocast": autocast, "cast": cast, "torch-compile": torch_compile, "mixprec": mixprec_,
    "configurator": configurator, "search": search, "debug-fix": debug_fix,
}


def tensor_bytes(t) -> int:
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if is_traceable_wrapper_subclass(t):  # torchao's tensors: their inner tensors
        return sum(tensor_bytes(getattr(t, n)) for n in t.__tensor_flatten__()[0])
    return t.numel() * t.element_size()


def linear_bytes(module) -> int:
    """Bytes the Linear layers store (weights and biases as stored)."""
    return sum(tensor_bytes(p) for m in module.modules() if isinstance(m, nn.Linear)
               for p in (m.weight, m.bias) if p is not None)


def weight_bytes(program: Program) -> int | None:
    facts = program.facts
    if "weight bytes" in facts or "param_bytes_after" in facts:
        return facts.get("weight bytes", facts.get("param_bytes_after"))
    return linear_bytes(program.call) if isinstance(program.call, nn.Module) else None


# ---- error and FLOP share: once --------------------------------------------------------------------------------
def rel_l2(outputs, references) -> float:
    """||y - y_fp32|| / ||y_fp32|| over all batches together, in fp64."""
    num = sum(float((o.double() - r.double()).pow(2).sum()) for o, r in zip(outputs, references))
    den = sum(float(r.double().pow(2).sum()) for r in references)
    return (num / den) ** 0.5 if den else float("nan")


class LowFlops(torch.utils._python_dispatch.TorchDispatchMode):
    """FLOPs of the matmul/conv/attention kernels a forward runs, by the dtype they run in (torch.autocast's share)."""

    def __init__(self):
        super().__init__()
        self.by_dtype: dict = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.name().split("::")[-1].split(".")[0]
        first = out[0] if isinstance(out, (tuple, list)) else out
        flops = _flops(name, args, first) if isinstance(first, torch.Tensor) else 0
        if flops:
            dtype = next(t.dtype for t in args if isinstance(t, torch.Tensor) and t.is_floating_point())
            self.by_dtype[dtype] = self.by_dtype.get(dtype, 0) + flops
        return out


def _flops(name, args, out) -> int:
    if name in ("mm", "bmm"):
        return 2 * out.numel() * args[0].shape[-1]
    if name in ("addmm", "baddbmm"):
        return 2 * out.numel() * args[1].shape[-1]
    if name in ("convolution", "_convolution"):
        transposed = bool(args[6]) if len(args) > 6 else False
        return 2 * (args[0].numel() if transposed else out.numel()) * args[1][0].numel()
    if name.startswith("_scaled_dot_product"):
        q, k, v = args[:3]
        return 2 * q.shape[:-2].numel() * q.shape[-2] * k.shape[-2] * (q.shape[-1] + v.shape[-1])
    return 0
