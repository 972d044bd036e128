"""What a new user hit in the first hour (issue 24): the thinker-only route and ``--pipeline``.

Item 1: ``expand --pipeline qwen3_omni_moe_thinker_only`` on the bundled three-stage preset
(or a copy of it under another name) splits the Thinker alone and the result validates and
plans a launch; ``--pipeline`` on a file whose ``pipeline:`` key names another pipeline is a
usage error (exit 2) naming both, the same in expand, validate, graph and diff; a
``--pipeline`` whose stages the file does not fit is the input's error (exit 2), never
expand's OPD000 (exit 3).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from omni_pd.cli import main
from omni_pd.io import load_file, parse_text

ROOT = Path(__file__).resolve().parents[1]
PRESET = ROOT / "presets" / "qwen3_omni_moe.yaml"
THINKER_ONLY = "qwen3_omni_moe_thinker_only"

OPD905 = ("info[OPD905]: --pipeline qwen3_omni_moe_thinker_only: the Thinker (stage 0) alone is split; "
          "stages 1 (talker), 2 (code2wav) of qwen3_omni_moe are left out, with the connectors only they used\n")


def _run(capsys, *args: str) -> tuple[int, str, str]:
    rc = main([str(a) for a in args])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("src", ["bundled", "my_deploy.yaml"])
def test_thinker_only_route_expands_validates_and_plans(tmp_path, capsys, src):
    inp = []
    if src != "bundled":
        shutil.copy(PRESET, tmp_path / src)
        inp = [tmp_path / src]
    out = tmp_path / "text_pd.yaml"
    rc, _, err = _run(capsys, "expand", *inp, "--pipeline", THINKER_ONLY, "-o", out)
    assert rc == 0, err
    assert err.startswith(OPD905)
    assert f"wrote {out} (qwen3_omni_moe_thinker_only_pd, 2 stages)\n" in err
    tree = load_file(out).tree
    assert tree["pipeline"] == "qwen3_omni_moe_thinker_only_pd"
    assert [s["stage_id"] for s in tree["stages"]] == [0, 1]
    assert [s["kv_transfer_config"]["kv_role"] for s in tree["stages"]] == ["kv_producer", "kv_consumer"]
    # the Talker/Code2Wav shared-memory connector and the musa overlay (audio stages only) went with them
    assert "connectors" not in tree
    assert sorted(tree["platforms"]) == ["cuda", "npu", "xpu"]
    assert all(s["stage_id"] in (0, 1) for p in tree["platforms"].values() for s in p["stages"])
    assert [dict(e) for e in tree["edges"]] == [{"from": 0, "to": 1}]
    text = out.read_text()
    assert "talker" not in text.split("# Notes from the input follow")[1].split("stages:")[1]
    rc, vout, _ = _run(capsys, "validate", out, "--all-platforms")
    assert (rc, vout) == (0, f"{out}: ok (0 errors, 0 warnings, 0 info)\n")
    rc, pout, perr = _run(capsys, "launch", out, "--model", "m", "--dry-run", "--format", "json",
                          "--vllm", "/nonexistent/vllm")
    assert rc == 0, perr
    plan = json.loads(pout)
    assert plan["runtime"] == "vllm"
    assert [(p["name"], p["role"]) for p in plan["processes"]] == [
        ("prefill-0", "prefill"), ("decode-0", "decode"), ("router", "router")]


def test_thinker_only_diagnostics_point_at_the_input_lines(tmp_path):
    """The narrowed document keeps the input's line positions (a located finding names a
    line the user can open)."""
    from omni_pd.compile.expand import _thinker_only

    doc = load_file(PRESET)
    narrowed, notes = _thinker_only(doc, THINKER_ONLY, None)
    assert [s["stage_id"] for s in narrowed.tree["stages"]] == [0]
    assert [s["stage_id"] for s in doc.tree["stages"]] == [0, 1, 2]  # the input is not modified
    line = narrowed.loc(("stages", 0, "devices"), value=True).line
    assert doc.line_text(line).strip() == 'devices: "0"'
    assert notes[0].location.line == doc.loc(("stages",)).line


def test_thinker_only_route_is_not_taken_for_other_pipelines(tmp_path, capsys):
    """A pipeline that is not the file's thinker-only variant keeps the file's stages: the
    stages it lacks are the input's error (exit 2, located in the input), not OPD000."""
    shutil.copy(PRESET, tmp_path / "my_deploy.yaml")
    rc, out, err = _run(capsys, "expand", tmp_path / "my_deploy.yaml", "--pipeline", "llm")
    assert (rc, out) == (2, "")
    assert "OPD000" not in err
    assert [ln for ln in err.splitlines() if ln.startswith(("error", "expand:"))] == [
        "error[OPD202]: stage_id 1 is not a stage of pipeline llm (stages 0)",
        "error[OPD202]: stage_id 2 is not a stage of pipeline llm (stages 0)",
        f"expand: {tmp_path / 'my_deploy.yaml'} already has these errors "
        f"(`omni-pd validate {tmp_path / 'my_deploy.yaml'} --pipeline llm`); fix them first, nothing was written"]
    assert f"--> {tmp_path / 'my_deploy.yaml'}:29:15" in err


