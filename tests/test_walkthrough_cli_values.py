"""New-user walkthrough of the README: option and input handling that vLLM users expect.

* ``validate --serve-arg tensor_parallel_size=x`` passed (exit 0): nothing typed the
  value, while ``vllm serve``'s argparse refuses it. The value is now typed like the same
  key in a stage entry (the deploy schema, OPD101), at ``<command line>``, naming the flag.
* A file that is not a deploy config (OPD007) still had every schema rule run on it
  (16 errors for a pipeline definition, OPD103 for a CI workflow's top-level keys):
  validate now stops that file's checks after OPD007, as a compiler stops at "not a
  source file".
* ``--platform`` / ``--format``: validate said OPD006 for ``--platform tpu`` while diff
  and graph gave the parser's usage error; now every command's closed-set option is a
  click Choice (usage error, exit 2, the choices listed).
* ``graph`` on a file without ``pipeline:`` drew ``<linear chain>`` with no hint.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from omni_pd.check.validate import ValidateOptions, validate_text
from omni_pd.diagnostics import Severity
from tests.test_cli import run_cli

ROOT = Path(__file__).resolve().parents[1]
PRESET = ROOT / "presets" / "qwen3_omni_moe.yaml"
TWO = "stages:\n  - {stage_id: 0, devices: \"0\"}\n  - {stage_id: 1, devices: \"1\"}\n"


# --- 1. --serve-arg values are typed ------------------------------------------------

def test_serve_arg_non_integer_is_a_located_opd101_naming_the_flag(tmp_path, capsys):
    rc, out, _ = run_cli(["validate", "-q", str(PRESET), "--serve-arg", "tensor_parallel_size=x"], capsys)
    assert rc == 1
    assert out.startswith("error[OPD101]: --tensor-parallel-size must be an integer, found 'x' "
                          "(vllm serve's parser refuses it)\n"
                          " --> <command line>\n"
                          "  = help: pass --serve-arg tensor_parallel_size=<an integer>\n")
    # the value is dropped, so OPD106 (broadcast) has no flag to warn about
    assert out.endswith(f"{PRESET}: FAILED (1 error, 0 warnings, 0 info)\n")


def test_serve_arg_types_json_location_and_values():
    res = validate_text(TWO, "two.yaml", ValidateOptions(cli={
        "tensor_parallel_size": "0", "gpu_memory_utilization": "lots", "max_model_len": "4096",
        "enforce_eager": "maybe", "dtype": "bfloat16", "compilation_config": '{"level": 3}'}))
    got = sorted((d.code, d.message, d.location.file, d.location.path) for d in res.diagnostics
                 if d.code == "OPD101")
    assert got == [
        ("OPD101", "--enforce-eager must be true or false, found 'maybe' (vllm serve's parser refuses it)",
         "<command line>", ("enforce_eager",)),
        ("OPD101", "--gpu-memory-utilization must be a number, found 'lots' (vllm serve's parser refuses it)",
         "<command line>", ("gpu_memory_utilization",)),
        ("OPD101", "--tensor-parallel-size must be a positive integer, found '0' (vllm serve's parser refuses it)",
         "<command line>", ("tensor_parallel_size",)),
    ]


def test_serve_arg_values_of_the_right_type_reach_the_rules_typed():
    from omni_pd.check.serve_flags import check_serve_args

    typed, diags = check_serve_args({"tensor_parallel_size": "2", "gpu_memory_utilization": "0.5",
                                     "enforce_eager": "true", "dtype": "half", "not_a_field": "x",
                                     "compilation_config": "{}"})
    assert diags == []
    assert typed == {"tensor_parallel_size": 2, "gpu_memory_utilization": 0.5, "enforce_eager": True,
                     "dtype": "half", "not_a_field": "x", "compilation_config": "{}"}
    # a badly typed value is dropped, as validate drops a wrongly typed YAML key, so no
    # rule reads it as the default
    typed, diags = check_serve_args({"tensor_parallel_size": "x", "max_num_seqs": "8"})
    assert typed == {"max_num_seqs": 8} and [d.location.path for d in diags] == [("tensor_parallel_size",)]


def test_human_readable_integers_are_read_as_vllm_serve_reads_them():
    # vLLM's parser takes --max-model-len 32k / auto and --max-num-batched-tokens 8K
    # (human_readable_int): they were OPD101 "vllm serve's parser refuses it"
    from omni_pd.check.serve_flags import check_serve_args

    assert check_serve_args({"max_model_len": "32k", "max_num_batched_tokens": "8K"}) == (
        {"max_model_len": 32000, "max_num_batched_tokens": 8192}, [])
    assert check_serve_args({"max_model_len": "25.6k"}) == ({"max_model_len": 25600}, [])
    assert check_serve_args({"max_model_len": "auto"}) == ({"max_model_len": -1}, [])
    # what vLLM refuses stays refused: decimals with a binary suffix, a suffix on a plain int flag
    typed, diags = check_serve_args({"max_model_len": "1.5K", "max_num_seqs": "2k"})
    assert typed == {} and [d.message for d in diags] == [
        "--max-model-len must be an integer, found '1.5K' (vllm serve's parser refuses it)",
        "--max-num-seqs must be an integer, found '2k' (vllm serve's parser refuses it)"]


def test_deploy_only_keys_are_not_typed_as_flags():
    from omni_pd.check.serve_flags import check_serve_args

    assert check_serve_args({"num_replicas": "x", "stage_id": "y"}) == ({"num_replicas": "x", "stage_id": "y"}, [])


_ENGINE_ARG_TYPES = """
import dataclasses, json
from vllm.engine.arg_utils import EngineArgs
from omni_pd.compile.model import StageDeploy
from omni_pd.check.serve_flags import _scalar_field
up = {f.name: str(f.type) for f in dataclasses.fields(EngineArgs)}
print(json.dumps({k: [str(f.annotation), up[k]] for k, f in StageDeploy.model_fields.items()
                  if _scalar_field(f.annotation) and k in up}))
