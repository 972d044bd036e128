"""The OPD007 gate ("not a deploy config") is one function shared by expand and validate.

A walkthrough found ``omni-pd validate`` passing a GitHub workflow, a Kubernetes
Deployment, a config.json, ``stages: []``, a bare ``pipeline:`` and the bundled
pipeline definitions (exit 0) while ``omni-pd expand`` refused them with OPD007. The
gate must not trip on a real deploy config: every file vllm-omni 0.30.0 ships in
``vllm_omni/deploy/`` except its forced-aligner stage settings, the case catalogues.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ruamel.yaml import YAML

from omni_pd.check.inputs import describe, not_a_deploy_config
from omni_pd.check.validate import validate_text
from omni_pd.diagnostics import Severity
from omni_pd.io import load_file
from tests.test_cli import run_cli

ROOT = Path(__file__).resolve().parents[1]
SHARED_CASES = ROOT.parent / "shared" / "cases"

NOT_DEPLOY = {
    "workflow.yaml": ("name: CI\non: [push]\njobs:\n  test:\n    runs-on: ubuntu-latest\n"
                      "    steps:\n      - run: pytest\n",
                      "a YAML mapping without `stages:` (top-level keys: jobs, name, on)"),
    "deployment.yaml": ("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: vllm}\nspec: {replicas: 1}\n",
                        "a YAML mapping without `stages:` (top-level keys: apiVersion, kind, metadata, spec)"),
    "config.json": ('{"model_type": "qwen3_omni_moe", "architectures": ["X"]}\n',
                    "a Hugging Face config.json (give it to `validate --model-info`)"),
    "empty.yaml": ("stages: []\n",
                   "an empty deploy config (`stages: []` sets no stage, so there is nothing to run)"),
    "pipeline_only.yaml": ("pipeline: qwen3_omni_moe\n",
                           "a YAML mapping without `stages:` (top-level keys: pipeline)"),
}


@pytest.mark.parametrize("name", sorted(NOT_DEPLOY))
def test_validate_refuses_what_expand_refuses(tmp_path, capsys, name):
    text, looks_like = NOT_DEPLOY[name]
    f = tmp_path / name
    f.write_text(text, encoding="utf-8")
    rc, out, err = run_cli(["validate", "-q", str(f)], capsys)
    assert rc == 1
    assert out.startswith(f"error[OPD007]: not a deploy config: this looks like {looks_like}\n --> {f}:1:1\n")
    assert out.splitlines()[-1].startswith(f"{f}: FAILED (1 error, ")
    rc, eout, err = run_cli(["expand", "-q", str(f), "-o", str(tmp_path / "pd.yaml")], capsys)
    assert (rc, eout) == (2, "")
    assert err.startswith(f"error[OPD007]: not a deploy config: this looks like {looks_like}\n")
    assert not (tmp_path / "pd.yaml").exists()


def test_validate_refuses_the_bundled_pipeline_definition(capsys):
    rc, out, _ = run_cli(["validate", "-q", "presets/pipelines/llm.yaml"], capsys)
    assert rc == 1
    assert out.startswith(
        "error[OPD007]: not a deploy config: this looks like an omni-pd pipeline definition (the stage graph, "
        "like presets/pipelines/*.yaml: stages with role/execution_type/input_sources), not deploy settings\n"
        " --> presets/pipelines/llm.yaml:1:1\n")
    # nothing after OPD007: the schema rules would judge a pipeline definition's keys
    assert out.endswith("presets/pipelines/llm.yaml: FAILED (1 error, 0 warnings, 0 info)\n")


def test_directory_walk_flags_the_non_deploy_files(tmp_path, capsys):
    for name in ("workflow.yaml", "empty.yaml"):
        (tmp_path / name).write_text(NOT_DEPLOY[name][0], encoding="utf-8")
    (tmp_path / "good.yaml").write_text((ROOT / "presets" / "qwen3_omni_moe.yaml").read_text(), encoding="utf-8")
    rc, out, _ = run_cli(["validate", "-q", str(tmp_path)], capsys)
    assert rc == 1
    lines = out.splitlines()
    flagged = [where.removeprefix(" --> ") for head, where in zip(lines, lines[1:])
               if head.startswith("error[OPD007]")]
    assert flagged == [f"{tmp_path}/empty.yaml:1:1", f"{tmp_path}/workflow.yaml:1:1"]
    assert out.splitlines()[-1].startswith("validate: 3 files, 1 ok, 2 failed (2 errors,")


def test_the_gate_only_runs_schema_rules():
    # `stages: []` used to get OPD901 ("async_chunk set to false ...") and friends from
    # rules that judge stages the file does not have
    res = validate_text("stages: []\n", "empty.yaml")
    assert [(d.code, d.location.line) for d in res.diagnostics] == [("OPD007", 1)]


@pytest.mark.parametrize("tree", [
    {"base_config": "bagel.yaml", "pipeline": "bagel_think"},       # a child overlay (vllm-omni's bagel_think.yaml)
    {"stages": [{"stage_id": 0, "final_output": True, "final_output_type": "text"}]},  # hunyuan_image_3_moe.yaml
    {"stage_args": [{"stage_id": 0}]},                               # legacy layout: OPD102 explains it
])
def test_deploy_shapes_pass_the_gate(tree):
    assert describe(tree) is None


def test_every_shipped_deploy_config_passes_the_gate(omni_wheel_deploy_dir: Path):
    files = sorted(omni_wheel_deploy_dir.glob("*.yaml"))
    tripped = {f.name: d for f in files if (d := not_a_deploy_config(load_file(f))) is not None}
    assert len(files) == 110
    # the one shipped file that is not a deploy config, by its own header comment
    # ("they are NOT a standalone engine"; given with --forced-aligner-config): a
    # warning, so validating vllm_omni/deploy/ stays free of errors
    assert list(tripped) == ["qwen3_tts_forced_aligner.yaml"]
    d = tripped["qwen3_tts_forced_aligner.yaml"]
    assert d.severity is Severity.WARNING
    assert d.message.startswith("not a deploy config: this looks like vllm-omni's forced-aligner stage settings")


def test_expand_refuses_the_forced_aligner_settings(tmp_path, capsys):
    f = tmp_path / "qwen3_tts_forced_aligner.yaml"
    f.write_text("forced_aligner:\n  model: Qwen/Qwen3-ForcedAligner-0.6B\n  runner: pooling\n")
    rc, out, err = run_cli(["validate", "-q", str(f)], capsys)
    assert rc == 0 and out.startswith("warning[OPD007]: not a deploy config: ")
    rc, out, err = run_cli(["expand", "-q", str(f)], capsys)
    assert (rc, out) == (2, "")
    assert err.startswith("error[OPD007]: not a deploy config: this looks like vllm-omni's forced-aligner stage ")


def _case_files() -> list[Path]:
    found = sorted((ROOT / "tests" / "cases").glob("*.yaml"))
    if SHARED_CASES.is_dir():
        found += sorted(SHARED_CASES.glob("*.yaml"))
    return found


@pytest.mark.parametrize("path", _case_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_case_trips_the_gate(path: Path):
    # pure: YAML 1.2, as the cases are written (typ="safe" alone picks libyaml, YAML 1.1,
    # when ruamel.yaml.clib is installed; it refuses the `[https://...]` of x-source)
    data = YAML(typ="safe", pure=True).load(path.read_text(encoding="utf-8"))
    assert describe(data) is None, path
