"""OPD621 hybrid-state-transfer and its table presets/targets/hybrid_kv.yaml (issue 22, BR-46/BR-47)."""

from __future__ import annotations

import pytest

from omni_pd.check.context import ModelInfo
from omni_pd.check.rules.hybrid_state import connector_row, hma_mode, state_kind, table
from omni_pd.check.validate import ValidateOptions, validate_text
from omni_pd.compile.targets import parse_version, target
from omni_pd.diagnostics import Severity

QWEN35 = ModelInfo.from_config_json({"model_type": "qwen3_5_moe", "text_config": {
    "model_type": "qwen3_5_moe_text", "num_key_value_heads": 2,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"]}})
PAIR = ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
        "  - stage_id: 0\n    devices: \"0\"\n{p}"
        "    kv_transfer_config: {{kv_connector: {c}, kv_role: kv_producer, engine_id: p0}}\n"
        "  - stage_id: 1\n    devices: \"1\"\n{d}"
        "    kv_transfer_config: {{kv_connector: {c}, kv_role: kv_consumer, engine_id: d0}}\n")
OFF = "    disable_hybrid_kv_cache_manager: false\n"


def _hits(version: str, c: str = "MooncakeConnector", p: str = "", d: str = "", model: ModelInfo = QWEN35):
    res = validate_text(PAIR.format(c=c, p=p, d=d), "pair.yaml", ValidateOptions(vllm_version=version, model=model))
    return [x for x in res.diagnostics if x.code == "OPD621"]


def test_state_kind_from_config_json() -> None:
    assert state_kind(QWEN35) == ("gdn", "layer_types has linear_attention")
    assert state_kind(ModelInfo.from_config_json({"model_type": "nemotron_h", "hybrid_override_pattern": "M-M*-"})) == \
        ("mamba", "the layer pattern has Mamba2 layers")
    assert state_kind(ModelInfo.from_config_json({"model_type": "jamba"})) == ("mamba", "model_type jamba")
    # sliding window + full attention is hybrid attention, not state
    gemma = ModelInfo.from_config_json({"model_type": "gemma3_text", "layer_types": ["sliding_attention", "full_attention"]})
    assert gemma.is_hybrid and state_kind(gemma) is None
    # linear_attention outside the GDN model types is another kind of state
    assert state_kind(ModelInfo.from_config_json({"model_type": "bailing_moe_linear",
                                                  "layer_types": ["linear_attention", "full_attention"]}))[0] == "other"


def test_mooncake_before_gdn_support_is_an_error_at_the_connector() -> None:
    hits = _hits("0.21")
    assert [(h.severity, h.message) for h in hits] == [(
        Severity.ERROR, "MooncakeConnector on vLLM 0.21 cannot transfer the GDN (linear-attention) state groups of a "
        "hybrid model (layer_types has linear_attention) (takes the attention backend of the first layer and treats "
        "every region as one homogeneous paged KV cache)")]
    assert hits[0].location.line == 6 and hits[0].help.startswith(
        "the state transfer arrives with vllm#46807 (Mooncake GDN support, merged 2026-06-26): upgrade")
    assert "source: https://github.com/vllm-project/vllm/pull/46807" in " ".join(hits[0].notes)


def test_mooncake_030_keeps_hma_on_and_passes() -> None:
    assert _hits("0.30") == []
    assert _hits("0.30", p=OFF, d=OFF) == []


def test_hma_forced_off_on_020_is_folded_into_the_connector_error() -> None:
    hits = _hits("0.20", c="NixlConnector")
    assert len(hits) == 1 and hits[0].message.endswith(
        "and vLLM 0.20 turns the hybrid KV cache manager off because kv_transfer_config is set, so the Mamba and "
        "attention specs cannot be unified (EngineCore ValueError at start on both stages)")
    assert hits[0].help.endswith("then set disable_hybrid_kv_cache_manager: false on both stages")


def test_hma_forced_off_with_a_connector_that_moves_the_state() -> None:
    # NIXL moves Mamba state where the release is not pinned; the forced-off HMA is the error, per stage
    nemo = ModelInfo.from_config_json({"model_type": "nemotron_h", "hybrid_override_pattern": "M*"})
    hits = _hits("0.20", c="NixlConnector", p=OFF, model=nemo)
    errors = [h for h in hits if h.severity is Severity.ERROR]
    assert [h.message.split(":")[0] for h in errors] == ["stage 1"]
    assert errors[0].location.line == 10
    assert [h.severity for h in hits if h is not errors[0]] == [Severity.INFO]  # Mamba on NIXL 0.20: not pinned


def test_explicit_true_is_an_error_at_each_key() -> None:
    on = "    disable_hybrid_kv_cache_manager: true\n"
    hits = _hits("0.30", p=on, d=on)
    assert [(h.severity, h.location.line, h.location.column) for h in hits] == [
        (Severity.ERROR, 6, 38), (Severity.ERROR, 10, 38)]
    assert hits[0].message == ("stage 0: disable_hybrid_kv_cache_manager: true with a hybrid GDN (linear-attention) "
                               "model (layer_types has linear_attention): vLLM cannot unify its KV specs and stops at start")


def test_multiconnector_child_without_hma() -> None:
    multi = ("{kv_connector: MultiConnector, kv_role: kv_producer, kv_connector_extra_config: {connectors: "
             "[{kv_connector: NixlConnector, kv_role: kv_producer}, {kv_connector: LMCacheConnectorV1, kv_role: kv_producer}]}}")
    text = PAIR.format(c="NixlConnector", p="", d="").replace(
        "{kv_connector: NixlConnector, kv_role: kv_producer, engine_id: p0}", multi)
    res = validate_text(text, "pair.yaml", ValidateOptions(vllm_version="0.30", model=QWEN35))
    hits = [h for h in res.diagnostics if h.code == "OPD621"]
    assert [h.severity for h in hits] == [Severity.ERROR] and hits[0].message.startswith("LMCacheConnectorV1 on vLLM 0.30")


def test_no_model_info_or_no_state_model_no_finding() -> None:
    assert _hits("0.21", model=None) == []
    assert _hits("0.21", model=ModelInfo.from_config_json({"model_type": "qwen3", "num_key_value_heads": 8})) == []


def test_table_rows_are_sorted_sourced_and_name_registered_connectors() -> None:
    t = table()
    for name, rows in t["connectors"].items():
        if isinstance(rows, dict):
            assert rows["same_as"] in t["connectors"], name
            continue
        since = [parse_version(r["since"]) for r in rows]
        assert since == sorted(since), name
        for row in rows:
            assert set(row) <= {"since", "gdn", "mamba", "other", "why", "fix", "sources"}, (name, row)
            assert all(row.get(k) in (True, False, None) for k in ("gdn", "mamba", "other")), (name, row)
            assert row["sources"], (name, row)
            # the connector is registered in vLLM at that release (presets/targets/vllm.yaml)
            assert name in target(row["since"]).connectors(), (name, row["since"])
    assert [m for m, _ in [(hma_mode(parse_version(v))) for v in ("0.20", "0.26", "0.30")]] == ["forced_off", None, "auto"]
    assert connector_row("NixlPullConnector", (0, 30)) is connector_row("NixlConnector", (0, 30))


@pytest.mark.parametrize(("version", "c", "verdict"), [("0.21", "NixlConnector", False), ("0.30", "NixlConnector", True),
                                                       ("0.24", "MooncakeConnector", False), ("0.27", "MooncakeConnector", None),
                                                       ("0.30", "MoRIIOConnector", False)])
def test_gdn_rows(version: str, c: str, verdict: bool | None) -> None:
    assert connector_row(c, parse_version(version))["gdn"] is verdict
