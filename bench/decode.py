"""``decode`` groups: transformers' generate() tokens/s of each variant, its logits' error and tokens against fp32.

Variants (``RECIPES``): ``hf`` (the model's own generate(), fp32 or a bf16 copy, optionally under torch.autocast or
with transformers' compiled-generate recipe: a static cache and ``torch.compile(model.forward)``),
``mixprec-generate`` (``mixprec.hf.compile_for_generation``: static cache or not, autocast, weight-only formats, on
the case's backend), ``openvino-kv`` (OpenVINO's model of the decoder with its KV cache as explicit inputs, after
NNCF's ``compress_weights`` in ``mode``, stepped by a greedy loop here) and ``torchao`` (weight-only configs on a
bf16 copy). Each round is one greedy generate() of ``new`` tokens (``min_new_tokens``: all make as many) after a
``prompt``-token prompt, batch 1; rounds interleave through the library's ``clock.interleaved`` (a sample is the
whole call; a streamer notes the first token's time with the library's clock, so decode tokens/s leaves the prefill
out). Roofline: the weight bytes one token reads (every Linear incl. the LM head as stored, the embedding's one
row left out) against this machine's copy bandwidth. ``interleave=False`` in the shape: variants one at a time
(the ~1B shape does not fit beside its peers in memory).
"""

from __future__ import annotations

import contextlib
import copy
import gc
import os
import statistics
import tempfile
import warnings

import torch

from . import machine
from .models import build
from .recipes import Missing, linear_bytes, need, precision_name, rel_l2, stored_bytes


class Decoder:
    def __init__(self, generate, logits, weight_bytes, facts=None):
        self.generate, self.logits, self.weight_bytes, self.facts = generate, logits, weight_bytes, facts or {}


class Streamer:
    """Notes the library clock's time at every put(): the prompt's, then each new token's."""

    def __init__(self):
        self.now, self.times = machine.measuring()[0].now, []

    def put(self, value):
        self.times.append(self.now())

    def end(self):
        pass


def hf_decoder(lm, run_options, autocast=False):
    def generate(prompt, new):
        streamer = Streamer()
        with torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext():
            out = lm.generate(**prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False, streamer=streamer,
                              **run_options)
        return out[0].tolist(), (len(streamer.times) - 2) / max(streamer.times[-1] - streamer.times[1], 1e-9)

    def logits(prompt):
        with torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext():
            return _logits(lm, prompt)

    return Decoder(generate, logits, linear_bytes(lm))


def _logits(lm, prompt):
    """The prompt's logits (causal LMs; None for an encoder-decoder model: its tokens are compared)."""
    if "input_ids" not in prompt or getattr(lm.config, "is_encoder_decoder", False):
        return None
    return lm(input_ids=prompt["input_ids"]).logits.float()


def bf16_copy(model):
    """A bf16 copy of the HF model without an fp32 copy on the way; non-persistent buffers (RoPE) kept."""
    with torch.device("meta"):
        new = type(model)(model.config)
    new.load_state_dict({n: p.detach().to(torch.bfloat16) for n, p in model.named_parameters()}, strict=False,
                        assign=True)
    for name, buffer in model.named_buffers():
        owner, _, leaf = name.rpartition(".")
        new.get_submodule(owner).register_buffer(leaf, buffer.clone(), persistent=False)
    return new.eval()


def hf(ctx, case):
    lm = bf16_copy(ctx.lm) if case.options.get("low") == "bf16" else ctx.lm
    if case.options.get("compiled"):  # transformers' recipe for a compiled generate()
        lm = copy.deepcopy(lm)
        lm.generation_config.cache_implementation = "static"
        lm.forward = torch.compile(lm.forward)
    return hf_decoder(lm, ctx.run_options, case.options.get("autocast", False))


def mixprec_generate(ctx, case):
    import mixprec.hf

    settings = {k: v for k, v in case.options.items() if k != "pending"}
    lm = bf16_copy(ctx.lm) if settings.pop("low", "fp32") == "bf16" else ctx.lm
    main = next(iter(ctx.prompt.values()))
    program = mixprec.hf.compile_for_generation(lm, main, max_cache_len=ctx.length, max_length=ctx.length,
                                                backend=case.backend, **settings)
    decoder = hf_decoder(program, ctx.run_options)
    decoder.weight_bytes = stored_bytes(program, weights_only=True) or decoder.weight_bytes
    return decoder


