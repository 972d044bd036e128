"""``render`` honours validate's suppressions as ``launch`` does (issue 24, conventions): an
inline ``# omni-pd: ignore[CODE]``, ``--ignore``/``--select`` and ``[tool.omni-pd]`` in
``.omni-pd.toml`` / ``pyproject.toml``, through the same code path (omni_pd/cli.py
``_plan_suppression``, handed to ``plan_document(suppress=...)``). Before the fix a
suppressed error still refused the render (``pd.yaml: not rendered (2 errors, ...)``, exit 1)
and render had no ``--select``/``--ignore``.

The config is tests/test_launch_suppress.py's: the tiny ``llm`` fixture split (NIXL) with
a stage key vLLM 0.30 does not accept, ``some_new_vllm_flag`` (OPD107 on both stages).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from test_launch_suppress import _config, _run

OPD107 = ("error[OPD107]: stage {}: `some_new_vllm_flag` becomes `--some-new-vllm-flag` on this engine's `vllm "
          "serve` command line, which vLLM 0.30 (assumed: no --vllm-version given; pass --vllm-version X.Y) does not accept")


def _render(capsys, cfg: Path, *extra: str) -> tuple[int, str, str, Path]:
    to = cfg.parent / "out"
    rc, out, err = _run(capsys, cfg.parent, "render", cfg.name, "--to", "out", "--model", "m",
                        "--router-workers", "1", *extra)
    return rc, out, err, to


def test_unsuppressed_the_error_refuses_the_render(tmp_path, capsys):
    rc, out, _, to = _render(capsys, _config(tmp_path))
    assert rc == 1
    assert [ln for ln in out.splitlines() if ln.startswith("error[")] == [OPD107.format(0), OPD107.format(1)]
    assert out.endswith("pd.yaml: not rendered (2 errors, 0 warnings, 0 info)\n")
    assert not to.exists()


def test_an_inline_suppression_renders_and_the_engines_get_the_key(tmp_path, capsys):
    cfg = _config(tmp_path, "  # omni-pd: ignore[OPD107] our vLLM has it")
    rc, out, err, to = _render(capsys, cfg)
    assert (rc, out) == (0, "")
    assert err == "wrote out: deploy.yaml, local.sh, plan.json (2 suppressed)\n"
    assert (to / "deploy.yaml").read_text() == cfg.read_text()  # the comment stays in the copy
    assert (to / "local.sh").read_text().count(" --some-new-vllm-flag 4 ") == 2


@pytest.mark.parametrize("args", [("--ignore", "OPD107"), ("--ignore", "serve-flag-unknown"),
                                  ("--select", "OPD3,OPD5")])
def test_ignore_and_select_on_the_command_line(tmp_path, capsys, args):
    rc, out, err, to = _render(capsys, _config(tmp_path), *args)
    assert (rc, out, err) == (0, "", "wrote out: deploy.yaml, local.sh, plan.json (2 suppressed)\n")
    assert (to / "local.sh").exists()


def test_the_project_settings_file_is_read_walking_up(tmp_path, capsys):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n\n[tool.omni-pd]\nignore = ["OPD107"]\n')
    sub = tmp_path / "deploy"
    sub.mkdir()
    rc, out, err, to = _render(capsys, _config(sub))
    assert (rc, out, err) == (0, "", "wrote out: deploy.yaml, local.sh, plan.json (2 suppressed)\n")


def test_a_partial_ignore_still_refuses_and_counts_what_it_hid(tmp_path, capsys):
    """Only stage 0's line carries the comment: stage 1's OPD107 still refuses the render."""
    cfg = _config(tmp_path)
    text = cfg.read_text()
    cfg.write_text(text.replace("some_new_vllm_flag: 4\n", "some_new_vllm_flag: 4  # omni-pd: ignore[OPD107]\n", 1))
    rc, out, _, to = _render(capsys, cfg)
    assert rc == 1
    assert [ln for ln in out.splitlines() if ln.startswith("error[")] == [OPD107.format(1)]
    assert out.endswith("pd.yaml: not rendered (1 error, 0 warnings, 0 info; 1 suppressed)\n")
    assert not to.exists()


def test_a_selector_that_names_no_code_is_a_usage_error(tmp_path, capsys):
    rc, out, err, to = _render(capsys, _config(tmp_path), "--ignore", "OPD10x")
    assert (rc, out) == (2, "")
    assert err.startswith("error[OPD006]: --ignore OPD10x: names no code omni-pd knows\n")
    assert not to.exists()
