"""Precision recipes of ``forward`` groups: ``RECIPES[name](ctx, case) -> Program``, once each.

A recipe builds one variant from the group's model and data (``Context``): mixprec's own (``mixprec``: compile with
settings; ``configurator``: activation and weight formats per module kind; ``search``: at a budget another case
set; ``debug-fix``: the debugger's first suggestion, pasted) and the peers' (torch.autocast, a cast copy,
torch.compile, OpenVINO's default, NNCF's PTQ, accuracy control and compress_weights, torchao's weight-only configs,
round-to-nearest weights). A peer that is not installed raises :class:`Missing`: the pipeline skips that case alone
and says why. ``Program.facts`` holds what the variant reports about itself (mixprec's report summary, OpenVINO's
inference precision, a search's trials and plan, weight bytes).
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import io
import os
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
    if settings.get("enable_autocast") and ctx.calibration:
        settings.setdefault("autocast_calibration_dataloader", ctx.calibration)
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
            facts["inference precision"] = _name(runner.compiled_model.get_property("INFERENCE_PRECISION_HINT"))
    if isinstance(getattr(runner, "module", None), torch.fx.GraphModule):  # inductor: the graph it hands over
        with contextlib.suppress(Exception):
            from mixprec.backends.lowering.onednn import KERNEL

            kernels = [n for n in runner.module.graph.nodes if n.target is KERNEL]
            facts["int8 Linears on oneDNN's kernel"] = len(kernels)
            facts["of them writing bf16"] = sum(n.args[5] is torch.bfloat16 for n in kernels)
    return facts


def _name(value) -> str:
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
    kinds = [getattr(nn, k) for k in o.get("kinds", ("Linear", "Conv2d"))]
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
    from mixprec.measure import clock

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
    for name in ("frontier", "phases", "phase_seconds"):  # what newer searches report, where they do
        if getattr(result, name, None):
            facts[name] = [str(p) for p in getattr(result, name)] if name == "frontier" else getattr(result, name)
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
    from mixprec.measure import clock

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


# ---- the peers -----------------------------------------------------------------------------------------------------
def _ov_config(extra=None) -> dict:
    return {"INFERENCE_NUM_THREADS": torch.get_num_threads(), **(extra or {})}


def _ov_program(compiled, facts=None):
    def call(*args):
        return torch.from_numpy(compiled([a.numpy() for a in args])[0])

    facts = dict(facts or {})
    facts["inference precision"] = _name(compiled.get_property("INFERENCE_PRECISION_HINT"))
    return Program(call, facts)


def _ov_model(ctx):
    ov = need("openvino")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ov, ov.convert_model(ctx.module, example_input=ctx.example)


def openvino_(ctx, case):
    ov, model = _ov_model(ctx)
    return _ov_program(ov.Core().compile_model(model, "CPU", _ov_config(case.options.get("config"))))


def _dataset(nncf, batches):
    return nncf.Dataset(list(batches), lambda batch: [t.numpy() for t in batch])


def nncf_ptq(ctx, case):
    """nncf.quantize of OpenVINO's model on the calibration batches (``model_type="transformer"``: NNCF's setting
    for transformers); ``fake_quantize_in_float``: its FakeQuantize spelled as float ops (the values its int8
    kernels compute exactly with VNNI, on any CPU)."""
    nncf = need("nncf")
    ov, model = _ov_model(ctx)
    extra = {"model_type": nncf.ModelType.TRANSFORMER} if case.options.get("model_type") == "transformer" else {}
    calibration = ctx.calibration or [ctx.example]
    quantized = nncf.quantize(model, _dataset(nncf, calibration), subset_size=len(calibration) * 64, **extra)
    if case.options.get("fake_quantize_in_float"):
        quantized = _fake_quantize_in_float(quantized, ov)
    return _ov_program(ov.Core().compile_model(quantized, "CPU", _ov_config()))


def _fake_quantize_in_float(model, ov):
    from openvino import opset13 as ops

    model = model.clone()
    for node in list(model.get_ordered_ops()):
        if node.get_type_name() != "FakeQuantize":
            continue
        x, il, ih, ol, oh = (node.input_value(i) for i in range(5))
        steps = ops.constant(float(node.get_attributes()["levels"] - 1), dtype=ov.Type.f32)
        unit = ops.divide(ops.subtract(ops.minimum(ops.maximum(x, il), ih), il), ops.subtract(ih, il))
        q = ops.round(ops.multiply(unit, steps), "half_to_even")
        out = ops.add(ops.multiply(ops.divide(q, steps), ops.subtract(oh, ol)), ol)
        for target in list(node.output(0).get_target_inputs()):
            target.replace_source_output(out.output(0))
    model.validate_nodes_and_infer_types()
    return model


def nncf_accuracy_control(ctx, case):
    """NNCF's accuracy-aware PTQ at the budget, validated on the search batches (-rel-L2, higher is better)."""
    nncf = need("nncf")
    ov, model = _ov_model(ctx)
    budget = ctx.budget(case.options["budget"])
    with torch.no_grad():
        references = [ctx.module(*b) for b in ctx.search]

    def validate(compiled, items):
        return -rel_l2([torch.from_numpy(compiled(list(item))[0]) for item in items], references)

    quantized = nncf.quantize_with_accuracy_control(
        model, _dataset(nncf, ctx.calibration or [ctx.example]), _dataset(nncf, ctx.search), validate,
        max_drop=budget, drop_type=nncf.DropType.ABSOLUTE, subset_size=len(ctx.calibration or [ctx.example]) * 64)
    return _ov_program(ov.Core().compile_model(quantized, "CPU", _ov_config()))


