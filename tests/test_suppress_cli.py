"""``omni-pd validate`` suppressions end to end (issue 24, conventions): inline
``# omni-pd: ignore[...]`` comments, ``--select``/``--ignore``, ``[tool.omni-pd]`` in
``pyproject.toml`` / ``.omni-pd.toml`` found walking up; exact output and exit codes,
OPD009 for unused suppressions, parse errors never suppressed, and directives that survive
``expand``'s round trip and still act on its output."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from omni_pd.cli import main

#: two errors: OPD101 (line 3) and OPD103 (line 4), checked as the single-stage `llm` pipeline
BAD = ("stages:\n"
       "  - stage_id: 0\n"
       "    tensor_parallel_size: two{c3}\n"
       "    max_num_seqz: 4{c4}\n")

OPD101 = ("error[OPD101]: `tensor_parallel_size` must be an integer, found 'two'\n"
          " --> {f}:3:27\n"
          "  |\n"
          "3 |     tensor_parallel_size: two{c3}\n"
          "  |                           ^^^\n"
          "  = help: write an integer for `tensor_parallel_size`\n")
OPD103 = ("error[OPD103]: unknown stage key `max_num_seqz`: it becomes `--max-num-seqz` on the engine's `vllm serve` "
          "command line, which vLLM rejects\n"
          " --> {f}:4:5\n"
          "  |\n"
          "4 |     max_num_seqz: 4{c4}\n"
          "  |     ^^^^^^^^^^^^\n"
          "  = help: did you mean `max_num_seqs`?\n")


def _bad(c3: str = "", c4: str = "") -> str:
    return BAD.format(c3=c3, c4=c4)


def _run(cwd: Path, capsys, *args: str) -> tuple[int, str, str]:
    old = os.getcwd()
    os.chdir(cwd)
    try:
        rc = main(["validate", "--pipeline", "llm", *args])
    finally:
        os.chdir(old)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_without_suppression_both_errors_fail(tmp_path, capsys):
    (tmp_path / "a.yaml").write_text(_bad())
    rc, out, _ = _run(tmp_path, capsys, "a.yaml")
    assert rc == 1
    assert out == (OPD101.format(f="a.yaml", c3="") + "\n" + OPD103.format(f="a.yaml", c4="")
                   + "a.yaml: FAILED (2 errors, 0 warnings, 0 info)\n")


def test_inline_comments_by_code_and_by_rule_name_make_the_file_pass(tmp_path, capsys):
    (tmp_path / "a.yaml").write_text(_bad("  # omni-pd: ignore[OPD101]", "  # omni-pd: ignore[unknown-key] typo kept on purpose"))
    rc, out, err = _run(tmp_path, capsys, "a.yaml")
    assert (rc, out, err) == (0, "a.yaml: ok (0 errors, 0 warnings, 0 info; 2 suppressed)\n", "")


def test_comment_alone_on_the_line_before_and_several_codes(tmp_path, capsys):
    (tmp_path / "a.yaml").write_text("stages:\n  - stage_id: 0\n    # omni-pd: ignore[OPD101, OPD103]\n"
                                     "    tensor_parallel_size: two\n    max_num_seqz: 4\n")
    rc, out, _ = _run(tmp_path, capsys, "a.yaml")
    assert rc == 1  # the comment covers line 4 only: OPD103 on line 5 stays, and the OPD103 code is unused
    assert out == (
        "warning[OPD009]: unused suppression `OPD103`: no OPD103 finding on line 4\n"
        " --> a.yaml:3:31\n"
        "  |\n"
        "3 |     # omni-pd: ignore[OPD101, OPD103]\n"
        "  |                               ^^^^^^\n"
        "  = help: remove `OPD103` from the comment\n"
        "\n"
        "error[OPD103]: unknown stage key `max_num_seqz`: it becomes `--max-num-seqz` on the engine's `vllm serve` "
        "command line, which vLLM rejects\n"
        " --> a.yaml:5:5\n"
        "  |\n"
        "5 |     max_num_seqz: 4\n"
        "  |     ^^^^^^^^^^^^\n"
        "  = help: did you mean `max_num_seqs`?\n"
        "a.yaml: FAILED (1 error, 1 warning, 0 info; 1 suppressed)\n")


def test_unused_suppression_is_a_located_warning_and_exit_stays_0(tmp_path, capsys):
    (tmp_path / "a.yaml").write_text("stages:\n  - stage_id: 0\n    devices: \"0\"  # omni-pd: ignore[OPD403]\n")
    rc, out, _ = _run(tmp_path, capsys, "a.yaml")
    assert rc == 0
    assert out == ("warning[OPD009]: unused suppression `OPD403`: no OPD403 finding on line 3\n"
                   " --> a.yaml:3:37\n"
                   "  |\n"
                   "3 |     devices: \"0\"  # omni-pd: ignore[OPD403]\n"
                   "  |                                     ^^^^^^\n"
                   "  = help: remove `OPD403` from the comment\n"
                   "a.yaml: ok (0 errors, 1 warning, 0 info)\n")
    rc, out, _ = _run(tmp_path, capsys, "a.yaml", "--ignore", "unused-suppression")
    assert (rc, out) == (0, "a.yaml: ok (0 errors, 0 warnings, 0 info)\n")  # an OPD009 left out is not a finding hidden


def test_ignore_and_select_on_the_command_line(tmp_path, capsys):
    (tmp_path / "a.yaml").write_text(_bad())
    rc, out, _ = _run(tmp_path, capsys, "a.yaml", "--ignore", "OPD101,unknown-key")
    assert (rc, out) == (0, "a.yaml: ok (0 errors, 0 warnings, 0 info; 2 suppressed)\n")
    rc, out, _ = _run(tmp_path, capsys, "a.yaml", "--select", "OPD1", "--ignore", "OPD103")
    assert (rc, out) == (1, OPD101.format(f="a.yaml", c3="") + "a.yaml: FAILED (1 error, 0 warnings, 0 info; 1 suppressed)\n")
    rc, out, _ = _run(tmp_path, capsys, "a.yaml", "--select", "wrong-type", "--select", "OPD103")  # repeatable
    assert rc == 1 and out.endswith("a.yaml: FAILED (2 errors, 0 warnings, 0 info)\n")


@pytest.mark.parametrize("option", ["--select", "--ignore"])
def test_a_selector_that_names_no_code_is_a_usage_error(tmp_path, capsys, option):
    (tmp_path / "a.yaml").write_text(_bad())
    rc, out, err = _run(tmp_path, capsys, "a.yaml", option, "OPD101,OPD1x3")
    assert (rc, out) == (2, "")
    assert err == (f"error[OPD006]: {option} OPD1x3: names no code omni-pd knows\n"
                   "  = help: give codes (OPD704), code prefixes (OPD7), rule names (`omni-pd rules`) or ALL, "
                   "comma-separated\n")


def test_pyproject_table_found_walking_up_with_per_file_ignores(tmp_path, capsys):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n\n[tool.omni-pd]\nignore = ["OPD103"]\n'
                                             'per-file-ignores = { "configs/*.yaml" = ["wrong-type"] }\n')
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "a.yaml").write_text(_bad())
    (tmp_path / "b.yaml").write_text(_bad())
    rc, out, _ = _run(tmp_path / "configs", capsys, "a.yaml")  # from inside the sub-directory, too
    assert (rc, out) == (0, "a.yaml: ok (0 errors, 0 warnings, 0 info; 2 suppressed)\n")
    rc, out, _ = _run(tmp_path, capsys, "configs/a.yaml", "b.yaml")
    assert rc == 1
    assert out == ("configs/a.yaml: ok (0 errors, 0 warnings, 0 info; 2 suppressed)\n"
                   + OPD101.format(f="b.yaml", c3="") + "\n"
                   "b.yaml: FAILED (1 error, 0 warnings, 0 info; 1 suppressed)\n"
                   "validate: 2 files, 1 ok, 1 failed (1 error, 0 warnings, 0 info; 3 suppressed)\n")
    # --select on the command line replaces the config's selection (ruff's layering)
    rc, out, _ = _run(tmp_path, capsys, "b.yaml", "--select", "OPD103")
    assert rc == 1 and out.startswith("error[OPD103]") and out.endswith("(1 error, 0 warnings, 0 info; 1 suppressed)\n")


def test_the_closest_settings_file_wins_and_omni_pd_toml_beats_pyproject(tmp_path, capsys):
    (tmp_path / "pyproject.toml").write_text('[tool.omni-pd]\nignore = ["OPD101", "OPD103"]\n')
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "pyproject.toml").write_text('[project]\nname = "no table here"\n')  # passed over
    (sub / "a.yaml").write_text(_bad())
    rc, out, _ = _run(tmp_path, capsys, "sub/a.yaml")
    assert (rc, out) == (0, "sub/a.yaml: ok (0 errors, 0 warnings, 0 info; 2 suppressed)\n")
    (sub / ".omni-pd.toml").write_text('select = ["OPD103"]\n')
    (sub / "pyproject.toml").write_text('[tool.omni-pd]\nignore = ["OPD103"]\n')  # same directory: loses
    rc, out, _ = _run(tmp_path, capsys, "sub/a.yaml")
    assert (rc, out) == (1, OPD103.format(f="sub/a.yaml", c4="") + "sub/a.yaml: FAILED (1 error, 0 warnings, 0 info; 1 suppressed)\n")


@pytest.mark.parametrize("text, message, at, caret", [
    ('[tool.omni-pd]\nignor = ["OPD103"]\n', "pyproject.toml [tool.omni-pd]: unknown key `ignor`", "2:1", "^^^^^"),
    ('[tool.omni-pd]\nignore = ["OPD1x3"]\n', "pyproject.toml [tool.omni-pd]: `ignore` names no known code: OPD1x3",
     "2:11", "^^^^^^^^"),
    ('[tool.omni-pd]\nignore = "OPD103"\n', "pyproject.toml [tool.omni-pd]: `ignore` must be a list of codes or rule names",
     "2:1", "^^^^^^"),
    ('[tool.omni-pd]\nignore = ["OPD103"\nselect = []\n', "not valid TOML: Unclosed array", "3:1", "^^^^^^"),
])
def test_a_settings_file_omni_pd_cannot_use_stops_the_run_located(tmp_path, capsys, text, message, at, caret):
    (tmp_path / "pyproject.toml").write_text(text)
    (tmp_path / "a.yaml").write_text(_bad())
    rc, out, err = _run(tmp_path, capsys, "a.yaml")
    assert (rc, out) == (2, "")
    lines = err.splitlines()
    assert lines[0] == f"error[OPD006]: {message}"
    assert lines[1] == f" --> pyproject.toml:{at}"
    assert lines[4].strip() == "| " + " " * (int(at.split(":")[1]) - 1) + caret


def test_a_parse_error_cannot_be_suppressed(tmp_path, capsys):
    (tmp_path / "pyproject.toml").write_text('[tool.omni-pd]\nignore = ["ALL"]\n')
    (tmp_path / "a.yaml").write_text("stages: [  # omni-pd: ignore[OPD002]\n  - stage_id: 0\n")
    rc, out, err = _run(tmp_path, capsys, "a.yaml", "--ignore", "OPD002")
    assert rc == 2 and out == ""
    assert err.startswith("error[OPD002]: ")


def test_json_output_leaves_suppressed_findings_out(tmp_path, capsys):
    (tmp_path / "a.yaml").write_text(_bad("  # omni-pd: ignore[OPD101]"))
    rc, out, _ = _run(tmp_path, capsys, "a.yaml", "--format", "json")
    assert rc == 1
    assert [(d["code"], d["location"]["line"]) for d in json.loads(out)] == [("OPD103", 4)]


def test_directives_survive_expand_and_act_on_its_output(tmp_path, capsys):
    """A directive on the Thinker's ``min_tokens`` (OPD701 fires on the prefill stage only):
    in the three-stage input there is no prefill, so it is unused (OPD009); expand's round
    trip copies the comment onto the prefill and decode stages, where it hides prefill's
    OPD701 and is reported unused on decode."""
    from omni_pd.resources import preset_path

    text = Path(preset_path("qwen3_omni_moe")).read_text()
    marker = "      max_tokens: 2048\n"
    assert text.count(marker) == 1
    src = tmp_path / "qwen3_omni_moe.yaml"  # the file name tells validate and expand its pipeline
    src.write_text(text.replace(marker, marker + "      min_tokens: 4  # omni-pd: ignore[prefill-sampling]\n"))
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert main(["expand", "qwen3_omni_moe.yaml", "-o", "pd.yaml"]) == 0
    finally:
        os.chdir(old)
    capsys.readouterr()
    out_text = (tmp_path / "pd.yaml").read_text()
    lines = [i + 1 for i, ln in enumerate(out_text.splitlines()) if ln == "      min_tokens: 4  # omni-pd: ignore[prefill-sampling]"]
    assert len(lines) == 2  # prefill's copy, then decode's
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        rc = main(["validate", "pd.yaml"])
    finally:
        os.chdir(old)
    out = capsys.readouterr().out
    assert rc == 0
    assert out == (f"warning[OPD009]: unused suppression `prefill-sampling`: no OPD701 finding on line {lines[1]}\n"
                   f"  --> pd.yaml:{lines[1]}:40\n"
                   "   |\n"
                   f"{lines[1]} |       min_tokens: 4  # omni-pd: ignore[prefill-sampling]\n"
                   "   |                                        ^^^^^^^^^^^^^^^^\n"
                   "   = help: remove `prefill-sampling` from the comment\n"
                   "pd.yaml: ok (0 errors, 1 warning, 0 info; 1 suppressed)\n")
    # without the comments' effect the prefill's OPD701 is there: what was suppressed is that finding
    (tmp_path / "plain.yaml").write_text(out_text.replace("  # omni-pd: ignore[prefill-sampling]", ""))
    os.chdir(tmp_path)
    try:
        rc = main(["validate", "plain.yaml"])
    finally:
        os.chdir(old)
    out = capsys.readouterr().out
    assert out.startswith("warning[OPD701]") and f"  --> plain.yaml:{lines[0]}:" in out
    assert out.endswith("plain.yaml: ok (0 errors, 1 warning, 0 info)\n")


def test_root_cause_order_survives_suppression(tmp_path, capsys):
    """validate lists OPD306/OPD401 right after the OPD103 typo that causes them (out of line
    order, omni_pd/check/causes.py); an OPD009 goes in by its line and that order stays."""
    from test_root_cause import TYPO_ON_DECODE

    text = TYPO_ON_DECODE.replace('    devices: "0,1"\n', '    devices: "0,1"  # omni-pd: ignore[OPD403]\n')
    (tmp_path / "pd.yaml").write_text(text)
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        rc = main(["validate", "--format", "json", "pd.yaml"])
    finally:
        os.chdir(old)
    found = [(d["code"], d["location"]["line"]) for d in json.loads(capsys.readouterr().out)]
    assert rc == 1
    assert found[:4] == [("OPD009", 5), ("OPD103", 11), ("OPD306", 9), ("OPD401", 10)]


def test_the_docs_examples_do_what_the_docs_say(tmp_path, capsys):
    """docs/validate.md, "Suppressing findings": its comment is a directive for OPD403 (by rule name),
    its settings table loads, and the verdict line it quotes is the one validate prints."""
    import re

    from omni_pd.check.settings import known_codes, load_layer
    from omni_pd.check.suppress import find_directives

    from docs_pages import page
    from docs_pages import section as page_section

    section = page_section(page("docs/validate.md"), "## Suppressing findings")
    yaml_block = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    [d] = find_directives(yaml_block, "x.yaml")
    assert [s.text for s in d.selectors] == ["pd-shared-device"]
    toml_block = re.search(r"```toml\n(.*?)```", section, re.S).group(1)
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "pyproject.toml").write_text(toml_block)
    layer = load_layer(tmp_path / "cfg" / "pyproject.toml", known_codes())
    assert (layer.ignore, layer.per_file_ignores) == (("OPD403",), (("legacy/*.yaml", ("legacy-stage-args",)),))
    # the quoted verdict: a PD config whose prefill and decode share device 0, the comment on decode's devices
    from test_root_cause import TYPO_ON_DECODE

    pd = (TYPO_ON_DECODE.replace("tensor_paralel_size", "tensor_parallel_size")
          .replace("tensor_parallel_size: 2\n", "tensor_parallel_size: 2\n    gpu_memory_utilization: 0.45\n")
          .replace('devices: "2,3"', 'devices: "0,1"' + yaml_block.strip().split('"0"', 1)[1]))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "pd.yaml").write_text(pd)
    old = os.getcwd()
    os.chdir(tmp_path / "sub")
    try:
        rc = main(["validate", "pd.yaml"])
    finally:
        os.chdir(old)
    out = capsys.readouterr().out
    quoted = re.search(r"\(`(pd\.yaml: ok \(.*?\))`\)", section).group(1)
    assert (rc, out) == (0, quoted + "\n")
