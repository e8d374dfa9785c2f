"""Each test here starts from a cost model that holds nothing (``mixprec.measure.costs``): the measurements a test
injects (fake timers, fixed speed-ups) must not answer for another test's layers of the same shapes."""

import pytest

from mixprec.measure import costs


@pytest.fixture(autouse=True)
def _fresh_cost_models(monkeypatch):
    monkeypatch.setattr(costs, "COSTS", costs.CostModels())
