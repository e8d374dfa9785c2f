"""Test-wide set-up: the verifier runs after every rewrite pass (with a fake-tensor re-run), every test
starts from the same random state, and `exports` counts the captures a test makes."""

import os

os.environ.setdefault("MIXPREC_VERIFY_EACH", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture
def exports(monkeypatch):
    """How many times torch.export ran (every capture goes through ir/export.py's export)."""
    import mixprec.ir.export as capture_module

    calls = []
    real = capture_module.export

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(capture_module, "export", counting)
    return calls
