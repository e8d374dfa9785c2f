"""``config.json`` and ``generation_config.json`` of a ``mixprec.hf.save`` directory, checked by mixprec before
transformers' config classes see them.

transformers' config classes were built for files their users chose: given a hostile value they fail with whatever
the value triggers (``num_attention_heads: 0``: ZeroDivisionError; a string ``max_length``: TypeError; their own
and huggingface_hub's validation errors), and a load must only ever refuse with FileFormatError. So the files are
read here (bounded JSON, ``bounded_json``), then checked over a closed vocabulary: the model type is one of
transformers' own (no remote code, nothing imported by a name outside that table), sizes are positive integers,
token ids non-negative integers, every other field of the model's config has the JSON type of the config class's
own default (the class built without the file), generation fields have the types transformers documents, and
fields that would build objects (quantization, watermarking, compile or cache configs) are refused. Only then is
the config built from the checked dict, and anything transformers still raises is a FileFormatError.
"""

from __future__ import annotations

import math

from ..errors import FileFormatError
from ..output.serialize.bounded_json import parse_json

MAX_BYTES = 1 << 20  # a config.json is a few KB (Whisper's, with its token lists, ~10 KB)
_ITEMS, _DEPTH, _STRING = 100_000, 16, 10_000
_ID_LIMIT = 1 << 31

_SIZES = frozenset({
    "hidden_size", "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "intermediate_size",
    "vocab_size", "max_position_embeddings", "head_dim", "n_embd", "n_head", "n_layer", "n_positions", "n_inner",
    "n_ctx", "d_model", "d_kv", "d_ff", "num_heads", "num_layers", "num_decoder_layers", "encoder_layers",
    "decoder_layers", "encoder_attention_heads", "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim",
    "num_mel_bins", "max_source_positions", "max_target_positions", "ffn_dim", "num_kv_heads", "kv_channels",
    "multi_query_group_num", "num_key_value_groups", "word_embed_proj_dim", "hidden_dim", "n_heads", "n_layers",
})  # fmt: skip  (a zero divides, a negative allocates nothing sensible)
_REFUSED = frozenset({
    "auto_map", "quantization_config", "watermarking_config", "compile_config", "cache_config",
    "continuous_batching_config", "constraints",
})  # fmt: skip  (remote code, or objects transformers builds from the field)

_DTYPES = frozenset({"float32", "float16", "bfloat16", "float64", "auto"})
_ATTENTION = frozenset({"eager", "sdpa", "flash_attention_2", "flex_attention"})
_NAMED = {"dtype": _DTYPES, "torch_dtype": _DTYPES, "attn_implementation": _ATTENTION,
          "_attn_implementation": _ATTENTION, "_attn_implementation_internal": _ATTENTION}  # fmt: skip
# (transformers looks a dtype name up on torch, and an attention name that is a hub repo downloads kernels)

# generation_config.json: transformers 5 defaults every field to None, so the types are listed here
_GEN_POSITIVE = frozenset({
    "max_length", "max_new_tokens", "num_beams", "num_return_sequences", "num_beam_groups", "max_cache_len",
    "prefill_chunk_size", "num_assistant_tokens", "prompt_lookup_num_tokens", "max_matching_ngram_size",
    "assistant_lookbehind", "target_lookbehind", "max_initial_timestamp_index",
})  # fmt: skip
_GEN_COUNTS = frozenset({"min_length", "min_new_tokens", "top_k", "no_repeat_ngram_size",
                         "encoder_no_repeat_ngram_size", "assistant_early_exit"})  # fmt: skip
_GEN_NUMBERS = frozenset({
    "temperature", "top_p", "min_p", "top_h", "typical_p", "epsilon_cutoff", "eta_cutoff", "repetition_penalty",
    "encoder_repetition_penalty", "length_penalty", "guidance_scale", "max_time", "diversity_penalty",
    "penalty_alpha", "assistant_confidence_threshold", "assistant_ensemble_weight",
})  # fmt: skip
_GEN_BOOLS = frozenset({
    "do_sample", "use_cache", "renormalize_logits", "remove_invalid_values", "output_attentions",
    "output_hidden_states", "output_scores", "output_logits", "return_dict_in_generate", "is_assistant",
    "low_memory", "disable_compile", "token_healing", "use_mtp", "_from_model_config", "is_multilingual",
    "return_timestamps",
})  # fmt: skip
_GEN_ID_LISTS = frozenset({"suppress_tokens", "begin_suppress_tokens"})
_GEN_ID_TABLES = frozenset({"bad_words_ids", "force_words_ids", "forced_decoder_ids", "alignment_heads"})
_GEN_ID_MAPS = frozenset({"lang_to_id", "task_to_id"})


