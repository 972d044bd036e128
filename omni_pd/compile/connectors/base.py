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
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Mapping

if TYPE_CHECKING:
    from omni_pd.compile.targets import Target

Side = Literal["prefill", "decode"]

#: how the PD router (``omni_pd.launch.router``) carries a request of a connector
#: (:attr:`KVConnector.router_protocol`): ``pull``: prefill first, decode gets the
#: ``kv_transfer_params`` prefill answered, verbatim; ``bootstrap``: prefill and decode at
#: once, joined by a ``transfer_id``, decode told the prefill's bootstrap address and the
#: engine id read from ``GET <bootstrap>/query``; ``push_front``: decode first, prefill
#: pushes into it (served by ``omni_pd.launch.ascend_proxy``, not the pull/bootstrap router).
ROUTER_PROTOCOLS = ("pull", "bootstrap", "push_front")

#: kv_role emitted for each side. kv_both is never emitted (deprecated for NIXL in
#: vLLM 0.24; Mooncake asserts on misrouted requests): vllm_kv_connectors.md §3.
ROLE = {"prefill": "kv_producer", "decode": "kv_consumer"}


@dataclass(frozen=True)
class Endpoint:
    """What the PD pass decided for one side of the pair.

    ``host``: address advertised to the peer (loopback for a single host).
    ``port_base``: first port of this side's connector range (per host), or None if
    the connector binds no fixed port on this side. ``tp``/``dp``: tensor/data
    parallel sizes of the engine. ``runtime``: ``"vllm"`` (plain ``vllm serve``) or
    ``"vllm-omni"`` (``vllm serve --omni``), which decides where some connectors read
    their ports (:meth:`omni_pd.compile.targets.Target.mooncake_bootstrap`).
    """

    side: Side
    engine_id: str
    host: str
    tp: int = 1
    dp: int = 1
    port_base: int | None = None
    kv_buffer_device: str | None = None
    runtime: str = "vllm"
    #: MooncakeConnector's Transfer Engine protocol (``kv_connector_extra_config.mooncake_protocol``,
    #: ``rdma`` when unset: vLLM ``MooncakeConnectorWorker.__init__``); None: not written
    mooncake_protocol: str | None = None


@dataclass(frozen=True)
class SideConfig:
    """Connector output for one side: ``kv_transfer_config`` (ordered), env vars to set,
    and env vars to remove from what the side copied from the Thinker (a setting this
    side does not use, e.g. a bootstrap port on a ``kv_consumer``)."""

    kv_transfer_config: dict[str, Any]
    env: dict[str, str]
    env_remove: tuple[str, ...] = ()


@dataclass(frozen=True)
class PortUse:
    """A contiguous port range ``[port, port + span)`` one engine (replica ``replica``
    of its stage) binds on its host. ``key``: the setting that decided ``port``
    (an env var name, or a dotted ``kv_transfer_config`` path), None for a default."""

    port: int
    span: int
    purpose: str
    env: str | None = None  # the env var that sets it, if any
    replica: int = 0
    key: str | None = None


#: the runtime of plain ``vllm serve`` engines, which omni-pd's launcher starts itself
LAUNCHER_RUNTIME = "vllm"


def config_int(raw: Any) -> int | None:
    """A port or size written in a config (``25201``, ``"25201"``, ``" 25201 "``) as an int;
    None for a bool or anything that is not an integer (validate reports those)."""
    if isinstance(raw, bool):
        return None
    try:
        return int(str(raw).strip())
    except (TypeError, ValueError):
        return None


def launched_replicas(num_replicas: int | None) -> int:
    """Engines a stage's deploy entry starts (>= 1; 1 for an absent or non-integer value):
    ``num_replicas`` on both runtimes, so the runtime is not an argument. vllm-omni's
    stage runtime starts one engine per replica (vllm_omni/engine/stage_runtime.py
    ``_build_logical_stage_init_plans``); on the ``vllm`` runtime omni-pd's launcher starts
    one ``vllm serve`` per replica of the prefill and of the decode stage (xPyD: x prefill
    and y decode instances; :func:`instance_port`, :func:`instance_engine_id`)."""
    try:
        return max(int(num_replicas or 1), 1)
    except (TypeError, ValueError):
        return 1


