"""Calibration batches, as users have them, turned into calls of the programs ``compile_for_generation`` compiles.

A user's loader yields what a collator makes for the *model*: ``input_ids``/``attention_mask``
(``input_features`` for Whisper) and, for an encoder-decoder model, ``labels`` or ``decoder_input_ids``.
Each program takes something else:

* a static-cache causal LM: ``(input_ids, cache_position)`` for a fixed number of sequences — every
  prompt is prefilled from position 0 (:class:`StaticCacheBatches`);
* an encoder program: the encoder's inputs of the batch, other keys dropped (:class:`EncoderBatches`);
* a decoder program: the target tokens (``decoder_input_ids``, else ``labels`` shifted right behind the
  decoder start token as the models do for training, else the start token alone) with the encoder side's
  fp32 outputs for the batch, computed by the eager encoder module (:class:`DecoderBatches`).

A static-cache program holds a fixed number of sequences: a batch of that size is used as it is; for a cache
of one sequence (the usual ``generate()`` case) every row of a batch is its own call, without its padding;
a batch whose rows divide the number is repeated per beam; any other size is a ``CalibrationError``.
"""

from __future__ import annotations

import torch

from ..calibrate.batches import as_call
from ..errors import CalibrationError
from .parts import start_token

_PAD_LABEL = -100  # transformers' ignore index in labels


def fit_rows(call: dict, sequences: int, lengths, where: str):
    """``call`` (tensors with the batch first) as calls of ``sequences`` rows (module docstring). ``lengths``: each
    row's own length along dimension 1 of ``call["input_ids"]``/``call["decoder_input_ids"]`` (None: the whole row)."""
    rows = next(iter(call.values())).shape[0]
    key = "decoder_input_ids" if "decoder_input_ids" in call else "input_ids"
    if sequences == 1:
        for row in range(rows):
            one = {k: v[row:row + 1] for k, v in call.items()}
            if lengths is not None:
                one[key] = one[key][:, : max(1, int(lengths[row]))]
            yield one
    elif sequences % rows == 0:
        yield {k: v.repeat_interleave(sequences // rows, dim=0) for k, v in call.items()}
    else:
        raise CalibrationError(
            f"{where} has {rows} rows and the static-cache program holds {sequences} sequences; give batches of "
            f"{sequences} rows (or a divisor of it), or compile for one sequence."
        )


def with_positions(call: dict, key: str) -> dict:
    """A prefill from position 0: ``cache_position`` for the tokens under ``key``."""
    return {**call, "cache_position": torch.arange(call[key].shape[1], device=call[key].device)}


class StaticCacheBatches:
    """A static-cache causal LM's calibration calls: ``{"input_ids", "cache_position"}`` (module docstring)."""

    def __init__(self, loader, sequences: int):
        self.loader = loader
        self.sequences = sequences

    def __iter__(self):
        for index, batch in enumerate(self.loader):
            where = f"calibration batch {index}"
            args, kwargs = as_call(batch, where, error=CalibrationError)
            ids = kwargs["input_ids"] if kwargs else args[0]
            mask = kwargs.get("attention_mask") if kwargs else (args[1] if len(args) > 1 else None)
            if self.sequences == 1:  # each row its own prompt, without its padding (left or right)
                for row in range(ids.shape[0]):
                    tokens = ids[row] if mask is None else ids[row][mask[row].bool()]
                    yield with_positions({"input_ids": tokens.unsqueeze(0)}, "input_ids")
                continue
            for call in fit_rows({"input_ids": ids}, self.sequences, None, where):
                yield with_positions(call, "input_ids")


def encoder_inputs(batch, where: str, speech: bool) -> dict:
    """The encoder's inputs in one batch (a dict from a collator, or a tuple of the encoder's positional inputs)."""
    args, kwargs = as_call(batch, where, error=CalibrationError)
    names = ("input_features",) if speech else ("input_ids", "attention_mask")
    found = dict(zip(names, args)) if args else {k: kwargs[k] for k in names if kwargs.get(k) is not None}
    if names[0] not in found:
        raise CalibrationError(f"{where} has no {names[0]}: the encoder program takes {' and '.join(names)}.")
    if not speech and "attention_mask" not in found:
        found["attention_mask"] = torch.ones_like(found["input_ids"])
    return found


class EncoderBatches:
    """An encoder program's calibration calls (module docstring)."""

    def __init__(self, loader, speech: bool):
        self.loader = loader
        self.speech = speech

    def __iter__(self):
        for index, batch in enumerate(self.loader):
            yield encoder_inputs(batch, f"calibration batch {index}", self.speech)


def decoder_tokens(batch, model, rows: int, device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The target tokens of a batch and each row's length (module docstring)."""
    kwargs = batch if isinstance(batch, dict) else {}
    if kwargs.get("decoder_input_ids") is not None:
        ids = kwargs["decoder_input_ids"]
        mask = kwargs.get("decoder_attention_mask")
        return ids.to(device), (mask.sum(dim=1) if mask is not None else None)
    first = torch.full((rows, 1), start_token(model), dtype=torch.long, device=device)
    labels = kwargs.get("labels")
    if labels is None or labels.dim() != 2:
        return first, None
    labels = labels.to(device)
    pad = int(model.config.pad_token_id if model.config.pad_token_id is not None else 0)
    shifted = torch.cat([first, labels[:, :-1]], dim=1)
    shifted = shifted.masked_fill(shifted == _PAD_LABEL, pad)
    return shifted, (labels != _PAD_LABEL).sum(dim=1)


class DecoderBatches:
    """A decoder program's calibration calls: the target tokens with the encoder side's fp32 outputs (module
    docstring). ``sequences``: the rows of a static-cache program, None for a program without a cache."""

    def __init__(self, loader, encoder: torch.nn.Module, model, sequences: int | None):
        self.loader = loader
        self.encoder = encoder
        self.model = model
        self.sequences = sequences

    def __iter__(self):
        for index, batch in enumerate(self.loader):
            where = f"calibration batch {index}"
            inputs = encoder_inputs(batch, where, self.encoder.speech)
            with torch.no_grad():
                states = self.encoder(**inputs)
            hidden = states["last_hidden_state"]
            tokens, lengths = decoder_tokens(batch, self.model, hidden.shape[0], hidden.device)
            call = {"decoder_input_ids": tokens, "encoder_hidden_states": hidden}
            if not self.encoder.speech:
                call["attention_mask"] = inputs["attention_mask"]
            if self.sequences is None:
                yield call
                continue
            call["cross_attention_keys"] = states["cross_attention_keys"]
            call["cross_attention_values"] = states["cross_attention_values"]
            for part in fit_rows(call, self.sequences, lengths, where):
                yield with_positions(part, "decoder_input_ids")
