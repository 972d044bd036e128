"""``launch`` shows the findings ``validate`` gives for its config, before it plans
(issue 24, item 3): same rendering, same counts in the summary line.

Reproduction: the bundled preset expanded (full Qwen3-Omni pipeline, 0 findings of its
own) launched with ``--engine-arg --max-num-seqs=4``: ``validate --serve-arg
max_num_seqs=4`` (the same global flag) gives ``warning[OPD106]`` (the flag is broadcast
to all 4 stages); before the fix ``launch --dry-run`` printed the plan and nothing of it,
and a failed launch counted "0 warnings".
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omni_pd.cli import main
from omni_pd.compile.expand import expand_document
from omni_pd.compile.passes.pd_split import ExpandOptions
from omni_pd.io import parse_text
from omni_pd.resources import preset_path

ROOT = Path(__file__).resolve().parents[1]
LLM = ROOT / "tests" / "fixtures" / "llm.yaml"

OPD106 = ("warning[OPD106]: global --max-num-seqs would be broadcast to all 4 stages\n"
          " --> <command line>\n"
          "  = help: drop the flag and set `max_num_seqs` per stage in the deploy YAML\n")


def _compiled(tmp_path: Path, src: Path, pipeline: str | None = None, **kw) -> Path:
    res = expand_document(parse_text(src.read_text(), src.name), ExpandOptions(**kw), pipeline=pipeline)
    out = tmp_path / "pd.yaml"
    out.write_text(res.text)
    return out


def _run(capsys, *args) -> tuple[int, str, str]:
    rc = main([str(a) for a in args])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture
def preset_pd(tmp_path):
    return _compiled(tmp_path, preset_path("qwen3_omni_moe"))


def test_validate_gives_the_warning_the_launch_must_show(preset_pd, capsys):
    rc, out, _ = _run(capsys, "validate", preset_pd, "--serve-arg", "max_num_seqs=4")
    assert (rc, out) == (0, OPD106 + f"{preset_pd}: ok (0 errors, 1 warning, 0 info)\n")
    rc, out, _ = _run(capsys, "validate", preset_pd)
    assert (rc, out) == (0, f"{preset_pd}: ok (0 errors, 0 warnings, 0 info)\n")


def test_dry_run_says_validates_findings_on_stderr_and_the_plan_alone_on_stdout(preset_pd, capsys):
    rc, vout, _ = _run(capsys, "validate", preset_pd, "--serve-arg", "max_num_seqs=4")
    assert rc == 0
    rc, out, err = _run(capsys, "launch", preset_pd, "--model", "m", "--dry-run", "--vllm", "/nonexistent/vllm",
                        "--engine-arg=--max-num-seqs=4")
    assert rc == 0, err
    # validate's exact text, verdict line included, on stderr; stdout the plan alone, so `launch --dry-run
    # > plan.sh` saves a script that runs (the second-hour walkthrough: findings on stdout broke it)
    assert err == vout
    assert out.startswith("# launch plan: qwen3_omni_moe_pd (vllm serve --omni), MooncakeConnector")


def test_dry_run_of_a_config_without_findings_prints_the_plan_alone(preset_pd, capsys):
    rc, out, err = _run(capsys, "launch", preset_pd, "--model", "m", "--dry-run", "--vllm", "/nonexistent/vllm")
    assert rc == 0, err
    assert out.startswith("# launch plan: qwen3_omni_moe_pd (vllm serve --omni), MooncakeConnector")


def test_json_dry_run_keeps_stdout_a_plan_and_says_the_findings_on_stderr(preset_pd, capsys):
    rc, out, err = _run(capsys, "launch", preset_pd, "--model", "m", "--dry-run", "--format", "json",
                        "--vllm", "/nonexistent/vllm", "--engine-arg=--max-num-seqs=4")
    assert rc == 0, err
    assert json.loads(out)["runtime"] == "vllm-omni"
    assert err == OPD106 + f"{preset_pd}: ok (0 errors, 1 warning, 0 info)\n"


def test_a_refused_launch_shows_every_finding_and_counts_them_as_validate(tmp_path, capsys):
    cfg = _compiled(tmp_path, preset_path("qwen3_omni_moe"))
    cfg.write_text(cfg.read_text().replace("kv_role: kv_consumer", "kv_role: kv_producer"))
    rc, vout, _ = _run(capsys, "validate", cfg, "--serve-arg", "max_num_seqs=4")
    assert rc == 1 and vout.endswith(f"{cfg}: FAILED (2 errors, 1 warning, 0 info)\n")
    findings = vout.rsplit(f"{cfg}: FAILED", 1)[0]
    rc, out, _ = _run(capsys, "launch", cfg, "--model", "m", "--dry-run", "--engine-arg=--max-num-seqs=4")
    assert rc == 1
    assert out == findings + f"{cfg}: not launched (2 errors, 1 warning, 0 info)\n"


def test_a_real_launch_counts_validates_warning_in_its_preflight_summary(preset_pd, tmp_path, capsys):
    run = tmp_path / "run"
    rc, out, _ = _run(capsys, "launch", preset_pd, "--model", "m", "--vllm", "/nonexistent/vllm",
                      "--python", "/nonexistent/python", "--run-dir", run, "--engine-arg=--max-num-seqs=4")
    assert rc == 1
    assert out.startswith(OPD106 + f"{preset_pd}: ok (0 errors, 1 warning, 0 info)\n")
    assert "error[OPD961]: omni: executable `/nonexistent/vllm` not found" in out
    last = out.rstrip().splitlines()[-1]
    assert last.startswith("preflight: not launched (") and ", 1 warning, " in last, last
    assert not run.exists()  # nothing started


def test_launch_and_render_read_a_local_checkpoints_config_json(tmp_path, capsys):
    # the model facts of `--model DIR` (its config.json) judge the launch as `validate
    # --model-info` does: prefill TP 2 over one KV head with decode at TP 1 fails vLLM 0.30's
    # NIXL handshake ("handshake_setup_failed" in decode, seen on CPU across two hosts)
    from omni_pd.check.context import ModelInfo

    pd = _compiled(tmp_path, LLM, pipeline="llm", connector="NixlConnector", prefill_tp=2)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"model_type": "qwen2", "num_key_value_heads": 1}))
    opd603 = ("error[OPD603]: prefill TP 2 > num_key_value_heads 1 with the other side at TP 1: KV heads are "
              "replicated and the heterogeneous-TP shape check fails")
    rc, out, _ = _run(capsys, "launch", pd, "--model", ckpt, "--dry-run")
    assert rc == 1 and opd603 in out
    rc, out, err = _run(capsys, "render", pd, "--model", ckpt, "--to", tmp_path / "out")
    assert rc == 1 and opd603 in out + err and not (tmp_path / "out").exists()
    # a hub id, a directory without config.json, or one that is not JSON: no facts, no finding
    assert _run(capsys, "launch", pd, "--model", "Qwen/Qwen2-0.5B", "--dry-run")[0] == 0
    (ckpt / "config.json").write_text("{not json")
    assert ModelInfo.from_model_dir(str(ckpt)) is None and ModelInfo.from_model_dir(str(tmp_path / "none")) is None
    assert _run(capsys, "launch", pd, "--model", ckpt, "--dry-run")[0] == 0
