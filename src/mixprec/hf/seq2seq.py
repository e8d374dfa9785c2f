"""Encoder-decoder models (T5, BART, Marian, mBART, Whisper): two programs, and transformers' ``generate()`` on them.

``generate()`` runs an encoder-decoder model's encoder once per prompt and its decoder once per
token, so :func:`compile_seq2seq` compiles two programs (``modules.py`` says what each takes):

* the encoder program: ``(input_ids, attention_mask)`` — ``(input_features)`` for speech models —
  to the encoder's ``last_hidden_state`` (dynamic batch and source length; Whisper's frames are fixed
  by the model), plus the cross-attention keys and values with a static cache;
* the decoder program, one of two ways of decoding, as for causal LMs:

  - ``static_cache=False``: ``(decoder_input_ids, encoder_hidden_states, attention_mask) -> logits``
    with dynamic batch, target and source lengths; every step reruns the whole target sequence;
  - ``static_cache=True``: the self-attention KV cache in the program's own buffers (transformers'
    ``StaticCache``, the ``EncoderDecoderCache`` route of its export recipes), the cross-attention
    keys and values computed once by the encoder program; one token per step. The number of sequences
    is fixed: the example's batch times ``num_beams``.

:class:`Seq2SeqLMProgram` is a ``PreTrainedModel`` + ``GenerationMixin`` around both, so
``lm.generate(input_ids, num_beams=4)`` is transformers' own (greedy, beam search, sampling, logits
processors, stopping criteria). For Whisper it is Whisper's own ``generate()`` (``WhisperGenerationMixin``:
language and task tokens, timestamps, long-form), which needs two facts of the model's shape: its
convolutions' strides (1 and 2 in every Whisper).
"""

from __future__ import annotations

import copy
import dataclasses

import torch
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import ModelOutput, Seq2SeqLMOutput

from ..errors import ConfigError, InputMismatchError, UnexpectedKeywordError
from .cache import GeneratesWithProgramCache, one_cache, refuse_keywords, with_cache
from .calibration import DecoderBatches, EncoderBatches
from .modules import SpeechDecoderLogits, SpeechDecoderStaticCache, SpeechEncoderStates
from .modules import TextDecoderLogits, TextDecoderStaticCache, TextEncoderStates
from .parts import MAX_BATCH, cache_length, cache_rows, compile_part, example_tokens, generation_config_for
from .parts import as_returned, default_length, program_inputs, start_token, static_cache_length

_ENCODER_INPUTS = ({"input_ids", "attention_mask"}, {"input_features"})
_NO_CACHE = ({"decoder_input_ids", "encoder_hidden_states", "attention_mask"},
             {"decoder_input_ids", "encoder_hidden_states"})
_STATIC = {"decoder_input_ids", "cache_position", "encoder_hidden_states", "cross_attention_keys",
           "cross_attention_values"}


def is_speech(model_or_config) -> bool:
    """Whether the model's encoder reads audio features (Whisper) rather than token ids."""
    config = getattr(model_or_config, "config", model_or_config)
    return getattr(model_or_config, "main_input_name", None) == "input_features" or hasattr(config, "num_mel_bins")


