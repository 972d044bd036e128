"""State that outlives a call or depends on where omni-pd is installed (issue 16):
``base_config`` chains of any depth (and loops), the bundled-data JSON cache on a
read-only install, and the YAML loader classes built once per process."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from omni_pd.check.validate import validate_document
from omni_pd.io import load_file

ROOT = Path(__file__).resolve().parents[1]


def _chain(tmp_path: Path, links: int) -> Path:
    """child.yaml -> b1.yaml -> ... -> b<links>.yaml -> the bundled qwen3_omni_moe.yaml."""
    for i in range(1, links + 1):
        nxt = f"b{i + 1}.yaml" if i < links else "qwen3_omni_moe.yaml"
        (tmp_path / f"b{i}.yaml").write_text(f"base_config: {nxt}\n", encoding="utf-8")
    child = tmp_path / "child.yaml"
    child.write_text("base_config: b1.yaml\nstages:\n  - stage_id: 1\n    gpu_memory_utilization: 0.95\n",
                     encoding="utf-8")
    return child


@pytest.mark.parametrize("links", [0, 5, 12])
def test_base_config_chains_of_any_depth_are_followed(tmp_path, links) -> None:
    """The Talker's 0.95 only over-commits GPU 1 with the preset's Code2Wav (0.1) merged
    in, however many files lie between (vllm-omni recurses without a limit; omni-pd
    stopped after 4 and dropped the rest without a word)."""
    child = _chain(tmp_path, links) if links else tmp_path / "child.yaml"
    if not links:
        child.write_text("base_config: qwen3_omni_moe.yaml\nstages:\n  - stage_id: 1\n"
                         "    gpu_memory_utilization: 0.95\n", encoding="utf-8")
    res = validate_document(load_file(child))
    assert [d.message for d in res.diagnostics if d.code == "OPD404"] == [
        "physical GPU 1: 0.95 (stage 1) + 0.1 (stage 2) = 1.05 > 1.0"]
    assert "OPD108" not in res.codes()


def test_a_base_config_loop_is_reported_where_it_closes(tmp_path) -> None:
    (tmp_path / "a.yaml").write_text("base_config: b.yaml\nstages:\n  - stage_id: 0\n", encoding="utf-8")
    (tmp_path / "b.yaml").write_text("async_chunk: false\nbase_config: a.yaml\n", encoding="utf-8")
    res = validate_document(load_file(tmp_path / "a.yaml"))
    [d] = [d for d in res.diagnostics if d.code == "OPD108"]
    assert d.message == "base_config chain loops: a.yaml -> b.yaml -> a.yaml (vllm-omni follows it until RecursionError)"
    assert (Path(d.location.file).name, d.location.line, d.location.column) == ("b.yaml", 2, 14)
    assert d.help == "remove `base_config` from a.yaml, or point it at a file outside the chain"


def test_a_file_that_names_itself_as_base_is_a_loop(tmp_path) -> None:
    (tmp_path / "a.yaml").write_text("base_config: ./a.yaml\nstages:\n  - stage_id: 0\n", encoding="utf-8")
    res = validate_document(load_file(tmp_path / "a.yaml"))
    assert [d.message for d in res.diagnostics if d.code == "OPD108"] == [
        "base_config chain loops: a.yaml -> a.yaml (vllm-omni follows it until RecursionError)"]
