"""Users' calibration batches (a collator's dicts with labels) as calls of the programs compile_for_generation makes."""

import pytest
import torch

import mixprec

transformers = pytest.importorskip("transformers")

import mixprec.hf  # noqa: E402  (needs transformers)
from mixprec.hf.calibration import StaticCacheBatches, decoder_tokens, fit_rows  # noqa: E402

from .tiny import bart  # noqa: E402


def seq2seq_batches():
    """Two collated batches of 3 and 2 rows: padded sources, labels padded with -100 (DataCollatorForSeq2Seq)."""
    generator = torch.Generator().manual_seed(3)
    batches = []
    for rows, source, target in ((3, 6, 5), (2, 9, 4)):
        ids = torch.randint(3, 64, (rows, source), generator=generator)
        mask = torch.ones_like(ids)
        mask[0, -2:] = 0
        labels = torch.randint(3, 64, (rows, target), generator=generator)
        labels[1, -2:] = -100
        batches.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return batches


def test_labels_become_decoder_inputs_behind_the_start_token():
    model = bart()
    labels = torch.tensor([[5, 6, 7], [8, -100, -100]])
    tokens, lengths = decoder_tokens({"labels": labels}, model, 2, torch.device("cpu"))
    start, pad = model.config.decoder_start_token_id, model.config.pad_token_id
    assert tokens.tolist() == [[start, 5, 6], [start, 8, pad]] and lengths.tolist() == [3, 1]
    tokens, lengths = decoder_tokens({"input_ids": labels}, model, 2, torch.device("cpu"))
    assert tokens.tolist() == [[start], [start]] and lengths is None


def test_rows_fit_the_number_of_sequences_a_static_cache_holds():
    call = {"decoder_input_ids": torch.arange(6).view(2, 3), "h": torch.zeros(2, 5)}
    single = list(fit_rows(call, 1, torch.tensor([3, 1]), "batch 0"))
    assert [c["decoder_input_ids"].tolist() for c in single] == [[[0, 1, 2]], [[3]]]  # each row without its padding
    (beams,) = fit_rows(call, 4, None, "batch 0")
    assert beams["decoder_input_ids"].shape == (4, 3)
    assert torch.equal(beams["decoder_input_ids"][1], call["decoder_input_ids"][0])
    with pytest.raises(mixprec.CalibrationError, match="batch 0 has 2 rows.*holds 3 sequences"):
        list(fit_rows(call, 3, None, "batch 0"))


def test_a_causal_static_cache_prefills_each_prompt_without_its_padding():
    ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    calls = list(StaticCacheBatches([{"input_ids": ids, "attention_mask": mask}], 1))
    assert [c["input_ids"].tolist() for c in calls] == [[[5, 6]], [[7, 8, 9, 10]]]
    assert calls[0]["cache_position"].tolist() == [0, 1]


def test_a_seq2seq_model_calibrates_both_programs_on_collated_batches():
    model = bart()
    batches = seq2seq_batches()
    lm = mixprec.hf.compile_for_generation(model, batches[0]["input_ids"][:1], static_cache=True, max_cache_len=16,
                                           enable_autocast=True, autocast_calibration_dataloader=batches)
    assert lm.encoder_program.report.summary["calibration_batches"] == 2  # the batches as they are
    assert lm.decoder_program.report.summary["calibration_batches"] == 5  # one prefill per row: the cache holds one
    assert lm.decoder_program.report.summary["layers_by_precision"].get("bfloat16", 0) > 0
    with torch.no_grad():
        tokens = lm.generate(input_ids=batches[1]["input_ids"][:1], max_new_tokens=4)
    assert tokens.shape[0] == 1 and tokens.shape[1] > 1
