"""The one Ray connection helper (mixprec/cluster.py), with a stand-in for ray: no cluster is started here."""

import sys

import pytest

from mixprec import cluster
from mixprec.errors import ConfigError


class FakeRay:
    def __init__(self, initialized=False, fails=None):
        self.initialized, self.fails, self.calls = initialized, fails, []

    def is_initialized(self):
        return self.initialized

    def init(self, **kwargs):
        self.calls.append(kwargs)
        if self.fails:
            raise self.fails
        self.initialized = True


def test_a_connected_process_keeps_its_cluster():
    ray = FakeRay(initialized=True)
    assert cluster.connect(ray, "local", what="x") is False and ray.calls == []


def test_local_starts_a_cluster_and_says_the_caller_shuts_it_down():
    ray = FakeRay()
    assert cluster.connect(ray, "local", what="x", num_cpus=2) is True
    assert ray.calls == [{"num_cpus": 2, "include_dashboard": False, "log_to_driver": False}]
    ray = FakeRay()
    assert cluster.connect(ray, "ray://10.0.0.1:10001", what="x") is True
    assert ray.calls == [{"address": "ray://10.0.0.1:10001", "log_to_driver": False}]


def test_a_cluster_that_cannot_be_joined_is_a_config_error_in_the_callers_words():
    ray = FakeRay(fails=ConnectionError("Could not find any running Ray instance\nmore"))
    with pytest.raises(ConfigError, match=r"^calibration could not connect to the Ray cluster at 'auto': "
                                          r"ConnectionError: Could not find any running Ray instance\. .*ray start"):
        cluster.connect(ray, "auto", what="calibration")


def test_missing_ray_names_the_extra_and_the_way_without(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ConfigError, match=r"^this runs on a Ray cluster, but Ray is not installed here\. Install it "
                                          r"with `pip install 'mixprec\[ray\]'`, or do without\.$"):
        cluster.import_ray("this", "do without")
