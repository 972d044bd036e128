"""``validate`` over many files says which file got which verdict (issue 24, item 6).

It ended with ``validate: 18 files, 4 ok, 12 failed, 2 unreadable`` and no per-file status:
now each file's diagnostics are followed by its verdict line, the one a single-file run
prints (``<file>: ok|FAILED|unreadable (<counts>)``, as ruff and check-jsonschema report
each file), and the summary stays last.
"""

from __future__ import annotations

import os
from pathlib import Path

from omni_pd.cli import main

CLEAN = "stages:\n  - stage_id: 0\n    devices: \"0\"\n"
BAD = "stages:\n  - stage_id: 0\n    tensor_parallel_size: two\n"
#: three stages, no pipeline: checked as a linear chain (info OPD207), no error
CHAIN = "stages:\n  - stage_id: 0\n  - stage_id: 1\n  - stage_id: 2\n"


def _validate(tmp_path: Path, capsys, *names: str, pipeline: str | None = "llm") -> tuple[int, list[str], str]:
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        rc = main(["validate", *(["--pipeline", pipeline] if pipeline else []), *names])
    finally:
        os.chdir(old)
    out = capsys.readouterr()
    return rc, out.out.splitlines(), out.err


def test_every_file_gets_its_verdict_line_in_order(tmp_path, capsys):
    (tmp_path / "a_clean.yaml").write_text(CLEAN)
    (tmp_path / "b_bad.yaml").write_text(BAD)
    (tmp_path / "c_broken.yaml").write_text("stages: [\n")
    rc, lines, err = _validate(tmp_path, capsys, "a_clean.yaml", "b_bad.yaml", "c_broken.yaml", "d_missing.yaml")
    assert rc == 2
    verdicts = [ln for ln in lines if ln.endswith(" info)")]
    assert verdicts == [
        "a_clean.yaml: ok (0 errors, 0 warnings, 0 info)",
        "b_bad.yaml: FAILED (1 error, 0 warnings, 0 info)",
        "c_broken.yaml: unreadable (1 error, 0 warnings, 0 info)",
        "d_missing.yaml: unreadable (1 error, 0 warnings, 0 info)",
        "validate: 4 files, 1 ok, 1 failed, 2 unreadable (3 errors, 0 warnings, 0 info)",
    ]
    # a file's verdict follows its own findings
    assert lines.index("b_bad.yaml: FAILED (1 error, 0 warnings, 0 info)") > lines.index(
        "error[OPD101]: `tensor_parallel_size` must be an integer, found 'two'")
    assert "error[OPD002]" in err and "error[OPD001]: file not found" in err


def test_a_file_with_infos_only_is_ok_with_its_counts(tmp_path, capsys):
    (tmp_path / "w.yaml").write_text(CHAIN)
    (tmp_path / "c.yaml").write_text(CLEAN)
    rc, lines, _ = _validate(tmp_path, capsys, "w.yaml", "c.yaml", pipeline=None)
    assert rc == 0
    assert [ln for ln in lines if ln.startswith(("w.yaml:", "c.yaml:", "validate:"))] == [
        "w.yaml: ok (0 errors, 0 warnings, 1 info)",
        "c.yaml: ok (0 errors, 0 warnings, 0 info)",
        "validate: 2 files, 2 ok, 0 failed (0 errors, 0 warnings, 1 info)",
    ]


def test_a_typo_on_a_pipeline_named_llm_on_the_command_line_says_what_vllm_does(tmp_path):
    """`validate FILE --pipeline llm`: the file runs as plain `vllm serve` engines, so the
    typo's effect is vLLM's, not 'vllm-omni 0.30 refuses to start' (new-user walkthrough);
    without --pipeline a one-stage file may be a vllm-omni deploy, and says so."""
    import subprocess
    import sys

    f = tmp_path / "llm.yaml"
    f.write_text("stages:\n  - stage_id: 0\n    max_modle_len: 1024\n    devices: \"0\"\n")
    named = subprocess.run([sys.executable, "-m", "omni_pd.cli", "validate", str(f), "--pipeline", "llm"],
                           capture_output=True, text=True)
    assert named.stdout.splitlines()[0] == ("error[OPD103]: unknown stage key `max_modle_len`: it becomes "
                                            "`--max-modle-len` on the engine's `vllm serve` command line, which "
                                            "vLLM rejects")
    unnamed = subprocess.run([sys.executable, "-m", "omni_pd.cli", "validate", str(f)], capture_output=True, text=True)
    assert unnamed.stdout.splitlines()[0] == ("error[OPD103]: unknown stage key `max_modle_len`: vllm-omni 0.30 "
                                              "refuses to start (\"no structured config owner\")")
