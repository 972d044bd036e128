"""validate ⊇ vllm-omni's loader: every generated file vllm-omni 0.30 refuses gets an error (issue 35).

Runs where the oracle venv exists (``OMNI_PD_ORACLE_PYTHON``, .ci/oracle_venv.sh). The bases are
expand's outputs that vllm-omni serves (the Qwen3-Omni preset streaming and one-piece, NIXL, the
Thinker alone); every base is valid to both. The single-stage LLM's PD output (``pipeline: llm_pd``)
is not a base: it is launched with plain ``vllm serve`` pairs, and vllm-omni's loader refuses its
pipeline name (not registered to OMNI_PIPELINES), so it has no vllm-omni verdict to compare. The cases of ``../shared/cases`` are not bases:
their repaired configs are partial overlays of plain vLLM pairs without ``pipeline:``, which
vllm-omni would load as the model's own three-stage pipeline (tests/test_cases.py runs them). Each base's one-edit mutations (tests/oracle/mutations.py:
types, ranges, names, ids, ports, keys dropped or moved) go through vllm-omni's own resolver and PD
checks in one oracle process (omni_pd/upstream/vllm_oracle.py); each one it refuses must get an
error from ``validate`` (the default target, vLLM 0.30), without a traceback. Files vllm-omni
accepts may still get errors (validate also checks what only shows at serve time).

``OMNI_PD_DIFF_MUTATIONS`` (default 600, CI's budget: about a minute of oracle time) caps the
mutations drawn, spread over the bases; ``OMNI_PD_DIFF_MUTATIONS=5000`` runs the long sweep.
The field table OPD114 reads (presets/targets/vllm_omni_stage_fields.yaml) is regenerated here
from the installed vllm-omni and must equal the committed file.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from omni_pd.check.validate import validate_text
from omni_pd.compile.expand import expand_document
from omni_pd.compile.passes.pd_split import ExpandOptions
from omni_pd.diagnostics import Severity
from omni_pd.io import parse_text
from omni_pd.resources import preset_path

ROOT = Path(__file__).resolve().parents[1]
ORACLE = os.environ.get("OMNI_PD_ORACLE_PYTHON")
sys.path.insert(0, str(ROOT / "tests" / "oracle"))
from mutations import mutations  # noqa: E402

pytestmark = pytest.mark.skipif(not ORACLE, reason="OMNI_PD_ORACLE_PYTHON not set (build it with .ci/oracle_venv.sh)")
BUDGET = int(os.environ.get("OMNI_PD_DIFF_MUTATIONS", "600"))


def _expand(src: Path | None, opts: ExpandOptions, pipeline: str | None = None) -> str:
    path = src or preset_path("qwen3_omni_moe")
    return expand_document(parse_text(path.read_text(), path.name), opts, pipeline=pipeline).text


def bases() -> dict[str, dict]:
    """Base name -> plain tree of each of expand's outputs the mutations start from."""
    safe = YAML(typ="safe")
    texts = {
        "preset": _expand(None, ExpandOptions()),
        "preset_one_piece": _expand(None, ExpandOptions(stream=False)),
        "preset_nixl": _expand(None, ExpandOptions(connector="NixlConnector")),
        "thinker_only": _expand(None, ExpandOptions(), pipeline="qwen3_omni_moe_thinker_only"),
    }
    return {name: safe.load(text) for name, text in texts.items()}


def _dump(tree: dict) -> str:
    buf = io.StringIO()
    YAML(typ="safe").dump(tree, buf)
    return buf.getvalue()


def run_oracle(files: list[Path]) -> dict[str, dict]:
    """File stem -> vllm-omni's result, from one oracle process over ``files``."""
    proc = subprocess.run([ORACLE, "-m", "omni_pd.upstream.vllm_oracle", *map(str, files)], capture_output=True,
                          text=True, timeout=1800, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")][1:]
    return {Path(r["file"]).stem: r for r in rows}


def errors_of(text: str, name: str) -> list[str]:
    """validate's error codes for ``text`` (an exception is a failure of its own: ``EXC:...``)."""
    try:
        res = validate_text(text, name)
    except Exception as e:  # noqa: BLE001 - the point is to see it
        return [f"EXC:{type(e).__name__}: {e}"]
    return [d.code for d in res.diagnostics if d.severity == Severity.ERROR]


def test_every_mutation_vllm_omni_refuses_gets_an_error_from_validate(tmp_path):
    base_trees = bases()
    per_base = max(20, BUDGET // len(base_trees))
    files: dict[str, tuple[str, str]] = {}  # stem -> (base, mutation name)
    seen: set[str] = set()
    for b, tree in base_trees.items():
        text = _dump(tree)
        (tmp_path / f"{b}__base.yaml").write_text(text)
        files[f"{b}__base"] = (b, "base")
        for i, (name, mutated) in enumerate(mutations(tree, per_base, seed=35)):
            text = _dump(mutated)
            if text in seen:
                continue
            seen.add(text)
            stem = f"{b}__{i:04d}"
            (tmp_path / f"{stem}.yaml").write_text(text)
            files[stem] = (b, name)
    results = run_oracle([tmp_path / f"{s}.yaml" for s in files])
    assert set(results) == set(files)
    refused, missed, base_errors = 0, [], []
    for stem, (b, name) in files.items():
        verdict = results[stem]["verdict"]
        errs = errors_of((tmp_path / f"{stem}.yaml").read_text(), f"{stem}.yaml")
        if name == "base":
            assert verdict.startswith("valid"), (b, verdict)
            if errs:
                base_errors.append((b, errs))
            continue
        if verdict.startswith("valid"):
            assert not any(e.startswith("EXC:") for e in errs), (b, name, errs)
            continue
        refused += 1
        if not errs or any(e.startswith("EXC:") for e in errs):
            missed.append(f"{b} {name}: vllm-omni ({results[stem]['step']}) {verdict[:160]}; validate {errs}")
    print(f"{len(files) - len(base_trees)} mutations of {len(base_trees)} bases, vllm-omni refused {refused}, "
          f"validate missed {len(missed)}")
    assert base_errors == [], "a base valid to vllm-omni gets errors from validate"
    assert refused > 0
    assert missed == [], "\n".join(missed)


def test_the_field_table_is_what_vllm_omni_says(tmp_path):
    """presets/targets/vllm_omni_stage_fields.yaml equals a fresh read of the oracle venv's vllm-omni."""
    out = tmp_path / "fields.yaml"
    proc = subprocess.run([ORACLE, "-m", "omni_pd.upstream.stage_fields_table", "-o", str(out)], capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out.read_text() == (ROOT / "presets" / "targets" / "vllm_omni_stage_fields.yaml").read_text()
