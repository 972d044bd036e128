"""OPD313 pd-model-identity: exact messages and locations (issue 22, BR-45)."""

from __future__ import annotations

from omni_pd.check.validate import ValidateOptions, validate_text
from omni_pd.check.context import ModelInfo
from omni_pd.diagnostics import Severity

PAIR = ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
        "  - stage_id: 0\n    devices: \"0\"\n{p}"
        "    kv_transfer_config: {{kv_connector: MooncakeConnector, kv_role: kv_producer, engine_id: p0}}\n"
        "  - stage_id: 1\n    devices: \"1\"\n{d}"
        "    kv_transfer_config: {{kv_connector: MooncakeConnector, kv_role: kv_consumer, engine_id: d0}}\n")


def _hits(p: str = "", d: str = "", top: str = "", **opts):
    res = validate_text(top + PAIR.format(p=p, d=d), "pair.yaml", ValidateOptions(**opts))
    return [x for x in res.diagnostics if x.code == "OPD313"]


def test_revisions_differ_error_at_decode_key_naming_prefill() -> None:
    hits = _hits("    revision: 3f2b1c0e9d8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c\n",
                 "    revision: a1b2c3d4e5f60718293a4b5c6d7e8f9012345678\n")
    assert [(h.severity, h.message) for h in hits] == [(
        Severity.ERROR, "prefill (stage 0) and decode (stage 1) load different model revisions (3f2b1c0 / a1b2c3d): "
        "the KV handshake does not compare them, decode would continue from KV computed by other weights or token ids")]
    h = hits[0]
    assert (h.location.line, h.location.column) == (10, 15)  # decode's revision value
    assert [(r.line, r.label) for r in h.related] == [(6, "prefill (stage 0) uses 3f2b1c0")]
    assert h.help == ("write the same `revision` on both stages of the PD pair "
                      "(`revision: a1b2c3d4e5f60718293a4b5c6d7e8f9012345678` on prefill too, or drop it from both)")


def test_equal_or_default_equivalent_values_pass() -> None:
    rev = "    revision: 3f2b1c0\n"
    assert _hits(rev, rev) == []
    assert _hits("    revision: main\n") == []  # main is what an unset revision loads
    assert _hits("    dtype: half\n", "    dtype: float16\n") == []
    assert _hits("    tokenizer_revision: abc\n    revision: abc\n", "    revision: abc\n") == []  # tokenizer_revision -> revision
    assert _hits() == []


def test_one_side_pinned_against_the_default_branch() -> None:
    hits = _hits("", "    code_revision: 0123abc\n")
    assert [(h.severity, h.location.line) for h in hits] == [(Severity.ERROR, 9)]
    assert "(main / 0123abc)" in hits[0].message and "code revisions" in hits[0].message


def test_dtype_against_auto_needs_the_checkpoint_dtype() -> None:
    hits = _hits("    dtype: bfloat16\n")
    assert [(h.severity, h.message) for h in hits] == [(
        Severity.WARNING, "prefill (stage 0) sets dtype bfloat16, decode (stage 1) uses auto (the checkpoint's dtype): "
        "they load the same weight dtype only if that is bfloat16")]
    assert hits[0].location.line == 6
    assert _hits("    dtype: bfloat16\n", model=ModelInfo(torch_dtype="bfloat16")) == []
    hits = _hits("    dtype: bfloat16\n", model=ModelInfo(torch_dtype="float16"))
    assert [h.severity for h in hits] == [Severity.ERROR] and "(bfloat16 / float16)" in hits[0].message


def test_quantization_resolved_from_model_info() -> None:
    fp8 = ModelInfo.from_config_json({"model_type": "qwen3", "quantization_config": {"quant_method": "fp8"}})
    plain = ModelInfo.from_config_json({"model_type": "qwen3"})
    assert _hits("    quantization: fp8\n", model=fp8) == []
    hits = _hits("    quantization: fp8\n", model=plain)
    assert [h.severity for h in hits] == [Severity.ERROR] and "(fp8 / none)" in hits[0].message


def test_pipeline_wide_key_against_a_stage_override_located_at_the_stage() -> None:
    hits = _hits("", "    quantization: awq\n", top="quantization: fp8\n")
    assert len(hits) == 1 and "(fp8 / awq)" in hits[0].message
    assert hits[0].location.line == 10  # decode's own key (the file has one extra top line)


def test_kv_cache_dtype_is_left_to_opd605() -> None:
    res = validate_text(PAIR.format(p="    kv_cache_dtype: fp8\n", d=""), "pair.yaml", ValidateOptions())
    assert "OPD605" in res.codes() and "OPD313" not in res.codes()
