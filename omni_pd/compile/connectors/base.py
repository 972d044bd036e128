"""The contract every KV connector module fulfils.

A connector module (one per vLLM KV connector) defines a subclass of
:class:`KVConnector` and exposes one instance as ``CONNECTOR``; the registry in
``omni_pd.compile.connectors`` discovers it, so adding a connector is one new module.

A contract answers, for one side of a prefill/decode pair and one vLLM target: the
``kv_transfer_config`` to emit, the environment the engine needs, and the ports it
binds per host (base port and how many consecutive ports from it, per TP/DP rank).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

if TYPE_CHECKING:
    from omni_pd.compile.targets import Target

Side = Literal["prefill", "decode"]

#: kv_role emitted for each side. kv_both is never emitted (deprecated for NIXL in
#: vLLM 0.24; Mooncake asserts on misrouted requests): vllm_kv_connectors.md §3.
ROLE = {"prefill": "kv_producer", "decode": "kv_consumer"}


@dataclass(frozen=True)
class Endpoint:
    """What the PD pass decided for one side of the pair.

    ``host``: address advertised to the peer (loopback for a single host).
    ``port_base``: first port of this side's connector range (per host), or None if
    the connector binds no fixed port on this side. ``tp``/``dp``: tensor/data
    parallel sizes of the engine.
    """

    side: Side
    engine_id: str
    host: str
    tp: int = 1
    dp: int = 1
    port_base: int | None = None
    kv_buffer_device: str | None = None


@dataclass(frozen=True)
class SideConfig:
    """Connector output for one side: ``kv_transfer_config`` (ordered) and env vars."""

    kv_transfer_config: dict[str, Any]
    env: dict[str, str]


@dataclass(frozen=True)
class PortUse:
    """A contiguous port range ``[port, port + span)`` one engine binds on its host."""

    port: int
    span: int
    purpose: str
    env: str | None = None  # the env var that sets it, if any


class KVConnector:
    """Base contract. Subclasses set the class attributes and override the methods."""

    name: ClassVar[str]
    #: pip package that provides the transport (checked by launch preflight)
    pip_package: ClassVar[str | None] = None
    #: Python module to import for the transport
    import_name: ClassVar[str | None] = None
    #: env var carrying this connector's base port, if any
    port_env: ClassVar[str | None] = None
    #: kv_transfer_params keys the router/orchestrator must carry from P to D
    routing_fields: ClassVar[tuple[str, ...]] = ()
    #: docs for `omni-pd connectors`
    summary: ClassVar[str] = ""

    def default_port_base(self, target: Target) -> int | None:
        """Where allocation starts for this connector's ports, or None (no fixed port)."""
        return None

    def port_span(self, side: Side, tp: int, dp: int, target: Target) -> int:
        """Consecutive ports bound from the base on ``side`` (0 = none)."""
        return 0

    def configure(self, ep: Endpoint, target: Target) -> SideConfig:
        """``kv_transfer_config`` and env for one side. Fields the target lacks are dropped."""
        raise NotImplementedError

    def ports(self, side: Side, kv: dict[str, Any], env: dict[str, Any], tp: int, dp: int,
              target: Target) -> list[PortUse]:
        """Ports an engine configured with ``kv``/``env`` binds (read back for checks)."""
        return []

    def hetero_tp_error(self, p_tp: int, d_tp: int, target: Target) -> str | None:
        """Why (p_tp, d_tp) is unsupported, or None when it is. Default: equal TP only."""
        if p_tp != d_tp:
            return f"{self.name} needs equal tensor parallel size on prefill and decode"
        return None

    # helpers -------------------------------------------------------------------
    @staticmethod
    def _kv(target: Target, **fields: Any) -> dict[str, Any]:
        allowed = target.kv_fields()
        return {k: v for k, v in fields.items() if v is not None and k in allowed}
