"""``diff`` with its arguments swapped says so (issue 24, item 8).

``omni-pd diff OUT IN`` (the split first) answered "IN is not a prefill/decode split: give the
output of `omni-pd expand OUT`", and expanding OUT, already split, fails with OPD803. Now the
swap is named and the command in the right order given.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from omni_pd.cli import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def expanded(tmp_path, capsys, monkeypatch) -> Path:
    """A working directory holding the preset (qwen3_omni_moe.yaml) and its expand output
    (pd.yaml); the expand's output is read off capsys."""
    shutil.copy(ROOT / "presets" / "qwen3_omni_moe.yaml", tmp_path / "qwen3_omni_moe.yaml")
    monkeypatch.chdir(tmp_path)
    assert main(["expand", "qwen3_omni_moe.yaml", "-q", "-o", "pd.yaml"]) == 0
    capsys.readouterr()
    return tmp_path


def test_swapped_arguments_are_named_with_the_right_order(expanded, capsys):
    rc = main(["diff", "pd.yaml", "qwen3_omni_moe.yaml"])
    out = capsys.readouterr()
    assert (rc, out.out) == (2, "")
    assert out.err == (
        "error[OPD008]: the arguments are swapped: pd.yaml is a prefill/decode split (qwen3_omni_moe_pd) "
        "and qwen3_omni_moe.yaml is not\n"
        " --> pd.yaml:1:1\n"
        "  |\n"
        "1 | # yaml-language-server: $schema=omni-pd-deploy.schema.json\n"
        "  | ^\n"
        "  = help: give the file expand read first and what it wrote second: "
        "`omni-pd diff qwen3_omni_moe.yaml pd.yaml`\n")
    # the order it names works
    assert main(["diff", "qwen3_omni_moe.yaml", "pd.yaml"]) == 0
    assert capsys.readouterr().out.startswith("--- qwen3_omni_moe.yaml\n+++ pd.yaml\n")
    # two unsplit files are not a swap: the old message, which names expand
    assert main(["diff", "qwen3_omni_moe.yaml", "qwen3_omni_moe.yaml"]) == 2
    err = capsys.readouterr().err
    assert "swapped" not in err and "is not a prefill/decode split" in err


def test_two_splits_are_refused_with_the_order_diff_wants(expanded, capsys):
    """``omni-pd diff pd.yaml pd.yaml`` (both already split) printed a stage-by-stage "diff" of
    the split against itself read as an input (stage 1 "from input stage 0", the Talker "from"
    decode): nonsense. It is refused, located at BEFORE's pipeline, with the order diff wants."""
    line = next(i for i, t in enumerate((expanded / "pd.yaml").read_text().splitlines(), 1)
                if t.startswith("pipeline:"))
    rc = main(["diff", "pd.yaml", "pd.yaml"])
    out = capsys.readouterr()
    assert (rc, out.out) == (2, "")
    assert out.err.startswith(
        "error[OPD008]: pd.yaml is already a prefill/decode split (qwen3_omni_moe_pd): diff compares the file "
        f"expand read with what it wrote, stage by stage\n{' ' * len(str(line))}--> pd.yaml:{line}:11\n")
    assert out.err.endswith("  = help: give the three-stage file expand read first: `omni-pd diff IN pd.yaml` "
                            "(two splits compare as text: `diff -u pd.yaml pd.yaml`)\n")
