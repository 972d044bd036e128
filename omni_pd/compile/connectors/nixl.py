"""NixlConnector (NIXL, pull/READ mode).

Facts (vllm_kv_connectors.md §3.1; vLLM v1/nixl_connector.py, v1/nixl/*.py):

* Both sides bind a ZMQ side channel: ``VLLM_NIXL_SIDE_CHANNEL_PORT`` (default 5557
  on 0.11, 5600 from 0.13) on ``VLLM_NIXL_SIDE_CHANNEL_HOST`` (default localhost; it
  is also the address advertised to the peer, so it must be routable across hosts).
* Ports per engine from the base: 0.11 one per TP worker (``base + dp_rank*tp +
  tp_rank``), 0.13+ one per engine (``base + dp index``). omni-pd gives prefill and
  decode disjoint ranges of that size.
* ``kv_buffer_device``: ``cuda`` or ``cpu`` (host staging) from 0.13; ``cpu`` on a
  CPU-only platform.
* Heterogeneous TP: 0.11–0.13 decode TP must be a multiple of prefill TP; from 0.18
  either direction, the larger divisible by the smaller.
* vllm-omni (0.30.0 read) passes a stage's env unchanged to every replica of the stage
  (nothing in ``vllm_omni/`` sets ``VLLM_NIXL_SIDE_CHANNEL_PORT``), so all replicas of a
  stage with ``num_replicas`` > 1 bind the same range.
* omni-pd's launcher (runtime ``vllm``) starts one ``vllm serve`` per replica and sets
  each one's ``VLLM_NIXL_SIDE_CHANNEL_PORT`` to ``base + r*span``
  (:func:`~omni_pd.compile.connectors.base.instance_port`): the stage's replicas take
  one contiguous range.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from omni_pd.compile.connectors.base import (
    LAUNCHER_RUNTIME, ROLE, Endpoint, KVConnector, PortUse, SideConfig, Side, instance_port)

ENV_PORT = "VLLM_NIXL_SIDE_CHANNEL_PORT"
ENV_HOST = "VLLM_NIXL_SIDE_CHANNEL_HOST"


class NixlConnector(KVConnector):
    name = "NixlConnector"
    pip_package = "nixl"
    import_name = "nixl"
    port_env = ENV_PORT
    routing_fields = ("remote_block_ids", "remote_engine_id", "remote_host", "remote_port",
                      "remote_request_id", "tp_size")
    summary = "NIXL (UCX) pull; each engine binds a ZMQ side-channel port range"
    #: the router sends P these and gives D P's answer verbatim (vLLM
    #: tests/v1/kv_connector/nixl_integration/toy_proxy_server.py; vllm_kv_connectors.md §3.1)
    router_protocol = "pull"
    router_prefill_params = MappingProxyType({
        "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
        "remote_block_ids": None, "remote_host": None, "remote_port": None})

    def default_port_base(self, target):
        return target.nixl_side_channel_default_port

    def port_span(self, side: Side, tp: int, dp: int, target, *, runtime: str = "vllm", replicas: int = 1) -> int:
        engine = target.nixl_side_channel_span(tp, dp)
        return engine * max(int(replicas), 1) if runtime == LAUNCHER_RUNTIME else engine

    def configure(self, ep: Endpoint, target) -> SideConfig:
        port = ep.port_base if ep.port_base is not None else target.nixl_side_channel_default_port
        kv = self._kv(
            target,
            kv_connector=self.name,
            kv_role=ROLE[ep.side],
            engine_id=ep.engine_id,
            kv_buffer_device=ep.kv_buffer_device,
        )
        return SideConfig(kv_transfer_config=kv, env={ENV_HOST: ep.host, ENV_PORT: str(port)})

    def ports(self, side, kv: dict[str, Any], env: dict[str, Any], tp, dp, target, *,
              runtime: str = "vllm", replicas: int = 1) -> list[PortUse]:
        raw = (env or {}).get(ENV_PORT, target.nixl_side_channel_default_port)
        try:
            port = int(raw)
        except (TypeError, ValueError):
            return []
        key = ENV_PORT if ENV_PORT in (env or {}) else None
        span = target.nixl_side_channel_span(tp, dp)
        per_instance = runtime == LAUNCHER_RUNTIME
        return [PortUse(instance_port(port, span, r) if per_instance else port, span, "NIXL side channel",
                        ENV_PORT, replica=r, key=key)
                for r in range(max(int(replicas), 1))]

    def hetero_tp_error(self, p_tp, d_tp, target):
        if p_tp == d_tp:
            return None
        if target.version < (0, 18):
            if d_tp % p_tp:
                return f"NixlConnector on vLLM {target.label} needs decode TP to be a multiple of prefill TP"
            return None
        big, small = max(p_tp, d_tp), min(p_tp, d_tp)
        if big % small:
            return f"NixlConnector needs one TP size to divide the other (got {p_tp} and {d_tp})"
        return None


CONNECTOR = NixlConnector()