def nncf_weights(ctx, case):
    """nncf.compress_weights in ``mode`` (INT8_ASYM, INT4_SYM, NF4, MXFP4, FP8_E4M3, ...) on OpenVINO's model (or,
    backend "torch", on a copy of the PyTorch model); ``data_aware``: on the calibration batches (with ``awq``,
    ``scale_estimation``); ``ratio``: a number, or ("bytes of", label): the ratio whose weight bytes equal that
    case's (NNCF mixes int4 and int8 only: clamped to 0..1); ``config``: the OpenVINO plugin's."""
    nncf = need("nncf")
    o = case.options
    extra = {k: o[k] for k in ("group_size", "awq", "scale_estimation") if o.get(k) is not None}
    if o.get("data_aware") or case.backend == "torch":
        extra["dataset"] = _dataset(nncf, ctx.search or ctx.calibration or [ctx.example])

    def compressed(ratio):
        model = copy.deepcopy(ctx.module) if case.backend == "torch" else _ov_model(ctx)[1]
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
            return nncf.compress_weights(model, mode=getattr(nncf.CompressWeightsMode, o["mode"]),
                                         **({} if ratio is None else {"ratio": ratio}), **extra)

    def size(model):
        return stored_bytes(model) if case.backend == "torch" else ov_weight_bytes(model)

    ratio = o.get("ratio")
    if isinstance(ratio, (tuple, list)):  # the ratio at the other case's bytes, between NNCF's two ends
        target, all8, all4 = stored_bytes(ctx.programs[ratio[1]].call), size(compressed(0.0)), size(compressed(1.0))
        ratio = min(1.0, max(0.0, (all8 - target) / (all8 - all4)))
    model = compressed(ratio)
    facts = {"weight bytes": size(model), "ratio": ratio}
    if case.backend == "torch":
        return Program(model.eval(), facts)
    ov = need("openvino")
    return _ov_program(ov.Core().compile_model(model, "CPU", _ov_config(o.get("config"))), facts)


def ov_weight_bytes(model) -> int:
    """Bytes of an OpenVINO model's constants of two dimensions or more (weights, not biases or shapes)."""
    return sum(op.get_byte_size() for op in model.get_ordered_ops()
               if op.get_type_name() == "Constant" and len(op.get_output_partial_shape(0)) >= 2)


def torchao_(ctx, case):
    """torchao's weight-only configs on a copy: Int8WeightOnlyConfig, or the CPU int4 prototype (group 128)."""
    need("torchao")
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    model = copy.deepcopy(ctx.module)
    if case.options["bits"] == 4:
        from torchao.prototype.quantization.int4.inference_workflow import PrototypeInt4WeightOnlyConfig

        quantize_(model, PrototypeInt4WeightOnlyConfig(group_size=case.options.get("group", 128)))
    else:
        quantize_(model, Int8WeightOnlyConfig())
    return Program(model)


def rounded(ctx, case):
    """Every Linear/Conv weight rounded (to ``dtype``, or round-to-nearest on a symmetric ``bits`` grid per output
    channel or per ``group`` inputs), computed in fp32: the error rounding the weights costs, nothing else."""
    model = copy.deepcopy(ctx.module)
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d)):
            w = module.weight.data
            if case.options.get("dtype"):
                module.weight.data = w.to(DTYPES[case.options["dtype"]]).float()
                continue
            group, top = case.options.get("group"), 2 ** (case.options["bits"] - 1) - 1
            flat = w.reshape(w.shape[0], -1)
            blocks = flat.reshape(flat.shape[0], -1, group) if group and flat.shape[1] % group == 0 \
                else flat.unsqueeze(1)
            scale = blocks.abs().amax(-1, keepdim=True).clamp_min(1e-12) / top
            module.weight.data = ((blocks / scale).round().clamp(-top - 1, top) * scale).reshape(w.shape)
    return Program(model)


RECIPES: dict[str, Callable] = {
    "fp32": fp32, "autocast": autocast, "cast": cast, "torch-compile": torch_compile, "mixprec": mixprec_,
    "configurator": configurator, "search": search, "debug-fix": debug_fix, "openvino": openvino_,
    "nncf-ptq": nncf_ptq, "nncf-accuracy-control": nncf_accuracy_control, "nncf-weights": nncf_weights,
    "torchao": torchao_, "rounded": rounded,
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
