"""What ``generate()`` sees as the KV cache of a static-cache program, which holds the keys and values itself.

transformers' ``generate()`` decides from ``past_key_values.get_seq_length()`` how many tokens a step
passes, and reorders the cache between beam-search steps with ``past_key_values.reorder_cache(beam_idx)``.
A static-cache program keeps its keys and values in tensors it writes (``ir/written_state.py``), so
:class:`ProgramCache` counts the positions filled and reorders those tensors in place: every written
tensor whose first dimension is the program's batch (the self-attention keys and values; the position
counters are scalars). A beam continues a sequence of the same prompt, so cross-attention keys and values,
which are the program's inputs and equal for every beam of a prompt, need no reordering.

Reordering needs the program's tensors in this process: the eager and inductor backends run the graph on
them; another backend (OpenVINO keeps its own copy) refuses beam search with a static cache.

The cache's keyword: transformers 5.24 renamed ``past_key_values`` to ``cache`` (``generate()`` passes
``cache=``; the old name still works with a FutureWarning). A program wrapper takes both names, whatever the
installed transformers passes, and mixprec's own calls use the name the callee takes (:func:`cache_keyword`).
A keyword a wrapper does not take is refused (:func:`refuse_keywords`), never dropped: a wrapper that ignored
``cache=`` restarted the cache every step and generated other tokens without a word.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
from types import MappingProxyType

import torch
from transformers import GenerationMixin
from transformers.cache_utils import DynamicCache

from ..errors import ConfigError, InputMismatchError, UnexpectedKeywordError
from ..ir.written_state import written_tensors

# backends whose runner reads the ExportedProgram's own written tensors (so an in-place reorder reaches it)
_SHARED_STATE_BACKENDS = frozenset({"eager", "inductor"})

# the KV cache's names: transformers >= 5.24's and the one before it
CACHE_NAMES = ("cache", "past_key_values")

# keywords a wrapper takes when they say "the default": what generate() passes that a program computes anyway
_DEFAULTS = MappingProxyType({"output_attentions": False, "output_hidden_states": False})


def cache_keyword(function) -> str:
    """The name under which ``function`` (a model's ``forward``, ``prepare_inputs_for_generation``) takes the KV
    cache: ``cache`` from transformers 5.24 on, ``past_key_values`` before (and for models that take neither)."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in parameters else "past_key_values"


@functools.cache
def generate_cache_keyword() -> str:
    """The name under which the installed transformers' ``generate()`` takes and passes on the KV cache."""
    return cache_keyword(GenerationMixin.prepare_inputs_for_generation)


def with_cache(output_class, cache, **fields):
    """``output_class(...)`` (``CausalLMOutputWithPast``, ``Seq2SeqLMOutput``) with ``cache`` under the field name the
    installed transformers has (``cache`` from 5.24 on, where the old name warns): generate() reads it there."""
    names = {f.name for f in dataclasses.fields(output_class)}
    return output_class(**fields, **{"cache" if "cache" in names else "past_key_values": cache})


def one_cache(cache, past_key_values):
    """The cache a wrapper's call gives under either name (None when neither); both, if not the same: refused."""
    if cache is not None and past_key_values is not None and cache is not past_key_values:
        raise ConfigError("the call gives two KV caches, cache= and past_key_values= (the name before transformers "
                          "5.24); pass one.")
    return cache if cache is not None else past_key_values


def refuse_keywords(kwargs: dict, what: str) -> None:
    """Refuse every keyword of ``kwargs`` (those a wrapper's forward does not name) that asks for something: a value
    other than None, or than the default for the few flags in ``_DEFAULTS``. ``what`` names the program."""
    for name, value in kwargs.items():
        if value is None or (name in _DEFAULTS and value is _DEFAULTS[name]):
            continue
        raise UnexpectedKeywordError(
            f"{what} does not take {name}={_short(value)}: a compiled program computes only the logits of the inputs "
            "it was compiled for (no attentions or hidden states of each layer, no inputs_embeds, labels or "
            f"position_ids); leave {name} out."
        )


def _short(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"<tensor {tuple(value.shape)}>"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class ProgramCache(DynamicCache):
    """The cache object ``generate()`` passes around for a static-cache program (module docstring)."""

    def __init__(self, program, batch_size: int):
        super().__init__()
        self.filled = 0
        self._program = program
        self._batch_size = batch_size
        self._state = None  # the tensors to reorder, found at the first reorder

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.filled

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        backend = self._program.settings.get("backend", "eager")
        if backend not in _SHARED_STATE_BACKENDS:
            raise InputMismatchError(
                f"beam search reorders the KV cache between steps, and a static-cache program on the {backend} "
                "backend keeps its cache where mixprec cannot reorder it; use backend='eager' or 'inductor', or "
                "compile_for_generation(static_cache=False)."
            )
        if self._state is None:
            self._state = batch_state(self._program, self._batch_size)
        with torch.no_grad():
            for tensor in self._state:
                tensor.copy_(tensor.index_select(0, beam_idx.to(tensor.device)))


def batch_state(program, batch_size: int) -> list[torch.Tensor]:
    """The tensors ``program`` writes that hold one row per sequence (its KV cache)."""
    return [t for t in written_tensors(program.exported_program) if t.dim() > 0 and t.shape[0] == batch_size]


class GeneratesWithProgramCache:
    """What a program wrapper adds to ``PreTrainedModel`` + ``GenerationMixin`` (listed before them): ``generate()``
    hands a static-cache program its own :class:`ProgramCache`; there is no embedding table to expose. The wrapper
    defines ``cached_program()``: the program that holds the KV cache (a causal LM's program, an encoder-decoder's
    decoder program)."""

    def cache_step(self, cache, ids: torch.Tensor, what: str = "sequence"):
        """(the ProgramCache or None, the positions ``ids`` fill in the program's cache): an InputMismatchError
        when the program's cache does not hold that many sequences or positions, or ``cache`` is not the program's."""
        if cache is not None and not isinstance(cache, ProgramCache):
            raise InputMismatchError(
                f"this static-cache program keeps its KV cache in its own tensors and was given a "
                f"{type(cache).__name__}, which it cannot read or fill; pass no cache (generate() makes the program's "
                "own), or compile_for_generation(static_cache=False)."
            )
        start = cache.filled if cache is not None else 0
        rows, length = ids.shape[0], ids.shape[1]
        if rows != self._sequences:
            raise InputMismatchError(
                f"this static-cache program holds a KV cache for {self._sequences} sequences (prompts x num_beams at "
                f"compile time) and is asked for {rows}; compile_for_generation with that many prompts and "
                "num_beams=..., or with static_cache=False."
            )
        if start + length > self._max_cache_len:
            raise InputMismatchError(
                f"the {what} reaches {start + length} positions and the program's KV cache holds "
                f"{self._max_cache_len}; compile with a larger max_cache_len or generate fewer tokens."
            )
        return cache, torch.arange(start, start + length, device=ids.device)

    @staticmethod
    def no_cache_step(cache):
        """The cache a call of a program without a KV cache returns: ``cache`` itself, left empty (every step reads
        the whole sequence); one that holds positions would make generate() pass only the new tokens: refused."""
        if cache is None:
            return None
        filled = cache.get_seq_length() if hasattr(cache, "get_seq_length") else None
        if filled != 0:
            held = f"holding {filled} positions" if filled is not None else "that is no transformers Cache"
            raise InputMismatchError(
                f"this program has no KV cache (every step reads the whole sequence) and was given a "
                f"{type(cache).__name__} {held}, with which generate() passes only the new tokens; pass no cache, "
                "or compile_for_generation(static_cache=True)."
            )
        return cache

    def generate(self, *args, **kwargs):
        """transformers' ``generate()`` (same arguments); a static-cache program brings its own cache, passed under
        the name the installed transformers takes."""
        if self.static_cache and all(kwargs.get(name) is None for name in CACHE_NAMES):
            for name in CACHE_NAMES:
                kwargs.pop(name, None)
            kwargs[generate_cache_keyword()] = ProgramCache(self.cached_program(), self._sequences)
        return super().generate(*args, **kwargs)

    @property
    def device(self) -> torch.device:
        """Where the program's tensors are; a program that holds none (OpenVINO keeps its own copy of the weights)
        takes and returns CPU tensors. (transformers' ``device`` is the first parameter's: a StopIteration here.)"""
        for tensor in itertools.chain(self.parameters(), self.buffers()):
            return tensor.device
        return torch.device("cpu")

    def get_input_embeddings(self):
        return None

    def can_generate(self) -> bool:  # noqa: D102
        return True
