"""omni-pd size against AIConfigurator itself, live (issue 26 "tests that must exist").

For two model+system pairs AIConfigurator 0.12.0 models, one subprocess in the AIConfigurator
venv (``OMNI_PD_AIC_PYTHON``, built by .ci/aic_venv.sh) runs AIConfigurator's own entry point
``aiconfigurator.cli.cli_default`` directly and ``omni-pd size`` live (tests/aic/size_probe.py,
one process so the perf database loads once). Here: omni-pd's Thinker choice is
AIConfigurator's top disaggregated row, the config ``--write`` wrote has exactly its instances,
TP and DP per side, and ``omni-pd validate`` passes it. Measured on the 2-core CI machine: ~2.5-3.5 min of one core
for both (the 30B example most of it; docs/sizing.md).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "sizing"
AIC = os.environ.get("OMNI_PD_AIC_PYTHON")
pytestmark = pytest.mark.skipif(not AIC, reason="OMNI_PD_AIC_PYTHON not set (build it with .ci/aic_venv.sh)")

SIDE_COLS = ("workers", "tp", "pp", "dp")


def _probe(tmp_path: Path, aic: dict, size: list[str]) -> dict:
    case = tmp_path / "case.json"
    case.write_text(json.dumps({"aic": aic, "size": size}))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.run([str(AIC), str(ROOT / "tests" / "aic" / "size_probe.py"), str(case)],
                          capture_output=True, text=True, timeout=1800, cwd=ROOT, env=env)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("AIC-PROBE ")), None)
    assert line, proc.stderr[-3000:]
    got = json.loads(line.split(" ", 1)[1])
    assert got["size_rc"] == 0, got["size_stderr"]
    return got


def _side(row: dict, p: str) -> tuple[int, ...]:
    return tuple(int(row[f"({p}){c}"]) for c in SIDE_COLS)


def _thinker(summary: dict, side: str) -> tuple[int, ...]:
    s = summary["thinker"][side]
    return (s["replicas"], s["tp"], s["pp"], s["dp"])


def _written(path: Path) -> dict[str, tuple]:
    """Per kv_role of the written file: (num_replicas, tensor_parallel_size, data_parallel_size, devices)."""
    from omni_pd.io import load_file

    out = {}
    for s in load_file(path).tree["stages"]:
        role = (s.get("kv_transfer_config") or {}).get("kv_role")
        if role:
            out[role] = (s.get("num_replicas", 1), s.get("tensor_parallel_size", 1), s.get("data_parallel_size", 1),
                         str(s["devices"]))
    return out


def _devices(first: int, n: int) -> str:
    return ",".join(str(i) for i in range(first, first + n))


def _check(got: dict, recorded: Path, out: Path, capsys) -> None:
    from omni_pd.cli import _run

    top, s = got["aic_top"], got["size"]
    # omni-pd's choice is AIConfigurator's own top disagg row, side by side, predictions too
    assert (_thinker(s, "prefill"), _thinker(s, "decode")) == (_side(top, "p"), _side(top, "d"))
    assert (s["thinker"]["ttft_ms"], s["thinker"]["tpot_ms"], s["thinker"]["tokens_per_s_gpu"]) == \
        (top["ttft"], top["tpot"], top["tokens/s/gpu"])
    # the recorded fixture the offline tests read is still what AIConfigurator 0.12.0 answers
    rec = json.loads(recorded.read_text())["best_configs"]["disagg"][0]
    assert (_side(rec, "p"), _side(rec, "d"), rec["ttft"], rec["tpot"]) == \
        (_side(top, "p"), _side(top, "d"), top["ttft"], top["tpot"])
    # the written config: exactly those instances, TP and DP, on consecutive devices
    pw, ptp, _, pdp = _side(top, "p")
    dw, dtp, _, ddp = _side(top, "d")
    per_p, per_d = ptp * pdp, dtp * ddp
    assert _written(out) == {"kv_producer": (pw, ptp, pdp, _devices(0, pw * per_p)),
                             "kv_consumer": (dw, dtp, ddp, _devices(pw * per_p, dw * per_d))}
    capsys.readouterr()
    rc = _run(["validate", str(out), "--all-platforms"])
    assert (rc, capsys.readouterr().out) == (0, f"{out}: ok (0 errors, 0 warnings, 0 info)\n")


def test_the_issues_example_qwen3_30b_a3b_on_8_h200(tmp_path, capsys):
    """Qwen3-Omni's Thinker (= Qwen3-30B-A3B), h200_sxm, 9 devices (8 for the Thinker, 1 for the
    Talker + Code2Wav), ISL 4000 (3306 text + 30 s audio + one 640x480 image + 4 markers) / OSL
    500, TTFT 1000 ms / TPOT 30 ms."""
    out = tmp_path / "sized.yaml"
    aic = {"model_path": "Qwen/Qwen3-30B-A3B", "total_gpus": 8, "system": "h200_sxm", "backend": "vllm",
           "isl": 4000, "osl": 500, "ttft": 1000.0, "tpot": 30.0, "top_n": 5}
    size = ["size", "--model-info", str(FIX / "qwen3_omni_config.json"), "--system", "h200_sxm",
            "--total-devices", "9", "--text-tokens", "3306", "--audio-seconds", "30", "--image", "640x480",
            "--output-tokens", "500", "--ttft", "1000", "--tpot", "30", "--write", str(out)]
    got = _probe(tmp_path, aic, size)
    assert got["size"]["request"]["total_gpus"] == 8 and got["size"]["traffic"]["isl"] == 4000
    assert (_side(got["aic_top"], "p"), _side(got["aic_top"], "d")) == ((4, 1, 1, 1), (1, 1, 1, 4))
    _check(got, FIX / "aic_qwen3_30b_a3b_h200_vllm.json", out, capsys)
    from omni_pd.io import load_file

    down = [str(s["devices"]) for s in load_file(out).tree["stages"] if not s.get("kv_transfer_config")]
    assert down == ["8", "8"]  # Talker + Code2Wav on the device the Thinker leaves


def test_a_plain_qwen3_8b_on_4_h100(tmp_path, capsys):
    """Qwen3-8B (AIConfigurator's own shipped config.json as --model-info), a one-stage LLM
    deploy file, h100_sxm x4, ISL 2000 / OSL 300, TTFT 800 ms / TPOT 25 ms."""
    src, out = tmp_path / "llm.yaml", tmp_path / "sized.yaml"
    src.write_text('stages:\n  - stage_id: 0\n    max_model_len: 4096\n    devices: "0"\n')
    aic = {"model_path": "Qwen/Qwen3-8B", "total_gpus": 4, "system": "h100_sxm", "backend": "vllm",
           "isl": 2000, "osl": 300, "ttft": 800.0, "tpot": 25.0, "top_n": 5}
    size = ["size", str(src), "--model-info", "{aic_model_configs}/Qwen--Qwen3-8B_config.json", "--system", "h100_sxm",
            "--total-devices", "4", "--text-tokens", "2000", "--output-tokens", "300", "--ttft", "800", "--tpot", "25",
            "--write", str(out)]
    got = _probe(tmp_path, aic, size)
    assert got["size"]["request"]["total_gpus"] == 4 and got["size"]["model_map"]["model"] == "Qwen/Qwen3-8B"
    assert (_side(got["aic_top"], "p"), _side(got["aic_top"], "d")) == ((1, 1, 1, 1), (1, 1, 1, 1))
    _check(got, FIX / "aic_qwen3_8b_h100_vllm.json", out, capsys)