def _named(tmp_path: Path) -> Path:
    p = tmp_path / "named.yaml"
    p.write_text("pipeline: qwen3_omni_moe\n" + PRESET.read_text())
    return p


def _clash(name: Path, asked: str) -> str:
    return (f"error[OPD006]: --pipeline {asked}: the file names pipeline `qwen3_omni_moe`\n"
            f" --> {name}:1:11\n"
            "  |\n"
            "1 | pipeline: qwen3_omni_moe\n"
            "  |           ^^^^^^^^^^^^^^\n"
            "  = help: --pipeline only names the pipeline of a file without a `pipeline:` key; drop --pipeline "
            f"to use `qwen3_omni_moe`, or change the file's `pipeline:` to `{asked}`\n")


@pytest.mark.parametrize("cmd", ["expand", "validate", "graph", "diff"])
def test_pipeline_option_against_the_files_own_key_is_a_usage_error(tmp_path, capsys, cmd):
    named = _named(tmp_path)
    split = tmp_path / "split.yaml"
    assert main(["expand", str(named), "-q", "-o", str(split)]) == 0
    capsys.readouterr()
    args = [named] + ([split] if cmd == "diff" else [])
    # expand takes `<its pipeline>_thinker_only` as the text route (it narrows the file: OPD905,
    # tests/test_first_hour_expand_options.py); another pipeline is a clash for every command
    asked = "qwen2_5_omni" if cmd == "expand" else THINKER_ONLY
    rc, out, err = _run(capsys, cmd, *args, "--pipeline", asked)
    assert (rc, out) == (2, "")
    assert err == _clash(named, asked)
    # the same name as the file's is no conflict
    rc, _, err = _run(capsys, cmd, *args, "--pipeline", "qwen3_omni_moe", *(["-q"] if cmd == "expand" else []))
    assert rc in (0, 1) and "OPD006" not in err


def test_many_files_validate_reports_the_clash_for_the_file_that_has_it(tmp_path, capsys):
    named = _named(tmp_path)
    plain = tmp_path / "plain.yaml"
    plain.write_text("stages:\n  - stage_id: 0\n    devices: \"0\"\n")
    rc, out, err = _run(capsys, "validate", named, plain, "--pipeline", "llm")
    assert rc == 2
    assert _clash(named, "llm") in out + err
    assert "plain.yaml" not in err


def test_library_callers_get_the_same_error():
    from omni_pd.check.validate import ValidateOptions, validate_document
    from omni_pd.diagnostics import OmniPdError

    doc = parse_text("pipeline: llm\nstages:\n  - stage_id: 0\n", "x.yaml")
    with pytest.raises(OmniPdError) as e:
        validate_document(doc, ValidateOptions(pipeline="qwen3_omni_moe"))
    assert (e.value.diagnostic.code, e.value.exit_code, e.value.diagnostic.message) == (
        "OPD006", 2, "--pipeline qwen3_omni_moe: the file names pipeline `llm`")
    assert validate_document(doc, ValidateOptions(pipeline="llm")).errors == []
