"""OPD704: where omni-pd's vllm-omni compatibility layer cannot hand the Talker prefill's rows, it is an error.

The fault and the fix are proven from vllm-omni's code in tests/test_oracle_talker_pd.py
(oracle venv); here: which pipelines and releases the layer covers (read from
presets/targets/vllm_omni_compat.yaml), that a covered PD file is silent in `expand` and
`validate`, and that each way the layer cannot act (an uncovered release or pipeline, a
switch set to 0 in the launcher environment or the Talker stage's env) is an error at the
place the user fixes it, so the spoken answer is never silently wrong.
"""

from __future__ import annotations

import pytest

from omni_pd.check.validate import ValidateOptions, validate_text
from omni_pd.cli import main
from omni_pd.compile.expand import expand_document
from omni_pd.compile.pipelines import load_catalogue
from omni_pd.compile.targets import target
from omni_pd.diagnostics import OmniPdError, Severity
from omni_pd.io import parse_text
from omni_pd.resources import preset_path
from omni_pd.compile import talker_pd

QWEN25 = """async_chunk: false
stages:
  - {stage_id: 0, devices: "0"}
  - {stage_id: 1, devices: "1"}
  - {stage_id: 2, devices: "0"}
"""


@pytest.mark.parametrize("name,want", [
    ("qwen3_omni_moe_pd", (1, 2)), ("qwen2_5_omni_pd", (1, 2)),
    ("qwen3_omni_moe_thinker_only_pd", None), ("qwen2_5_omni_thinker_only_pd", None), ("llm_pd", None),
    ("qwen3_omni_moe", None),  # not PD
])
def test_talker_after_decode_on_the_catalogue(name, want):
    found = talker_pd.talker_after_decode(load_catalogue().get(name))
    assert (None if found is None else (found[0].stage_id, found[1].stage_id)) == want
    if found is not None:
        assert (found[0].pd_role, found[1].role) == ("decode", "talker")


def _704(diags):
    return [d for d in diags if d.code == "OPD704"]


def pd_text(**opts):
    return expand_document(parse_text(preset_path("qwen3_omni_moe").read_text(), "qwen3_omni_moe.yaml"),
                           **opts).text


def with_talker_env(text, var, value="0"):
    """The expanded file with ``env: {var: value}`` on the Talker's entry (stage 2)."""
    lines = text.splitlines()
    i = next(i for i, line in enumerate(lines) if line.strip().startswith("- stage_id: 2"))
    indent = lines[i].index("-") + 2
    lines[i + 1:i + 1] = [" " * indent + "env:", " " * indent + f"  {var}: \"{value}\""]
    return "\n".join(lines) + "\n", i + 3


def test_the_layer_covers_qwen3_omni_on_0_30_and_nothing_else():
    assert talker_pd.covered_pipelines("0.30") == ("qwen3_omni_moe_pd",)
    assert talker_pd.covered("0.30", "qwen3_omni_moe_pd") and not talker_pd.covered("0.30", "qwen2_5_omni_pd")
    assert talker_pd.covered_pipelines("0.28") == ()
    # vLLM 0.31-0.33 have no vllm-omni release of their own: 0.30's facts (and layer) apply
    assert [talker_pd.omni_release(target(v)) for v in ("0.13", "0.14", "0.29", "0.30", "0.33")] == [
        None, "0.14", "0.28", "0.30", "0.30"]


def test_expand_and_validate_of_the_qwen3_preset_are_silent_where_the_layer_covers_it():
    res = expand_document(parse_text(preset_path("qwen3_omni_moe").read_text(), "qwen3_omni_moe.yaml"))
    assert _704(res.diagnostics) == []
    assert _704(validate_text(res.text, "pd.yaml").diagnostics) == []
    assert _704(validate_text(res.text, "pd.yaml", ValidateOptions(vllm_version="0.32")).diagnostics) == []


def test_expand_of_qwen2_5_is_refused_at_its_pipeline_key():
    with pytest.raises(OmniPdError) as e:
        expand_document(parse_text("pipeline: qwen2_5_omni\n" + QWEN25, "q25.yaml"))
    d = e.value.diagnostic
    assert (d.code, d.severity, d.location.line, d.location.column) == ("OPD704", Severity.ERROR, 1, 11)
    assert d.message == (
        "the Talker (stage 2) is conditioned by the PD decode stage 1, which computes no prompt rows, and omni-pd's "
        "compatibility layer fixes the Talker handoff for qwen3_omni_moe_pd only (qwen2_5_omni_pd: the decode engine "
        "withholds or shifts the Talker's payload): audio answers fail or are conditioned on the wrong rows")
    assert d.help.endswith("for text only: `omni-pd expand <three-stage file> --pipeline qwen2_5_omni_thinker_only` (the Thinker alone as a PD pair)")
    assert d.notes == list(talker_pd.NOTES)


