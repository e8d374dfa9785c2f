"""Hugging Face models: compile for ``generate()``, and run transformers' own ``generate()`` on the programs.

``mixprec.compile`` returns a ``torch.nn.Module`` that takes what the model takes, but transformers'
``generate()`` is a method of the model, not something a module can be handed: ``model.forward = prog``
does nothing useful (assigning a Module to an attribute registers a submodule; ``forward`` stays the
model's), and ``generate()`` would then run the fp32 model. So this package gives compiled programs the
shape of a transformers model:

* :func:`compile_for_generation` compiles a model that generates: a causal LM into one program
  (``causal.py``), an encoder-decoder model (T5, BART, Marian, mBART, Whisper) into an encoder and a
  decoder program (``seq2seq.py``); each without a KV cache (dynamic lengths) or with a static one;
* :class:`CausalLMProgram` and :class:`Seq2SeqLMProgram` are ``PreTrainedModel`` + ``GenerationMixin``
  around the programs and a copy of the model's config: ``lm.generate(...)`` is transformers' own
  (greedy, beam search, sampling, logits processors, generation config; Whisper's own for Whisper);
* :func:`save` and :func:`load` keep the programs, config and generation config in one directory.

Where each part lives: ``modules.py`` (the modules captured), ``cache.py`` (the cache ``generate()``
sees for a program that keeps its own), ``calibration.py`` (users' batches as calls of each program),
``parts.py`` (what both kinds share), ``files.py``.
"""

from __future__ import annotations

import torch

from ..errors import ConfigError

try:  # transformers is optional for mixprec; this package needs it
    from transformers import PreTrainedModel
except ImportError as e:  # pragma: no cover - exercised only without transformers
    raise ImportError("mixprec.hf needs transformers: pip install transformers") from e

from .causal import CausalLMProgram, compile_causal
from .files import load, save
from .seq2seq import Seq2SeqLMProgram, compile_seq2seq
from . import weight_only as weight_only_options

__all__ = ["compile_for_generation", "CausalLMProgram", "Seq2SeqLMProgram", "save", "load"]


def compile_for_generation(
    model,
    input_ids: torch.Tensor | None = None,
    *,
    attention_mask: torch.Tensor | None = None,
    decoder_input_ids: torch.Tensor | None = None,
    static_cache: bool = False,
    max_cache_len: int | None = None,
    max_length: int | None = None,
    num_beams: int = 1,
    weights: str | None = None,
    group_size: int | None = None,
    lm_head: str | None = "int8",
    **settings,
) -> CausalLMProgram | Seq2SeqLMProgram:
    """Compile a transformers model that generates for its ``generate()``: a causal LM (``LlamaForCausalLM``,
    ``GPT2LMHeadModel``, ...) or an encoder-decoder model (``T5ForConditionalGeneration``, BART, Marian, mBART,
    ``WhisperForConditionalGeneration``).

    ``input_ids`` (and ``attention_mask``) are the example prompts, e.g. what the tokenizer returns; for a speech
    model (Whisper), its ``input_features``. Without them: random tokens of shape (2, 8) (Whisper: random features
    of two 30-s windows). ``decoder_input_ids``: an encoder-decoder model's example target (default: the decoder
    start token and one token). ``settings`` are ``mixprec.compile``'s (``enable_autocast=True``,
    ``autocast_calibration_dataloader=`` with a collator's batches, ``backend=``...), applied to every program.

    ``static_cache=False``: dynamic batch and lengths (sequences up to ``max_length``, default the model's
    maximum). ``static_cache=True``: a KV cache of ``max_cache_len`` positions (default ``max_length`` or 256) for
    the example's number of prompts times ``num_beams`` sequences.

    ``weights="int4"`` or ``"int8"`` (causal LMs): weight-only Linears (W4A16 / W8A16, real int4/int8 weight
    kernels, ``hf/weight_only.py``) in the decoder, ``group_size`` input channels per scale (default: 128 for int4,
    one scale per output channel for int8); ``lm_head`` the LM head's weights ("int8" by default, "int4", or None
    for float); embeddings stay as they are.
    """
    if not isinstance(model, PreTrainedModel) or not model.can_generate():
        raise ConfigError(
            f"compile_for_generation takes a transformers model that can generate (e.g. LlamaForCausalLM or "
            f"T5ForConditionalGeneration), got {type(model).__name__}; for other models use mixprec.compile."
        )
    if "dynamic_shapes" in settings:
        raise ConfigError("compile_for_generation chooses dynamic_shapes itself (batch and sequence lengths); drop it.")
    if not isinstance(num_beams, int) or num_beams < 1:
        raise ConfigError(f"num_beams must be a positive int (beams per prompt in generate()), got {num_beams!r}.")
    if "input_features" in settings:  # the speech models' name for their main input
        input_ids = settings.pop("input_features") if input_ids is None else input_ids
    weight_only = None
    if weights is not None or group_size is not None:
        weight_only_options.check(weights, lm_head, settings)
        weight_only = (weights, group_size, lm_head)
    if getattr(model.config, "is_encoder_decoder", False):
        if weight_only is not None:
            raise ConfigError("weights= (weight-only Linears) is built for causal LMs; for an encoder-decoder model "
                              "make a plan with MixedPrecisionConfigurator and param={'weight': 'int4'}.")
        return compile_seq2seq(model, input_ids, attention_mask, decoder_input_ids, static_cache=static_cache,
                               max_cache_len=max_cache_len, max_length=max_length, num_beams=num_beams,
                               settings=settings)
    if decoder_input_ids is not None:
        raise ConfigError(f"decoder_input_ids is for encoder-decoder models; {type(model).__name__} is a causal LM.")
    if input_ids is None:
        from .parts import example_tokens

        input_ids = example_tokens(model.config, 2, 8).to(model.device)
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise ConfigError("input_ids must be a 2-D tensor of token ids (batch, sequence), e.g. tokenizer(...)"
                          ".input_ids.")
    return compile_causal(model, input_ids, attention_mask, static_cache=static_cache, max_cache_len=max_cache_len,
                          max_length=max_length, num_beams=num_beams, settings=settings, weights=weight_only)

