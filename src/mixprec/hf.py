"""Hugging Face causal LMs: compile for ``generate()``, and run transformers' own ``generate()`` on the program.

``mixprec.compile`` returns a ``torch.nn.Module`` that takes what the model takes
(``prog(input_ids=..., attention_mask=...)``), but transformers' ``generate()`` is a method
of the model, not something a module can be handed: ``model.forward = prog`` does nothing
useful (assigning a Module to an attribute registers a submodule; ``forward`` stays the
model's), and ``generate()`` would then run the fp32 model. So this module gives the compiled
program the shape of a transformers model:

* :func:`compile_for_generation` compiles a causal LM for one of two ways of decoding:

  - ``static_cache=False`` (default): the program maps ``(input_ids, attention_mask)`` to
    logits, with a dynamic batch and sequence length; every step reruns the whole sequence
    (no KV cache: simple, one program, cost grows with the length);
  - ``static_cache=True``: the model wrapped in transformers' own export recipe
    (``TorchExportableModuleWithStaticCache``, what ExecuTorch runs): the program keeps a KV
    cache of ``max_cache_len`` positions in its own buffers and maps
    ``(input_ids, cache_position)`` to logits; prefill takes any prompt length in one call
    (a dynamic sequence dimension), then one token per step.

* :class:`CausalLMProgram` is a ``PreTrainedModel`` + ``GenerationMixin`` around the
  program and the model's config: ``lm.generate(input_ids, max_new_tokens=..., do_sample=...)``
  is transformers' ``generate()`` (greedy, sampling, logits processors, stopping criteria,
  generation config), and ``lm(input_ids=...)`` returns ``CausalLMOutputWithPast``. Wrap a
  program loaded with ``mixprec.load`` the same way (``CausalLMProgram(prog, config)``).

The program owns its KV cache: the model, and the tensors of the recipe module, are never
written (``ir/written_state.py``). Numerics: under strong typing (the default) the logits are
eager PyTorch's; with ``enable_autocast=True`` the usual rules decide.
"""

from __future__ import annotations

import copy

import torch

from .calibrate.batches import as_call
from .errors import CalibrationError, ConfigError, InputMismatchError

try:  # transformers is optional for mixprec; this module needs it
    from transformers import GenerationConfig, GenerationMixin, PretrainedConfig, PreTrainedModel
    from transformers.cache_utils import DynamicCache
    from transformers.modeling_outputs import CausalLMOutputWithPast
except ImportError as e:  # pragma: no cover - exercised only without transformers
    raise ImportError("mixprec.hf needs transformers: pip install transformers") from e

__all__ = ["compile_for_generation", "CausalLMProgram"]


