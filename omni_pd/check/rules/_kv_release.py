"""Helpers shared by the rules of vLLM 0.34's KV-connector changes (OPD626-OPD629):
``presets/targets/kv_semantics.yaml`` and the sides of the PD pair, each with the connector
identity its ``kv_transfer_config`` loads (:mod:`omni_pd.compile.connectors.identity`)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from omni_pd.compile.connectors.identity import ConnectorIdentity, identify

if TYPE_CHECKING:
    from omni_pd.check.rules import Context
    from omni_pd.compile.topology import StageNode

EXTRA = "kv_connector_extra_config"


@lru_cache(maxsize=1)
def facts() -> dict[str, Any]:
    """The parsed ``presets/targets/kv_semantics.yaml``."""
    from omni_pd.resources import data_dir, load_data

    return load_data(data_dir("presets") / "targets" / "kv_semantics.yaml")


def since(section: str) -> tuple[int, int]:
    """``since`` of a section of the facts, as a version tuple."""
    from omni_pd.compile.targets import parse_version

    f = facts()[section]
    return parse_version(str(f.get("since") or f.get("from_children_since")))


def platform(ctx: "Context", node: "StageNode") -> str:
    """The platform ``node`` runs on: ``--platform``, else its inventory host's accelerator,
    else cuda (as the capability rules decide it)."""
    if ctx.platform:
        return ctx.platform
    h = ctx.inventory.host(ctx.host_of(node)) if ctx.inventory is not None else None
    return h.accelerator if h is not None and h.accelerator else "cuda"


@dataclass(frozen=True)
class Side:
    """One KV stage: its node, ``side`` (``"prefill"``/``"decode"``), its identity and extra config."""

    node: "StageNode"
    side: str
    ident: ConnectorIdentity | None
    extra: dict[str, Any]

    @property
    def where(self) -> str:
        return f"{self.side} (stage {self.node.stage_id})"


def sides(ctx: "Context") -> list[Side]:
    """The PD pair's two sides (prefill first) when the topology has one, else each KV
    stage by its ``kv_role`` (kv_producer: prefill, kv_consumer: decode; kv_both: skipped)."""
    if ctx.topology is None:
        return []
    pair = ctx.pd_pair
    nodes: list[tuple["StageNode", str]] = []
    if pair is not None:
        nodes = [(pair[0], "prefill"), (pair[1], "decode")]
    else:
        for n in ctx.topology.stages:
            role = (n.kv or {}).get("kv_role")
            if role in ("kv_producer", "kv_consumer"):
                nodes.append((n, "prefill" if role == "kv_producer" else "decode"))
    out = []
    for n, s in nodes:
        if not n.kv:
            continue
        extra = n.kv.get(EXTRA)
        out.append(Side(n, s, identify(n.kv, platform(ctx, n)), extra if isinstance(extra, dict) else {}))
    return out
