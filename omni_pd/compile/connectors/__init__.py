"""Registry of KV connector contracts.

Every module in this package that defines ``CONNECTOR`` (a
:class:`~omni_pd.compile.connectors.base.KVConnector`) is registered under its ``name``.
Adding a connector is one new module; nothing here changes.
"""

from __future__ import annotations

from functools import lru_cache

from omni_pd.compile.connectors.base import KVConnector
from omni_pd.compile.discovery import discover_contracts


@lru_cache(maxsize=1)
def registry() -> dict[str, KVConnector]:
    """Connector name -> contract, discovered from this package's modules."""
    return discover_contracts(__name__, __path__, KVConnector)


def get(name: str) -> KVConnector | None:
    """The contract for ``name`` (case-insensitive match as a fallback), or None."""
    reg = registry()
    if name in reg:
        return reg[name]
    low = {k.lower(): v for k, v in reg.items()}
    return low.get(name.lower())


def canonical(typed: str) -> str | None:
    """The registered name a user typed (an option, a router flag): exact, case-insensitive,
    with or without the ``Connector`` suffix, surrounding blanks ignored (``nixl``,
    ``Mooncake``, ``mooncakeconnectorv1``); None when no connector module has it. Deploy
    files are not normalised: vLLM matches ``kv_connector`` exactly."""
    want = typed.strip().lower()
    if not want:
        return None
    for name in registry():
        if want in (name.lower(), name.lower().removesuffix("connector")):
            return name
    return None


def names() -> list[str]:
    return sorted(registry())
