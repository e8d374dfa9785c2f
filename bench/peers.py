"""The peers' recipes (``RECIPES[name](ctx, case) -> Program``): OpenVINO's default, NNCF's post-training
quantization, its accuracy control and its weight compression (``compress_weights``: INT8/INT4/NF4/MXFP4/FP8 modes,
data-aware or not, a ratio matched to another case's weight bytes), torchao's weight-only configs, and
round-to-nearest weights computed in fp32 (the error rounding costs, nothing else quantized).

NNCF and torchao are not mixprec dependencies: each recipe asks for its package (``recipes.need``) and the case is
skipped, with the reason, where it is missing. OpenVINO programs run on ``torch.get_num_threads()`` threads, as
mixprec's OpenVINO backend does.
"""

from __future__ import annotations

import contextlib
import copy
import os
import warnings
from collections.abc import Callable

import torch
from torch import nn

from .recipes import DTYPES, Program, need, precision_name, rel_l2, stored_bytes


def _ov_config(extra=None) -> dict:
    return {"INFERENCE_NUM_THREADS": torch.get_num_threads(), **(extra or {})}


def _ov_program(compiled, facts=None):
    def call(*args):
        return torch.from_numpy(compiled([a.numpy() for a in args])[0])

    facts = dict(facts or {})
    facts["inference precision"] = precision_name(compiled.get_property("INFERENCE_PRECISION_HINT"))
    return Program(call, facts)


def _ov_model(ctx):
    """OpenVINO's model of the module (traced), or of its torch.export where tracing fails (transformers' decoders)."""
    ov = need("openvino")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return ov, ov.convert_model(ctx.module, example_input=ctx.example)
        except Exception:  # noqa: BLE001  (OpConversionFailure: an op its tracing frontend has no rule for)
            return ov, ov.convert_model(torch.export.export(ctx.module, ctx.example))


def openvino_(ctx, case):
    ov, model = _ov_model(ctx)
    return _ov_program(ov.Core().compile_model(model, "CPU", _ov_config(case.options.get("config"))))


def _dataset(nncf, batches, torch_inputs=False):
    """NNCF's dataset of the batches: numpy arrays for OpenVINO's models, the tensors for a PyTorch one."""
    return nncf.Dataset(list(batches), (lambda batch: tuple(batch)) if torch_inputs else
                        (lambda batch: [t.numpy() for t in batch]))


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
    ``scale_estimation``); ``all_layers``: NNCF's, the first and last layers in ``mode`` too (else INT8_ASYM); ``ratio``: a number, or ("bytes of", label): the ratio whose weight bytes equal that
    case's (NNCF mixes int4 and int8 only: clamped to 0..1); ``config``: the OpenVINO plugin's."""
    nncf = need("nncf")
    o = case.options
    extra = {k: o[k] for k in ("group_size", "awq", "scale_estimation", "all_layers") if o.get(k) is not None}
    if o.get("data_aware") or case.backend == "torch":
        extra["dataset"] = _dataset(nncf, ctx.search or ctx.calibration or [ctx.example], case.backend == "torch")

    def compressed(ratio, mode=o["mode"]):
        model = copy.deepcopy(ctx.module) if case.backend == "torch" else _ov_model(ctx)[1]
        options = {**extra, **({} if ratio is None else {"ratio": ratio})}
        if mode == "INT8_ASYM":  # NNCF's all-int8 end (its ratio 0 is taken as "not given")
            options = {k: v for k, v in options.items() if k == "dataset"}
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
            return nncf.compress_weights(model, mode=getattr(nncf.CompressWeightsMode, mode), **options)

    def size(model):
        return stored_bytes(model) if case.backend == "torch" else ov_weight_bytes(model)

    ratio = o.get("ratio")
    if isinstance(ratio, (tuple, list)):  # the ratio at the other case's bytes, between NNCF's two ends
        target = stored_bytes(ctx.programs[ratio[1]].call)
        all8, all4 = size(compressed(None, "INT8_ASYM")), size(compressed(1.0))
        ratio = min(1.0, max(0.0, (all8 - target) / (all8 - all4)))
    model = compressed(None, "INT8_ASYM") if ratio == 0 else compressed(ratio)
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
    "openvino": openvino_, "nncf-ptq": nncf_ptq, "nncf-accuracy-control": nncf_accuracy_control,
    "nncf-weights": nncf_weights, "torchao": torchao_, "rounded": rounded,
}