def torchao_(ctx, case):
    need("torchao")
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    lm = bf16_copy(ctx.lm)
    if case.options["bits"] == 4:
        from torchao.prototype.quantization.int4.inference_workflow import PrototypeInt4WeightOnlyConfig

        quantize_(lm, PrototypeInt4WeightOnlyConfig(group_size=128), filter_fn=lambda m, fqn: isinstance(
            m, torch.nn.Linear) and fqn != "lm_head")
        quantize_(lm, Int8WeightOnlyConfig(), filter_fn=lambda m, fqn: fqn == "lm_head")  # as NNCF keeps it
    else:
        quantize_(lm, Int8WeightOnlyConfig())
    return hf_decoder(lm, ctx.run_options)


class KVWrapper(torch.nn.Module):
    """(input_ids, attention_mask, position_ids, *past keys/values) -> (logits, *present ones): the KV cache as
    explicit tensors, so OpenVINO runs the decoder step by step."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, position_ids, *past):
        import transformers

        cache = transformers.DynamicCache(config=self.model.config)
        for i, layer in enumerate(cache.layers):  # filled directly: update() would cat onto an empty 1-d tensor
            layer.dtype, layer.device = past[0].dtype, past[0].device
            layer.keys, layer.values, layer.is_initialized = past[2 * i], past[2 * i + 1], True
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=cache, use_cache=True)
        return (out.logits, *[t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)])


def openvino_kv(ctx, case):
    """The decoder converted with its KV cache explicit, NNCF's compress_weights in ``mode``, OpenVINO's defaults
    (its dynamic int8 activations included) unless ``config`` says otherwise."""
    import numpy as np

    ov, nncf = need("openvino"), need("nncf")
    config, o = ctx.lm.config, case.options
    layers, head = 2 * config.num_hidden_layers, config.hidden_size // config.num_attention_heads

    def kv(length):
        return (1, config.num_key_value_heads, length, head)

    if "path" not in ctx.cache:  # converted once per group, read back per variant
        past, step = 8, 4  # traced with a non-empty cache and several tokens: the general path
        example = (torch.randint(0, config.vocab_size, (1, step)), torch.ones(1, past + step, dtype=torch.long),
                   torch.arange(past, past + step)[None], *[torch.zeros(kv(past)) for _ in range(layers)])
        with torch.no_grad():
            converted = ov.convert_model(KVWrapper(ctx.lm), example_input=example)
        ctx.cache["path"] = os.path.join(ctx.cache["dir"], "decoder.xml")
        ov.save_model(converted, ctx.cache["path"], compress_to_fp16=False)
    model = ov.Core().read_model(ctx.cache["path"])
    if o.get("mode"):
        options = {"group_size": o["group_size"]} if o.get("group_size") else {}
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
            model = nncf.compress_weights(model, mode=getattr(nncf.CompressWeightsMode, o["mode"]), **options)
    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": torch.get_num_threads(),
                                                      **o.get("config", {})})
    precision = precision_name(compiled.get_property("INFERENCE_PRECISION_HINT"))
    request = compiled.create_infer_request()

    def run(ids, past, position):
        mask = np.ones((1, position + ids.shape[1]), np.int64)
        result = request.infer([ids, mask, np.arange(position, position + ids.shape[1])[None], *past])
        return result[0], [result[i] for i in range(1, layers + 1)]

    def empty():
        return [np.zeros(kv(0), np.float32) for _ in range(layers)]

    def generate(prompt, new):
        ids = prompt["input_ids"].numpy()
        logits, past = run(ids, empty(), 0)
        tokens, first = [int(logits[0, -1].argmax())], ctx.now()
        for _ in range(new - 1):
            logits, past = run(np.array([[tokens[-1]]]), past, ids.shape[1] + len(tokens) - 1)
            tokens.append(int(logits[0, -1].argmax()))
        return prompt["input_ids"][0].tolist() + tokens, (new - 1) / max(ctx.now() - first, 1e-9)

    def logits(prompt):
        return torch.from_numpy(run(prompt["input_ids"].numpy(), empty(), 0)[0].copy()).float()

    return Decoder(generate, logits, ov_token_bytes(model), {"inference precision": precision})


def ov_token_bytes(model) -> int:
    """Bytes of constants one token reads: all but the embedding's (constants feeding a Gather of token ids,
    through their decompression ops)."""
    gathered = set()
    for op in model.get_ordered_ops():
        stack = [op.input_value(0).get_node()] if op.get_type_name() == "Gather" else []
        while stack:
            node = stack.pop()
            if node.get_type_name() == "Constant":
                gathered.add(node.get_friendly_name())
            elif node.get_type_name() in ("Convert", "Subtract", "Multiply", "Reshape", "Unsqueeze"):
                stack += [v.get_node() for v in node.input_values()]
    return sum(op.get_byte_size() for op in model.get_ordered_ops()
               if op.get_type_name() == "Constant" and op.get_friendly_name() not in gathered)


RECIPES = {"hf": hf, "mixprec-generate": mixprec_generate, "torchao": torchao_, "openvino-kv": openvino_kv}


class DecodeContext:
    def __init__(self, lm, prompt, length, run_options, directory):
        self.lm, self.prompt, self.length, self.run_options = lm, prompt, length, run_options
        self.cache, self.now = {"dir": directory}, machine.measuring()[0].now


def measure(group, smoke: bool) -> list[dict]:
    clock, _ = machine.measuring()
    shape = dict(group.shape)
    tokens, new, interleave = shape.pop("prompt", 16 if smoke else 128), shape.pop("new", 4 if smoke else 16), \
        shape.pop("interleave", True)
    built = build(group.model, shape, smoke)
    lm = built.lm
    prompt = built.prompt(0, tokens)
    options = {} if lm.config.is_encoder_decoder else {"pad_token_id": 0}
    bandwidth = machine.copy_bandwidth()
    records, live, reference = [], {}, {}
    directory = tempfile.TemporaryDirectory(prefix="bench_decode_")
    ctx = DecodeContext(lm, prompt, tokens + new + 2, options, directory.name)
    rates: dict[str, list] = {}

    def sample_of(label, decoder):
        def call():
            (_, rate), seconds = clock.timed(lambda: decoder.generate(prompt, new))
            rates[label].append(rate)
            return seconds
        return call

    def finish(label, samples):
        record = next(r for r in records if r["case"] == label)
        record["seconds"] = statistics.median(samples)
        record["tokens_per_s"] = new / record["seconds"]
        record["decode_tokens_per_s"] = statistics.median(rates[label][-len(samples):])
        record["of roofline"] = record["decode_tokens_per_s"] * record["facts"]["weight bytes"] / bandwidth

    for case in group.cases:
        record = {"case": case.label, "recipe": case.recipe, "backend": case.backend, "options": case.options}
        records.append(record)
        try:
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")
                decoder, record["build_s"] = clock.timed(lambda case=case: RECIPES[case.recipe](ctx, case))
                logits = decoder.logits(prompt)
                generated, _ = decoder.generate(prompt, new)  # warm-up (compiles happen here) and the tokens
        except Missing as e:
            record["skipped"] = str(e)
            continue
        except Exception as e:  # noqa: BLE001  (one case failing says why; the others run)
            from .pipeline import failed

            failed(record, case, e)
            continue
        generated = generated[-new:]
        if not reference:
            reference.update(logits=logits, tokens=generated)
        same = sum(a == b for a, b in zip(generated, reference["tokens"])) / max(len(generated), 1)
        error = rel_l2([logits], [reference["logits"]]) if logits is not None and reference["logits"] is not None \
            else None
        record.update(error=error, tokens_same=same,
                      facts={**decoder.facts, "weight bytes": decoder.weight_bytes, "copy GiB/s": bandwidth / 2**30})
        rates[case.label] = []
        if interleave:
            live[case.label] = sample_of(case.label, decoder)
            continue
        with torch.no_grad():
            samples = clock.interleaved({case.label: sample_of(case.label, decoder)}, rounds=group.timing.rounds,
                                        sample=lambda call, key: call())
        finish(case.label, samples[case.label])
        del decoder
        gc.collect()
    if live and group.timing.rounds:
        with torch.no_grad():
            samples = clock.interleaved(live, rounds=group.timing.rounds, sample=lambda call, key: call())
        for label, values in samples.items():
            finish(label, values)
    directory.cleanup()
    return records
