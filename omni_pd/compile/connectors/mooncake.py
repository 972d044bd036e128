"""MooncakeConnector (Mooncake Transfer Engine, P2P handshake).

Facts (vllm_kv_connectors.md §3.2; vLLM v1/mooncake/*.py; vllm-omni
engine/stage_runtime.py; ``presets/targets/mooncake_bootstrap.yaml`` per runtime/version):

* An engine whose ``kv_role`` is not ``kv_consumer`` runs an HTTP bootstrap server
  (vLLM ``MooncakeConnectorWorker.__init__``): one port per engine from vLLM 0.18,
  ``base + dp_rank*tp + tp_rank`` on 0.13. Decode (``kv_consumer``) binds no fixed port,
  so omni-pd gives it no bootstrap port.
* Which setting decides that port depends on the runtime: plain vLLM reads only the env
  ``VLLM_MOONCAKE_BOOTSTRAP_PORT`` (default 8998). vllm-omni 0.30 computes it for each
  ``kv_producer`` replica *r* as ``kv_connector_extra_config.bootstrap_port`` (default
  8998) ``+ r`` and overwrites the replica's env with it
  (``StageRuntime._prepare_replica_vllm_config``), so a prefill stage with
  ``num_replicas`` N binds N consecutive ports. ``mooncake_bootstrap_port`` (the key of
  vllm-omni's PD recipe) feeds no running code path on any release read.
* omni-pd's launcher (runtime ``vllm``) starts one ``vllm serve`` per replica and sets
  replica r's env to ``port + r*span`` (:func:`~omni_pd.compile.connectors.base.instance_port`).
* omni-pd writes the deciding key and, for vllm-omni, also the env variable with the
  value the runtime will set for replica 0, so the file says what will be bound.
* Heterogeneous TP: 0.13–0.18 equal TP only; from 0.22 one must divide the other.
  vllm-omni's PD validator requires equal TP regardless (pd_utils.py).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from omni_pd.compile.connectors.base import (
    LAUNCHER_RUNTIME, ROLE, Endpoint, KVConnector, PortUse, SideConfig, Side, config_int, instance_port)

ENV_PORT = "VLLM_MOONCAKE_BOOTSTRAP_PORT"
#: vLLM's default of ``VLLM_MOONCAKE_BOOTSTRAP_PORT`` (vllm_kv_connectors.md §3.2)
VLLM_DEFAULT_PORT = 8998
#: first port of omni-pd's allocation (vllm-omni's PD recipe value), away from vLLM's
#: 8998 default so a plain Mooncake engine on the same host does not collide
BASE_PORT = 25201
EXTRA = "kv_connector_extra_config"
#: the Transfer Engine protocol key vLLM reads (``MooncakeConnectorWorker.__init__``,
#: default ``rdma``); ``tcp`` needs no RDMA NIC (a CPU rehearsal, a cluster without RDMA)
PROTOCOL_KEY = "mooncake_protocol"
#: the protocols ``expand --mooncake-protocol`` writes: the two Mooncake's Transfer Engine
#: offers on every build (mooncake-transfer-engine ``TransferEngine.initialize``)
PROTOCOLS = ("rdma", "tcp")


def deciding_setting(kv: dict[str, Any] | None, target, runtime: str) -> str:
    """Where the engine(s) configured with ``kv`` take the bootstrap port from:
    ``"env"`` or a dotted ``kv_transfer_config`` path. vllm-omni's rewrite applies only to
    ``kv_producer`` (``_prepare_replica_vllm_config`` tests ``kv_role == "kv_producer"``);
    a ``kv_both`` engine reads the env like plain vLLM."""
    facts = target.mooncake_bootstrap(runtime)
    if facts.extra_key and (kv or {}).get("kv_role") == "kv_producer":
        return facts.key
    return "env"


def bootstrap_ports(kv: dict[str, Any] | None, env: dict[str, Any] | None, tp: int, dp: int, target,
                    runtime: str = "vllm", replicas: int = 1) -> list[PortUse]:
    """The bootstrap port range each of a stage's ``replicas`` engines binds.

    ``kv``/``env``: the stage's ``kv_transfer_config`` and env as written. Returns [] for
    a ``kv_consumer`` (no bootstrap server) or a port that is not an integer; else one
    :class:`PortUse` per replica: ``port + r`` where the runtime adds the replica id,
    ``port + r*span`` on omni-pd's launcher (runtime ``vllm``, one ``vllm serve`` per
    replica), ``port`` for every replica elsewhere. Port units: TCP port numbers.
    Sources: presets/targets/mooncake_bootstrap.yaml (per runtime and version).
    """
    kv = kv or {}
    if kv.get("kv_role") == "kv_consumer":
        return []
    facts = target.mooncake_bootstrap(runtime)
    setting = deciding_setting(kv, target, runtime)
    if setting == "env":
        raw, key = (env or {}).get(ENV_PORT), ENV_PORT
    else:
        raw, key = (kv.get(EXTRA) or {}).get(facts.extra_key), setting
    if raw is None:
        raw, key = facts.default, None
    port = config_int(raw)
    if port is None:
        return []
    offset = setting != "env" and facts.replica_offset
    span = target.mooncake_bootstrap_span(tp, dp)
    purpose = "Mooncake bootstrap" if key is not None else f"Mooncake bootstrap ({facts.where} default)"
    def first(r: int) -> int:
        if runtime == LAUNCHER_RUNTIME:
            return instance_port(port, span, r)
        return port + (r if offset else 0)

    return [PortUse(first(r), span, purpose, ENV_PORT, replica=r, key=key)
            for r in range(max(int(replicas), 1))]


def binds_every_interface(purpose: str) -> bool:
    """True for a port (by its plan purpose) the runtime binds on 0.0.0.0 whatever the
    config's addresses say: vLLM 0.30 mooncake_connector.py starts
    ``MooncakeBootstrapServer("0.0.0.0", port)``; ``kv_ip`` only names where decode asks."""
    return purpose.startswith("Mooncake bootstrap")


class MooncakeConnector(KVConnector):
    name = "MooncakeConnector"
    pip_package = "mooncake-transfer-engine"
    import_name = "mooncake.engine"
    port_env = ENV_PORT
    routing_fields = ("transfer_id", "remote_bootstrap_addr", "remote_engine_id")
    router_bootstrap = True
    summary = "Mooncake Transfer Engine; prefill serves an HTTP bootstrap port"
    #: vLLM >= 0.18 protocol (examples/disaggregated/mooncake_connector/mooncake_connector_proxy.py;
    #: vllm_kv_connectors.md §3.2): P gets these + ``transfer_id`` and its DP rank in a header,
    #: D gets these + ``remote_bootstrap_addr``, ``remote_engine_id``, ``transfer_id`` at once
    router_protocol = "bootstrap"
    router_prefill_params = MappingProxyType({"do_remote_decode": True, "do_remote_prefill": False})
    router_decode_params = MappingProxyType({"do_remote_decode": False, "do_remote_prefill": True})
    router_default_bootstrap_port = VLLM_DEFAULT_PORT
    router_dp_rank_header = "X-data-parallel-rank"

    def default_port_base(self, target):
        return BASE_PORT

    def port_span(self, side: Side, tp: int, dp: int, target, *, runtime: str = "vllm", replicas: int = 1) -> int:
        if side != "prefill":
            return 0  # kv_consumer binds no bootstrap port
        engine = target.mooncake_bootstrap_span(tp, dp)
        if runtime == LAUNCHER_RUNTIME:
            return engine * max(int(replicas), 1)
        facts = target.mooncake_bootstrap(runtime)
        if facts.extra_key and facts.replica_offset:
            return engine + max(int(replicas), 1) - 1
        return engine

    def configure(self, ep: Endpoint, target) -> SideConfig:
        port = ep.port_base if ep.port_base is not None else (BASE_PORT if ep.side == "prefill" else None)
        role = ROLE[ep.side]
        env: dict[str, str] = {}
        extra = None
        if port is not None:
            env[ENV_PORT] = str(port)  # plain vLLM reads it; vllm-omni sets it to this for replica 0
            setting = deciding_setting({"kv_role": role}, target, ep.runtime)
            if setting != "env":
                extra = {setting.split(".", 1)[1]: port}
        if ep.mooncake_protocol is not None:  # both sides' Transfer Engines speak it
            extra = {**(extra or {}), PROTOCOL_KEY: ep.mooncake_protocol}
        kv = self._kv(
            target,
            kv_connector=self.name,
            kv_role=role,
            engine_id=ep.engine_id,
            kv_ip=ep.host,
            kv_buffer_device=ep.kv_buffer_device,
            kv_connector_extra_config=extra,
        )
        return SideConfig(kv_transfer_config=kv, env=env, env_remove=() if env else (ENV_PORT,))

    def ports(self, side, kv: dict[str, Any], env: dict[str, Any], tp, dp, target, *,
              runtime: str = "vllm", replicas: int = 1) -> list[PortUse]:
        kv = dict(kv or {})
        kv.setdefault("kv_role", ROLE.get(side, "kv_producer"))
        return bootstrap_ports(kv, env, tp, dp, target, runtime, replicas)

    def unread_keys(self, target, runtime: str = "vllm", *, side: Side | None = None) -> tuple[str, ...]:
        """The target's unread paths, plus, on decode, the extra-config key that decides the
        bootstrap port: vllm-omni 0.30 reads ``bootstrap_port`` only for a ``kv_producer``
        (``StageRuntime._prepare_replica_vllm_config``) and a ``kv_consumer`` binds no
        bootstrap server, so the Thinker's port copied to decode would be read by nothing."""
        facts = target.mooncake_bootstrap(runtime)
        unread = facts.unread_keys
        if side == "decode" and facts.extra_key and facts.key not in unread:
            unread = (*unread, facts.key)
        return unread

    def hetero_tp_error(self, p_tp, d_tp, target):
        if p_tp == d_tp:
            return None
        if target.version < (0, 22):
            return f"MooncakeConnector on vLLM {target.label} needs equal TP on prefill and decode"
        big, small = max(p_tp, d_tp), min(p_tp, d_tp)
        if big % small:
            return f"MooncakeConnector needs one TP size to divide the other (got {p_tp} and {d_tp})"
        return None


CONNECTOR = MooncakeConnector()
