"""Plug-in discovery shared by the connector registries (KV and EC).

A contract package holds one module per connector; each module that defines
``CONNECTOR`` (an instance of the package's contract class) is registered under that
contract's ``name``. Adding a connector is one new module; no table changes.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable
from typing import TypeVar

T = TypeVar("T")


def discover_contracts(package: str, path: Iterable[str], kind: type[T]) -> dict[str, T]:
    """``name -> CONNECTOR`` for every module of ``package`` (its ``__path__`` is
    ``path``) whose ``CONNECTOR`` is a ``kind``; modules named ``base`` or starting with
    ``_`` are skipped. Sorted by module name, so the result is deterministic. Raises
    whatever importing a module raises (a broken contract module is a bug)."""
    out: dict[str, T] = {}
    for mod in sorted(pkgutil.iter_modules(path), key=lambda m: m.name):
        if mod.name.startswith("_") or mod.name == "base":
            continue
        c = getattr(importlib.import_module(f"{package}.{mod.name}"), "CONNECTOR", None)
        if isinstance(c, kind):
            out[c.name] = c  # type: ignore[attr-defined]
    return out
