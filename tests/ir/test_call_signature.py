"""CallSignature: a call as the user writes it, mapped onto the call the program was captured with.

Each arranged call is run through torch.export's own module (which rejects any other spelling of the
captured call) and compared with the eager model called the user's way.
"""

import inspect
import types

import pytest
import torch
from torch import nn

from mixprec.errors import CalibrationError, ConfigError, InputMismatchError, UnexpectedKeywordError
from mixprec.ir.call_signature import CallSignature, arrange_or_pass, capture_keywords, flat_user_inputs
from mixprec.ir.export import capture


class Masked(nn.Module):
    """forward(x, mask=None, scale=1.0): a positional input, an optional tensor, a Python default."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, mask=None, scale=1.0):
        y = self.lin(x) * scale
        if mask is not None:
            y = y + mask
        return y


class KeywordOnly(nn.Module):
    def forward(self, x, *, bias, gain):
        return x * gain + bias


class Extra(nn.Module):
    def forward(self, x, **extra):
        return x + extra["a"] * extra["b"]


class Collated(nn.Module):
    """forward(input_ids, attention_mask=None, **kwargs): the shape of a transformers model's forward."""

    def forward(self, input_ids, attention_mask=None, **kwargs):
        y = input_ids * 2.0
        return y if attention_mask is None else y * attention_mask


class Batch(nn.Module):
    """One nested input (an HF-collator-like dict holding a list)."""

    def forward(self, batch):
        return batch["ids"] * 2 + batch["pair"][0] - batch["pair"][1]


class Varargs(nn.Module):
    def forward(self, *xs):
        return xs[0] - xs[1]


def _xy():
    return torch.randn(2, 4), torch.randn(2, 4)


def _masked_program(keyword_mask=True):
    model = Masked().eval()
    x, mask = _xy()
    if keyword_mask:
        ep = capture(model, (x,), kwargs={"mask": mask})
    else:
        ep = capture(model, (x, mask))
    return model, ep, x, mask


def _run(ep, args, kwargs):
    with torch.no_grad():
        return ep.module()(*args, **kwargs)


def _eager(model, *args, **kwargs):
    with torch.no_grad():
        return model(*args, **kwargs)


# ---- what CallSignature.of reads from the program -----------------------------------------------------


def test_of_reads_positional_and_keyword_names_in_capture_order():
    model, ep, _, _ = _masked_program(keyword_mask=True)
    sig = CallSignature.of(ep, model)
    assert sig.positional == ("x",)
    assert sig.keywords == ("mask",)
    assert sig.parameter_names() == ("x", "mask")
    assert sig.forward == inspect.signature(model.forward)
    loaded = CallSignature.of(ep)  # a program loaded from a file: no model, no forward
    assert (loaded.positional, loaded.keywords, loaded.forward) == (("x",), ("mask",), None)


def test_of_names_keyword_only_var_keyword_and_var_positional_arguments():
    x, y = _xy()
    sig = CallSignature.of(capture(KeywordOnly(), (x,), kwargs={"gain": y, "bias": x}), KeywordOnly())
    assert (sig.positional, sig.keywords) == (("x",), ("gain", "bias"))
    sig = CallSignature.of(capture(Extra(), (x,), kwargs={"b": y, "a": x}), Extra())
    assert (sig.positional, set(sig.keywords)) == (("x",), {"a", "b"})
    sig = CallSignature.of(capture(Varargs(), (x, y)), Varargs())
    assert len(sig.positional) == 2 and sig.keywords == ()


def test_of_is_none_when_torch_recorded_no_call():
    assert CallSignature.of(types.SimpleNamespace(module_call_graph=[])) is None


# ---- arrange: calls the captured program accepts ----------------------------------------------------


def test_a_call_as_captured_is_returned_as_it_is():
    x, y = _xy()
    sig = CallSignature(("x", "y"), ())
    args, kwargs = sig.arrange([x, y], {})
    assert isinstance(args, tuple) and args[0] is x and args[1] is y and kwargs == {}


