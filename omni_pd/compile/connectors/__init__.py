"""Registry of KV connector contracts.

Every module in this package that defines ``CONNECTOR`` (a
:class:`~omni_pd.compile.connectors.base.KVConnector`) is registered under its ``name``.
Adding a connector is one new module; nothing here changes.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

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


def contract_of(kv: dict[str, Any] | None, platform: str | None = None) -> KVConnector | None:
    """The contract of the connector a ``kv_transfer_config`` (or a MultiConnector child) loads
    on ``platform`` (None: cuda): the row its :func:`~omni_pd.compile.connectors.identity.identify`
    names, so ``kv_connector: MooncakeConnector`` with vllm-ascend's
    ``kv_connector_module_path`` gets vllm-ascend's pull connector's contract
    (``MooncakeConnectorV1``: ports from ``kv_port``), and a class only an out-of-tree module path
    names gets None (omni-pd knows nothing of its ports or protocol). vLLM's
    ``KVConnectorFactory.get_connector_class`` (kv_connector/factory.py) loads the module path's
    class when one is set. Pure; never raises."""
    from omni_pd.compile.connectors.identity import identify

    ident = identify(kv, platform)
    return get(ident.name) if ident is not None else None


def row_name(kv: dict[str, Any] | None, platform: str | None = None) -> str:
    """The registered name of the connector ``kv`` loads on ``platform`` (:func:`contract_of`'s
    row: ``MooncakeConnectorV1`` for vllm-ascend's ``MooncakeConnector`` module path), or
    ``kv_connector`` as written when no contract has it (an out-of-tree class, a typo); ``""``
    without a connector."""
    c = contract_of(kv, platform)
    if c is not None:
        return c.name
    name = (kv or {}).get("kv_connector") if isinstance(kv, dict) else None
    return name if isinstance(name, str) else ""


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
