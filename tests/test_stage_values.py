"""OPD114 and the loader facts validate now holds (issue 35, "validate ⊇ vllm-omni's loader").

Each value below was put to vllm-omni 0.30.0's own resolver (``python -m
omni_pd.upstream.vllm_oracle`` in the oracle venv, on the expanded preset with the value in
stage 1): ``max_num_seqs: "64"``, ``true`` and ``64.0`` load (pydantic's lax mode), ``64.5`` and
``max_model_len: "32k"`` are refused, ``enforce_eager: "yes"`` loads; ``devices: 1``,
``gpu_memory_utilization: 0``, ``stage_id: "1"`` and ``pipeline: qwen3_omni_pd`` are refused
(the last two at PD validation and at pipeline lookup). tests/test_oracle_differential.py
re-asks vllm-omni for a few hundred generated files in CI.
"""

from __future__ import annotations

import pytest

from omni_pd.check.rules.stage_values import lax_candidates, refusal, table
from omni_pd.check.validate import ValidateOptions, validate_text
from omni_pd.compile.expand import expand_document
from omni_pd.compile.passes.pd_split import ExpandOptions
from omni_pd.io import parse_text
from omni_pd.resources import preset_path


@pytest.fixture(scope="module")
def pd_text() -> str:
    src = preset_path("qwen3_omni_moe")
    return expand_document(parse_text(src.read_text(), src.name), ExpandOptions()).text


def _in_decode(text: str, old: str, new: str) -> str:
    i = text.index("stage_id: 1")
    j = text.index(old, i)
    return text[:j] + new + text[j + len(old):]


def errors(text: str, **opts) -> list[tuple[str, str]]:
    res = validate_text(text, "pd.yaml", ValidateOptions(**opts))
    return [(d.code, d.message) for d in res.diagnostics if d.severity.value == "error"]


@pytest.mark.parametrize("value, refused", [
    ('"64"', False), ("true", False), ("64.0", False), ("64.5", True), ("0", True), ("-1", True), ('"abc"', True)])
def test_max_num_seqs_is_judged_as_pydantic_lax_mode_does(pd_text, value, refused):
    found = errors(_in_decode(pd_text, "max_num_seqs: 64", f"max_num_seqs: {value}"))
    assert bool(found) is refused, found


def test_refusal_names_what_the_field_accepts(pd_text):
    assert refusal("gpu_memory_utilization", 0) == "the field accepts a number > 0.0, <= 1.0 or null"
    assert refusal("gpu_memory_utilization", 0.5) is None
    assert refusal("devices", 1) == "the field accepts a string or null"
    assert refusal("max_model_len", "32k") == "the field accepts an integer >= -1 or null"
    assert refusal("enforce_eager", "yes") is None
    assert refusal("kv_ip", None, "kv_transfer_config_fields") == "the field accepts a string"
    text = _in_decode(pd_text, 'kv_ip: "127.0.0.1"', "kv_ip: null")
    assert ("OPD114", "`kv_ip: null` is refused by vllm-omni (KVTransferConfig.kv_ip): the field accepts a string"
            ) in errors(text)
    assert refusal("not_a_field", object()) is None
    assert lax_candidates("16") == ["16", 16] and lax_candidates(True) == [True, 1]


def test_an_integer_device_gets_the_quoted_string_as_its_fix(pd_text):
    text = _in_decode(pd_text, 'devices: "1"', "devices: 1")
    res = validate_text(text, "pd.yaml")
    [d] = [d for d in res.diagnostics if d.code == "OPD114"]
    assert d.message == "`devices: 1` is refused by vllm-omni (OmniStageRuntimeConfig.devices): the field accepts a string or null"
    assert (d.edit.old, d.edit.new) == ("1", '"1"') and d.help == 'write a string or null for `devices`, e.g. "1"'
    assert "assumed: no --vllm-version given" in d.notes[0]


