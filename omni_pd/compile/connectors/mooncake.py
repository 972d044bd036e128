"""MooncakeConnector (Mooncake Transfer Engine, P2P handshake).

Facts (vllm_kv_connectors.md §3.2; vLLM v1/mooncake/*.py; vllm-omni 0.30.0
entrypoints/pd_utils.py and engine/omni_engine_base.py):

* Prefill (``kv_producer``) runs an HTTP bootstrap server on
  ``VLLM_MOONCAKE_BOOTSTRAP_PORT`` (default 8998): one port per engine from vLLM 0.18,
  ``base + dp_rank*tp + tp_rank`` on 0.13. Decode (``kv_consumer``) binds no fixed port.
* vllm-omni builds the bootstrap address twice: ``pd_utils`` from
  ``kv_ip`` + ``kv_connector_extra_config.mooncake_bootstrap_port`` (default 25201) and
  the engine from ``kv_ip`` + the engine process's ``VLLM_MOONCAKE_BOOTSTRAP_PORT``.
  Both must name the same port, so omni-pd writes it in both places.
* Each side gets its own port (the vllm-omni PD recipes use 25201 / 25202), so a side
  flipped to ``kv_both`` would not collide.
* Heterogeneous TP: 0.13–0.18 equal TP only; from 0.22 one must divide the other.
  vllm-omni's PD validator requires equal TP regardless (pd_utils.py).
"""

from __future__ import annotations

from typing import Any

from omni_pd.compile.connectors.base import ROLE, Endpoint, KVConnector, PortUse, SideConfig, Side

ENV_PORT = "VLLM_MOONCAKE_BOOTSTRAP_PORT"
#: first port of omni-pd's allocation; vllm-omni's pd_utils default and PD recipes
BASE_PORT = 25201


class MooncakeConnector(KVConnector):
    name = "MooncakeConnector"
    pip_package = "mooncake-transfer-engine"
    import_name = "mooncake.engine"
    port_env = ENV_PORT
    routing_fields = ("transfer_id", "remote_bootstrap_addr", "remote_engine_id")
    summary = "Mooncake Transfer Engine; prefill serves an HTTP bootstrap port"

    def default_port_base(self, target):
        return BASE_PORT

    def port_span(self, side: Side, tp: int, dp: int, target) -> int:
        # decode reserves one port too: the env var is set on both sides
        return target.mooncake_bootstrap_span(tp, dp) if side == "prefill" else 1

    def configure(self, ep: Endpoint, target) -> SideConfig:
        port = ep.port_base if ep.port_base is not None else BASE_PORT
        kv = self._kv(
            target,
            kv_connector=self.name,
            kv_role=ROLE[ep.side],
            engine_id=ep.engine_id,
            kv_ip=ep.host,
            kv_buffer_device=ep.kv_buffer_device,
            kv_connector_extra_config={"mooncake_bootstrap_port": port},
        )
        return SideConfig(kv_transfer_config=kv, env={ENV_PORT: str(port)})

    def ports(self, side, kv: dict[str, Any], env: dict[str, Any], tp, dp, target) -> list[PortUse]:
        raw = (env or {}).get(ENV_PORT)
        if raw is None:
            raw = ((kv or {}).get("kv_connector_extra_config") or {}).get("mooncake_bootstrap_port")
        if raw is None:
            if side != "prefill":
                return []
            raw = target.mooncake_bootstrap_default_port
        try:
            port = int(raw)
        except (TypeError, ValueError):
            return []
        return [PortUse(port, self.port_span(side, tp, dp, target), "Mooncake bootstrap", ENV_PORT)]

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
