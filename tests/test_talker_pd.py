"""OPD704: `expand` and `validate` warn that vllm-omni 0.30's Talker gets no prompt rows under PD.

The verdict itself is proven from vllm-omni's code in tests/test_oracle_talker_pd.py (oracle
venv); here: which pipelines the warning covers, where it points, and that the CLI shows it
without failing (text answers are unaffected, so it is a warning, not an error).
"""

from __future__ import annotations

import pytest

from omni_pd.check.validate import validate_text
from omni_pd.cli import main
from omni_pd.compile.expand import expand_document
from omni_pd.compile.pipelines import load_catalogue
from omni_pd.diagnostics import Severity
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


def test_expand_of_the_qwen3_preset_warns_at_the_talker_entry():
    text = preset_path("qwen3_omni_moe").read_text()
    res = expand_document(parse_text(text, "qwen3_omni_moe.yaml"))
    [d] = _704(res.diagnostics)
    assert d.severity is Severity.WARNING
    assert d.message == ("the Talker (stage 2) is conditioned by the PD decode stage 1, which computes no prompt rows: "
                         "on vllm-omni 0.30.0 audio answers fail or are conditioned on the wrong rows")
    talker_line = next(i for i, line in enumerate(text.splitlines(), 1) if "stage_id: 1" in line)
    assert (d.location.file, d.location.line) == ("qwen3_omni_moe.yaml", talker_line)
    assert "thinker_only_pd" in d.help and d.notes == list(talker_pd.NOTES)


def test_expand_of_qwen2_5_warns_at_its_pipeline_key():
    res = expand_document(parse_text("pipeline: qwen2_5_omni\n" + QWEN25, "q25.yaml"))
    [d] = _704(res.diagnostics)
    assert (d.location.line, d.location.column) == (1, 11)
    assert "stage 2" in d.message and "decode stage 1" in d.message


def test_expand_of_a_thinker_only_pipeline_does_not_warn():
    res = expand_document(parse_text("pipeline: qwen3_omni_moe_thinker_only\nstages:\n  - {stage_id: 0, devices: \"0\"}\n",
                                     "t.yaml"))
    assert _704(res.diagnostics) == []


def test_validate_of_the_expanded_preset_warns_once_with_the_talker_related():
    out = expand_document(parse_text(preset_path("qwen3_omni_moe").read_text(), "qwen3_omni_moe.yaml")).text
    res = validate_text(out, "pd.yaml")
    [d] = _704(res.diagnostics)
    pipeline_line = next(i for i, line in enumerate(out.splitlines(), 1) if line.startswith("pipeline:"))
    assert (d.location.line, d.location.column) == (pipeline_line, 11)
    [rel] = d.related
    assert rel.label == "Talker" and out.splitlines()[rel.line - 1].strip().startswith("- stage_id: 2")
    assert not res.errors


def test_validate_all_platforms_reports_it_once():
    out = expand_document(parse_text(preset_path("qwen3_omni_moe").read_text(), "qwen3_omni_moe.yaml")).text
    from omni_pd.check.validate import ValidateOptions

    res = validate_text(out, "pd.yaml", ValidateOptions(all_platforms=True))
    assert len(_704(res.diagnostics)) == 1


def test_cli_expand_and_validate_show_the_warning_and_exit_0(tmp_path, capsys):
    dst = tmp_path / "pd.yaml"
    assert main(["expand", "-o", str(dst)]) == 0
    assert "warning[OPD704]" in capsys.readouterr().err
    assert main(["validate", str(dst)]) == 0
    out = capsys.readouterr()
    assert "warning[OPD704]" in out.out + out.err
    assert main(["explain", "OPD704"]) == 0
    assert "talker-pd-conditioning (warning, runtime)" in capsys.readouterr().out