def test_every_release_is_judged_and_the_note_names_the_release_read(pd_text):
    text = _in_decode(pd_text, "max_num_seqs: 64", "max_num_seqs: 0")
    for version in ("0.24", "0.30", "0.34"):
        res = validate_text(text, "pd.yaml", ValidateOptions(vllm_version=version))
        [d] = [d for d in res.diagnostics if d.code == "OPD114"]
        assert d.notes[0].endswith(f"vLLM {version}, table read from vllm-omni 0.30.0")


def test_a_string_stage_id_is_one_error(pd_text):
    text = pd_text.replace("  - stage_id: 1  #", '  - stage_id: "1"  #', 1)
    assert errors(text) == [("OPD101", "`stage_id` must be an integer, found '1'")]


def test_a_pipeline_name_nobody_registers_is_an_error_with_the_nearest_name(pd_text):
    text = pd_text.replace("pipeline: qwen3_omni_moe_pd", "pipeline: qwen3_omni_pd", 1)
    res = validate_text(text, "pd.yaml")
    [d] = [d for d in res.diagnostics if d.code == "OPD207"]
    assert d.severity.value == "error" and "did you mean `qwen3_omni_moe_pd`?" in d.help
    assert (d.edit.old, d.edit.new) == ("qwen3_omni_pd", "qwen3_omni_moe_pd")
    # the rest is judged as the nearest catalogued pipeline: reversed roles still show (the walkthrough's g3.yaml)
    swapped = (text.replace("kv_role: kv_producer", "kv_role: KV_P").replace("kv_role: kv_consumer", "kv_role: kv_producer")
               .replace("kv_role: KV_P", "kv_role: kv_consumer"))
    assert [c for c, _ in errors(swapped)].count("OPD302") == 2
    # a pipeline vllm-omni registers that omni-pd does not catalogue stays an info
    assert "bagel" in table()["pipelines"]


def test_a_quoted_async_chunk_is_an_error_at_both_levels(pd_text):
    # vllm-omni 0.30 keeps the raw value and tests its truthiness (stage_config.py:
    # ``bool(deploy.async_chunk and stage.async_chunk is not False)``), so "false" streams; on the
    # Thinker-only PD pipeline, which has no async-chunk processor, it is refused at resolve
    # (found by tests/test_oracle_differential.py's type:async_chunk:str mutation).
    assert "async_chunk: true" in pd_text
    text = pd_text.replace("async_chunk: true", 'async_chunk: "false"', 1)
    assert errors(text) == [("OPD101", "`async_chunk` must be true or false, found 'false'")]
    text = _in_decode(pd_text, "devices:", 'async_chunk: "no"\n    devices:')
    assert errors(text) == [("OPD101", "`async_chunk` must be true or false, found 'no'")]


SAMPLES = [None, True, False, 0, 1, -1, 2, 0.0, 0.5, 1.0, 1.5, -0.1, 64, 64.5, "", "x", "auto", "16", "fp8", "fcfs",
           [], [1], ["a"], [1, "a"], {}, {"a": 1}, {"a": "b"}]


def test_the_evaluator_judges_as_jsonschema_over_the_whole_table():
    """:func:`accepts` is the jsonschema library's verdict on every field of the table for a spread
    of values (and the table uses no keyword it does not evaluate)."""
    import jsonschema

    from omni_pd.check.rules.stage_values import KEYWORDS, accepts

    n = 0
    for kind in ("fields", "kv_transfer_config_fields"):
        for name, row in table()[kind].items():
            schema = row["schema"]
            v = jsonschema.Draft202012Validator(schema)
            for value in SAMPLES + [e for s in [schema, *schema.get("anyOf", [])] for e in s.get("enum", [])]:
                assert accepts(schema, value) == v.is_valid(value), (name, schema, value)
                n += 1
    assert n > 5000
    with pytest.raises(ValueError):
        accepts({"pattern": "a+"}, "a")
    assert "anyOf" in KEYWORDS
