"""``size`` says what it is doing during AIConfigurator's one-to-two-minute sweep (issue 36
item 13): one line per phase on stderr (a terminal, a CI log or a pipe alike). AIConfigurator
itself is replaced by the recorded result."""

from __future__ import annotations

import json
from pathlib import Path

from omni_pd.cli import main
from omni_pd.sizing import aic, model_map

FIX = Path(__file__).parent / "fixtures" / "sizing"
RESULT = json.loads((FIX / "aic_qwen3_30b_a3b_h200_vllm.json").read_text())
OMNI = json.loads((FIX / "qwen3_omni_config.json").read_text())


def test_each_phase_is_one_line_on_stderr(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(aic, "shipped_configs", lambda: {"Qwen/Qwen3-30B-A3B": dict(OMNI["thinker_config"]["text_config"])})
    monkeypatch.setattr(aic, "gpu_memory_bytes", lambda system: int(RESULT["gpu_memory_bytes"]))
    monkeypatch.setattr(aic, "run", lambda req: calls.append(req) or json.loads(json.dumps(RESULT)))
    rc = main(["size", "--model-info", str(FIX / "qwen3_omni_config.json"), "--system", "h200_sxm",
               "--total-devices", "9", "--text-tokens", "3306", "--audio-seconds", "30", "--image", "640x480",
               "--output-tokens", "500", "--ttft", "1000", "--tpot", "30", "--format", "json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert len(calls) == 1 and model_map.shape(OMNI["thinker_config"]["text_config"])
    lines = err.splitlines()
    assert lines[:2] == [
        "size: matching the Thinker (thinker_config.text_config) with AIConfigurator's models",
        "size: AIConfigurator sweeps Qwen/Qwen3-30B-A3B on 8 h200_sxm GPUs (vllm; usually 1-2 minutes)"]
    assert lines[2].startswith("size: AIConfigurator done in ") and lines[2].endswith(" s")
    assert json.loads(out)["thinker"]["prefill"]["replicas"] == 4
