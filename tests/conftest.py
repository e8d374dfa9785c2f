"""Test-wide set-up: the verifier runs after every rewrite pass (with a fake-tensor re-run), no cost cache is read or
written, every test starts from the same random state, autocast's speed check answers "2x faster", and `exports`
counts the captures a test makes."""

import os

os.environ.setdefault("MIXPREC_VERIFY_EACH", "1")
# the cost cache (measure/cost_file.py) is never the user's file in tests: off, here and in subprocesses (the CLI);
# the cache's own tests name files under tmp_path
os.environ["MIXPREC_COST_CACHE"] = "off"

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True, scope="session")
def _low_type_measured_faster():
    """The tests written before autocast's speed check (issue 34, ``mixprec.weak_typing.speed``) test rules and numerics
    with enable_autocast=True and expect bf16 layers; what they test must not depend on how fast this CPU runs
    bf16 (slower than fp32 on avx512_bf16 CPUs without AMX for some shapes, emulated on AVX2-only CPUs). So the
    check's measurer answers "the low type is 2x faster" for every layer here, which keeps today's plans. The
    check's own tests (tests/plan/test_speed.py) inject the measurements they need, and one runs the real one.
    Subprocesses (the CLI, the fuzzer) measure for real: they pass autocast_require_speedup=False where they
    expect low-precision layers."""
    from helpers import FixedSpeed

    from mixprec.weak_typing import speed

    with pytest.MonkeyPatch.context() as patch:  # session-wide: module-scoped fixtures compile before tests
        patch.setattr(speed, "MEASURER", FixedSpeed(2.0))
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
