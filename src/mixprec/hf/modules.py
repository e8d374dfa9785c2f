"""The modules mixprec captures for ``generate()``: each part of a transformers model as tensors in, tensors out.

A transformers model's ``forward`` takes and returns cache objects, which ``torch.export`` cannot
carry across a program's boundary, and an encoder-decoder model's ``forward`` runs encoder and
decoder together, while ``generate()`` runs the encoder once and the decoder once per token. So each
part is wrapped in a small module whose inputs and outputs are tensors:

* :class:`CausalLMLogits`: ``(input_ids, attention_mask) -> logits``, no cache;
* :class:`CausalLMStaticCache`: ``(input_ids, cache_position) -> logits``, a static KV cache in the program;
* :class:`EncoderStates`: ``(input_ids, attention_mask)`` or ``(input_features)`` -> ``{last_hidden_state}``,
  with a static cache also the cross-attention keys and values (computed once per prompt, not per token);
* :class:`DecoderLogits`: ``(decoder_input_ids, encoder_hidden_states, attention_mask) -> logits``, no cache;
* :class:`DecoderStaticCache`: ``(decoder_input_ids, cache_position, encoder_hidden_states,
  cross_attention_keys, cross_attention_values, attention_mask) -> logits``, the self-attention cache static
  in the program, the cross-attention keys and values from the inputs.

Every module calls the whole model's ``forward`` (never ``decoder`` + ``lm_head`` by hand), so what the
model does around its layers is kept: T5's rescaling of tied embeddings, BART's ``final_logits_bias``,
Whisper's ``proj_out``. Each module registers the model's own children, parameters and buffers under their
own names (:class:`ModelParts`), so module paths in reports, in ``autocast_excluded_nodes`` and in plans are
the model's (``lm_head``, ``model.layers.0.mlp``), not ``model.lm_head``.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DummyLayer, DynamicCache, EncoderDecoderCache, StaticCache, StaticLayer
from transformers.cache_utils import StaticSlidingWindowLayer

from .cache import cache_keyword
from .parts import start_token


class ModelParts(torch.nn.Module):
    """A module that runs ``model`` and holds its children, parameters and buffers under their own names.

    The model itself is kept out of the module tree, so module paths in reports, in ``autocast_excluded_nodes``
    and in plans are the model's (``lm_head``, ``model.layers.0.mlp``), not ``model.lm_head``. ``mixprec_name``
    is what error messages call the module. The KV cache goes to the model under the name its ``forward`` takes
    (``cache`` from transformers 5.24 on, ``past_key_values`` before: ``cache_keyword``), so capturing prints no
    deprecation warning."""

    def __init__(self, model, what: str):
        super().__init__()
        self.__dict__["hf_model"] = model  # not a submodule: its parts are registered below, by their names
        for name, child in model.named_children():
            self.add_module(name, child)
        for name, parameter in model.named_parameters(recurse=False):
            self.register_parameter(name, parameter)
        non_persistent = getattr(model, "_non_persistent_buffers_set", set())
        for name, buffer in model.named_buffers(recurse=False):
            self.register_buffer(name, buffer, persistent=name not in non_persistent)
        self.mixprec_name = f"{type(model).__name__} ({what})"
        self.cache_keyword = cache_keyword(model.forward)  # the name the model's forward takes the KV cache by

    def with_cache(self, cache) -> dict:
        """``{name: cache}``: the keyword that gives ``cache`` to the model's forward."""
        return {self.cache_keyword: cache}


def static_cache(model, max_cache_len: int) -> StaticCache:
    """transformers' StaticCache for ``model``, with the layers ``torch.export`` cannot trace replaced as in
    transformers' own export recipe: sliding-window layers by plain static layers of the whole length (their
    masks still apply the window), KV-sharing consumers by empty ones."""
    cache = StaticCache(config=model.config, max_cache_len=max_cache_len)
    for index, layer in enumerate(cache.layers):
        if isinstance(layer, StaticSlidingWindowLayer):
            cache.layers[index] = StaticLayer(max_cache_len)
        elif isinstance(layer, DummyLayer):
            cache.layers[index] = StaticLayer(0)
    return cache


