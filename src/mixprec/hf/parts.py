"""What compiling a causal LM and an encoder-decoder model for ``generate()`` share: one compile per part of the
model, the example tokens when the user gives none, and reading back what a compiled part takes."""

from __future__ import annotations

import copy

import torch

from ..errors import ConfigError, UnsupportedModelError

# the largest batch (prompts x beams) a program with a dynamic batch takes; a bound torch.export needs
MAX_BATCH = 1024


def compile_part(module, call, shapes, settings: dict, what: str):
    """``mixprec.compile`` of one wrapper module (``modules.py``) with the dynamic sizes ``generate()`` needs.
    ``call``: the example positional arguments (a tuple) or keyword arguments (a dict)."""
    from ..compiler import compile as mixprec_compile

    args, kwargs = ((), call) if isinstance(call, dict) else (tuple(call), None)
    try:
        return mixprec_compile(module, args, kwargs=kwargs, dynamic_shapes=shapes, **settings)
    except ConfigError as e:
        if not str(e).startswith("dynamic_shapes does not fit"):
            raise
        # the user gave no dynamic_shapes: the model fixes a size generate() needs free (batch, length)
        reason = str(e).split(": ", 1)[-1].split("\nGive one entry")[0]
        raise UnsupportedModelError(
            f"compile_for_generation could not capture the {what} of {module.mixprec_name.split(' (')[0]} with the "
            f"dynamic batch and sequence lengths generate() needs: {reason}\nIf the model only takes fixed sizes, "
            "compile it with mixprec.compile and the sizes you use.",
            reason=getattr(e, "reason", None) or str(e),
        ) from e


def example_tokens(config, rows: int, length: int) -> torch.Tensor:
    """Token ids for an example call when the user gives none: a fixed generator, so a compile leaves the global
    random state (a user's seed for sampling) as it was."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    vocab = int(getattr(text, "vocab_size", None) or 2)
    return torch.randint(0, vocab, (rows, length), generator=torch.Generator().manual_seed(0))


def default_length(config) -> int:
    """The longest sequence a model takes, from its config (1024 when it names none)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for name in ("max_target_positions", "max_position_embeddings", "n_positions"):
        value = getattr(text, name, None)
        if value:
            return int(value)
    return 1024


def static_cache_length(config, max_cache_len: int | None, max_length: int | None, prompt: int) -> int:
    """The KV cache length of a static-cache program: ``max_cache_len``, else ``max_length``, else up to 256."""
    length = int(max_cache_len or max_length or min(256, default_length(config)))
    if prompt >= length:
        raise ConfigError(f"the example prompt ({prompt} tokens) must be shorter than max_cache_len={length}.")
    return length


def start_token(model) -> int:
    """The token an encoder-decoder model's decoder starts from."""
    token = model.generation_config.decoder_start_token_id
    return int(token if token is not None else (model.config.decoder_start_token_id or 0))


def generation_config_for(config, generation_config, static: bool):
    """A copy of the model's generation config (or one from its config) for a program: without a KV cache every step
    reads the whole sequence (``use_cache=False``); a static-cache program has its own cache, so generate() must not
    make one (``cache_implementation=None``)."""
    from transformers import GenerationConfig

    if generation_config is None:
        base = GenerationConfig.from_model_config(config)
    else:
        base = copy.deepcopy(generation_config)
    base.use_cache = static
    if static:
        base.cache_implementation = None
    return base


def as_returned(output, return_dict):
    """A wrapper's ``output`` as a model returns it: the ModelOutput, or its tuple with ``return_dict=False``."""
    return output.to_tuple() if return_dict is False else output


def program_inputs(program) -> set[str]:
    """The names of the inputs a compiled program takes."""
    signature = getattr(program, "_call_signature", None)
    return set(signature.parameter_names()) if signature is not None else set()


def cache_length(program) -> int:
    """The KV cache length of a static-cache program: its largest ``cache_position`` + 1."""
    for spec in program._input_specs:
        if spec.name.startswith("cache_position") and spec.dims and not isinstance(spec.dims[0], int):
            high = spec.dims[0][1]
            if high is not None:
                return int(high) + 1
    return 1 << 30


def cache_rows(program) -> int:
    """How many sequences a static-cache program's KV cache holds (its fixed batch)."""
    for spec in program._input_specs:
        if spec.name.startswith("cache_position"):
            continue
        if spec.dims and isinstance(spec.dims[0], int):
            return int(spec.dims[0])
    raise ConfigError("this program has no fixed batch; it is not a static-cache program of compile_for_generation.")