def instance_port(port: int, span: int, replica: int) -> int:
    """First connector port of instance ``replica`` of a stage on omni-pd's launcher
    (runtime ``vllm``): instance r binds ``[port + r*span, port + (r+1)*span)``, so the
    stage's instances take one contiguous range of ``replicas*span`` ports from the
    stage's own value (what expand allocates and validate checks). Units: TCP ports."""
    return port + replica * max(int(span), 1)


def instance_engine_id(engine_id: str, replica: int, replicas: int) -> str:
    """``kv_transfer_config.engine_id`` of instance ``replica`` on omni-pd's launcher:
    ``<engine_id>-r<replica>`` when the stage has several instances (KV connectors key
    their peers by engine id, so instances must differ), else unchanged. vllm-omni 0.30
    does the same with ``-s<stage>-r<replica>`` (presets/targets/mooncake_bootstrap.yaml)."""
    return f"{engine_id}-r{replica}" if replicas > 1 else engine_id


class KVConnector:
    """Base contract. Subclasses set the class attributes and override the methods."""

    name: ClassVar[str]
    #: pip package that provides the transport (checked by launch preflight)
    pip_package: ClassVar[str | None] = None
    #: Python module to import for the transport
    import_name: ClassVar[str | None] = None
    #: env var carrying this connector's base port, if any
    port_env: ClassVar[str | None] = None
    #: the PD router must know each prefill's first connector port (``--prefill URL,PORT``):
    #: MooncakeConnector's decode asks the prefill's bootstrap server there
    router_bootstrap: ClassVar[bool] = False
    #: kv_transfer_params keys the router/orchestrator must carry from P to D
    routing_fields: ClassVar[tuple[str, ...]] = ()
    #: how omni-pd's PD router carries this connector (one of :data:`ROUTER_PROTOCOLS`), or
    #: None when the router does not serve it (``python -m omni_pd.launch.router`` refuses it)
    router_protocol: ClassVar[str | None] = None
    #: ``kv_transfer_params`` the router sends on the prefill leg (``bootstrap`` adds the
    #: request's ``transfer_id``)
    router_prefill_params: ClassVar[Mapping[str, Any]] = MappingProxyType({})
    #: ``kv_transfer_params`` flags of the decode leg (``bootstrap``; ``pull`` relays prefill's)
    router_decode_params: ClassVar[Mapping[str, Any]] = MappingProxyType({})
    #: bootstrap port of a prefill the router is given no port for (``bootstrap``)
    router_default_bootstrap_port: ClassVar[int | None] = None
    #: header of the prefill leg naming the prefill's DP rank the request goes to (``bootstrap``)
    router_dp_rank_header: ClassVar[str | None] = None
    #: docs for `omni-pd connectors`
    summary: ClassVar[str] = ""

    def default_port_base(self, target: Target) -> int | None:
        """Where allocation starts for this connector's ports, or None (no fixed port)."""
        return None

    def port_span(self, side: Side, tp: int, dp: int, target: Target, *,
                  runtime: str = "vllm", replicas: int = 1) -> int:
        """Consecutive ports to reserve from the base on ``side`` (0 = none) for a stage
        of ``replicas`` engines on ``runtime``, so that no port it binds is outside."""
        return 0

    def configure(self, ep: Endpoint, target: Target) -> SideConfig:
        """``kv_transfer_config`` and env for one side. Fields the target lacks are dropped."""
        raise NotImplementedError

    def ports(self, side: Side, kv: dict[str, Any], env: dict[str, Any], tp: int, dp: int,
              target: Target, *, runtime: str = "vllm", replicas: int = 1) -> list[PortUse]:
        """Ports the ``replicas`` engines of a stage configured with ``kv``/``env`` bind,
        one :class:`PortUse` per replica and range (read back for checks and preflight)."""
        return []

    def unread_keys(self, target: Target, runtime: str = "vllm", *,
                    side: Side | None = None) -> tuple[str, ...]:
        """Dotted ``kv_transfer_config`` paths (``kv_connector_extra_config.x``) that no
        code reads on ``runtime`` at ``target`` for an engine on ``side`` (None: on either
        side, the keys unread whatever the ``kv_role``). Expand drops them from what each
        side copies from the Thinker, so a setting of the other side's role (a prefill's
        bootstrap port) does not reach this one."""
        return ()

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