def test_all_keyword_call_is_arranged_into_the_captured_structure():
    """How transformers' generate() and HF collators call a model: every argument by keyword."""
    model, ep, x, mask = _masked_program(keyword_mask=False)
    sig = CallSignature.of(ep, model)
    args, kwargs = sig.arrange((), {"mask": mask, "x": x})
    assert args[0] is x and args[1] is mask and kwargs == {}
    torch.testing.assert_close(_run(ep, args, kwargs), _eager(model, x=x, mask=mask), rtol=0, atol=0)


def test_keywords_come_back_in_capture_order_and_positional_keywords_move_to_args():
    x, y = _xy()
    model = KeywordOnly()
    ep = capture(model, (x,), kwargs={"gain": y, "bias": x})
    sig = CallSignature.of(ep, model)
    args, kwargs = sig.arrange((), {"bias": x, "gain": y, "x": x})
    assert args == (x,) and list(kwargs) == ["gain", "bias"]
    torch.testing.assert_close(_run(ep, args, kwargs), _eager(model, x, bias=x, gain=y), rtol=0, atol=0)


def test_a_keyword_captured_argument_given_positionally_is_moved_to_kwargs():
    model, ep, x, mask = _masked_program(keyword_mask=True)
    sig = CallSignature.of(ep, model)
    args, kwargs = sig.arrange((x, mask), {})
    assert args == (x,) and set(kwargs) == {"mask"} and kwargs["mask"] is mask
    torch.testing.assert_close(_run(ep, args, kwargs), _eager(model, x, mask), rtol=0, atol=0)


def test_an_argument_given_with_its_default_value_is_dropped():
    model, ep, x, mask = _masked_program(keyword_mask=True)
    sig = CallSignature.of(ep, model)
    args, kwargs = sig.arrange((x,), {"mask": mask, "scale": 1.0})
    assert "scale" not in kwargs
    torch.testing.assert_close(_run(ep, args, kwargs), _eager(model, x, mask=mask, scale=1.0), rtol=0, atol=0)


@pytest.mark.parametrize("value", [2.0, 1])  # another value; the same number as another type (int, not float)
def test_an_argument_given_with_another_value_than_the_captured_default_is_refused(value):
    model, ep, x, mask = _masked_program(keyword_mask=True)
    sig = CallSignature.of(ep, model)
    with pytest.raises(InputMismatchError, match="gives argument 'scale', which the program was compiled without"):
        sig.arrange((x,), {"mask": mask, "scale": value})


def test_var_keyword_arguments_are_spread_into_the_captured_keywords():
    x, y = _xy()
    model = Extra()
    ep = capture(model, (x,), kwargs={"a": x, "b": y})
    sig = CallSignature.of(ep, model)
    args, kwargs = sig.arrange((), {"b": y, "x": x, "a": x})
    assert args == (x,) and list(kwargs) == list(sig.keywords)
    torch.testing.assert_close(_run(ep, args, kwargs), _eager(model, x, a=x, b=y), rtol=0, atol=0)


def test_a_nested_input_passes_through_as_one_argument():
    x, y = _xy()
    model = Batch()
    batch = {"ids": x, "pair": [y, x]}
    ep = capture(model, (batch,))
    sig = CallSignature.of(ep, model)
    args, kwargs = sig.arrange((), {"batch": batch})
    assert args == (batch,) and kwargs == {}
    torch.testing.assert_close(_run(ep, args, kwargs), _eager(model, batch), rtol=0, atol=0)


def test_var_positional_forward_binds_by_the_captured_names():
    x, y = _xy()
    model = Varargs()
    ep = capture(model, (x, y))
    sig = CallSignature.of(ep, model)
    args, kwargs = sig.arrange((x, y), {})
    torch.testing.assert_close(_run(ep, args, kwargs), x - y, rtol=0, atol=0)
    with pytest.raises(InputMismatchError, match="gives 3 positional argument"):
        sig.arrange((x, y, x), {})