def compile_seq2seq(model, inputs, attention_mask, decoder_input_ids, *, static_cache: bool, max_cache_len,
                    max_length, num_beams: int, settings: dict) -> "Seq2SeqLMProgram":
    """Compile an encoder-decoder model's encoder and decoder for ``generate()`` (module docstring)."""
    speech = is_speech(model)
    config = model.config
    loader = settings.pop("autocast_calibration_dataloader", None)
    encoder_args, encoder_shapes = _encoder_example(model, inputs, attention_mask, speech)
    encoder = (SpeechEncoderStates if speech else TextEncoderStates)(model, cross_attention=static_cache)
    encoder_settings = dict(settings)
    if loader is not None:
        encoder_settings["autocast_calibration_dataloader"] = EncoderBatches(loader, speech)
    encoder_program = compile_part(encoder, encoder_args, encoder_shapes, encoder_settings, "encoder")

    prompts = inputs.shape[0] if inputs is not None else encoder_args[0].shape[0]
    with torch.no_grad():  # the encoder side's fp32 outputs: the decoder's example inputs
        states = encoder(*[a[:prompts] for a in encoder_args])
    if not speech:
        states["attention_mask"] = encoder_args[1][:prompts]
    target = decoder_input_ids
    if target is None:
        first = torch.full((prompts, 1), start_token(model), dtype=torch.long)
        target = torch.cat([first, example_tokens(config, prompts, 1)], dim=1)
    target = target.to(states["last_hidden_state"].device)
    if target.dim() != 2 or target.shape[0] != prompts:
        raise ConfigError(f"decoder_input_ids must be a 2-D tensor with one row per prompt ({prompts}), got shape "
                          f"{tuple(target.shape)}.")
    if target.shape[1] == 1:  # torch.export specialises a dimension whose example size is 1
        target = target.repeat(1, 2)
    source = torch.export.Dim.STATIC if speech else torch.export.Dim("source", min=1, max=encoder_shapes[0][1].max)
    decoder_settings = dict(settings)
    if static_cache:
        length = static_cache_length(config, max_cache_len, max_length, target.shape[1])
        if loader is not None:
            batches = DecoderBatches(loader, encoder, model, prompts * num_beams)
            decoder_settings["autocast_calibration_dataloader"] = batches
        decoder_program = _compile_static_decoder(model, states, target, num_beams, length, source, decoder_settings)
    else:
        if loader is not None:
            decoder_settings["autocast_calibration_dataloader"] = DecoderBatches(loader, encoder, model, None)
        longest = max_length or default_length(config)
        decoder_program = _compile_decoder(model, states, target, int(longest), source, decoder_settings)
    return program_class(config)(encoder_program, decoder_program, config, generation_config=model.generation_config)


def _compile_decoder(model, states: dict, target, longest: int, source, settings):
    """The decoder without a cache: dynamic batch, target and source lengths."""
    speech = "attention_mask" not in states
    if target.shape[0] == 1:  # torch.export specialises a dimension whose example size is 1
        target, states = target.repeat(2, 1), {k: v.repeat(2, *[1] * (v.dim() - 1)) for k, v in states.items()}
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    steps = torch.export.Dim("target", min=1, max=longest)
    kwargs = {"decoder_input_ids": target, "encoder_hidden_states": states["last_hidden_state"]}
    shapes = {"decoder_input_ids": {0: batch, 1: steps}, "encoder_hidden_states": {0: batch, 1: source}}
    if not speech:
        kwargs["attention_mask"], shapes["attention_mask"] = states["attention_mask"], {0: batch, 1: source}
    decoder = (SpeechDecoderLogits if speech else TextDecoderLogits)(model)
    return compile_part(decoder, kwargs, shapes, settings, "decoder")


def _compile_static_decoder(model, states: dict, target, num_beams: int, length: int, source, settings):
    """The decoder with a static self-attention cache for (prompts x num_beams) sequences of ``length`` positions."""
    speech = "attention_mask" not in states
    states = {k: v.repeat_interleave(num_beams, dim=0) for k, v in states.items()}
    target = target.repeat_interleave(num_beams, dim=0)
    decoder = (SpeechDecoderStaticCache if speech else TextDecoderStaticCache)(model, states, length)
    kwargs = {
        "decoder_input_ids": target, "cache_position": torch.arange(target.shape[1], device=target.device),
        "encoder_hidden_states": states["last_hidden_state"], "cross_attention_keys": states["cross_attention_keys"],
        "cross_attention_values": states["cross_attention_values"],
    }
    steps = torch.export.Dim("target", min=1, max=length - 1)
    shapes = {"decoder_input_ids": {1: steps}, "cache_position": {0: steps}, "encoder_hidden_states": {1: source},
              "cross_attention_keys": {3: source}, "cross_attention_values": {3: source}}
    if not speech:
        kwargs["attention_mask"], shapes["attention_mask"] = states["attention_mask"], {1: source}
    return compile_part(decoder, kwargs, shapes, settings, "decoder")


