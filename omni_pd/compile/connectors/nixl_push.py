"""NixlPushConnector (NIXL, push/WRITE mode).

Facts (vLLM 0.30.0 ``kv_connector/v1/nixl/connector.py``, ``push_scheduler.py``,
``base_worker.py``; vLLM PRs #35264 (push mode) and #45880 (PP prefill)):

* Registered in vLLM's KVConnectorFactory from 0.24 (``presets/targets/vllm.yaml``).
* Same side channel as the pull connector: ``VLLM_NIXL_SIDE_CHANNEL_HOST`` /
  ``VLLM_NIXL_SIDE_CHANNEL_PORT``, one port per engine (per DP index) from 0.13.
* Decode registers its freshly allocated blocks with prefill, which WRITEs into them:
  decode needs prefill's identity (``remote_engine_id``, ``remote_host``,
  ``remote_port``, ``tp_size``, ``pp_size``), not prefill's block ids, so a router may
  dispatch both legs at once. Pull and push engines never pair (handshake compat hash).
* Pipeline parallelism: prefill PP > 1 with a non-hybrid model (0.30), decode PP 1
  (``presets/targets/kv_pp.yaml``, rule OPD612).
* ``decode_context_parallel_size`` > 1 is refused (ValueError in ``__init__``).
"""

from __future__ import annotations

from omni_pd.compile.connectors.nixl import NixlConnector


class NixlPushConnector(NixlConnector):
    name = "NixlPushConnector"
    routing_fields = ("remote_engine_id", "remote_host", "remote_port", "tp_size", "pp_size")
    summary = "NIXL (UCX) push: prefill WRITEs into blocks decode registers; same side-channel ports as NixlConnector"
    #: decode needs prefill's identity before prefill runs: not the pull protocol; the
    #: router does not serve it (yet)
    router_protocol = None


CONNECTOR = NixlPushConnector()