"""


def test_typed_serve_args_have_vllms_engine_args_types():
    # the schema types a --serve-arg value; for vLLM's own flags they must be EngineArgs' types
    import os
    import subprocess

    py = os.environ.get("OMNI_PD_ORACLE_PYTHON")
    if not py:
        pytest.skip("OMNI_PD_ORACLE_PYTHON not set (build it with .ci/oracle_venv.sh)")
    proc = subprocess.run([py, "-c", _ENGINE_ARG_TYPES], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"tensor_parallel_size", "gpu_memory_utilization", "max_model_len", "enforce_eager"} <= set(got)
    for key, (ours, vllm) in got.items():
        base = lambda t: {w for w in ("int", "float", "bool", "str") if w in t}  # noqa: E731
        assert base(ours) == base(vllm), (key, ours, vllm)


def test_serve_arg_integer_still_reaches_the_device_rules(capsys):
    rc, out, _ = run_cli(["validate", "-q", "--format", "json", str(PRESET), "--serve-arg", "tensor_parallel_size=2"],
                         capsys)
    assert rc == 1
    codes = [d["code"] for d in json.loads(out)]
    assert "OPD401" in codes and "OPD101" not in codes


def test_serve_arg_type_error_honours_the_rule_filter():
    res = validate_text(TWO, "two.yaml", ValidateOptions(cli={"tensor_parallel_size": "x"}, rules=("OPD401",)))
    assert [d for d in res.diagnostics if d.code == "OPD101"] == []
    res = validate_text(TWO, "two.yaml", ValidateOptions(cli={"tensor_parallel_size": "x"}, rules=("OPD101",)))
    assert [d.code for d in res.diagnostics if d.severity is Severity.ERROR] == ["OPD101"]


# --- 2. not a deploy config: stop there -----------------------------------------------

def test_pipeline_definition_gets_only_opd007(capsys):
    rc, out, _ = run_cli(["validate", "presets/pipelines/qwen3_omni_moe.yaml"], capsys)
    assert rc == 1
    assert [ln.split("]")[0] for ln in out.splitlines() if ln.startswith(("error[", "warning[", "info["))] \
        == ["error[OPD007"]
    assert out.endswith("presets/pipelines/qwen3_omni_moe.yaml: FAILED (1 error, 0 warnings, 0 info)\n")


def test_ci_workflow_gets_only_opd007_and_the_multi_file_summary_counts_it(tmp_path, capsys):
    wf = tmp_path / "ci.yaml"
    wf.write_text("name: CI\non: [push]\njobs:\n  test:\n    runs-on: ubuntu-latest\n", encoding="utf-8")
    res = validate_text(wf.read_text(), str(wf))
    assert [(d.code, d.severity) for d in res.diagnostics] == [("OPD007", Severity.ERROR)]
    rc, out, _ = run_cli(["validate", "-q", str(wf), str(PRESET)], capsys)
    assert rc == 1
    assert out.splitlines()[-1] == "validate: 2 files, 1 ok, 1 failed (1 error, 0 warnings, 0 info)"


def test_expand_of_a_pipeline_definition_reports_opd007_alone(tmp_path, capsys):
    rc, out, err = run_cli(["expand", "presets/pipelines/qwen3_omni_moe.yaml", "-o", str(tmp_path / "pd.yaml")],
                           capsys)
    assert (rc, out) == (2, "")
    assert "schema checks" not in err and "OPD103" not in err and "OPD111" not in err
    assert err.endswith("  = help: expand takes a vllm-omni deploy config (a `stages:` list of per-stage engine "
                        "settings, like presets/qwen3_omni_moe.yaml); nothing was written\n")


# --- 3. closed-set options are the parser's; graph's linear-chain hint ----------------


@pytest.mark.parametrize("argv, option, choices", [
    (["validate", "--platform", "tpu", "X"], "--platform", "'cuda', 'rocm', 'npu', 'xpu', 'musa', 'cpu'"),
    (["diff", "--platform", "tpu", "A", "B"], "--platform", "'cuda', 'rocm', 'npu', 'xpu', 'musa'"),
    (["graph", "--platform", "tpu", "X"], "--platform", "'cuda', 'rocm', 'npu', 'xpu', 'musa'"),
    (["graph", "--format", "png", "X"], "--format", "'tree', 'mermaid', 'dot'"),
    (["validate", "--format", "xml", "X"], "--format", "'text', 'json', 'sarif', 'concise', 'github'"),
    (["diff", "--format", "yaml", "A", "B"], "--format", "'text', 'json'"),
])
def test_closed_set_options_are_usage_errors_before_any_file_is_read(capsys, argv, option, choices):
    rc, out, err = run_cli(argv, capsys)
    assert (rc, out) == (2, "")
    assert f"Error: Invalid value for '{option}': " in err
    assert f"'{argv[argv.index(option) + 1]}' is not one of {choices}." in err
    assert "OPD" not in err  # not a finding about a file (the files named do not exist)


def test_platform_choices_are_the_compilers_and_the_launchers():
    # cli.py spells the choices out (importing their owners costs start-up time)
    from typing import get_args

    from omni_pd.cli.options import LAUNCH_PLATFORM as _LAUNCH_PLATFORM, PLATFORM as _PLATFORM
    from omni_pd.compile.topology import PLATFORMS
    from omni_pd.launch.plan import DEVICE_ENV

    assert get_args(_PLATFORM) == PLATFORMS
    assert get_args(_LAUNCH_PLATFORM) == tuple(DEVICE_ENV)


def test_launch_platform_is_a_choice_too(capsys):
    rc, out, err = run_cli(["launch", "X", "--model", "m", "--platform", "tpu"], capsys)
    assert (rc, out) == (2, "")
    assert "'tpu' is not one of 'cuda', 'rocm', 'npu', 'xpu', 'musa', 'cpu'." in err


def test_graph_of_an_unnamed_chain_says_how_to_name_the_pipeline(tmp_path, capsys):
    f = tmp_path / "three.yaml"
    f.write_text("stages:\n  - {stage_id: 0, devices: \"0\"}\n  - {stage_id: 1, devices: \"1\"}\n"
                 "  - {stage_id: 2, devices: \"2\"}\n", encoding="utf-8")
    rc, out, err = run_cli(["graph", str(f)], capsys)
    assert rc == 0 and "<linear chain>" in out
    assert err == (f"note: {f} names no `pipeline:` and omni-pd cannot infer one, so its stages are drawn "
                   "as a linear chain with unknown roles; pass --pipeline NAME (see `omni-pd pipelines`) "
                   "or add `pipeline: NAME` to the file\n")
    rc, out, err = run_cli(["graph", str(f), "--pipeline", "qwen3_omni_moe"], capsys)
    assert rc == 0 and err == "" and "<linear chain>" not in out and "thinker" in out
    rc, out, err = run_cli(["graph", str(f), "--pipeline", "qwen3_omni"], capsys)
    assert rc == 0 and "<qwen3_omni: linear chain>" in out
    assert err.startswith("note: pipeline `qwen3_omni` (--pipeline) is not in omni-pd's catalogue, so its stages "
                          "are drawn as a linear chain with unknown roles; pass --pipeline NAME")
    rc, out, err = run_cli(["graph", "presets/qwen3_omni_moe.yaml"], capsys)
    assert rc == 0 and err == ""


# --- review fixes: the linear-chain stand-in is a field, diff notes it, Literal flags list their values


def _chosen(text: str, pipeline: str | None = None):
    from omni_pd.check.validate import Locator, choose_pipeline
    from omni_pd.compile.parse import parse_config
    from omni_pd.compile.pipelines import load_catalogue
    from omni_pd.io import load_stream

    doc = load_stream(io.BytesIO(text.encode()), "x.yaml")
    return choose_pipeline(parse_config(doc), Locator(doc), load_catalogue(), ValidateOptions(pipeline=pipeline))[0]


THREE = "stages:\n  - {stage_id: 0}\n  - {stage_id: 1}\n  - {stage_id: 2}\n"


def test_the_linear_chain_stand_in_is_marked_by_a_field_not_by_its_name():
    # graph's note and diff's fallback test this field; they used to match the display name
    assert _chosen(THREE).linear_chain and _chosen(THREE).name == "<linear chain>"
    assert _chosen("pipeline: foo\n" + THREE).linear_chain
    assert _chosen(THREE, pipeline="foo").linear_chain
    assert not _chosen(THREE, pipeline="qwen3_omni_moe").linear_chain
    pd = ("stages:\n  - {stage_id: 0, engine_args: {kv_transfer_config: {kv_role: kv_producer}}}\n"
          "  - {stage_id: 1, engine_args: {kv_transfer_config: {kv_role: kv_consumer}}}\n")
    assert _chosen(pd).name == "<inferred PD chain>" and not _chosen(pd).linear_chain


def test_diff_with_an_unknown_pipeline_says_so_as_graph_does(tmp_path, capsys):
    from tests.test_cli import ROOT

    (tmp_path / "my.yaml").write_text((ROOT / "presets" / "qwen3_omni_moe.yaml").read_text())
    rc, _, _ = run_cli(["expand", "my.yaml", "--pipeline", "qwen3_omni_moe", "-q", "-o", "pd.yaml"],
                       capsys, cwd=tmp_path)
    assert rc == 0
    rc, out, err = run_cli(["diff", "--pipeline", "nosuch", "my.yaml", "pd.yaml"], capsys, cwd=tmp_path)
    assert rc == 0 and "stage 2 talker (from input stage 1 stage)" in out
    assert err == ("note: pipeline `nosuch` (--pipeline) is not in omni-pd's catalogue, so its stages are compared "
                   "as a linear chain with unknown roles; pass --pipeline NAME (see `omni-pd pipelines`) "
                   "or add `pipeline: NAME` to the file\n")
    rc, out, err = run_cli(["diff", "my.yaml", "pd.yaml"], capsys, cwd=tmp_path)  # the fallback: no note
    assert (rc, err) == (0, "") and "stage 2 talker (from input stage 1 talker)" in out


def test_a_literal_flag_names_the_values_it_accepts(monkeypatch):
    from typing import Literal

    from pydantic import model_validator

    import omni_pd.compile.model as model
    from omni_pd.check.serve_flags import check_serve_args

    class WithChoice(model.StageDeploy):
        load_format: Literal["auto", "dummy"] | None = None

        @model_validator(mode="after")
        def _no_three(self):  # a refusal pydantic locates at the model, not at the field
            if self.tensor_parallel_size == 3:
                raise ValueError("three")
            return self

    monkeypatch.setattr(model, "StageDeploy", WithChoice)
    typed, diags = check_serve_args({"load_format": "pt", "tensor_parallel_size": "3"})
    assert typed == {}
    assert [(d.code, d.message, d.help) for d in diags] == [
        ("OPD101", "--load-format must be one of `auto`, `dummy`, found 'pt' (vllm serve's parser refuses it)",
         "pass --serve-arg load_format=<one of `auto`, `dummy`>"),
        ("OPD101", "--tensor-parallel-size must be a value it accepts, found '3' (vllm serve's parser refuses it)",
         "pass --serve-arg tensor_parallel_size=<a value it accepts>")]
