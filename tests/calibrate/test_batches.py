"""The one batch normaliser: a loader's item as a call of forward, with each boundary's error type."""

import pytest
import torch

from mixprec.calibrate.batches import Call, arrange, as_call, batch_list, fit
from mixprec.errors import CalibrationError, ConfigError

X, Y = torch.randn(2, 3), torch.randn(2, 3)


@pytest.mark.parametrize(
    "batch, expected",
    [
        (X, ((X,), {})),
        ((X, Y), ((X, Y), {})),
        ([X, Y], ((X, Y), {})),
        ({"x": X, "y": Y}, ((), {"x": X, "y": Y})),
        (Call((X,), {"y": Y}), ((X,), {"y": Y})),
    ],
    ids=["tensor", "tuple", "list", "dict", "call"],
)
def test_every_form_becomes_args_and_kwargs(batch, expected):
    args, kwargs = as_call(batch, "batch 0", error=CalibrationError)
    assert len(args) == len(expected[0]) and all(a is b for a, b in zip(args, expected[0]))
    assert kwargs.keys() == expected[1].keys() and all(kwargs[k] is v for k, v in expected[1].items())
    assert isinstance(args, tuple) and isinstance(kwargs, dict)


def test_what_the_user_passed_is_not_changed():
    batch = [X]
    mapping = {"x": X}
    args, _ = as_call(batch, "batch 0", error=CalibrationError)
    _, kwargs = as_call(mapping, "batch 0", error=CalibrationError)
    kwargs["y"] = Y
    assert batch == [X] and mapping == {"x": X}


def test_other_forms_raise_the_callers_error_naming_the_batch():
    with pytest.raises(CalibrationError, match="calibration batch 2 is a int; .*tuple or list.*a dict keyed by"):
        as_call(3, "calibration batch 2", error=CalibrationError)
    with pytest.raises(ConfigError, match="eval_dataloader batch 0 is a set; .*a dict keyed by forward's"):
        as_call({X}, "eval_dataloader batch 0", error=ConfigError)


def test_batch_list_reads_the_loader_once_into_calls():
    loader = iter([X, (X, Y), {"x": X}])  # a generator can be read only once
    calls = batch_list(loader, "eval_dataloader")
    assert [(len(c.args), list(c.kwargs)) for c in calls] == [(1, []), (2, []), (0, ["x"])]


@pytest.mark.parametrize(
    "loader, message",
    [
        (X, "eval_dataloader must be an iterable of batches.*got Tensor; wrap one batch"),
        ("abc", "got str"),
        (5, "got int"),
        ([], "yielded no batches"),
        ([(X,), "x"], "eval_dataloader batch 1 is a str"),
    ],
)
def test_batch_list_refuses_what_is_not_batches(loader, message):
    with pytest.raises(ConfigError, match=message):
        batch_list(loader, "eval_dataloader")


class _Collated(torch.nn.Module):
    """A transformers-style forward: optional named inputs and ``**kwargs``."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(16, 8)
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        return self.lin(self.emb(input_ids))


def test_a_misspelt_key_of_a_dict_batch_is_an_error_with_the_name_meant():
    """compile's calibration data: a dict batch's 'input_id' is not handed to ``**kwargs`` as an argument."""
    import mixprec

    ids = torch.randint(0, 16, (2, 5))
    with pytest.raises(CalibrationError, match=r"calibration batch 1 gives argument 'input_id', which is not a "
                       r"parameter of the model's forward \(did you mean 'input_ids'\?\)"):  # fmt: skip
        mixprec.compile(_Collated().eval(), (ids,), enable_autocast=True,
                        autocast_calibration_dataloader=[{"input_ids": ids}, {"input_id": ids}])  # fmt: skip


def _signature_and_inputs(model, *example):
    from mixprec.ir.captured import CapturedModel

    captured = CapturedModel(model.eval(), example)
    return captured.signature, captured.base.user_input_nodes()


def test_arrange_maps_a_dict_batch_onto_the_captured_call_and_fit_checks_it():
    ids = torch.randint(0, 16, (2, 5))
    signature, nodes = _signature_and_inputs(_Collated(), ids)
    call = arrange({"input_ids": torch.randint(0, 16, (3, 7))}, "eval_dataloader batch 2", signature)
    assert len(call.args) == 1 and call.kwargs == {} and call.args[0].shape == (3, 7)
    assert fit(call, nodes, "eval_dataloader batch 2", resizable=True) is None  # only sizes differ: a graph for them
    assert fit(Call((ids,)), nodes, "eval_dataloader batch 0") == [ids]
    with pytest.raises(CalibrationError, match=r"eval_dataloader batch 2, input 0 \('input_ids'\): shape \(3, 7\)"):
        fit(call, nodes, "eval_dataloader batch 2")  # not resizable: an ExportedProgram's fixed sizes
    with pytest.raises(CalibrationError, match="eval_dataloader batch 1, input 0 .*dtype torch.float32"):
        fit(Call((torch.randn(2, 5),)), nodes, "eval_dataloader batch 1")
    with pytest.raises(ConfigError, match=r"batch 4 gives argument 'input_id'.*did you mean 'input_ids'"):
        arrange({"input_id": ids}, "eval_dataloader batch 4", signature, error=ConfigError)
