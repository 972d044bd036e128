"""Which prefill TP / decode TP pairs a KV connector, a vLLM release and a runtime accept. Pure.

One table for everyone who needs it: ``expand --prefill-tp/--decode-tp`` refuses a pair
here before writing anything, validate's OPD603 (connector) and OPD306 (vllm-omni runtime)
report the same answers on a file (``omni_pd/check/rules/hetero_tp.py``,
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
* with the model's facts (``presets/targets/hetero_tp.yaml``, per release): prefill TP above
  decode TP and above ``num_key_value_heads`` (non-MLA) fails on every release; decode TP
  above prefill TP and above ``num_key_value_heads`` failed NIXL's handshake until
  vllm#45879 (https://github.com/vllm-project/vllm/issues/45330; 0.23 and before, 0.24 not
  pinned, fixed from 0.25); an NHD-native attention (MiniMax-M3's MSA) needs equal TP over
  NIXL (vllm#46204, fix #46223 unmerged); a hybrid-attention model needs equal TP over NIXL;
* the vllm-omni runtime (``vllm serve --omni``): its PD validator requires equal TP
  whatever the connector (vllm_omni/entrypoints/pd_utils.py
  ``_validate_pd_separation_config``, "PD stages must have matching tensor_parallel_size").
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omni_pd.compile.targets import Target

#: vllm-ascend's connector names (registered by the vllm-ascend plugin, NPU only)
ASCEND_CONNECTORS = frozenset({"MooncakeConnectorV1", "MooncakeLayerwiseConnector", "MooncakeHybridConnector",
                               "MooncakeConnectorStoreV1", "AscendStoreConnector", "LLMDataDistCMgrConnector"})
#: connectors that pair prefill rank i with decode rank i (no heterogeneous TP)
RANK_PAIRED = ("P2pNcclConnector", "PyNcclConnector")
#: the runtime whose PD validator requires equal TP (``Pipeline.launcher``)
EQUAL_TP_RUNTIME = "vllm-omni"


@lru_cache(maxsize=1)
def facts() -> dict[str, Any]:
    """``presets/targets/hetero_tp.yaml`` (shape in its comments)."""
    from omni_pd.resources import data_dir, load_data

    return dict(load_data(data_dir("presets") / "targets" / "hetero_tp.yaml"))


def kv_head_split_problem(connector: str, p_tp: int, d_tp: int, target: "Target", num_kv_heads: int | None,
                          mla: bool = False) -> tuple[str, str] | None:
    """(status, why) when the larger TP of an unequal pair exceeds ``num_key_value_heads``
    (a non-MLA model) and ``target`` refuses it: status ``"error"``, or ``"unpinned"`` when
    the release is not pinned for the fix (``presets/targets/hetero_tp.yaml`` ``kv_heads``);
    None when it pairs. Prefill above decode: every release. Decode above prefill over NIXL:
    until vllm#45879 (0.23 and before; 0.24 unpinned; fixed from 0.25); other connectors
    keep the pre-#45879 fact (not re-read)."""
    from omni_pd.compile.targets import parse_version

    if not num_kv_heads or mla or p_tp == d_tp or max(p_tp, d_tp) <= num_kv_heads:
        return None
    side, tp = ("decode", d_tp) if d_tp > p_tp else ("prefill", p_tp)
    why = (f"{side} TP {tp} > num_key_value_heads {num_kv_heads} with the other side at TP {min(p_tp, d_tp)}: "
           "KV heads are replicated and the heterogeneous-TP shape check fails")
    if side == "prefill":
        return "error", why
    row = facts()["kv_heads"]["decode_above"]
    if connector not in row["connectors"]:
        return "error", why
    if target.version >= parse_version(str(row["fixed_since"])):
        return None
    if target.label in [str(v) for v in row["unpinned"]]:
        return "unpinned", (f"decode TP {tp} > num_key_value_heads {num_kv_heads} with prefill at TP {p_tp}: the NIXL "
                            f"handshake failed before vllm#45879 (merged 2026-06-17), and vLLM {target.label} is not "
                            "pinned for it")
    return "error", why + f" (NIXL before vllm#45879; vLLM {target.label} lacks it, {row['fixed_since']}+ has it)"


def nhd_native_problem(connector: str, p_tp: int, d_tp: int, sparse_attention: str | None) -> str | None:
    """Why an attention that keeps KV NHD (``presets/targets/hetero_tp.yaml`` ``nhd_native``:
    MiniMax-M3's MSA) cannot pair unequal TPs over ``connector``, or None."""
    row = (facts().get("nhd_native") or {}).get(sparse_attention or "")
    if row is None or p_tp == d_tp or connector not in row["connectors"] or row.get("fixed_since"):
        return None
    return (f"{row['what']} keeps its KV cache NHD; {connector}'s heterogeneous-TP transfer (prefill TP {p_tp} -> "
            f"decode TP {d_tp}) splits heads assuming HND, so decode reads permuted heads (wrong output, no error; "
            f"vllm#46204, fix pending {row['fix']})")


def connector_tp_problem(connector: str | None, p_tp: int, d_tp: int, target: "Target", *,
                         num_kv_heads: int | None = None, mla: bool = False,
                         hybrid: bool = False, sparse_attention: str | None = None) -> str | None:
    """Why ``connector`` at ``target`` cannot pair prefill TP ``p_tp`` with decode TP
    ``d_tp`` (one line), or None when it can (also for equal TPs, an unknown connector
    and a TP below 1, which is another rule's finding). ``num_kv_heads``/``mla``/``hybrid``/
    ``sparse_attention``: the model's facts when known (``validate --model-info``). A fact
    whose release is not pinned is not an answer here (:func:`kv_head_split_problem`). The
    rows: module docstring."""
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
    nhd = nhd_native_problem(connector, p_tp, d_tp, sparse_attention)
    if nhd:
        return nhd
    split = kv_head_split_problem(connector, p_tp, d_tp, target, num_kv_heads, mla)
    if split is not None and split[0] == "error":
        return split[1]
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