def register_cache(module: torch.nn.Module, cache: StaticCache) -> None:
    """Zero the cache's tensors (filled once to allocate them) and make them the module's buffers."""
    with torch.no_grad():
        for index, layer in enumerate(cache.layers):
            if not getattr(layer, "is_initialized", False):
                continue
            layer.keys.zero_()
            layer.values.zero_()
            layer.cumulative_length.zero_()
            module.register_buffer(f"key_cache_{index}", layer.keys, persistent=False)
            module.register_buffer(f"value_cache_{index}", layer.values, persistent=False)
            module.register_buffer(f"cumulative_length_{index}", layer.cumulative_length, persistent=False)


def start_at(cache: StaticCache, cache_position: torch.Tensor) -> None:
    """Make the cache's layers count ``cache_position[0]`` positions filled: a call may restart a prompt."""
    for layer in cache.layers:
        layer.cumulative_length.copy_(cache_position[0])


class CausalLMLogits(ModelParts):
    """A causal LM as ``(input_ids, attention_mask) -> logits``, without a cache: a call reads the whole sequence."""

    def __init__(self, model):
        super().__init__(model, "input_ids, attention_mask -> logits, for generate() without a KV cache")

    def forward(self, input_ids, attention_mask=None):
        return self.hf_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


class CausalLMStaticCache(ModelParts):
    """A causal LM as ``(input_ids, cache_position) -> logits`` with a KV cache of ``max_cache_len`` positions for
    ``input_ids.shape[0]`` sequences in its own buffers (transformers' ``TorchExportableModuleWithStaticCache``, the
    recipe ExecuTorch runs, with the model's own names). The model runs once here to allocate the cache."""

    def __init__(self, model, input_ids: torch.Tensor, max_cache_len: int):
        super().__init__(model, f"input_ids, cache_position -> logits, static KV cache of {max_cache_len}")
        self.__dict__["cache"] = static_cache(model, max_cache_len)
        with torch.no_grad():
            model(input_ids=input_ids[:, :1], **self.with_cache(self.cache), use_cache=True)
        register_cache(self, self.cache)

    def forward(self, input_ids, cache_position):
        start_at(self.cache, cache_position)
        out = self.hf_model(input_ids=input_ids, attention_mask=None, **self.with_cache(self.cache), use_cache=True)
        return out.logits


class EncoderStates(ModelParts):
    """An encoder-decoder model's encoder: ``(input_ids, attention_mask)`` — or ``(input_features)`` for speech
    models — to ``{"last_hidden_state"}``; with ``cross_attention=True`` also every decoder layer's cross-attention
    keys and values.

    Cross-attention keys and values depend on the encoder's output only, so ``generate()`` computes them once per
    prompt; a decoder program that recomputed them every step would do ``2 * source_length`` times a layer's
    projection work per token. With a static cache the encoder-side program therefore also returns them: the
    model's decoder run once on the start token with an empty cache, of which only the cross-attention projections
    reach the outputs, so the rest is dead code the capture drops; stacked as ``(batch, layers, heads, source,
    head_dim)`` with the batch first, so that ``generate()`` expands them for beam search like every encoder
    output. The decoder program (:class:`DecoderStaticCache`) reads them through a pre-filled cross-attention
    cache."""

    def __init__(self, model, *, speech: bool, cross_attention: bool):
        super().__init__(model, "encoder" + (" and cross-attention keys/values" if cross_attention else ""))
        self.speech = speech
        self.cross_attention = cross_attention
        self.start_token = start_token(model)
        self.__dict__["hf_encoder"] = model.get_encoder()  # registered above under the model's own path

    def states(self, inputs: dict) -> dict:
        """The subclasses' forward: their signatures name the inputs the program takes."""
        hidden = self.hf_encoder(**inputs).last_hidden_state
        out = {"last_hidden_state": hidden}
        if self.cross_attention:
            cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
            start = torch.full((hidden.shape[0], 1), self.start_token, dtype=torch.long, device=hidden.device)
            self.hf_model(
                encoder_outputs=(hidden,), attention_mask=inputs.get("attention_mask"), decoder_input_ids=start,
                **self.with_cache(cache), use_cache=True,
            )
            layers = cache.cross_attention_cache.layers
            out["cross_attention_keys"] = torch.stack([layer.keys for layer in layers], dim=1)
            out["cross_attention_values"] = torch.stack([layer.values for layer in layers], dim=1)
        return out


