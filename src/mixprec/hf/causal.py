"""Causal LMs (Llama, Qwen2, Mistral, GPT-2, ...): one program, and transformers' ``generate()`` on it.

:func:`compile_causal` compiles the model for one of two ways of decoding (``modules.py``):

* ``static_cache=False``: the program maps ``(input_ids, attention_mask)`` to logits, with a dynamic
  batch and sequence length; every step reruns the whole sequence (no KV cache: simple, one program,
  padded batches work, cost grows with the length);
* ``static_cache=True``: transformers' static-cache export recipe: the program keeps a KV cache of
  ``max_cache_len`` positions in its own buffers and maps ``(input_ids, cache_position)`` to logits;
  prefill takes any prompt length in one call, then one token per step. The number of sequences is
  fixed: the example's batch times ``num_beams``.

:class:`CausalLMProgram` is a ``PreTrainedModel`` + ``GenerationMixin`` around the program and the
model's config: ``lm.generate(input_ids, max_new_tokens=..., do_sample=..., num_beams=...)`` is
transformers' ``generate()``, and ``lm(input_ids=...)`` returns ``CausalLMOutputWithPast``.

The program owns its KV cache: the model is never written (``ir/written_state.py``); on backend="openvino" the cache
lives in OpenVINO's infer request as variables (``backends/openvino/state.py``). Numerics: under
strong typing (the default) the logits are eager PyTorch's; with ``enable_autocast=True`` the usual
rules decide.
"""

from __future__ import annotations

import copy

import torch
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from ..errors import ConfigError, InputMismatchError
from .cache import GeneratesWithProgramCache, one_cache, refuse_keywords, with_cache
from .calibration import StaticCacheBatches
from .modules import CausalLMLogits, CausalLMStaticCache
from .parts import MAX_BATCH, cache_length, cache_rows, compile_part, default_length, generation_config_for
from .parts import as_returned, program_inputs, static_cache_length
from .weight_only import weight_only_plan


def compile_causal(model, input_ids, attention_mask, *, static_cache: bool, max_cache_len, max_length,
                   num_beams: int, settings: dict, weights=None) -> "CausalLMProgram":
    """Compile a causal LM for ``generate()`` (module docstring). ``weights``: None, or (bits, group size, lm_head)
    of weight-only Linears (``weight_only.py``)."""
    if weights is not None:
        settings = {**settings, "weights": weights}
    if static_cache:
        length = static_cache_length(model.config, max_cache_len, max_length, input_ids.shape[1])
        prog = _compile_static(model, input_ids.repeat_interleave(num_beams, dim=0), length, settings)
    else:
        prog = _compile_full(model, input_ids, attention_mask, max_length or default_length(model.config), settings)
    return CausalLMProgram(prog, model.config, generation_config=model.generation_config)


def _compile_full(model, input_ids, attention_mask, longest: int, settings):
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    # torch.export specialises a dimension whose example size is 1: capture a batch/sequence of 2 then
    if input_ids.shape[0] == 1:
        input_ids, attention_mask = input_ids.repeat(2, 1), attention_mask.repeat(2, 1)
    if input_ids.shape[1] == 1:
        input_ids, attention_mask = input_ids.repeat(1, 2), attention_mask.repeat(1, 2)
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    seq = torch.export.Dim("seq", min=1, max=int(longest))
    shapes = ({0: batch, 1: seq}, {0: batch, 1: seq})
    wrapper = CausalLMLogits(model)
    call = (input_ids, attention_mask)
    return compile_part(wrapper, call, shapes, _with_plan(settings, call, wrapper), "model")