def test_without_forward_keywords_are_bound_to_the_captured_names():
    _, ep, x, mask = _masked_program(keyword_mask=False)
    sig = CallSignature.of(ep)  # loaded from a file
    args, kwargs = sig.arrange((), {"mask": mask, "x": x})
    assert args[0] is x and args[1] is mask and kwargs == {}


# ---- arrange: calls it cannot take, with the caller's error type, naming the parameter -----------------


def test_a_misspelt_keyword_is_named_with_the_models_forward():
    model, ep, x, mask = _masked_program(keyword_mask=True)
    sig = CallSignature.of(ep, model)
    with pytest.raises(InputMismatchError, match=r"gives argument 'maks', which the model's forward\(x, mask=None"):
        sig.arrange((x,), {"maks": mask})


def test_a_misspelt_keyword_gets_a_did_you_mean_answer():
    model, ep, x, mask = _masked_program(keyword_mask=True)
    with pytest.raises(InputMismatchError, match=r"'maks', which the model's forward.* \(did you mean 'mask'\?\)"):
        CallSignature.of(ep, model).arrange((x,), {"maks": mask})
    with pytest.raises(InputMismatchError, match=r"'maks', which the program does not take \(did you mean 'mask'\?\)"):
        CallSignature.of(ep).arrange((x,), {"maks": mask})  # no forward: matched against the captured names


def test_a_misspelt_key_that_var_keyword_would_swallow_is_not_taken_as_an_argument():
    """A dict batch's misspelt key ('input_id') reaches ``**kwargs`` of a transformers-style forward: it is
    named as no parameter of forward, with the name meant, not as an argument the program was compiled without."""
    model = Collated().eval()
    ids = torch.randn(2, 4)
    sig = CallSignature.of(capture(model, (ids,)), model)
    with pytest.raises(
        CalibrationError,
        match=r"^calibration batch 0 gives argument 'input_id', which is not a parameter of the model's forward "
        r"\(did you mean 'input_ids'\?\); the program takes \(input_ids\)",
    ):
        sig.arrange((), {"input_id": ids}, error=CalibrationError, where="calibration batch 0")
    with pytest.raises(CalibrationError, match=r"'atention_mask', .*\(did you mean 'attention_mask'\?\)"):
        sig.arrange((), {"input_ids": ids, "atention_mask": ids}, error=CalibrationError, where="batch 1")
    # a real parameter the program was captured without keeps its own answer
    with pytest.raises(CalibrationError, match="'attention_mask', which the program was compiled without"):
        sig.arrange((), {"input_ids": ids, "attention_mask": ids}, error=CalibrationError, where="batch 2")


def test_a_missing_captured_argument_is_named():
    model, ep, x, _ = _masked_program(keyword_mask=True)
    sig = CallSignature.of(ep, model)
    with pytest.raises(InputMismatchError, match=r"does not give argument 'mask'.*takes \(x, mask=\)"):
        sig.arrange((x,), {})


def test_a_call_that_does_not_bind_to_forward_is_refused():
    model, ep, x, mask = _masked_program(keyword_mask=True)
    sig = CallSignature.of(ep, model)
    with pytest.raises(InputMismatchError, match="does not fit the model's forward"):
        sig.arrange((x, mask), {"x": x})


def test_without_forward_extra_twice_and_unknown_arguments_are_refused():
    _, ep, x, mask = _masked_program(keyword_mask=True)
    sig = CallSignature.of(ep)
    with pytest.raises(InputMismatchError, match=r"gives 2 positional argument\(s\); the program takes 1 \(x\)"):
        sig.arrange((x, mask), {})
    with pytest.raises(InputMismatchError, match="gives argument 'x' twice"):
        sig.arrange((x,), {"x": x, "mask": mask})
    with pytest.raises(InputMismatchError, match="gives argument 'scale', which the program does not take"):
        sig.arrange((x,), {"mask": mask, "scale": 1.0})  # no forward: a default cannot be recognised


