"""The search's tests: what this CPU's speed would decide is fixed, so that they pass on every CPU kind.

* The frontier (``searching/frontier.py``) returns the fastest whole program measured within the budget, so which
  plan a search returns depends on how fast this CPU runs each type. The tests of the phases before it (sensitivity,
  budget, held-out data, types, Ray) assert the budget's plan; they get frontier timings in which the budget's plan
  is the fastest and all-fp32 the slowest (:func:`budget_plan_fastest`). The frontier's own tests
  (test_frontier.py) set the timings they need, and one times the programs for real (the ``real_timing`` fixture).
* A precision boundary's price (``latency.measure_boundaries``) is nothing here unless a test sets one, and the cost
  model keeps the prices the tests inject: it is not rescaled to the model's whole programs (``whole.model_prices``,
  whose own tests are in test_whole.py).
"""

import pytest

from mixprec.searching import frontier, latency, whole

REAL_TIMING = frontier.time_candidates
MODEL_PRICES = whole.model_prices


def budget_plan_fastest(programs, batch, race=True):
    """Seconds per call: the budget's plan ("searched", maybe also named as a trivial plan) 1, other searched plans 2,
    trivial plans 3, all-fp32 4."""
    def seconds(name: str) -> float:
        names = name.split(" = ")
        if "searched" in names:
            return 1.0
        if frontier.FP32 in names:
            return 4.0
        return 2.0 if names[0].startswith("searched") else 3.0

    return {name: seconds(name) for name in programs}


@pytest.fixture(autouse=True, scope="session")
def _frontier_and_boundaries_fixed():
    with pytest.MonkeyPatch.context() as patch:  # session-wide: module-scoped fixtures search before tests
        patch.setattr(frontier, "time_candidates", budget_plan_fastest)
        patch.setattr(latency, "measure_boundaries", lambda backend, dtypes, device: {d: 0.0 for d in dtypes})
        patch.setattr(whole, "model_prices", lambda built, groups, lows, costs, *args: costs)
        yield


@pytest.fixture
def real_timing():
    """The frontier's own timing (``frontier.time_candidates`` as the search runs it outside these tests)."""
    return REAL_TIMING


@pytest.fixture
def model_prices(monkeypatch):
    """The cost model rescaled to the model's whole programs, as outside these tests."""
    monkeypatch.setattr(whole, "model_prices", MODEL_PRICES)
