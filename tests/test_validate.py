"""`omni-pd validate` end to end: CLI exit codes and output, clean verdicts on the
bundled presets' expansions and on vllm-omni 0.30.0's shipped deploy configs,
base_config and platform overlays, and the schema file staying in sync."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omni_pd.cli import main
from omni_pd.diagnostics import Severity
from omni_pd.io import load_file
from omni_pd.check.validate import ValidateOptions, validate_document, validate_text

REPO = Path(__file__).resolve().parents[1]
PRESETS = sorted((REPO / "presets").glob("*.yaml"))
CONNECTORS = ["MooncakeConnector", "NixlConnector"]


def _expand(preset: Path, connector: str) -> str:
    from omni_pd.compile.expand import expand_document
    from omni_pd.compile.passes.pd_split import ExpandOptions

    return expand_document(load_file(preset), ExpandOptions(connector=connector)).text


@pytest.fixture(scope="module")
def expansions() -> dict[tuple[str, str], str]:
    return {(p.name, c): _expand(p, c) for p in PRESETS for c in CONNECTORS}


@pytest.mark.parametrize("connector", CONNECTORS)
@pytest.mark.parametrize("preset", [p.name for p in PRESETS])
@pytest.mark.parametrize("platform", [None, "cuda", "rocm", "xpu", "musa"])
def test_expand_output_validates_clean(expansions, preset: str, connector: str, platform: str | None) -> None:
    res = validate_text(expansions[(preset, connector)], "expanded.yaml", ValidateOptions(platform=platform))
    # no OPD704: omni-pd's compatibility layer gives the Talker its prompt rows on vllm-omni 0.30;
    # no OPD703: one host, omni-pd's router, no model facts: nothing only a transfer would show
    assert [d.code for d in res.diagnostics] == []


@pytest.mark.parametrize("connector", CONNECTORS)
def test_expand_output_npu_overlay_validates_clean(expansions, connector: str) -> None:
    res = validate_text(expansions[(PRESETS[0].name, connector)], "expanded.yaml", ValidateOptions(platform="npu"))
    assert not res.errors, [(d.code, d.message) for d in res.errors]


@pytest.mark.parametrize("preset", [p.name for p in PRESETS])
def test_bundled_presets_validate_clean_on_every_platform(preset: str) -> None:
    res = validate_document(load_file(REPO / "presets" / preset), ValidateOptions(all_platforms=True))
    assert [(d.code, d.message) for d in res.diagnostics] == []


#: shipped configs that really are wrong, with the reason (reported in the issue note)
WHEEL_KNOWN_WRONG = {
    "minicpmo_4_5_8x4090_stage1_replicas.yaml":
        "stage 1 is moved to devices 4,5,6,7 (4 replicas at gpu_memory_utilization 0.8) while stage 2 stays on "
        "device 5 from the base file at 0.9: GPU 5 is asked for 1.7 of its memory",
}


def _wheel_dir(request) -> Path:
    return request.getfixturevalue("omni_wheel_deploy_dir")


def test_vllm_omni_wheel_deploy_configs_have_no_errors(request) -> None:
    """Zero errors on every vllm_omni/deploy/*.yaml of vllm-omni 0.30.0, all platforms."""
    deploy = _wheel_dir(request)
    files = sorted(deploy.glob("*.yaml"))
    assert len(files) > 20
    failures = {}
    for f in files:
        res = validate_document(load_file(f), ValidateOptions(all_platforms=True))
        if res.errors:
            failures[f.name] = [(d.code, d.message) for d in res.errors]
    assert set(failures) == set(WHEEL_KNOWN_WRONG), failures
    assert failures["minicpmo_4_5_8x4090_stage1_replicas.yaml"][0][0] == "OPD404"


# --- CLI ---------------------------------------------------------------------------------

def test_cli_default_preset_is_clean(capsys) -> None:
    assert main(["validate"]) == 0
    out = capsys.readouterr().out
    assert out.strip().endswith("qwen3_omni_moe.yaml: ok (0 errors, 0 warnings, 0 info)")


def test_cli_errors_exit_1_with_rustc_style_text(tmp_path, capsys) -> None:
    f = tmp_path / "pd.yaml"
    f.write_text("pipeline: qwen3_omni_moe_pd\nasync_chunk: false\nstages:\n"
                 "  - stage_id: 0\n    devices: \"0\"\n    kv_transfer_config:\n      kv_connector: MooncakeConnector\n"
                 "      kv_role: kv_producer\n      engine_id: p\n"
                 "  - stage_id: 1\n    devices: \"1\"\n    kv_transfer_config:\n      kv_connector: NixlConnector\n"
                 "      kv_role: kv_consumer\n      engine_id: d\n")
    assert main(["validate", str(f)]) == 1
    out = capsys.readouterr().out
    assert "error[OPD304]: prefill and decode use different KV connectors\n" in out
    assert f"  --> {f}:13:21\n" in out
    assert "13 |       kv_connector: NixlConnector\n" in out
    assert "   |                     ^^^^^^^^^^^^^ decode uses NixlConnector\n" in out
    assert f"   = note: prefill (stage 0) uses MooncakeConnector: {f}:7:21\n" in out
    assert "   = help: use the same kv_connector on both stages of the PD pair\n" in out
    assert "FAILED (1 error" in out


def test_cli_json_format(tmp_path, capsys) -> None:
    f = tmp_path / "a.yaml"
    f.write_text("stages:\n  - stage_id: 0\n    devices: \"0\"\n    tensor_parallel_size: 2\n")
    assert main(["validate", str(f), "--format", "json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert [(d["code"], d["severity"], d["location"]["line"], d["location"]["column"], d["location"]["path"])
            for d in data] == [("OPD401", "error", 3, 14, "stages[0].devices")]


def test_cli_exit_2_for_unreadable_input_and_bad_usage(tmp_path, capsys) -> None:
    assert main(["validate", str(tmp_path / "missing.yaml")]) == 2
    assert main(["validate", "--format", "xml"]) == 2
    assert main(["validate", "--platform", "tpu"]) == 2
    assert main(["validate", "--platform", "npu", "--all-platforms"]) == 2
    assert main(["validate", "--vllm-version", "latest"]) == 2
    bad = tmp_path / "inv.yaml"
    bad.write_text("hosts: {a: {accelerator: gpu}}\n")
    assert main(["validate", "--inventory", str(bad)]) == 2
    assert main(["explain", "OPD999"]) == 2


def test_cli_inventory_and_model_info(tmp_path, capsys) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  host-a: {accelerator: npu, count: 2, memory_gib: 64}\nplacement:\n  all: host-a\n")
    assert main(["validate", "--platform", "npu", "--inventory", str(inv)]) == 1
    out = capsys.readouterr().out
    assert "error[OPD402]: stage 1 npu overlay places device 2, but only 2 NPUs are visible (host host-a has 2)" in out
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "qwen3_omni_moe", "thinker_config": {"text_config": {"num_key_value_heads": 4}}}))
    assert main(["validate", "--model-info", str(cfg)]) == 1
    assert "error[OPD206]" in capsys.readouterr().out


def test_cli_rules_and_explain(capsys) -> None:
    assert main(["rules"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("OPD101  error    wrong-type")
    assert any(line.startswith("OPD304  error    pd-connector-mismatch") for line in lines)
    assert main(["explain", "opd404"]) == 0
    assert capsys.readouterr().out.startswith("OPD404 memory-budget (error, devices)")


# --- base_config, platforms, pipeline inference --------------------------------------------

def test_base_config_diagnostics_point_into_the_file_that_sets_the_key(tmp_path) -> None:
    child = tmp_path / "child.yaml"
    child.write_text("base_config: qwen3_omni_moe.yaml\nstages:\n  - stage_id: 1\n    gpu_memory_utilization: 0.95\n")
    res = validate_document(load_file(child))
    d = [d for d in res.diagnostics if d.code == "OPD404"][0]
    assert (d.location.file, d.location.line, d.location.column) == (str(child), 4, 29)
    assert d.message == "physical GPU 1: 0.95 (stage 1) + 0.1 (stage 2) = 1.05 > 1.0"
    assert [(r.file.endswith("presets/qwen3_omni_moe.yaml"), r.line, r.label) for r in d.related] == [
        (True, 49, "stage 2 reserves 0.1")]


def test_all_platforms_tags_overlay_findings() -> None:
    text = ("pipeline: qwen3_omni_moe\nstages:\n  - {stage_id: 0, devices: \"0\"}\n"
            "platforms:\n  rocm:\n    stages:\n      - {stage_id: 0, tensor_parallel_size: 2}\n")
    res = validate_text(text, "t.yaml", ValidateOptions(all_platforms=True))
    d = [d for d in res.diagnostics if d.code == "OPD401"]
    assert len(d) == 1 and d[0].notes == ["found with the `platforms.rocm` overlay applied"]
    assert (d[0].location.line, d[0].location.column) == (3, 28)
    assert not validate_text(text, "t.yaml").errors


def test_pd_inferred_from_kv_roles_without_pipeline_key() -> None:
    text = ("async_chunk: false\nstages:\n"
            "  - {stage_id: 0, devices: \"0\", kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer}}\n"
            "  - {stage_id: 1, devices: \"0\", kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_consumer}}\n")
    res = validate_text(text, "t.yaml")
    assert "OPD403" in res.codes(Severity.WARNING)  # the pair was found: they share GPU 0




def test_cli_env_and_serve_args_are_context(capsys) -> None:
    assert main(["validate", "--serve-arg", "tensor-parallel-size=4", "--env", "CUDA_VISIBLE_DEVICE=0"]) == 1
    out = capsys.readouterr().out
    assert "error[OPD401]: stage 0: tensor_parallel_size 4" in out
    assert "warning[OPD106]: global --tensor-parallel-size would be broadcast to all 3 stages" in out
    assert "error[OPD105]: `CUDA_VISIBLE_DEVICE` is not a known variable; did you mean `CUDA_VISIBLE_DEVICES`?" in out
    assert main(["validate", "--env", "CUDA_VISIBLE_DEVICES=7"]) == 1  # one device visible, stage 1 uses index 1
    assert "error[OPD402]: stage 1 uses device 1, but only 1 GPU is visible" in capsys.readouterr().out
    assert main(["validate", "--env", "NOEQUALS"]) == 2


def test_against_vllm_omni_without_vllm_omni_says_how_to_install(tmp_path):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OMNI_PD_ORACLE_PYTHON"}
    p = subprocess.run([sys.executable, "-m", "omni_pd.cli", "validate", "--against-vllm-omni"],
                       capture_output=True, text=True, env=env)
    assert p.returncode == 2
    assert "error[OPD952]: vllm-omni is not importable here and no --vllm-omni-python was given" in p.stderr
    assert "pip install vllm-omni==0.30.0" in p.stderr


def test_against_vllm_omni_does_not_apply_to_plain_vllm_pipelines(tmp_path, capsys):
    # vllm-omni registers no `llm_pd` (its resolver raised KeyError, reported as OPD951,
    # exit 1); the file now gets an info and vllm-omni is not run at all (the python
    # given does not exist: running it would be OPD952, exit 2)
    from omni_pd.compile.expand import expand_document
    from omni_pd.compile.passes.pd_split import ExpandOptions

    f = tmp_path / "pd.yaml"
    f.write_text(expand_document(load_file(REPO / "tests" / "fixtures" / "llm.yaml"), ExpandOptions()).text)
    rc = main(["validate", str(f), "--against-vllm-omni", "--vllm-omni-python", str(tmp_path / "no-python")])
    out = capsys.readouterr().out
    assert rc == 0
    assert (f"info[OPD953]: pipeline `llm_pd` runs on plain `vllm serve` (omni-pd launch starts one vLLM engine "
            f"per stage), not on vllm-omni: --against-vllm-omni does not apply and nothing was run\n --> {f}:1:1\n") in out
    assert out.endswith(f"{f}: ok (0 errors, 0 warnings, 1 info)\n")


def test_plain_vllm_scope_is_read_from_the_catalogue(tmp_path):
    from omni_pd.upstream.against import against_vllm_omni, plain_vllm_pipeline

    f = tmp_path / "pd.yaml"
    [d] = against_vllm_omni(f, python=str(tmp_path / "no-python"), pipeline="llm_pd")
    assert (d.code, d.severity, d.location.line, d.message) == (
        "OPD953", Severity.INFO, 1,
        "pipeline `llm_pd` runs on plain `vllm serve` (omni-pd launch starts one vLLM engine per stage), "
        "not on vllm-omni: --against-vllm-omni does not apply and nothing was run")
    # pipelines vllm-omni registers (or omni-pd's plugin registers in it) still go to vllm-omni
    for name in ("qwen3_omni_moe_pd", "qwen3_omni_moe_thinker_only_pd", "not_catalogued", None):
        assert plain_vllm_pipeline(f, name) is None
