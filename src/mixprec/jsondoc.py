"""The versioned JSON documents mixprec writes (plans, reports, debug reports, search results).

Each is an object with a ``format`` name and a ``version``; reading checks both once, here, so
every document type rejects foreign or newer JSON with the same clear ConfigError.
"""

from __future__ import annotations

import json
import math

from .errors import ConfigError


def load(text: str, *, fmt: str, version: int | tuple[int, ...], what: str, hint: str = "") -> dict:
    """The document's object, or ConfigError when ``text`` is not JSON, not a ``fmt`` or another version."""
    try:
        data = json.loads(text)
    except (ValueError, TypeError) as e:  # ValueError: JSONDecodeError, and an integer of more than 4300 digits
        raise ConfigError(f"the {what} is not valid JSON ({str(e)[:200]}){hint}.") from e
    except RecursionError:
        raise ConfigError(f"the {what} nests deeper than any {what} does{hint}.") from None
    return check(data, fmt=fmt, version=version, what=what)


def check(data, *, fmt: str, version: int | tuple[int, ...], what: str) -> dict:
    """``version``: the version this mixprec reads, or a tuple of the versions it reads."""
    if not isinstance(data, dict) or data.get("format") != fmt:
        raise ConfigError(f"this JSON is not a mixprec {what} (its 'format' is not '{fmt}').")
    versions = version if isinstance(version, tuple) else (version,)
    if data.get("version") not in versions:
        which = f"version {versions[0]}" if len(versions) == 1 else f"versions {', '.join(map(str, versions))}"
        raise ConfigError(
            f"{what} version {data.get('version')!r} is not supported by this mixprec (it reads {which})."
        )
    return data


def same(a, b) -> bool:
    """Equality of JSON-like values in which NaN equals NaN (a summary's error may be NaN)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b
