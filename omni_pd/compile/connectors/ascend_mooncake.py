"""vllm-ascend's Mooncake PD connectors (npu platform only): ``MooncakeConnectorV1``
(decode pulls the KV cache from prefill) and, in :mod:`.ascend_layerwise`,
``MooncakeLayerwiseConnector`` (prefill pushes layer by layer).

Facts (``presets/targets/vllm_ascend.yaml``, each with its vllm-ascend file:line):

* Registered by vllm-ascend's plugin as ``MooncakeConnectorV1`` ->
  ``kv_p2p/mooncake_connector.py:MooncakeConnector`` (0.13, 0.18, 0.23.0.post1).
* The worker asserts ``kv_connector_extra_config.prefill`` and ``.decode`` with
  ``tp_size`` and ``dp_size`` (``pp_size`` optional, default 1; decode PP must be 1) and
  raises unless prefill TP >= decode TP.
* Side channel ``kv_port + dp_rank*tp*pp``, handshake ``+ device index``: one engine
  binds ``[kv_port, kv_port + dp*tp*pp)``. ``engine_id`` must differ from the peer's.
* ``kv_port`` ranges must avoid AscendDirectTransport's random ports
  ``[20000, 20000 + 1000*NPUs)``; omni-pd allocates from 36000 (the guide's 16-NPU row).

The peer blocks need both sides' sizes, which one :class:`Endpoint` does not carry:
:meth:`configure` writes the symmetric pair (this side's sizes on both blocks); expand's
npu pass (:mod:`omni_pd.compile.passes.ascend`) writes the real asymmetric blocks with
:func:`omni_pd.compile.ascend.side_config`.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from omni_pd.compile import ascend
from omni_pd.compile.connectors.base import (
    LAUNCHER_RUNTIME, Endpoint, KVConnector, PortUse, SideConfig, Side, config_int, instance_port)


class AscendMooncakeConnector(KVConnector):
    """``MooncakeConnectorV1`` on vllm-ascend (pull)."""

    name = ascend.PULL
    pip_package = "mooncake-transfer-engine"
    import_name = "mooncake.engine"
    #: P's kv_transfer_params are relayed to D verbatim by vllm-ascend's pull proxy
    routing_fields = ("remote_engine_id", "remote_host", "remote_port", "remote_block_ids")
    summary = "vllm-ascend Mooncake (npu only): decode pulls; kv_port range + peer tp/dp blocks"
    platforms = ("npu",)
    #: the router's two sequential legs, as vllm-ascend 0.23.0.post1's proxy
    #: (examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py lines 792-798, 925-927)
    router_protocol = "pull"
    router_prefill_params = MappingProxyType({
        "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
        "remote_block_ids": None, "remote_host": None, "remote_port": None})

    def default_port_base(self, target):
        return int(ascend.rules()["kv_port_base"])

    def port_span(self, side: Side, tp: int, dp: int, target, *, runtime: str = "vllm", replicas: int = 1) -> int:
        engine = ascend.kv_port_span(self.name, ascend.Sizes(tp=tp, dp=dp))
        return engine * max(int(replicas), 1)

    def configure(self, ep: Endpoint, target) -> SideConfig:
        port = ep.port_base if ep.port_base is not None else self.default_port_base(target)
        own = ascend.Sizes(tp=ep.tp, dp=ep.dp)
        kv, env = ascend.side_config(self.name, ep.side, engine_id=ep.engine_id, kv_port=port,
                                     prefill=own, decode=own, hccl_base=None,
                                     release=ascend.release_for_vllm(target.label))
        return SideConfig(kv_transfer_config=kv, env=env)

    def ports(self, side, kv: dict[str, Any], env: dict[str, Any], tp, dp, target, *,
              runtime: str = "vllm", replicas: int = 1) -> list[PortUse]:
        """``[kv_port + r*span, kv_port + (r+1)*span)`` per launched instance r on omni-pd's
        launcher; on vllm-omni every replica reads the same ``kv_port``."""
        port = config_int((kv or {}).get("kv_port"))
        if port is None:
            return []
        span = ascend.kv_port_span(self.name, ascend.Sizes(tp=tp, dp=dp))
        reps = max(int(replicas), 1)
        first = (lambda r: instance_port(port, span, r)) if runtime == LAUNCHER_RUNTIME else (lambda r: port)
        return [PortUse(first(r), span, f"kv_port + rank ({self.name})", None, replica=r, key="kv_port")
                for r in range(reps)]

    def hetero_tp_error(self, p_tp, d_tp, target):
        return ascend.tp_error(self.name, p_tp, d_tp)


CONNECTOR = AscendMooncakeConnector()
