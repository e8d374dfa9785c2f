"""Backend registry: a backend turns the rewritten ExportedProgram into something callable.

Backends register by name (``@register_backend("eager")``); ``mixprec.compile`` looks
them up by the ``backend=`` setting. An unknown name raises ConfigError listing the
known ones. A factory is called as ``factory(exported_program, options)`` with the stage's
``options.BackendOptions`` (or None: the defaults).
"""

from __future__ import annotations

from .registry import get_backend, known_backends, register_backend

__all__ = ["get_backend", "known_backends", "register_backend"]

from . import eager, inductor, openvino  # noqa: E402,F401  (register themselves)
