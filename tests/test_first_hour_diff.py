"""``diff`` with its arguments swapped says so (issue 24, item 8).

``omni-pd diff OUT IN`` (the split first) answered "IN is not a prefill/decode split: give the
output of `omni-pd expand OUT`", and expanding OUT, already split, fails with OPD803. Now the
swap is named and the command in the right order given.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from omni_pd.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_swapped_arguments_are_named_with_the_right_order(tmp_path, capsys):
    shutil.copy(ROOT / "presets" / "qwen3_omni_moe.yaml", tmp_path / "qwen3_omni_moe.yaml")
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert main(["expand", "qwen3_omni_moe.yaml", "-q", "-o", "pd.yaml"]) == 0
        capsys.readouterr()
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
    finally:
        os.chdir(old)
