"""``resources.load_data``: bundled YAML data parsed once, then read from a JSON cache
in ``__pycache__`` (a cold-start cost found by bench/fig2_coldstart.py)."""

from __future__ import annotations

import json
import os
import sys

from ruamel.yaml import YAML

from omni_pd.resources import data_dir, load_data


def _cache(p):
    return p.parent / "__pycache__" / (p.name + ".json")


def test_cached_value_is_the_yaml_value_and_is_used(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    p = tmp_path / "facts.yaml"
    p.write_text("a: [1, 2.5, true, null]\nb: {c: text}\n", encoding="utf-8")
    want = {"a": [1, 2.5, True, None], "b": {"c": "text"}}
    assert load_data(p) == want
    cached = json.loads(_cache(p).read_text(encoding="utf-8"))
    assert cached["data"] == want
    cached["data"] = {"from": "cache"}  # same key: the next load must come from here
    _cache(p).write_text(json.dumps(cached), encoding="utf-8")
    assert load_data(p) == {"from": "cache"}
    assert [f.name for f in _cache(p).parent.iterdir()] == ["facts.yaml.json"]  # no temp files left


def test_an_edited_file_is_parsed_again(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    p = tmp_path / "facts.yaml"
    p.write_text("a: 1\n", encoding="utf-8")
    assert load_data(p) == {"a": 1}
    p.write_text("a: 22\n", encoding="utf-8")
    st = p.stat()
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert load_data(p) == {"a": 22}


def test_no_cache_without_bytecode_writing_or_for_non_json_data(tmp_path, monkeypatch):
    p = tmp_path / "facts.yaml"
    p.write_text("a: 1\n", encoding="utf-8")
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert load_data(p) == {"a": 1} and not _cache(p).exists()
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    q = tmp_path / "intkeys.yaml"
    q.write_text("1: host-a\n", encoding="utf-8")
    assert load_data(q) == {1: "host-a"} and not _cache(q).exists()
    assert load_data(q) == {1: "host-a"}


def test_a_broken_cache_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    p = tmp_path / "facts.yaml"
    p.write_text("a: 1\n", encoding="utf-8")
    _cache(p).parent.mkdir()
    for junk in ("{not json", "[]", '{"source": 1}'):
        _cache(p).write_text(junk, encoding="utf-8")
        assert load_data(p) == {"a": 1}


def test_bundled_data_loads_as_yaml_does():
    y = YAML(typ="safe", pure=True)
    files = sorted((data_dir("presets") / "pipelines").glob("*.yaml")) + [data_dir("presets") / "targets" / "vllm.yaml"]
    for f in files:
        assert load_data(f) == y.load(f.read_text(encoding="utf-8")), f


def test_yaml_1_2_plain_scalars_with_colons_parse_with_or_without_libyaml(tmp_path, monkeypatch):
    # presets/targets/vllm_ascend.yaml maps connector names to "module:Class" inside flow
    # mappings; libyaml (ruamel.yaml.clib, picked by typ="safe" when installed) refuses a
    # ':' inside a plain scalar there, the pure YAML 1.2 loader reads it
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    p = tmp_path / "facts.yaml"
    p.write_text("value: {AscendStore: vllm_ascend.kv_pool.store:AscendStore, B: m:C}\n", encoding="utf-8")
    assert load_data(p) == {"value": {"AscendStore": "vllm_ascend.kv_pool.store:AscendStore", "B": "m:C"}}


def test_every_bundled_data_file_parses(monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    for sub in ("presets", "schemas"):
        for p in sorted(data_dir(sub).rglob("*.yaml")):
            assert load_data(p) is not None, p