class _Logits(torch.nn.Module):
    """The causal LM as ``(input_ids, attention_mask) -> logits``, without a cache (so it can be captured)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask=None):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


def compile_for_generation(
    model,
    input_ids: torch.Tensor | None = None,
    *,
    attention_mask: torch.Tensor | None = None,
    static_cache: bool = False,
    max_cache_len: int | None = None,
    max_length: int | None = None,
    **settings,
) -> "CausalLMProgram":
    """Compile a transformers causal LM (``LlamaForCausalLM``, ``GPT2LMHeadModel``, ...) for ``generate()``.

    ``input_ids`` (and ``attention_mask``) are the example inputs: a prompt batch, e.g. what the tokenizer
    returns; without them, random tokens of shape (2, 8). ``settings`` are ``mixprec.compile``'s
    (``enable_autocast=True``, ``autocast_calibration_dataloader=`` with dict batches from a collator, ...).

    ``static_cache=False``: dynamic batch (1..64) and sequence length (1..``max_length``, default the
    model's ``max_position_embeddings``). ``static_cache=True``: a KV cache of ``max_cache_len`` positions
    (default ``max_length`` or 256) for the batch size of ``input_ids``.
    """
    if not isinstance(model, PreTrainedModel) or not model.can_generate():
        raise ConfigError(
            f"compile_for_generation takes a transformers model that can generate (e.g. LlamaForCausalLM), got "
            f"{type(model).__name__}; for other models use mixprec.compile."
        )
    if "dynamic_shapes" in settings:
        raise ConfigError("compile_for_generation chooses dynamic_shapes itself (batch and sequence length); drop it.")
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    longest = max_length or getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None) or 1024
    if input_ids is None:
        input_ids = torch.randint(0, int(getattr(config, "vocab_size", 2)), (2, 8), device=model.device)
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise ConfigError("input_ids must be a 2-D tensor of token ids (batch, sequence), e.g. tokenizer(...).input_ids.")
    if static_cache:
        prog = _compile_static(model, input_ids, max_cache_len or max_length or min(256, longest), settings)
    else:
        prog = _compile_full(model, input_ids, attention_mask, longest, settings)
    return CausalLMProgram(prog, model.config, generation_config=model.generation_config)


def _compile_full(model, input_ids, attention_mask, longest: int, settings):
    from .compiler import compile as mixprec_compile

    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    # torch.export specialises a dimension whose example size is 1: capture a batch/sequence of 2 then
    if input_ids.shape[0] == 1:
        input_ids, attention_mask = input_ids.repeat(2, 1), attention_mask.repeat(2, 1)
    if input_ids.shape[1] == 1:
        input_ids, attention_mask = input_ids.repeat(1, 2), attention_mask.repeat(1, 2)
    batch = torch.export.Dim("batch", min=1, max=64)
    seq = torch.export.Dim("seq", min=1, max=int(longest))
    shapes = ({0: batch, 1: seq}, {0: batch, 1: seq})
    return mixprec_compile(_Logits(model), (input_ids, attention_mask), dynamic_shapes=shapes, **settings)


def _compile_static(model, input_ids, max_cache_len: int, settings):
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    from .compiler import compile as mixprec_compile

    if input_ids.shape[1] >= max_cache_len:
        raise ConfigError(f"the example prompt ({input_ids.shape[1]} tokens) must be shorter than max_cache_len={max_cache_len}.")
    # the recipe reads these from the generation config; a copy is set for its constructor only
    generation_config = copy.deepcopy(model.generation_config)
    generation_config.cache_implementation = "static"
    generation_config.use_cache = True
    original = model.generation_config
    model.generation_config = generation_config
    try:
        recipe = TorchExportableModuleWithStaticCache(model, batch_size=input_ids.shape[0], max_cache_len=max_cache_len)
    finally:
        model.generation_config = original
    seq = torch.export.Dim("seq", min=1, max=max_cache_len - 1)
    loader = settings.pop("autocast_calibration_dataloader", None)
    if loader is not None:
        settings["autocast_calibration_dataloader"] = _StaticCacheBatches(loader, input_ids.shape[0])
    return mixprec_compile(
        recipe, (), kwargs={"input_ids": input_ids, "cache_position": torch.arange(input_ids.shape[1], device=input_ids.device)},
        dynamic_shapes={"input_ids": {1: seq}, "cache_position": {0: seq}}, **settings,
    )


class _StaticCacheBatches:
    """Calibration batches (dicts from a collator, tuples, tensors) as calls of the static-cache program:
    each prompt is prefilled from position 0. The program's cache has a fixed batch size; for a batch of
    one (the usual generate() case) every row of a batch becomes its own prompt, without its padding."""

    def __init__(self, loader, batch_size: int):
        self.loader = loader
        self.batch_size = batch_size

    def __iter__(self):
        for index, batch in enumerate(self.loader):
            args, kwargs = as_call(batch, f"calibration batch {index}", error=CalibrationError)
            if kwargs:
                ids, mask = kwargs["input_ids"], kwargs.get("attention_mask")
            else:
                ids, mask = args[0], (args[1] if len(args) > 1 else None)
            if self.batch_size == 1:
                for row in range(ids.shape[0]):
                    tokens = ids[row] if mask is None else ids[row][mask[row].bool()]
                    yield self._call(tokens.unsqueeze(0))
            else:
                yield self._call(ids)  # a batch of another size gives a CalibrationError naming it

    @staticmethod
    def _call(ids):
        return {"input_ids": ids, "cache_position": torch.arange(ids.shape[1], device=ids.device)}


class _PositionCache(DynamicCache):
    """What ``generate()`` sees as the cache of a static-cache program: the program holds the keys and
    values; this counts the positions filled, so generate passes only the new tokens."""

    def __init__(self):
        super().__init__()
        self.filled = 0

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.filled


class CausalLMProgram(PreTrainedModel, GenerationMixin):
    """A compiled causal-LM program that generates like the model: ``lm.generate(...)`` is transformers'.

    ``program``: a ``MixedPrecisionModule`` from :func:`compile_for_generation` (or ``mixprec.load`` of
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
        names = _parameter_names(program)
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
        self._max_cache_len = _cache_length(program) if static else None
        base = copy.deepcopy(generation_config) if generation_config is not None else GenerationConfig.from_model_config(config)
        base.use_cache = static  # without a KV cache every step reads the whole sequence
        if static:
            base.cache_implementation = None  # the program has its own cache; generate must not make one
        self.generation_config = base

    def forward(self, input_ids=None, attention_mask=None, past_key_values=None, use_cache=None, return_dict=None, **kwargs):
        unused = sorted(k for k, v in kwargs.items() if isinstance(v, torch.Tensor))
        if unused:
            raise InputMismatchError(
                f"this program was compiled for input_ids{' and attention_mask' if not self.static_cache else ''} "
                f"and does not take {', '.join(unused)}."
            )
        if input_ids is None:
            raise InputMismatchError("input_ids is required (inputs_embeds are not supported by a compiled program).")
        if not self.static_cache:
            if attention_mask is None:
                attention_mask = torch.ones_like(input_ids)
            logits = self.program(input_ids, attention_mask)
            return CausalLMOutputWithPast(logits=logits)
        cache = past_key_values if isinstance(past_key_values, _PositionCache) else None
        start = cache.filled if cache is not None else 0
        length = input_ids.shape[1]
        if start + length > self._max_cache_len:
            raise InputMismatchError(
                f"the sequence reaches {start + length} positions and the program's KV cache holds "
                f"{self._max_cache_len}; compile with a larger max_cache_len or generate fewer tokens."
            )
        if attention_mask is not None and not bool((attention_mask != 0).all()):
            raise InputMismatchError(
                "a static-cache program decodes without an attention mask, so prompts must not be padded; use "
                "compile_for_generation(static_cache=False) for padded batches."
            )
        position = torch.arange(start, start + length, device=input_ids.device)
        logits = self.program(input_ids=input_ids, cache_position=position)
        if cache is not None:
            cache.filled += length
        return CausalLMOutputWithPast(logits=logits, past_key_values=cache)

    def generate(self, *args, **kwargs):
        """transformers' ``generate()`` (same arguments); a static-cache program brings its own cache."""
        if self.static_cache and kwargs.get("past_key_values") is None:
            kwargs["past_key_values"] = _PositionCache()
        return super().generate(*args, **kwargs)

    def get_input_embeddings(self):
        return None

    def can_generate(self) -> bool:  # noqa: D102
        return True


def _parameter_names(program) -> set[str]:
    signature = getattr(program, "_call_signature", None)
    if signature is None:
        return set()
    return set(signature.parameter_names())


def _cache_length(program) -> int:
    """The largest cache_position + 1 the program accepts (its KV cache length)."""
    for spec in program._input_specs:
        if spec.name.startswith("cache_position") and spec.dims and not isinstance(spec.dims[0], int):
            high = spec.dims[0][1]
            if high is not None:
                return int(high) + 1
    return 1 << 30