def _encoder_example(model, inputs, attention_mask, speech: bool):
    """The encoder's example call (a batch of at least 2: torch.export specialises a size of 1) and dynamic shapes."""
    config = model.config
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    if speech:
        if inputs is None:
            frames = 2 * int(config.max_source_positions)  # Whisper's convolutions halve the frames once
            generator = torch.Generator().manual_seed(0)
            inputs = torch.randn((2, config.num_mel_bins, frames), generator=generator).to(model.device, model.dtype)
        if not isinstance(inputs, torch.Tensor) or inputs.dim() != 3:
            raise ConfigError("input_features must be a 3-D tensor (batch, mel bins, frames), e.g. what the feature "
                              "extractor returns.")
        if inputs.shape[0] == 1:
            inputs = inputs.repeat(2, 1, 1)
        return (inputs,), ({0: batch},)
    if inputs is None:
        inputs = example_tokens(config, 2, 8).to(model.device)
    if not isinstance(inputs, torch.Tensor) or inputs.dim() != 2:
        raise ConfigError("input_ids must be a 2-D tensor of token ids (batch, sequence), e.g. tokenizer(...)"
                          ".input_ids.")
    mask = attention_mask if attention_mask is not None else torch.ones_like(inputs)
    if inputs.shape[0] == 1:
        inputs, mask = inputs.repeat(2, 1), mask.repeat(2, 1)
    if inputs.shape[1] == 1:
        inputs, mask = inputs.repeat(1, 2), mask.repeat(1, 2)
    longest = getattr(config, "max_position_embeddings", None) or 4096  # T5's relative positions have no limit
    source = torch.export.Dim("source", min=1, max=int(longest))
    return (inputs, mask), ({0: batch, 1: source}, {0: batch, 1: source})


@dataclasses.dataclass
class EncoderProgramOutput(ModelOutput):
    """The encoder program's outputs as ``generate()`` keeps them (it expands every tensor here for beam search)."""

    last_hidden_state: torch.FloatTensor | None = None
    cross_attention_keys: torch.FloatTensor | None = None
    cross_attention_values: torch.FloatTensor | None = None


class EncoderCall(torch.nn.Module):
    """The encoder program as ``generate()`` calls an encoder (``get_encoder()(input_ids=..., return_dict=True)``)."""

    def __init__(self, program, speech: bool):
        super().__init__()
        self.__dict__["program"] = program  # the LM registers it; not a second time here
        self.speech = speech

    def forward(self, input_ids=None, attention_mask=None, input_features=None, output_attentions=False,
                output_hidden_states=False, return_dict=True, **others):
        # the catch-all is not called kwargs: generate() would then pass the encoder all its model keywords
        refuse_keywords(others, "this encoder program")
        if output_attentions or output_hidden_states:
            raise UnexpectedKeywordError(
                "a compiled encoder returns its last hidden state only, not attentions or hidden states of every "
                "layer; generate without output_attentions/output_hidden_states."
            )
        if self.speech:
            if input_features is None:
                raise InputMismatchError("this encoder program takes input_features (what the feature extractor "
                                         "returns).")
            out = self.program(input_features)
        else:
            if input_ids is None:
                raise InputMismatchError("input_ids is required (a compiled program takes no inputs_embeds).")
            out = self.program(input_ids, attention_mask if attention_mask is not None else torch.ones_like(input_ids))
        return as_returned(EncoderProgramOutput(**out), return_dict)


