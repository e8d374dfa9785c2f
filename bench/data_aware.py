"""Issue 43's data-aware weight rounding against NNCF's AWQ + scale estimation: the recipe that rounds a model's Linear
weights with ``mixprec.calibrate.weight_rounding`` alone, and the model with outlier input channels.

Why: the bar compares errors, and the error a weight grid costs is best read with nothing else changed — every
Linear's weight replaced by its rounded float value, computed in fp32 (as ``peers.rounded`` does for round-to-nearest).
``rounded-data-aware`` does that from the calibration batches' input moments (``calibrate/moments.py``, collected by
forward pre-hooks on the same batches NNCF's dataset holds); mixprec's compile path (``weight_rounding="data_aware"``)
is a case of its own (``cases._awq43``), so the table shows that the program computes what the algorithm chose.

Random weights hide what AWQ is for: trained models' LayerNorm / RMSNorm outputs have a few input channels far larger
than the rest. :func:`llama_outliers` plants them in a random Llama (a few channels of every norm's weight times
``gain``), as the tests' outlier layers do.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from .recipes import Program


def input_moments(module: nn.Module, batches, names) -> dict:
    """The second moments of the inputs of the Linears ``names`` over ``batches`` (``InputMoments`` by name)."""
    from mixprec.calibrate.moments import InputMoments

    found: dict = {}
    hooks = []

    def hook(name):
        def pre(_, args):
            m = InputMoments.of(args[0])
            found[name] = m if name not in found else found[name].merge(m)
        return pre

    for name, m in module.named_modules():
        if name in names:
            hooks.append(m.register_forward_pre_hook(hook(name)))
    try:
        with torch.no_grad():
            for batch in batches:
                module(*batch)
    finally:
        for h in hooks:
            h.remove()
    return found


def rounded_data_aware(ctx, case):
    """Every Linear's weight (but those matching ``skip``) rounded to ``format`` ("int4": symmetric, "nf4") in groups of
    ``group``, computed in fp32: ``aware`` with the data-aware choice on the calibration batches (``gptq``, ``awq``,
    ``hold_out``: the policy's switches), else round-to-nearest (int4: mixprec's int4 quantize, its MSE scale
    search)."""
    import re

    from mixprec.calibrate import weight_rounding as wr
    from mixprec.ops import weight_only as wo

    o = case.options
    group, fmt = o.get("group", 128), o.get("format", "int4")
    grid = wr.int_grid(4, group, True) if fmt == "int4" else wr.nf4_grid(group)
    policy = wr.RoundingPolicy(gptq=o.get("gptq", True), hold_out=o.get("hold_out", True),
                               **({} if o.get("awq", True) else {"alphas": ()}))
    model = copy.deepcopy(ctx.module)
    skip = re.compile(o["skip"]) if o.get("skip") else None
    linears = {n: m for n, m in model.named_modules()
               if isinstance(m, nn.Linear) and m.in_features % group == 0 and not (skip and skip.search(n))}
    moments = input_moments(model, ctx.calibration or [ctx.example], set(linears)) if o.get("aware") else {}
    for name, m in linears.items():
        w = m.weight.data.float()
        if name in moments:
            new = wr.rounded(w, grid, wr.choose(w, grid, moments[name], policy))
        elif fmt == "int4":
            u, s, z = wo.quantize_int4(w, group, True)
            new = wo.dequantize_int4(u, s, z)
        else:
            s, z = wr.grids.round_to_nearest(w, grid)
            new = wr.dequantize(wr.codes(w, grid, s, z), grid, s, z)
        m.weight.data = new.to(m.weight.dtype)
    return Program(model, {"rounded Linears": len(linears)})


def llama_outliers(layers=4, batch=1, seq=128, hidden=1024, intermediate=2816, heads=16, kv_heads=4, vocab=32000,
                   channels=8, gain=30.0, smoke=False):
    """A random Llama (``models.llama``) whose every RMSNorm weight has ``channels`` channels times ``gain`` (the same
    channels in every layer, as trained LLMs' outlier channels): the Linears after them meet outlier inputs."""
    from .models import llama

    built = llama(layers=layers, batch=batch, seq=seq, hidden=hidden, intermediate=intermediate, heads=heads,
                  kv_heads=kv_heads, vocab=vocab, smoke=smoke)
    lm = built.lm
    width = lm.config.hidden_size
    chosen = torch.randperm(width, generator=torch.Generator().manual_seed(43))[:channels]
    with torch.no_grad():
        for layer in lm.model.layers:
            layer.input_layernorm.weight[chosen] *= gain
            layer.post_attention_layernorm.weight[chosen] *= gain
    return built


def rounding_seconds(n=1024, k=2048, rows=512, repeats=3) -> dict:
    """Seconds ``weight_rounding.choose`` takes on one random [n, k] weight with ``rows`` input rows, per grid (the
    fastest of ``repeats``, one thread): the data-aware pass's cost without the model around it."""
    import time

    from mixprec.calibrate import weight_rounding as wr
    from mixprec.calibrate.moments import InputMoments

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    w, moments = torch.randn(n, k, generator=g) * 0.02, InputMoments.of(torch.randn(rows, k, generator=g))
    out = {}
    for name, grid in (("int4 g128", wr.int_grid(4, 128, True)), ("nf4 g128", wr.nf4_grid(128)),
                       ("mxfp4", wr.mxfp4_grid())):
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            wr.choose(w, grid, moments)
            best = min(best, time.perf_counter() - start)
        out[name] = round(best, 2)
    return out


RECIPES = {"rounded-data-aware": rounded_data_aware}

if __name__ == "__main__":  # PYTHONPATH=src python -m bench.data_aware: seconds per grid (run on an idle machine)
    import os

    print(rounding_seconds(), "load", os.getloadavg())
