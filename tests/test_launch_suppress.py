"""``launch`` honours validate's suppressions (issue 24, conventions): an inline
``# omni-pd: ignore[CODE]``, ``--ignore``/``--select`` and ``[tool.omni-pd]`` in
``pyproject.toml`` / ``.omni-pd.toml``. Before the fix launch printed validate's findings
unsuppressed and a suppressed error still refused the launch (exit 1).

The config: the tiny ``llm`` fixture split (NIXL) with a stage key vLLM 0.30 does not
accept, ``some_new_vllm_flag`` (OPD107 on both stages), as a user who runs a newer vLLM
would write it.
"""

from __future__ import annotations

from rule_found import cli_in  # tests/rule_found.py

from pathlib import Path

import pytest

from omni_pd.compile.expand import expand_document
from omni_pd.compile.passes.pd_split import ExpandOptions
from omni_pd.io import parse_text

ROOT = Path(__file__).resolve().parents[1]
LLM = ROOT / "tests" / "fixtures" / "llm.yaml"
KEY = "    some_new_vllm_flag: 4"


def _config(tmp_path: Path, comment: str = "") -> Path:
    text = expand_document(parse_text(LLM.read_text(), LLM.name), ExpandOptions(connector="NixlConnector"),
                           pipeline="llm").text
    assert text.count("    max_model_len: 1024\n") == 2
    out = tmp_path / "pd.yaml"
    out.write_text(text.replace("    max_model_len: 1024\n", f"    max_model_len: 1024\n{KEY}{comment}\n"))
    return out


def _run(capsys, cwd: Path, *args: str) -> tuple[int, str, str]:
    return cli_in(cwd, capsys, *args)


def _launch(capsys, cfg: Path, *extra: str) -> tuple[int, str, str]:
    return _run(capsys, cfg.parent, "launch", cfg.name, "--model", "m", "--dry-run", "--router-workers", "1", *extra)


def test_unsuppressed_the_error_refuses_the_launch(tmp_path, capsys):
    cfg = _config(tmp_path)
    rc, out, _ = _launch(capsys, cfg)
    assert rc == 1
    assert [ln for ln in out.splitlines() if ln.startswith("error[")] == [
        f"error[OPD107]: stage {i}: `some_new_vllm_flag` becomes `--some-new-vllm-flag` on this engine's `vllm serve` "
        "command line, which vLLM 0.30 (assumed: no --vllm-version given; pass --vllm-version X.Y) does not accept" for i in (0, 1)]
    assert out.endswith("pd.yaml: not launched (2 errors, 0 warnings, 0 info)\n")


def test_an_inline_suppression_launches_the_dry_run_and_counts_what_it_hid(tmp_path, capsys):
    cfg = _config(tmp_path, "  # omni-pd: ignore[OPD107] our vLLM has it")
    rc, vout, _ = _run(capsys, tmp_path, "validate", cfg.name)
    assert (rc, vout) == (0, "pd.yaml: ok (0 errors, 0 warnings, 0 info; 2 suppressed)\n")
    rc, out, err = _launch(capsys, cfg)
    assert rc == 0, out + err
    # --dry-run: validate's text on stderr, stdout the plan alone (a shell script a user can save)
    assert err == vout and out.startswith("# launch plan: llm_pd (vllm serve per engine + router), NixlConnector")
    assert out.count("  --some-new-vllm-flag 4 \\\n") == 2  # the key reaches both engines


def test_a_rule_name_in_the_comment_works_as_in_validate(tmp_path, capsys):
    cfg = _config(tmp_path, "  # omni-pd: ignore[serve-flag-unknown]")
    rc, vout, _ = _run(capsys, tmp_path, "validate", cfg.name)
    rc2, out, err = _launch(capsys, cfg)
    assert (rc, rc2) == (0, 0)
    assert err == vout and vout.endswith("; 2 suppressed)\n") and out.startswith("# launch plan: ")


def test_an_unused_suppression_is_reported_as_validate_reports_it(tmp_path, capsys):
    cfg = _config(tmp_path, "  # omni-pd: ignore[OPD107, OPD103]")
    rc, vout, _ = _run(capsys, tmp_path, "validate", cfg.name)
    assert rc == 0 and vout.count("warning[OPD009]: unused suppression `OPD103`: no OPD103 finding on line") == 2
    rc, out, err = _launch(capsys, cfg)
    assert rc == 0
    assert err == vout and vout.endswith("pd.yaml: ok (0 errors, 2 warnings, 0 info; 2 suppressed)\n")


@pytest.mark.parametrize("args", [("--ignore", "OPD107"), ("--ignore", "serve-flag-unknown"),
                                  ("--select", "OPD3,OPD5")])
def test_ignore_and_select_on_the_command_line(tmp_path, capsys, args):
    cfg = _config(tmp_path)
    rc, vout, _ = _run(capsys, tmp_path, "validate", cfg.name, *args)
    assert (rc, vout) == (0, "pd.yaml: ok (0 errors, 0 warnings, 0 info; 2 suppressed)\n")
    rc, out, err = _launch(capsys, cfg, *args)
    assert rc == 0, out + err
    assert err == vout and out.startswith("# launch plan: ")


@pytest.mark.parametrize("name,text", [
    (".omni-pd.toml", 'ignore = ["OPD107"]\n'),
    ("pyproject.toml", '[project]\nname = "x"\n\n[tool.omni-pd]\nignore = ["serve-flag-unknown"]\n'),
])
def test_the_project_settings_file_is_read_walking_up(tmp_path, capsys, name, text):
    (tmp_path / name).write_text(text)
    sub = tmp_path / "deploy"
    sub.mkdir()
    cfg = _config(sub)
    rc, out, err = _launch(capsys, cfg)
    assert rc == 0, out + err
    assert err == "pd.yaml: ok (0 errors, 0 warnings, 0 info; 2 suppressed)\n" and out.startswith("# launch plan: ")


def test_a_selector_that_names_no_code_is_a_usage_error(tmp_path, capsys):
    cfg = _config(tmp_path)
    rc, out, err = _launch(capsys, cfg, "--ignore", "OPD10x")
    assert (rc, out) == (2, "")
    assert err.startswith("error[OPD006]: --ignore OPD10x: names no code omni-pd knows\n")


def test_a_broken_settings_file_stops_the_launch(tmp_path, capsys):
    (tmp_path / ".omni-pd.toml").write_text('ignore = ["OPD107"]\nselcet = ["OPD1"]\n')
    cfg = _config(tmp_path)
    rc, out, err = _launch(capsys, cfg)
    assert (rc, out) == (2, "")
    assert err.startswith("error[OPD006]: .omni-pd.toml: unknown key `selcet`\n --> .omni-pd.toml:2:1\n")


def test_json_dry_run_says_the_suppressed_count_on_stderr(tmp_path, capsys):
    cfg = _config(tmp_path, "  # omni-pd: ignore[OPD107]")
    rc, out, err = _launch(capsys, cfg, "--format", "json")
    assert rc == 0
    assert err == "pd.yaml: ok (0 errors, 0 warnings, 0 info; 2 suppressed)\n"
    assert out.startswith("{")
