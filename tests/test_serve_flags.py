"""`vllm serve` flags: the generated per-release list, argv parsing, and launch refusing
an engine flag vllm serve would reject (OPD107) before anything starts.

The drift test regenerates presets/targets/serve_flags.yaml from vLLM's and
vllm-omni's own parsers in the oracle venv (OMNI_PD_ORACLE_PYTHON) and compares.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from omni_pd.check.serve_flags import flags_for, option_candidates, parse_argv, releases

ROOT = Path(__file__).resolve().parents[1]
ORACLE = os.environ.get("OMNI_PD_ORACLE_PYTHON")


def test_generated_list_has_vllm_0_30_serve_and_omni_flags() -> None:
    fs = flags_for("0.30")
    assert fs is not None and "0.30" in releases()
    assert {"--tensor-parallel-size", "-tp", "--max-model-len", "--kv-transfer-config", "--ec-transfer-config"} <= fs.serve
    assert {"--omni", "--deploy-config", "--stage-overrides", "--cfg-parallel-size"} <= fs.omni
    assert not fs.serve & fs.omni
    assert not any("stage-0" in f for f in fs.serve | fs.omni)
    assert fs.accepts("max_model_len", omni=False) and fs.accepts("tp", omni=False)
    assert not fs.accepts("stage_overrides", omni=False) and fs.accepts("stage_overrides", omni=True)
    assert fs.nearest("max_model_length", omni=False) == "--max-model-len"


def test_option_candidates() -> None:
    assert option_candidates("max_model_len") == ["--max-model-len"]
    assert option_candidates("--max-model-len") == ["--max-model-len"]
    assert option_candidates("tp") == ["--tp", "-tp"]


def test_parse_argv() -> None:
    assert parse_argv(["--max-model-len", "4096", "--enforce-eager", "--stage-0-devices=0", "-tp", "2",
                       "--seed", "-1"]) == {"max_model_len": "4096", "enforce_eager": True, "stage_0_devices": "0",
                                           "tp": "2", "seed": "-1"}
    assert parse_argv([]) == {}


def _pd_doc():
    from omni_pd.compile.expand import expand_document
    from omni_pd.io import parse_text

    text = (ROOT / "tests" / "fixtures" / "llm.yaml").read_text()
    res = expand_document(parse_text(text, "llm.yaml"), pipeline="llm")
    return parse_text(res.text, "pd.yaml")


@pytest.mark.parametrize(("args", "launched"), [
    ((), True),
    (("--max-model-len", "4096"), True),
    (("--stage-0-devices=0",), False),
    (("--max-model-lenn=4096",), False),
])
def test_launch_refuses_an_engine_arg_vllm_serve_rejects(args, launched) -> None:
    """plan_document validates with --engine-arg as global flags: OPD107 leaves no plan."""
    from omni_pd.launch.plan import LaunchOptions, plan_document

    planned = plan_document(_pd_doc(), "/tmp/pd.yaml", LaunchOptions(model="m", extra_args=tuple(args)))
    assert (planned.plan is not None) is launched
    codes = [d.code for d in planned.validation.diagnostics if d.code == "OPD107"]
    assert codes == ([] if launched else ["OPD107"])


@pytest.mark.skipif(not ORACLE, reason="OMNI_PD_ORACLE_PYTHON not set (build it with .ci/oracle_venv.sh)")
def test_serve_flag_list_matches_the_live_parsers(tmp_path) -> None:
    """Regenerate the list from vLLM's and vllm-omni's parsers in the oracle venv."""
    out = tmp_path / "serve_flags.yaml"  # a file: vLLM's import-time logging goes to stdout
    proc = subprocess.run([ORACLE, "-m", "omni_pd.check.serve_flags", "-o", str(out)], capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    from ruamel.yaml import YAML

    live = YAML(typ="safe", pure=True).load(out.read_text())["releases"]
    bundled = YAML(typ="safe", pure=True).load((ROOT / "presets" / "targets" / "serve_flags.yaml").read_text())["releases"]
    for rel, entry in live.items():
        assert rel in bundled, f"no list for vLLM {rel}: run the generator (see the file header)"
        assert sorted(bundled[rel]["serve"]) == entry["serve"], "vllm serve flags drifted: regenerate"
        assert sorted(bundled[rel]["omni"]) == entry["omni"], "vllm serve --omni flags drifted: regenerate"


def test_generator_refuses_without_vllm() -> None:
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is importable here")
    proc = subprocess.run([sys.executable, "-m", "omni_pd.check.serve_flags"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and "not importable" in proc.stderr


def test_generator_merges_the_old_file_as_yaml_1_2(tmp_path, monkeypatch) -> None:
    """`-o FILE` re-reads FILE's other releases with the YAML 1.2 reader every other data
    file goes through: `yes` stays the string `yes` and a plain `m:C` inside a flow
    sequence is read (libyaml, picked by typ="safe" alone when ruamel.yaml.clib is
    installed, refuses the latter: "found unexpected ':'")."""
    from omni_pd.check import serve_flags

    out = tmp_path / "serve_flags.yaml"
    out.write_text("releases:\n  '0.29':\n    vllm: yes\n    serve: [--a, no, m:C]\n    omni: []\n", encoding="utf-8")
    monkeypatch.setattr(serve_flags, "generate",
                        lambda: {"releases": {"0.30": {"vllm": "0.30.0", "serve": ["--b"], "omni": []}}})
    assert serve_flags.main(["-o", str(out)]) == 0
    from ruamel.yaml import YAML

    got = YAML(typ="safe", pure=True).load(out.read_text(encoding="utf-8"))["releases"]
    assert got == {"0.29": {"vllm": "yes", "serve": ["--a", "no", "m:C"], "omni": []},
                   "0.30": {"vllm": "0.30.0", "serve": ["--b"], "omni": []}}
    assert "vllm: yes" in out.read_text(encoding="utf-8")