class TextEncoderStates(EncoderStates):
    def __init__(self, model, *, cross_attention: bool):
        super().__init__(model, speech=False, cross_attention=cross_attention)

    def forward(self, input_ids, attention_mask):
        return self.states({"input_ids": input_ids, "attention_mask": attention_mask})


class SpeechEncoderStates(EncoderStates):
    def __init__(self, model, *, cross_attention: bool):
        super().__init__(model, speech=True, cross_attention=cross_attention)

    def forward(self, input_features):
        return self.states({"input_features": input_features})


class DecoderLogits(ModelParts):
    """An encoder-decoder model's decoder without a cache: ``(decoder_input_ids, encoder_hidden_states[,
    attention_mask]) -> logits``, the whole target sequence every call. ``attention_mask`` is the encoder's
    (text models; speech models have none)."""

    def __init__(self, model):
        super().__init__(model, "decoder_input_ids, encoder_hidden_states -> logits, for generate() without a KV cache")

    def logits(self, decoder_input_ids, encoder_hidden_states, attention_mask):
        return self.hf_model(
            encoder_outputs=(encoder_hidden_states,), attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids, use_cache=False,
        ).logits


class TextDecoderLogits(DecoderLogits):
    def forward(self, decoder_input_ids, encoder_hidden_states, attention_mask):
        return self.logits(decoder_input_ids, encoder_hidden_states, attention_mask)


class SpeechDecoderLogits(DecoderLogits):
    def forward(self, decoder_input_ids, encoder_hidden_states):
        return self.logits(decoder_input_ids, encoder_hidden_states, None)


class DecoderStaticCache(ModelParts):
    """An encoder-decoder model's decoder with a static self-attention cache of ``max_cache_len`` positions for a
    fixed number of sequences in its own buffers, and the cross-attention keys and values as inputs
    (:class:`EncoderStates`). The decoder runs once here, on ``example`` (the encoder side's outputs), to allocate
    the cache."""

    def __init__(self, model, example: dict, max_cache_len: int):
        super().__init__(model, f"decoder step, static KV cache of {max_cache_len}")
        self.__dict__["cache"] = static_cache(model, max_cache_len)
        batch = example["last_hidden_state"].shape[0]
        start = torch.zeros((batch, 1), dtype=torch.long, device=example["last_hidden_state"].device)  # any token
        with torch.no_grad():
            self.logits(start, example["last_hidden_state"], example["cross_attention_keys"],
                        example["cross_attention_values"], example.get("attention_mask"))
        register_cache(self, self.cache)

    def logits(self, decoder_input_ids, encoder_hidden_states, keys, values, attention_mask):
        cross = DynamicCache([(keys[:, index], values[:, index]) for index in range(keys.shape[1])])
        return self.hf_model(
            encoder_outputs=(encoder_hidden_states,), attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids, **self.with_cache(EncoderDecoderCache(self.cache, cross)),
            use_cache=True,
        ).logits


class TextDecoderStaticCache(DecoderStaticCache):
    def forward(self, decoder_input_ids, cache_position, encoder_hidden_states, cross_attention_keys,
                cross_attention_values, attention_mask):
        start_at(self.cache, cache_position)
        return self.logits(decoder_input_ids, encoder_hidden_states, cross_attention_keys, cross_attention_values,
                           attention_mask)


class SpeechDecoderStaticCache(DecoderStaticCache):
    def forward(self, decoder_input_ids, cache_position, encoder_hidden_states, cross_attention_keys,
                cross_attention_values):
        start_at(self.cache, cache_position)
        return self.logits(decoder_input_ids, encoder_hidden_states, cross_attention_keys, cross_attention_values, None)