def _compile_static(model, input_ids, max_cache_len: int, settings):
    settings = dict(settings)
    loader = settings.pop("autocast_calibration_dataloader", None)
    if loader is not None:
        settings["autocast_calibration_dataloader"] = StaticCacheBatches(loader, input_ids.shape[0])
    if input_ids.shape[1] == 1:  # a prefill of 2 tokens: torch.export specialises a size of 1
        input_ids = input_ids.repeat(1, 2)
    seq = torch.export.Dim("seq", min=1, max=max_cache_len - 1)
    call = {"input_ids": input_ids, "cache_position": torch.arange(input_ids.shape[1], device=input_ids.device)}
    shapes = {"input_ids": {1: seq}, "cache_position": {0: seq}}
    wrapper = CausalLMStaticCache(model, input_ids, max_cache_len)
    return compile_part(wrapper, call, shapes, _with_plan(settings, call, wrapper), "model")


def _with_plan(settings: dict, call, wrapper) -> dict:
    """``settings`` for mixprec.compile: the weight-only request (if any) made into a plan for the wrapper."""
    settings = dict(settings)
    weights = settings.pop("weights", None)
    if weights is None:
        return settings
    bits, group_size, lm_head = weights
    settings["plan"] = weight_only_plan(wrapper, call, bits, group_size, lm_head)
    return settings


class CausalLMProgram(GeneratesWithProgramCache, PreTrainedModel, GenerationMixin):
    """A compiled causal-LM program that generates like the model: ``lm.generate(...)`` is transformers'.

    ``program``: a ``MixedPrecisionModule`` from :func:`mixprec.hf.compile_for_generation` (or ``mixprec.load`` of
    one); ``config``: the model's config (``model.config`` or ``AutoConfig.from_pretrained(...)``);
    ``generation_config``: the model's (default: from the config). Neither is modified.
    """

    config_class = PretrainedConfig
    main_input_name = "input_ids"
    base_model_prefix = "program"
    _supports_cache_class = True
    # the attention kernels are baked into the program; transformers checks these flags at construction
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True

    def __init__(self, program, config, generation_config=None):
        names = program_inputs(program)
        if names == {"input_ids", "cache_position"}:
            static = True
        elif names in ({"input_ids", "attention_mask"}, {"input_ids"}):
            static = False
        else:
            raise ConfigError(
                f"CausalLMProgram takes a program compiled by mixprec.hf.compile_for_generation (inputs input_ids with "
                f"attention_mask or cache_position); this one takes {sorted(names)}."
            )
        super().__init__(copy.deepcopy(config))
        self.program = program
        self.static_cache = static
        self._max_cache_len = cache_length(program) if static else None
        self._sequences = cache_rows(program) if static else None
        self.generation_config = generation_config_for(config, generation_config, static)

    @property
    def reports(self) -> dict:
        """The program's report, as ``{"program": ...}`` (``Seq2SeqLMProgram.reports`` has two)."""
        return {"program": self.program.report}

    def forward(self, input_ids=None, attention_mask=None, cache=None, past_key_values=None, use_cache=None,
                return_dict=None, **kwargs):
        """The logits of ``input_ids`` as ``CausalLMOutputWithPast``; ``cache`` (``past_key_values`` before
        transformers 5.24) is the ProgramCache ``generate()`` passes a static-cache program. A keyword the program
        does not take is refused (``cache.refuse_keywords``)."""
        refuse_keywords(kwargs, "this causal-LM program")
        past = one_cache(cache, past_key_values)
        if input_ids is None:
            raise InputMismatchError("input_ids is required (inputs_embeds are not supported by a compiled program).")
        if not self.static_cache:
            if attention_mask is None:
                attention_mask = torch.ones_like(input_ids)
            logits = self.program(input_ids, attention_mask)
            return as_returned(with_cache(CausalLMOutputWithPast, self.no_cache_step(past), logits=logits), return_dict)
        cache, position = self.cache_step(past, input_ids)
        if attention_mask is not None and not bool((attention_mask != 0).all()):
            raise InputMismatchError(
                "a static-cache program decodes without an attention mask, so prompts must not be padded; use "
                "compile_for_generation(static_cache=False) for padded batches."
            )
        logits = self.program(input_ids=input_ids, cache_position=position)
        if cache is not None:
            cache.filled += len(position)
        return as_returned(with_cache(CausalLMOutputWithPast, cache, logits=logits), return_dict)

    def cached_program(self):  # noqa: D102
        return self.program