def read_json(data: bytes, what: str) -> dict:
    value = parse_json(data, what, max_items=_ITEMS, max_depth=_DEPTH, max_string=_STRING)
    if not isinstance(value, dict):
        raise FileFormatError(f"{what} holds a JSON {type(value).__name__}, not an object.")
    return value


def model_config(data: bytes, what: str):
    """The transformers config of ``config.json`` (its bytes), built from the checked fields."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING, CONFIG_MAPPING_NAMES

    values = read_json(data, what)
    model_type = values.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING_NAMES:
        shown = repr(model_type)[:80]
        raise FileFormatError(
            f"{what}: model_type {shown} is not one transformers defines; mixprec.hf.load reads configs of "
            "transformers' own model types (no remote code)."
        )
    config_class = CONFIG_MAPPING[model_type]
    try:
        defaults = config_class().to_dict()  # the class's own defaults: nothing from the file
    except Exception:  # noqa: BLE001 - a composite config without defaults: the explicit checks only
        defaults = {}
    _check_fields(values, defaults, what, 0)
    return _built(lambda: config_class.from_dict(values), what)


def generation_config(data: bytes, what: str):
    """The ``GenerationConfig`` of ``generation_config.json`` (its bytes), built from the checked fields."""
    from transformers import GenerationConfig

    values = read_json(data, what)
    for key, value in values.items():
        if key in _REFUSED:
            _bad(what, key, value, "a field mixprec.hf.load does not read (it builds objects)")
        ok = _scalar(value)  # a field this list does not know: a plain value, kept as an attribute
        if key in _GEN_POSITIVE:
            ok = value is None or _integer(value, 1)
        elif key in _GEN_COUNTS:
            ok = value is None or _integer(value, 0)
        elif key in _GEN_NUMBERS:
            ok = value is None or _number(value)
        elif key in _GEN_BOOLS:
            ok = value is None or isinstance(value, bool)
        elif key == "early_stopping":
            ok = value is None or isinstance(value, bool) or value == "never"
        elif key.endswith("_token_id"):
            ok = _token_ids(value)
        elif key in _GEN_ID_LISTS:
            ok = value is None or _ids(value)
        elif key in _GEN_ID_TABLES:
            ok = value is None or isinstance(value, list) and all(_ids(row) for row in value)
        elif key in _GEN_ID_MAPS:
            ok = value is None or isinstance(value, dict) and all(_integer(v, 0) for v in value.values())
        elif key == "stop_strings":
            ok = value is None or isinstance(value, str) or isinstance(value, list) and all(
                isinstance(v, str) for v in value)  # fmt: skip
        if not ok:
            _bad(what, key, value, "not a value of its type")
    return _built(lambda: GenerationConfig.from_dict(values), what)


def _check_fields(values: dict, defaults: dict, what: str, depth: int) -> None:
    for key, value in values.items():
        if key in _REFUSED:
            _bad(what, key, value, "a field mixprec.hf.load does not read (remote code, or objects it builds)")
        if key in _SIZES:
            ok = value is None or _integer(value, 1)
        elif key in _NAMED:
            ok = value is None or isinstance(value, str) and value in _NAMED[key]
        elif key.endswith("_token_id"):
            ok = _token_ids(value)
        elif key in defaults and defaults[key] is not None:
            ok = _same_kind(value, defaults[key])
            if ok and isinstance(value, dict) and isinstance(defaults[key], dict) and depth < 3:
                _check_fields(value, defaults[key], f"{what}: {key}", depth + 1)  # a sub-config (text_config)
        else:
            ok = True  # a field the class does not default: kept as data (bounded by read_json)
        if not ok:
            _bad(what, key, value, "not a value of its type")


def _same_kind(value, default) -> bool:
    if value is None:
        return True
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, (int, float)):
        return _number(value) and (isinstance(value, int) or isinstance(default, float))
    return isinstance(value, type(default)) or (isinstance(default, (list, tuple)) and isinstance(value, list))


def _built(build, what: str):
    try:
        return build()
    except Exception as e:  # transformers' and huggingface_hub's own validation: a value our checks let through
        raise FileFormatError(f"{what}: transformers refuses it ({type(e).__name__}: {_cut(str(e))}).") from e


def _bad(what: str, key: str, value, why: str):
    raise FileFormatError(f"{what}: field {_cut(repr(key))} holds {_cut(repr(value))}, {why}.")


def _cut(text: str, most: int = 80) -> str:
    return text if len(text) <= most else text[:most] + "..."


def _integer(value, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and least <= value < _ID_LIMIT


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _ids(value) -> bool:
    return isinstance(value, list) and all(_integer(v, 0) for v in value)


def _token_ids(value) -> bool:
    return value is None or _integer(value, 0) or _ids(value)


def _scalar(value) -> bool:
    return value is None or isinstance(value, (bool, int, float, str)) or isinstance(value, list) and all(
        v is None or isinstance(v, (bool, int, float, str)) for v in value)  # fmt: skip
