import pytest

from mixprec.backends import get_backend, known_backends, register_backend
from mixprec.errors import ConfigError


def test_eager_is_registered():
    assert "eager" in known_backends()


def test_unknown_backend_lists_the_known_ones():
    with pytest.raises(ConfigError, match="eager"):
        get_backend("tensorrt")


def test_registering_a_backend_makes_it_known():
    @register_backend("test-identity")
    def build(ep, options):
        return ep.module()

    try:
        assert get_backend("test-identity") is build
    finally:
        from mixprec.backends import registry

        registry._REGISTRY.pop("test-identity")
