"""Expanding the deploy configs that vllm-omni==0.30.0 ships (issue 2).

The wheel is fetched by the session fixture ``omni_wheel_deploy_dir`` (conftest.py).
Every ``vllm_omni/deploy/*.yaml`` whose pipeline is in omni-pd's catalogue (its
``pipeline:`` key, else the file name via :meth:`Catalogue.for_deploy_file`) must
expand into a chained prefill/decode topology. Files whose pipeline is not
catalogued are listed with the reason and skipped, never dropped silently.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from omni_pd.diagnostics import OmniPdError, Severity
from ruamel.yaml import YAML

from omni_pd.compile.expand import expand_document
from omni_pd.io import load_file, parse_text
from omni_pd.compile.parse import parse_config
from omni_pd.compile.pipelines import Catalogue, Pipeline, load_catalogue
from omni_pd.compile.topology import resolve

pytestmark = pytest.mark.wheel

#: file name -> (source pipeline, source stage count). Update when vllm-omni ships a
#: new deploy file for a catalogued pipeline: the set test below fails until then.
CATALOGUED = {
    "qwen2_5_omni.yaml": ("qwen2_5_omni", 3),
    "qwen3_omni_moe.yaml": ("qwen3_omni_moe", 3),
    "qwen3_omni_moe_mori_intranode.yaml": ("qwen3_omni_moe", 3),
    "qwen3_omni_moe_thinking.yaml": ("qwen3_omni_moe_thinker_only", 1),
}

#: Total deploy YAMLs in vllm-omni 0.30.0's wheel (vllm_omni/deploy/*.yaml).
WHEEL_DEPLOY_FILES = 110


def classify(path: Path, cat: Catalogue) -> tuple[Pipeline | None, str]:
    """The catalogued pipeline of deploy file ``path`` and how it was found, or
    (None, the reason it is not catalogued)."""
    data = YAML(typ="safe", pure=True).load(path.read_text(encoding="utf-8"))
    name = data.get("pipeline") if isinstance(data, dict) else None
    if name:
        pipe = cat.get(str(name))
        return (pipe, f"pipeline: {name}") if pipe else (None, f"pipeline `{name}` is not in the catalogue")
    pipe = cat.for_deploy_file(path.name)
    if pipe is not None:
        return pipe, f"file name -> {pipe.name}"
    return None, "no `pipeline:` key and the file name is no catalogued pipeline's deploy file"


def assert_chain(result, pipe_name: str, n_stages: int) -> None:
    """Ids 0..n-1, each stage fed by the previous one, edges 0->1->..., P/D roles."""
    cfg = result.config
    assert cfg.pipeline == pipe_name + "_pd"
    assert result.plan.target_pipeline.name == pipe_name + "_pd"
    assert [s.stage_id for s in cfg.stages] == list(range(n_stages))
    tp = result.plan.target_pipeline
    assert [s.stage_id for s in tp.stages] == list(range(n_stages))
    for s in tp.stages:
        assert s.input_sources == ((s.stage_id - 1,) if s.stage_id else ())
    if n_stages > 2 or cfg.edges:
        # a streaming PD output (async_chunk kept on) has no 0 -> 1 stage edge: the KV connector carries it
        first = 1 if result.plan.stream else 0
        assert [(e.from_, e.to) for e in cfg.edges or []] == [(i, i + 1) for i in range(first, n_stages - 1)]
        assert cfg.async_chunk is (True if result.plan.stream else False)
    topo = resolve(cfg, tp, None)
    p, d = topo.stages[0], topo.stages[1]
    assert (p.pd_role, d.pd_role) == ("prefill", "decode")
    assert p.kv["kv_role"] == "kv_producer" and d.kv["kv_role"] == "kv_consumer"
    assert p.kv["kv_connector"] == d.kv["kv_connector"]
    assert p.kv["engine_id"] != d.kv["engine_id"]
    assert isinstance(p.devices, tuple) and isinstance(d.devices, tuple)
    assert len(p.devices) == len(d.devices) and not set(p.devices) & set(d.devices)
    assert p.tp == d.tp


#: pipelines whose Talker handoff under PD omni-pd's compatibility layer cannot repair on vllm-omni
#: 0.30: Qwen2.5-Omni's decode engine withholds the Talker payload (qwen2_5_omni.py 325-333)
TALKER_UNCOVERED = {"qwen2_5_omni"}


@pytest.mark.parametrize("filename", sorted(CATALOGUED))
def test_catalogued_wheel_config_expands(omni_wheel_deploy_dir: Path, filename: str) -> None:
    path = omni_wheel_deploy_dir / filename
    assert path.is_file(), f"vllm-omni 0.30.0 no longer ships {filename}"
    pipe, _how = classify(path, load_catalogue())
    want_pipe, n_src = CATALOGUED[filename]
    assert pipe is not None and pipe.name == want_pipe
    src_cfg = parse_config(load_file(path))
    assert len(src_cfg.stages) == n_src
    if want_pipe in TALKER_UNCOVERED:  # issue 21: a PD file whose Talker would get the wrong rows is refused
        with pytest.raises(OmniPdError) as e:
            expand_document(load_file(path))
        d = e.value.diagnostic
        assert (e.value.exit_code, d.code, d.severity, d.message, d.help) == (
            2, "OPD704", Severity.ERROR,
            "the Talker (stage 2) is conditioned by the PD decode stage 1, which computes no prompt rows, and "
            "omni-pd's compatibility layer fixes the Talker handoff for qwen3_omni_moe_pd only (qwen2_5_omni_pd: "
            "the decode engine withholds or shifts the Talker's payload): audio answers fail or are conditioned on "
            "the wrong rows",
            "serve the three-stage pipeline without PD; for text only: `omni-pd expand <three-stage file> "
            "--pipeline qwen2_5_omni_thinker_only` (the Thinker alone as a PD pair)")
        # the file has no `pipeline:` key: located at the Talker's stage entry (its stage_id 1)
        talker_line = path.read_text(encoding="utf-8").splitlines().index("  - stage_id: 1") + 1
        assert (d.location.line, d.location.column) == (talker_line, 5)
        # the text-only route the help names: the Thinker alone is split
        res = expand_document(load_file(path), pipeline=f"{want_pipe}_thinker_only")
        assert_chain(res, f"{want_pipe}_thinker_only", 2)
        assert [s.role for s in res.plan.target_pipeline.stages] == ["thinker", "thinker"]
        assert [d.code for d in res.diagnostics if d.code == "OPD905"] == ["OPD905"]
        return
    res = expand_document(load_file(path))
    assert len(res.config.stages) == n_src + 1
    assert_chain(res, want_pipe, n_src + 1)
    # the output is stable and re-reads to the same model
    assert parse_config(parse_text(res.text, filename)) == res.config
    assert expand_document(load_file(path)).text == res.text


def test_catalogued_set_is_exact(omni_wheel_deploy_dir: Path) -> None:
    cat = load_catalogue()
    files = sorted(omni_wheel_deploy_dir.glob("*.yaml"))
    assert len(files) == WHEEL_DEPLOY_FILES
    found = {p.name: classify(p, cat)[0] for p in files}
    catalogued = {name: pipe.name for name, pipe in found.items() if pipe is not None}
    assert catalogued == {k: v[0] for k, v in CATALOGUED.items()}


UNCATALOGUED_GOLDEN = Path(__file__).resolve().parent / "golden" / "wheel_uncatalogued.txt"


def test_uncatalogued_wheel_configs_are_listed_with_reason(omni_wheel_deploy_dir: Path) -> None:
    """Every other file is listed with its reason in tests/golden/wheel_uncatalogued.txt
    (regenerate with OMNI_PD_REGEN=1). A pass is a pass: the list is the golden, not a
    skip line (issue 16: the test used to call skip after its assertions passed)."""
    cat = load_catalogue()
    skipped: list[str] = []
    for path in sorted(omni_wheel_deploy_dir.glob("*.yaml")):
        pipe, why = classify(path, cat)
        if pipe is None:
            assert why
            skipped.append(f"{path.name} ({why})")
    assert len(skipped) == WHEEL_DEPLOY_FILES - len(CATALOGUED)
    assert "qwen3_tts.yaml (no `pipeline:` key and the file name is no catalogued pipeline's deploy file)" in skipped
    assert "bagel_single_stage.yaml (pipeline `bagel_single_stage` is not in the catalogue)" in skipped
    text = "".join(f"{line}\n" for line in skipped)
    if os.environ.get("OMNI_PD_REGEN") == "1":
        UNCATALOGUED_GOLDEN.write_text(text, encoding="utf-8")
    assert text == UNCATALOGUED_GOLDEN.read_text(encoding="utf-8")