def test_the_caller_chooses_the_error_type_and_names_the_call():
    model, ep, x, _ = _masked_program(keyword_mask=True)
    sig = CallSignature.of(ep, model)
    with pytest.raises(CalibrationError, match="^calibration batch 3 does not give argument 'mask'"):
        sig.arrange((x,), {}, error=CalibrationError, where="calibration batch 3")


def test_arrange_never_changes_the_callers_kwargs():
    model, ep, x, mask = _masked_program(keyword_mask=False)
    sig = CallSignature.of(ep, model)
    given = {"mask": mask, "x": x, "scale": 1.0}
    sig.arrange((), given)
    assert list(given) == ["mask", "x", "scale"]


def test_arrange_or_pass_without_a_signature_passes_the_call_on():
    x, y = _xy()
    given = {"y": y}
    args, kwargs = arrange_or_pass(None, [x], given)
    assert args == (x,) and kwargs == {"y": y} and kwargs is not given
    model, ep, _, mask = _masked_program(keyword_mask=True)
    args, kwargs = arrange_or_pass(CallSignature.of(ep, model), (), {"mask": mask, "x": x})
    assert args == (x,) and kwargs == {"mask": mask}


# ---- a keyword the program does not take: refused as a ConfigError, never dropped (issue 42) ----------------


@pytest.mark.parametrize("with_forward", [True, False], ids=["compiled", "loaded"])
def test_a_keyword_the_program_does_not_take_is_a_config_error_at_call_time(with_forward):
    model, ep, x, mask = _masked_program(keyword_mask=True)
    sig = CallSignature.of(ep, model if with_forward else None)
    for extra in ({"cache": object()}, {"scale": 2.0}, {"maks": mask}):
        with pytest.raises(UnexpectedKeywordError, match=f"gives argument '{next(iter(extra))}'") as info:
            sig.arrange((x,), {"mask": mask, **extra})
        assert isinstance(info.value, ConfigError) and isinstance(info.value, InputMismatchError)
    with pytest.raises(CalibrationError) as info:  # calibration batches keep the error their caller asks for
        sig.arrange((x,), {"mask": mask, "cache": object()}, error=CalibrationError, where="calibration batch 0")
    assert not isinstance(info.value, ConfigError)


@pytest.mark.parametrize("keyword_mask", [True, False], ids=["mask-by-keyword", "mask-positional"])
def test_every_spelling_of_the_captured_call_arranges_to_the_captured_structure(keyword_mask):
    """The quick paths (called as captured, everything by name) give what binding to forward gives."""
    model, ep, x, mask = _masked_program(keyword_mask=keyword_mask)
    expected = ((x,), {"mask": mask}) if keyword_mask else ((x, mask), {})
    for sig in (CallSignature.of(ep, model), CallSignature.of(ep)):
        spellings = [((x,), {"mask": mask}), ((), {"mask": mask, "x": x}), ((), {"x": x, "mask": mask})]
        if sig.forward is not None or not keyword_mask:  # without forward, a keyword capture takes mask by name only
            spellings.append(((x, mask), {}))
        for args, kwargs in spellings:
            got = sig.arrange(args, kwargs)
            assert got[0] == expected[0] and list(got[1]) == list(expected[1]), (args, kwargs)
        torch.testing.assert_close(_run(ep, *sig.arrange((), {"mask": mask, "x": x})), _eager(model, x, mask))


def test_flat_user_inputs_follow_the_captured_keyword_order():
    x, y = _xy()
    model = KeywordOnly()
    ep = capture(model, (x,), kwargs={"gain": y, "bias": x})
    assert capture_keywords(ep) == ("gain", "bias")
    bias = x * 2
    leaves = flat_user_inputs(ep, (x,), {"bias": bias, "gain": y})
    assert len(leaves) == 3 and leaves[0] is x and leaves[1] is y and leaves[2] is bias
