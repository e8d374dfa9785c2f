"""Backend registry: a backend turns the rewritten ExportedProgram into something callable.

Backends register by name (``@register_backend("eager")``); ``mixprec.compile`` looks
them up by the ``backend=`` setting. An unknown name raises ConfigError listing the
known ones. A factory is called as ``factory(exported_program, options)`` with the stage's
``options.BackendOptions`` (or None: the defaults).
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


from . import eager, inductor, openvino  # noqa: E402,F401  (register themselves)
