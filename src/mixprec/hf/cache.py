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
"""

from __future__ import annotations

import itertools

import torch
from transformers.cache_utils import DynamicCache

from ..errors import InputMismatchError
from ..ir.written_state import written_tensors

# backends whose runner reads the ExportedProgram's own written tensors (so an in-place reorder reaches it)
_SHARED_STATE_BACKENDS = frozenset({"eager", "inductor"})


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

    def cache_step(self, past_key_values, ids: torch.Tensor, what: str = "sequence"):
        """(the ProgramCache or None, the positions ``ids`` fill in the program's cache): an InputMismatchError
        when the program's cache does not hold that many sequences or positions."""
        cache = past_key_values if isinstance(past_key_values, ProgramCache) else None
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

    def generate(self, *args, **kwargs):
        """transformers' ``generate()`` (same arguments); a static-cache program brings its own cache."""
        if self.static_cache and kwargs.get("past_key_values") is None:
            kwargs["past_key_values"] = ProgramCache(self.cached_program(), self._sequences)
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
