"""Test-wide set-up: the verifier runs after every rewrite pass (with a fake-tensor re-run), and
every test starts from the same random state."""

import os

os.environ.setdefault("MIXPREC_VERIFY_EACH", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
