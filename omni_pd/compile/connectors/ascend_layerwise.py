"""vllm-ascend's ``MooncakeLayerwiseConnector`` (npu only): prefill pushes the KV cache
layer by layer; the proxy sends each request to decode first.

Facts (``presets/targets/vllm_ascend.yaml``):

* Registered as ``MooncakeLayerwiseConnector`` (0.13, 0.18, 0.23.0.post1).
* Side channel ``kv_port + dp_rank*tp`` (+ ``pcp`` terms on 0.23), handshake ``+ tp_rank``:
  one engine binds ``[kv_port, kv_port + dp*tp)``.
* Peer blocks ``prefill``/``decode`` are read only by 0.13 (asserted there); from 0.18
  decode sends its TP per request (``remote_tp_size`` in the metaserver call).
* Decode posts ``kv_transfer_params`` to the ``metaserver`` URL the proxy put in the
  request (``/v1/metaserver`` on the example proxy); the router implements it
  (:mod:`omni_pd.launch.ascend_proxy`).
"""

from __future__ import annotations

from omni_pd.compile import ascend
from omni_pd.compile.connectors.ascend_mooncake import AscendMooncakeConnector


class AscendLayerwiseConnector(AscendMooncakeConnector):
    """``MooncakeLayerwiseConnector`` on vllm-ascend (push)."""

    name = ascend.PUSH
    routing_fields = ("metaserver",)
    #: decode first; omni_pd.launch.ascend_proxy serves it behind the router's command line
    router_protocol = "push_front"
    summary = "vllm-ascend Mooncake layerwise (npu only): prefill pushes; router serves /v1/metaserver"


CONNECTOR = AscendLayerwiseConnector()
