"""OPD622 known-broken-combination and its table presets/targets/known_broken.yaml (issue 22, BR-54)."""

from __future__ import annotations

from omni_pd.check.rules.known_broken import table
from omni_pd.check.validate import ValidateOptions, validate_text
from omni_pd.compile.targets import parse_version
from omni_pd.diagnostics import Severity

PAIR = ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
        "  - stage_id: 0\n    devices: \"0,1,2,3\"\n    data_parallel_size: 4\n{p}"
        "    kv_transfer_config: {{kv_connector: MooncakeConnector, kv_role: kv_producer, engine_id: p0}}\n"
        "  - stage_id: 1\n    devices: \"4\"\n"
        "    kv_transfer_config: {{kv_connector: MooncakeConnector, kv_role: kv_consumer, engine_id: d0}}\n")
LB = "    data_parallel_multi_port_external_lb: true\n"


def _hits(p: str, **opts):
    res = validate_text(PAIR.format(p=p), "pair.yaml", ValidateOptions(**opts))
    return [d for d in res.diagnostics if d.code == "OPD622"]


def test_mooncake_prefill_dp_external_lb_exact() -> None:
    hits = _hits(LB + "    env: {VLLM_MOONCAKE_BOOTSTRAP_PORT: \"9100\"}\n", vllm_version="0.30")
    assert [(h.severity, h.message) for h in hits] == [(
        Severity.ERROR, "MooncakeConnector prefill with data_parallel_size 4 and data_parallel_multi_port_external_lb: "
        "every DP engine reads the same VLLM_MOONCAKE_BOOTSTRAP_PORT (9100) and registers as dp_rank 0 (vllm#51531: "
        "\"Engine ID mismatch for dp_rank=0\", then \"address already in use\") on vLLM 0.30; fix pending vllm#51532 (open)")]
    assert (hits[0].location.line, hits[0].location.column) == (7, 43)
    assert hits[0].help.startswith("use internal or hybrid DP load balancing")


def test_default_port_and_the_passing_shapes() -> None:
    assert "(8998)" in _hits(LB)[0].message
    assert _hits("") == []
    assert _hits("    data_parallel_multi_port_external_lb: false\n") == []
    assert _hits(LB, vllm_version="0.11") == []  # MooncakeConnector is not in vLLM 0.11 (row since 0.13)


def test_cli_flag_counts() -> None:
    assert len(_hits("", cli={"data_parallel_multi_port_external_lb": True})) == 1


def test_rows_are_complete() -> None:
    for row in table():
        assert {"id", "label", "connectors", "side", "when", "since", "at", "message", "help", "sources"} <= set(row), row
        parse_version(row["since"])
        assert row["side"] in ("prefill", "decode", "any") and row["sources"]
