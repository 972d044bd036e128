"""The command line users of linters and config tools expect (issue 13): ``--version``,
``validate`` over many files and directories, option values checked where they are
parsed, ``explain`` for every emitted code, ``graph``, shell completion, ``--help``."""

from __future__ import annotations

import io
import os
import sys
import tomllib
from pathlib import Path

import pytest

from omni_pd.cli import main

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures"

#: a single-stage LLM config with one located type error (exit 1)
BAD = "stages:\n  - stage_id: 0\n    tensor_parallel_size: two\n"
BAD_DIAG = ("error[OPD101]: `tensor_parallel_size` must be an integer, found 'two'\n"
            " --> {name}:3:27\n"
            "  |\n"
            "3 |     tensor_parallel_size: two\n"
            "  |                           ^^^\n"
            "  = help: write an integer for `tensor_parallel_size`\n")
#: clean single-stage LLM config (no diagnostics at all)
CLEAN = (FIX / "llm.yaml").read_text()


def run_cli(args, capsys, cwd: Path = ROOT, stdin: bytes | None = None, monkeypatch=None):
    old = os.getcwd()
    os.chdir(cwd)
    saved = sys.stdin
    if stdin is not None:
        sys.stdin = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8")
    try:
        rc = main(args)
    finally:
        sys.stdin = saved
        os.chdir(old)
    out, err = capsys.readouterr()
    return rc, out, err


# --- 1. --version -----------------------------------------------------------------------

def test_version_names_omni_pd_and_the_targets_from_data(capsys):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    rc, out, err = run_cli(["--version"], capsys)
    assert rc == 0 and err == ""
    # 0.30 / 0.11..0.33: presets/targets/vllm.yaml; vllm-omni 0.30: presets/targets/vllm_omni_stage_keys.yaml
    assert out == (f"omni-pd {project}\n"
                   "targets vLLM 0.30 (--vllm-version 0.11 to 0.33), vllm-omni 0.30\n")


def test_version_follows_the_target_data(capsys, monkeypatch):
    from omni_pd.compile import versions

    monkeypatch.setattr(versions, "_vllm_facts",
                        lambda: {"default_version": "0.31", "known_versions": {"first": "0.13", "last": "0.35"}})
    monkeypatch.setattr(versions, "default_vllm_omni_version", lambda: "0.31")
    rc, out, _ = run_cli(["--version"], capsys)
    assert rc == 0
    assert out.splitlines()[1] == "targets vLLM 0.31 (--vllm-version 0.13 to 0.35), vllm-omni 0.31"


# --- 2. validate on many files ---------------------------------------------------------

@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    (tmp_path / "configs" / "sub").mkdir(parents=True)
    (tmp_path / "configs" / "a.yaml").write_text(CLEAN)
    (tmp_path / "configs" / "sub" / "b.yml").write_text(BAD)
    (tmp_path / "configs" / "notes.txt").write_text("not yaml: [")
    (tmp_path / "configs" / ".hidden").mkdir()
    (tmp_path / "configs" / ".hidden" / "c.yaml").write_text("not: [closed")
    return tmp_path


def test_validate_walks_directories_and_prints_one_summary(tree, capsys):
    rc, out, err = run_cli(["validate", "--pipeline", "llm", "configs"], capsys, cwd=tree)
    assert rc == 1
    assert err == ""
    assert out == BAD_DIAG.format(name="configs/sub/b.yml") + "\n" + \
        "validate: 2 files, 1 ok, 1 failed (1 error, 0 warnings, 0 info)\n"


def test_validate_worst_exit_status_wins_and_stdin_is_dash(tree, capsys):
    rc, out, err = run_cli(["validate", "--pipeline", "llm", "configs/a.yaml", "-", "missing.yaml"],
                           capsys, cwd=tree, stdin=BAD.encode())
    assert rc == 2  # unreadable (2) beats errors found (1)
    assert out == BAD_DIAG.format(name="<stdin>") + "\n" + \
        "validate: 3 files, 1 ok, 1 failed, 1 unreadable (2 errors, 0 warnings, 0 info)\n"
    assert err == ("error[OPD001]: file not found\n"
                   " --> missing.yaml\n"
                   "  = help: check the path\n\n")


def test_validate_single_file_keeps_its_verdict_line(tree, capsys):
    rc, out, _ = run_cli(["validate", "--pipeline", "llm", "-"], capsys, cwd=tree, stdin=CLEAN.encode())
    assert (rc, out) == (0, "<stdin>: ok (0 errors, 0 warnings, 0 info)\n")


def test_validate_many_files_json_holds_every_file(tree, capsys):
    import json

    rc, out, _ = run_cli(["validate", "--pipeline", "llm", "--format", "json", "configs", "missing.yaml"],
                         capsys, cwd=tree)
    assert rc == 2
    got = [(d["code"], d["location"]["file"], d["location"]["line"]) for d in json.loads(out)]
    assert got == [("OPD101", "configs/sub/b.yml", 3), ("OPD001", "missing.yaml", None)]


def test_validate_empty_directory_is_bad_input(tree, capsys):
    (tree / "empty").mkdir()
    rc, out, err = run_cli(["validate", "--pipeline", "llm", "empty", "configs/a.yaml"], capsys, cwd=tree)
    assert rc == 2
    assert out == "validate: 1 file, 1 ok, 0 failed (1 error, 0 warnings, 0 info)\n"
    assert err == ("error[OPD001]: directory holds no *.yaml or *.yml file\n"
                   " --> empty\n"
                   "  = help: give deploy files or a directory that contains them\n\n")


def test_collect_inputs_order_repeats_and_hidden(tree):
    from omni_pd.check.inputs import collect_inputs

    got = collect_inputs([str(tree / "configs"), str(tree / "configs" / "a.yaml"), "-",
                          str(tree / "configs" / "notes.txt")])
    rel = [p if p == "-" else os.path.relpath(p, tree) for p in got.paths]
    assert rel == ["configs/a.yaml", "configs/sub/b.yml", "-", "configs/notes.txt"]
    assert got.problems == ()


def test_expand_takes_one_file(capsys):
    rc, out, err = run_cli(["expand", "tests/fixtures/llm.yaml", "presets/qwen3_omni_moe.yaml"], capsys)
    assert rc == 2 and out == ""
    assert err == ("Usage: omni-pd expand [OPTIONS] [input]\n"
                   "Try 'omni-pd expand --help' for help.\n\n"
                   "Error: Got unexpected extra argument(s) (presets/qwen3_omni_moe.yaml)\n")
