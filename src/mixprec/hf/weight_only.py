"""Weight-only decoders for ``compile_for_generation(..., weights="int4", group_size=128)`` (W8A16 / W4A16, and every
weight format of ``formats.WEIGHT_FORMATS``: "nf4", "mxfp4", "fp8", ...).

Why: decoding reads every weight once per token, so a CPU decodes at the speed it reads weights; int4 weights are a
quarter of bf16's bytes (``ops/weight_only.py``). The plan is the configurator's, made on the wrapper module that is
compiled (``modules.py``: its graph layers are the program's): every ``nn.Linear`` of the decoder gets weight-only
``weights`` with ``group_size`` input channels per scale, the LM head ``lm_head`` (default int8: its rows are the
logits, int4 there costs more accuracy than it saves bytes in most models; None keeps it float), with **16-bit
activations** (the "A16": bf16, or fp16 for an fp16 model): PyTorch's CPU weight-only kernels are fast only there
and several times slower than a plain float32 Linear on float32 rows (bench/log/2026-11.md "Issue 32: weight-only
decode"), so a float32 model's weight-only Linears read and write bf16 (the casts around them are the rewrite's;
``enable_autocast=True`` may still lower the other layers).
Embeddings are left as they are (a gather reads one row per token, not the whole table). ``generate()`` is unchanged.
"""

from __future__ import annotations

import torch

from ..errors import ConfigError
from ..formats import WEIGHT_FORMATS
from ..plan.precision_plan import PrecisionPlan, is_weight_only


def check(weights, lm_head, settings: dict) -> None:
    """Refuse what the weight-only options cannot mean, before anything is captured."""
    names = ", ".join(map(repr, WEIGHT_FORMATS))
    if weights not in WEIGHT_FORMATS:
        raise ConfigError(f"weights must be one of {names} (the weight formats of weight-only Linears) or None, got "
                          f"{weights!r}.")
    if lm_head is not None and lm_head not in WEIGHT_FORMATS:
        raise ConfigError(f"lm_head must be one of {names}, or None (the LM head keeps its float weights), got "
                          f"{lm_head!r}.")
    if "plan" in settings:
        raise ConfigError("compile_for_generation takes weights= or plan=, not both: a plan already says every "
                          "layer's weights (make it with MixedPrecisionConfigurator and param={'weight': 'int4'}).")


def weight_only_plan(wrapper, call, weights: str, group_size, lm_head):
    """The configurator's plan for ``wrapper`` (called with ``call``: a tuple or a dict of its arguments)."""
    from ..configurator import MixedPrecisionConfigurator

    model = wrapper.hf_model
    floats = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    activation = torch.float16 if floats == torch.float16 else torch.bfloat16  # module docstring: the "A16"
    inputs = tuple(call.values()) if isinstance(call, dict) else tuple(call)
    cfg = MixedPrecisionConfigurator(wrapper, inputs)
    head = model.get_output_embeddings()
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    for module in decoder.modules():
        if isinstance(module, torch.nn.Linear) and module is not head:
            cfg.set_precision(module, activation=activation, param={"weight": weights}, group_size=group_size)
    if isinstance(head, torch.nn.Linear) and lm_head is not None:
        cfg.set_precision(head, activation=activation, param={"weight": lm_head},
                          group_size=group_size if lm_head == weights else None)
    plan = cfg.apply()
    # the Linears' decisions only: the configurator's capture has static shapes, the program's dynamic ones, and
    # only the layers' names are the same in both (a Linear's; not the size arithmetic around them)
    return PrecisionPlan({name: d for name, d in plan.items() if is_weight_only(d)}, log=plan.log,
                         policy=plan.policy)
