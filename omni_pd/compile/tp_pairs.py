"""Which prefill TP / decode TP pairs a KV connector, a vLLM release and a runtime accept. Pure.

One table for everyone who needs it: ``expand --prefill-tp/--decode-tp`` refuses a pair
here before writing anything, validate's OPD603 (connector) and OPD306 (vllm-omni runtime)
report the same answers on a file (``omni_pd/check/rules/capability.py``,
``omni_pd/check/rules/pd_pair.py``), and the npu pass checks the Ascend pair with it.

Rows (sources per row):

* P2pNcclConnector and the V0 PyNccl pipe pair rank i with rank i: equal TP (vLLM
  ``v1/p2p/p2p_nccl_engine.py``, ports ``kv_port + rank``; vllm#14952: unequal TP hangs);
* vllm-ascend's connectors (:data:`ASCEND_CONNECTORS`): prefill TP >= decode TP and a
  multiple of it (worker init raises otherwise; vllm-ascend
  ``docs/source/developer_guide/feature_guide/disaggregated_prefill.md`` limits, seed 004;
  ``omni_pd.compile.ascend.tp_error``);
* a connector with a contract (``omni_pd/compile/connectors/``) answers for its versions
  (:meth:`~omni_pd.compile.connectors.base.KVConnector.hetero_tp_error`): NixlConnector
  decode TP a multiple of prefill TP on vLLM 0.11-0.13, either direction if divisible from
  0.18 (vLLM ``kv_connector/utils.py`` ``TransferTopology.tp_ratio``; older wheels
  ``v1/nixl_connector.py``); MooncakeConnector equal TP before 0.22, then divisible
  (``v1/mooncake/mooncake_connector.py`` ``_get_tp_ratio``); a contract that says nothing
  more needs equal TP;
* with the model's facts: differing TPs above ``num_key_value_heads`` (non-MLA) fail the
  heterogeneous-TP shape check (https://github.com/vllm-project/vllm/issues/45330), and a
  hybrid-attention model needs equal TP over NIXL;
* the vllm-omni runtime (``vllm serve --omni``): its PD validator requires equal TP
  whatever the connector (vllm_omni/entrypoints/pd_utils.py
  ``_validate_pd_separation_config``, "PD stages must have matching tensor_parallel_size").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from omni_pd.compile.targets import Target

#: vllm-ascend's connector names (registered by the vllm-ascend plugin, NPU only)
ASCEND_CONNECTORS = frozenset({"MooncakeConnectorV1", "MooncakeLayerwiseConnector", "MooncakeHybridConnector",
                               "MooncakeConnectorStoreV1", "AscendStoreConnector", "LLMDataDistCMgrConnector"})
#: connectors that pair prefill rank i with decode rank i (no heterogeneous TP)
RANK_PAIRED = ("P2pNcclConnector", "PyNcclConnector")
#: the runtime whose PD validator requires equal TP (``Pipeline.launcher``)
EQUAL_TP_RUNTIME = "vllm-omni"


def connector_tp_problem(connector: str | None, p_tp: int, d_tp: int, target: "Target", *,
                         num_kv_heads: int | None = None, mla: bool = False,
                         hybrid: bool = False) -> str | None:
    """Why ``connector`` at ``target`` cannot pair prefill TP ``p_tp`` with decode TP
    ``d_tp`` (one line), or None when it can (also for equal TPs, an unknown connector
    and a TP below 1, which is another rule's finding). ``num_kv_heads``/``mla``/``hybrid``:
    the model's facts when known (``validate --model-info``). The rows: module docstring."""
    from omni_pd.compile import ascend, connectors

    if not connector or p_tp == d_tp or p_tp < 1 or d_tp < 1:
        return None
    if connector in RANK_PAIRED:
        return (f"{connector} pairs ranks one to one and needs equal TP on prefill and decode "
                f"(got P={p_tp}, D={d_tp}; it hangs otherwise)")
    if connector in ASCEND_CONNECTORS:
        return ascend.tp_error(connector, p_tp, d_tp)
    contract = connectors.get(connector)
    if contract is not None:
        if connector == "NixlConnector" and target.version < (0, 18) and d_tp % p_tp:
            return (f"NixlConnector on vLLM {target.label} allows decode TP >= prefill TP only, as a multiple "
                    f"(got P={p_tp}, D={d_tp})")
        msg = contract.hetero_tp_error(p_tp, d_tp, target)
        if msg:
            return msg
    if num_kv_heads and not mla and max(p_tp, d_tp) > num_kv_heads:
        side, tp = ("decode", d_tp) if d_tp > p_tp else ("prefill", p_tp)
        return (f"{side} TP {tp} > num_key_value_heads {num_kv_heads} with the other side at TP {min(p_tp, d_tp)}: "
                "KV heads are replicated and the heterogeneous-TP shape check fails")
    if hybrid and connector.startswith("Nixl"):
        return f"hybrid-attention models need equal TP over NIXL (got P={p_tp}, D={d_tp})"
    return None


def runtime_tp_problem(launcher: str, p_tp: int, d_tp: int) -> str | None:
    """Why the runtime ``launcher`` (``Pipeline.launcher``: ``"vllm-omni"`` or ``"vllm"``)
    refuses unequal TPs, or None. vllm-omni's PD validator requires them equal
    (vllm_omni/entrypoints/pd_utils.py ``_validate_pd_separation_config`` rule 6); a pair
    launched as plain ``vllm serve`` engines never meets it."""
    if launcher == EQUAL_TP_RUNTIME and p_tp != d_tp:
        return (f"tensor_parallel_size differs: prefill {p_tp}, decode {d_tp}; "
                "vllm-omni's PD validator requires them equal")
    return None