def test_expand_for_a_release_the_layer_does_not_cover_is_refused():
    text = preset_path("qwen3_omni_moe").read_text()
    with pytest.raises(OmniPdError) as e:
        expand_document(parse_text(text, "qwen3_omni_moe.yaml"), vllm_version="0.28")
    d = e.value.diagnostic
    assert "does not cover the Talker handoff on vllm-omni 0.28" in d.message and d.severity is Severity.ERROR
    assert d.help.startswith("target a release it covers (`--vllm-version 0.30`)")
    talker_line = next(i for i, line in enumerate(text.splitlines(), 1) if "stage_id: 1" in line)
    assert (d.location.file, d.location.line) == ("qwen3_omni_moe.yaml", talker_line)


def test_expand_of_a_thinker_only_pipeline_is_silent_at_any_release():
    src = "pipeline: qwen3_omni_moe_thinker_only\nstages:\n  - {stage_id: 0, devices: \"0\"}\n"
    for v in (None, "0.28"):
        assert _704(expand_document(parse_text(src, "t.yaml"), vllm_version=v).diagnostics) == []


@pytest.mark.parametrize("var", talker_pd.SWITCHES)
def test_validate_errors_at_the_talkers_env_entry_when_the_layer_is_off_there(var):
    text, line = with_talker_env(pd_text(), var)
    res = validate_text(text, "pd.yaml")
    [d] = _704(res.diagnostics)
    assert (d.severity, d.location.line) == (Severity.ERROR, line)
    assert d.message.endswith(f"and omni-pd's compatibility layer is switched off in the Talker stage's env "
                              f"({var}=0): audio answers fail or are conditioned on the wrong rows")
    assert d.help.startswith(f"remove {var} from the Talker stage's env")
    [rel] = d.related
    assert rel.label == "Talker"
    assert res.errors  # validate fails: the spoken answer would be wrong


def test_a_switch_in_another_stages_env_changes_nothing_the_talker_reads():
    text = pd_text().replace("- stage_id: 3   # code2wav\n",
                             "- stage_id: 3   # code2wav\n    env:\n      OMNI_PD_VLLM_OMNI_COMPAT: \"0\"\n", 1)
    assert "OMNI_PD_VLLM_OMNI_COMPAT" in text
    assert _704(validate_text(text, "pd.yaml").diagnostics) == []
    on, _ = with_talker_env(pd_text(), "OMNI_PD_VLLM_OMNI_TALKER_PD", "1")
    assert _704(validate_text(on, "pd.yaml").diagnostics) == []


def test_validate_errors_at_the_pipeline_when_the_launcher_environment_switches_it_off():
    out = pd_text()
    res = validate_text(out, "pd.yaml", ValidateOptions(env={"OMNI_PD_VLLM_OMNI_COMPAT": "off"}))
    [d] = _704(res.diagnostics)
    pipeline_line = next(i for i, line in enumerate(out.splitlines(), 1) if line.startswith("pipeline:"))
    assert (d.severity, d.location.line, d.location.column) == (Severity.ERROR, pipeline_line, 11)
    assert "switched off in the launcher environment (OMNI_PD_VLLM_OMNI_COMPAT=off)" in d.message


def test_validate_of_an_uncovered_release_errors_once_under_all_platforms():
    res = validate_text(pd_text(), "pd.yaml", ValidateOptions(all_platforms=True, vllm_version="0.28"))
    [d] = _704(res.diagnostics)
    assert d.severity is Severity.ERROR and "vllm-omni 0.28" in d.message


def test_cli_expand_and_validate_are_clean_and_explain_says_error(tmp_path, capsys):
    dst = tmp_path / "pd.yaml"
    assert main(["expand", "-o", str(dst)]) == 0
    assert "OPD704" not in capsys.readouterr().err
    assert main(["validate", str(dst)]) == 0
    out = capsys.readouterr()
    assert "OPD704" not in out.out + out.err
    assert main(["explain", "OPD704"]) == 0
    assert "talker-pd-conditioning (error, runtime)" in capsys.readouterr().out


def test_a_release_that_merges_by_itself_is_covered_without_the_patches(monkeypatch):
    table = {"versions": {"0.32": {"patches": ["pd_detect"], "talker_fixed_upstream": ["qwen2_5_omni_pd"]},
                          "0.34": {"patches": ["pd_prefill_rows"], "talker_pipelines": ["qwen3_omni_moe_pd"]}}}
    monkeypatch.setattr(talker_pd, "compat_table", lambda: table)
    assert talker_pd.covered_pipelines("0.32") == ("qwen2_5_omni_pd",)
    assert talker_pd.covered_pipelines("0.34") == ()  # listed, but not every Talker patch is
