"""State that outlives a call or depends on where omni-pd is installed (issue 16):
``base_config`` chains of any depth (and loops), the bundled-data JSON cache on a
read-only install, and the YAML loader classes built once per process."""

from __future__ import annotations

import os
import shutil
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


# --- the bundled-data JSON cache on a read-only install ---------------------------------------------------

def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _read_only_fs(monkeypatch) -> None:
    """Every way load_data writes fails as on a read-only filesystem (EROFS), for root too."""
    import errno

    def refuse(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(Path, "mkdir", refuse)
    monkeypatch.setattr(Path, "write_text", refuse)
    monkeypatch.setattr(os, "replace", refuse)


def test_bundled_data_loads_from_a_read_only_copy_without_writing(tmp_path, monkeypatch) -> None:
    """A copy of the bundled presets on a filesystem that refuses writes: every file loads
    to the value ruamel gives, and the copy is unchanged (no cache, no temp files)."""
    from ruamel.yaml import YAML

    from omni_pd.resources import data_dir, load_data

    src = data_dir("presets")
    copy = tmp_path / "presets"
    shutil.copytree(src, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = _tree(copy)
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    _read_only_fs(monkeypatch)
    files = sorted(copy.rglob("*.yaml"))
    assert len(files) > 10
    for f in files:
        assert load_data(f) == YAML(typ="safe", pure=True).load(f.read_text(encoding="utf-8")), f
    assert _tree(copy) == before


def test_a_cache_folder_that_cannot_be_created_is_skipped(tmp_path, monkeypatch) -> None:
    """``__pycache__`` taken by a file (creation fails for root too): loads, writes nothing."""
    from omni_pd.resources import load_data

    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    (tmp_path / "__pycache__").write_text("not a folder", encoding="utf-8")
    p = tmp_path / "facts.yaml"
    p.write_text("a: [1, 2]\n", encoding="utf-8")
    assert load_data(p) == {"a": [1, 2]}
    assert load_data(p) == {"a": [1, 2]}
    assert sorted(f.name for f in tmp_path.iterdir()) == ["__pycache__", "facts.yaml"]
    assert (tmp_path / "__pycache__").read_text(encoding="utf-8") == "not a folder"


# --- the YAML loader classes built once per process --------------------------------------------------------

def test_loader_state_is_per_document_not_per_process(monkeypatch) -> None:
    """io.py builds its loader classes once (a cache of class objects); the node count
    and the own-output switch live on each load's instances: many loads under the limit
    stay under it, and loading expand's own output does not lift the limit for the
    next input."""
    from omni_pd import io as omni_io
    from omni_pd.diagnostics import OmniPdError

    monkeypatch.setattr(omni_io, "MAX_NODES", 50)
    text = "x: [" + "1, " * 30 + "1]\n"  # 33 nodes
    for _ in range(5):
        omni_io.parse_text(text, "t.yaml")
    big = "x: [" + "1, " * 60 + "1]\n"
    omni_io.parse_text(big, "out.yaml", own_output=True)
    with pytest.raises(OmniPdError) as e:
        omni_io.parse_text(big, "t.yaml")
    assert e.value.diagnostic.message == "document has more than 50 YAML nodes"