class Seq2SeqLMProgram(GeneratesWithProgramCache, PreTrainedModel, GenerationMixin):
    """Compiled encoder and decoder programs that generate like the model: ``lm.generate(...)`` is transformers'.

    ``encoder_program``/``decoder_program``: ``MixedPrecisionModule``\\ s from :func:`mixprec.hf.compile_for_generation`
    (or ``mixprec.load`` of them); ``config``: the model's config; ``generation_config``: the model's (default: from the
    config). Neither is modified. ``lm.encoder_program.report`` and ``lm.decoder_program.report`` are the reports.
    """

    config_class = PretrainedConfig
    base_model_prefix = "decoder_program"
    _supports_cache_class = True
    _supports_sdpa = True  # the attention kernels are baked into the programs
    _supports_flash_attn = True
    _supports_flex_attn = True

    def __init__(self, encoder_program, decoder_program, config, generation_config=None):
        encoder_names, decoder_names = program_inputs(encoder_program), program_inputs(decoder_program)
        static = decoder_names in (_STATIC, _STATIC | {"attention_mask"})
        if encoder_names not in _ENCODER_INPUTS or not (static or decoder_names in _NO_CACHE):
            raise ConfigError(
                "Seq2SeqLMProgram takes the encoder and decoder programs mixprec.hf.compile_for_generation "
                f"compiles for an encoder-decoder model; these take {sorted(encoder_names)} and "
                f"{sorted(decoder_names)}."
            )
        super().__init__(copy.deepcopy(config))
        self.encoder_program = encoder_program
        self.decoder_program = decoder_program
        self.static_cache = static
        self.speech = encoder_names == {"input_features"}
        self.main_input_name = "input_features" if self.speech else "input_ids"
        self.__dict__["encoder_call"] = EncoderCall(encoder_program, self.speech)
        self._sequences = cache_rows(decoder_program) if static else None
        self._max_cache_len = cache_length(decoder_program) if static else None
        self.generation_config = generation_config_for(config, generation_config, static)

    @property
    def reports(self) -> dict:
        """Both programs' reports: ``{"encoder": ..., "decoder": ...}``."""
        return {"encoder": self.encoder_program.report, "decoder": self.decoder_program.report}

    def get_encoder(self, *args, **kwargs):
        return self.encoder_call

    def forward(self, input_ids=None, attention_mask=None, decoder_input_ids=None, encoder_outputs=None,
                cache=None, past_key_values=None, use_cache=None, return_dict=None, input_features=None, **kwargs):
        """The logits of ``decoder_input_ids`` as ``Seq2SeqLMOutput``; ``cache`` (``past_key_values`` before
        transformers 5.24) is the ProgramCache ``generate()`` passes a static-cache program. A keyword the programs
        do not take is refused (``cache.refuse_keywords``)."""
        refuse_keywords(kwargs, "this encoder-decoder program")
        past = one_cache(cache, past_key_values)
        if decoder_input_ids is None:
            raise InputMismatchError("decoder_input_ids is required (e.g. the decoder start token).")
        if encoder_outputs is None:
            encoder_outputs = self.encoder_call(input_ids=input_ids, attention_mask=attention_mask,
                                                input_features=input_features)
        hidden = getattr(encoder_outputs, "last_hidden_state", None)
        hidden = encoder_outputs[0] if hidden is None else hidden
        mask = None
        if not self.speech:
            mask = attention_mask if attention_mask is not None else hidden.new_ones(hidden.shape[:2], dtype=torch.long)
        if not self.static_cache:
            args = (decoder_input_ids, hidden) + (() if self.speech else (mask,))
            output = with_cache(Seq2SeqLMOutput, self.no_cache_step(past), logits=self.decoder_program(*args),
                                encoder_last_hidden_state=hidden)
            return as_returned(output, return_dict)
        keys = getattr(encoder_outputs, "cross_attention_keys", None)
        values = getattr(encoder_outputs, "cross_attention_values", None)
        if keys is None or values is None:
            raise InputMismatchError("a static-cache decoder program needs the encoder program's cross-attention keys "
                                     "and values: pass encoder_outputs from lm.get_encoder(), or the encoder inputs.")
        cache, position = self.cache_step(past, decoder_input_ids, "target sequence")
        args = dict(decoder_input_ids=decoder_input_ids, cache_position=position, encoder_hidden_states=hidden,
                    cross_attention_keys=keys, cross_attention_values=values)
        if not self.speech:
            args["attention_mask"] = mask
        logits = self.decoder_program(**args)
        if cache is not None:
            cache.filled += len(position)
        return as_returned(with_cache(Seq2SeqLMOutput, cache, logits=logits, encoder_last_hidden_state=hidden),
                           return_dict)

    def cached_program(self):  # noqa: D102
        return self.decoder_program


class _WhisperShape:
    """What ``WhisperGenerationMixin.generate`` reads of ``self.model``: the encoder's convolution strides (1 and 2
    in every Whisper: the encoder halves the frames once) and the config."""

    def __init__(self, config):
        conv = type("Conv", (), {})
        self.encoder = type("Encoder", (), {})()
        self.encoder.conv1, self.encoder.conv2 = conv(), conv()
        self.encoder.conv1.stride, self.encoder.conv2.stride = (1,), (2,)
        self.config = config


def program_class(config) -> type:
    """The wrapper class for a model's config: Whisper's generate() for Whisper, transformers' for the others."""
    if getattr(config, "model_type", None) != "whisper":
        return Seq2SeqLMProgram
    from transformers.models.whisper.generation_whisper import WhisperGenerationMixin

    class WhisperProgram(WhisperGenerationMixin, Seq2SeqLMProgram):
        """Compiled Whisper encoder and decoder; ``generate()`` is Whisper's own."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.__dict__["model"] = _WhisperShape(self.config)

    return WhisperProgram
