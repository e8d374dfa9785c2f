"""The backend registry: name -> factory(exported_program, options) -> callable program.

Kept apart from the package's ``__init__`` (which imports the backends so they register) so that a
backend module never imports the package that imports it.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import ConfigError

_REGISTRY: dict[str, Callable] = {}


def register_backend(name: str):
    def decorate(factory: Callable) -> Callable:
        _REGISTRY[name] = factory
        return factory

    return decorate


def known_backends() -> frozenset[str]:
    return frozenset(_REGISTRY)


def get_backend(name: str) -> Callable:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(f"backend={name!r} is not known; the backends are: {', '.join(sorted(_REGISTRY))}.") from None
