"""Registry of encoder-cache (EC) connector contracts (encoder disaggregation).

A sibling of :mod:`omni_pd.compile.connectors` (the KV connectors), not a member: an EC
connector answers a different question (``ec_transfer_config`` for an encoder producer and
the stage that runs prefill, not ``kv_transfer_config`` for a prefill/decode pair), is
registered in vLLM under a different factory (``vllm/distributed/ec_transfer/ec_connector/
factory.py``), and must never be found by a KV lookup (``--connector ECExampleConnector``
is not a KV connector). Same shape: every module here that defines ``CONNECTOR`` (an
:class:`~omni_pd.compile.ec_connectors.base.ECConnector`) is registered under its ``name``;
adding one is one new module. Facts per vLLM release stay in
``presets/targets/ec_connectors.yaml`` (also read by validate's OPD614/OPD615).
"""

from __future__ import annotations

from functools import lru_cache

from omni_pd.compile.ec_connectors.base import ECConnector
from omni_pd.compile.discovery import discover_contracts


@lru_cache(maxsize=1)
def registry() -> dict[str, ECConnector]:
    """EC connector name -> contract, discovered from this package's modules."""
    return discover_contracts(__name__, __path__, ECConnector)


def get(name: str) -> ECConnector | None:
    """The contract for ``name`` (exact, then case-insensitive), or None."""
    reg = registry()
    if name in reg:
        return reg[name]
    return {k.lower(): v for k, v in reg.items()}.get(name.lower())


def names() -> list[str]:
    return sorted(registry())
