"""Issue 35's audit (docs/facts.md): one test per fact the audit changed, each judging the same
config on the release before and after the boundary the fact names (one finding on one side,
none or another on the other)."""

from __future__ import annotations

import pytest

from omni_pd.check.context import ModelInfo
from omni_pd.check.validate import ValidateOptions
from rule_found import found

_PAIR = ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
         "  - {{stage_id: 0, devices: \"0,1\", tensor_parallel_size: 2{p}, kv_transfer_config: {{kv_connector: {c}, "
         "kv_role: kv_producer, engine_id: p0{pk}}}}}\n"
         "  - {{stage_id: 1, devices: \"2,3\", tensor_parallel_size: 2{d}, env: {{VLLM_NIXL_SIDE_CHANNEL_PORT: \"5700\"}}, "
         "kv_transfer_config: {{kv_connector: {c}, kv_role: kv_consumer, engine_id: d0{dk}}}}}\n")
DCP2 = ", decode_context_parallel_size: 2"
MLA = ModelInfo(num_kv_heads=1, attention="MLA")


def pair(c: str, p: str = "", d: str = "", pk: str = "", dk: str = "") -> str:
    return _PAIR.format(c=c, p=p, d=d, pk=pk, dk=dk)


def sev(text: str, code: str, version: str, **kw) -> list[str]:
    return [g[0] for g in found(text, code, opts=ValidateOptions(vllm_version=version, **kw))]


# --- OPD625: NixlPushConnector refuses DCP > 1 (vLLM 0.29.0-0.34.0 nixl/connector.py) -----------

def test_opd625_push_nixl_dcp_is_refused_from_0_29_and_not_pinned_on_0_28() -> None:
    text = pair("NixlPushConnector", DCP2, DCP2)
    got = found(text, "OPD625", opts=ValidateOptions(vllm_version="0.29", model=MLA))
    assert [g[0] for g in got] == ["error"]
    assert "NixlPushConnector on vLLM 0.29 cannot move DCP-sharded KV" in got[0][1]
    assert "does not support decode_context_parallel_size > 1" in got[0][1] or "raises ValueError" in got[0][1]
    assert sev(text, "OPD625", "0.28", model=MLA) == ["info"]
    assert sev(text, "OPD625", "0.34", model=MLA) == ["error"]


def test_opd625_pull_nixl_dcp_on_mla_passes_where_push_is_refused() -> None:
    assert sev(pair("NixlConnector", DCP2, DCP2), "OPD625", "0.29", model=MLA) == []


@pytest.mark.parametrize(("version", "want"), [("0.33", []), ("0.34", ["error"])])
def test_opd625_transfer_mode_push_is_push_only_from_0_34(version: str, want: list[str]) -> None:
    push = ", kv_connector_extra_config: {transfer_mode: push}"
    text = pair("NixlConnector", DCP2, DCP2, push, push)
    assert sev(text, "OPD625", version, model=MLA) == want


# --- OPD608: MoRIIO's handshake_port / notify_port default (vLLM 0.18.0-0.34.0) -----------------

_MORIIO_HTTP = ", kv_connector_extra_config: {{http_port: {port}}}"


@pytest.mark.parametrize("version", ["0.18", "0.34"])
def test_opd608_moriio_needs_http_port_only(version: str) -> None:
    ok = pair("MoRIIOConnector", pk=_MORIIO_HTTP.format(port=8100), dk=_MORIIO_HTTP.format(port=8200))
    assert sev(ok, "OPD608", version) == []
    missing = pair("MoRIIOConnector", pk=_MORIIO_HTTP.format(port=8100))
    got = found(missing, "OPD608", opts=ValidateOptions(vllm_version=version))
    assert [g[1] for g in got] == ["stage 1: MoRIIOConnector requires kv_connector_extra_config.http_port"]


def test_opd608_moriio_is_not_a_connector_before_0_18() -> None:
    """The boundary below: MoRIIO is registered from 0.18 (OPD601 on 0.13), so OPD608 has no
    MoRIIO fact to apply there."""
    text = pair("MoRIIOConnector", pk=_MORIIO_HTTP.format(port=8100))
    assert sev(text, "OPD601", "0.13") and not sev(text, "OPD601", "0.18")


# --- OPD607: NIXL with prefill TP > decode TP needs equal block sizes (vLLM 0.18.0-0.34.0) --------

_TP = ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
       "  - {{stage_id: 0, devices: \"0,1\", tensor_parallel_size: 2, block_size: 16, kv_transfer_config: "
       "{{kv_connector: NixlConnector, kv_role: kv_producer, engine_id: p0}}}}\n"
       "  - {{stage_id: 1, devices: \"{dd}\", tensor_parallel_size: {dtp}, block_size: 32, env: {{VLLM_NIXL_SIDE_CHANNEL_PORT: \"5700\"}}, "
       "kv_transfer_config: {{kv_connector: NixlConnector, kv_role: kv_consumer, engine_id: d0}}}}\n")
GQA = ModelInfo(num_kv_heads=8, attention="GQA")


def test_opd607_prefill_tp_above_decode_tp_needs_equal_block_sizes_from_0_18() -> None:
    text = _TP.format(dd="2", dtp=1)
    got = found(text, "OPD607", opts=ValidateOptions(vllm_version="0.18", model=GQA))
    assert [g[0] for g in got] == ["error"]
    assert got[0][1] == ("block_size 16 (prefill) and 32 (decode) with prefill TP 2 > decode TP 1: NixlConnector "
                         "needs equal block sizes when prefill TP is larger")
    assert sev(text, "OPD607", "0.34", model=GQA) == ["error"]
    # 0.13: prefill TP > decode TP is refused as a whole (OPD603), no block-size finding
    assert sev(text, "OPD607", "0.13", model=GQA) == []
    # unknown model: a warning (MLA is exempt)
    assert sev(text, "OPD607", "0.34") == ["warning"]
    # MLA: the replicated latent KV pairs at any block-size multiple
    assert sev(text, "OPD607", "0.34", model=ModelInfo(num_kv_heads=1, attention="MLA")) == []


def test_opd607_decode_tp_above_prefill_tp_keeps_the_multiple() -> None:
    text = _TP.format(dd="2,3,4,5", dtp=4)
    assert sev(text, "OPD607", "0.34", model=GQA) == []
