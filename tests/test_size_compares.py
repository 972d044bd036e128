"""``size --from-result`` compares the model (issue 36 item 2): it printed "same shape as
thinker_config.text_config" for any ``--model-info`` (``{}``, a 70B config), and with a
model info lacking the Talker and Code2Wav configs ``--write`` put them on device 8 under
``--total-devices 8`` (a ninth device) and validate passed the file."""

from __future__ import annotations

import json
from pathlib import Path

from omni_pd.cli import main

FIX = Path(__file__).parent / "fixtures" / "sizing"
RESULT = FIX / "aic_qwen3_30b_a3b_h200_vllm.json"
OMNI = json.loads((FIX / "qwen3_omni_config.json").read_text())
ARGS = ["size", "--system", "h200_sxm", "--text-tokens", "3306", "--audio-seconds", "30", "--image", "640x480",
        "--output-tokens", "500", "--ttft", "1000", "--tpot", "30"]


def size(capsys, info: dict | Path, tmp_path: Path, *extra: str, result: Path = RESULT) -> tuple[int, str, str]:
    if isinstance(info, dict):
        p = tmp_path / "config.json"
        p.write_text(json.dumps(info))
        info = p
    rc = main(ARGS + ["--model-info", str(info), "--from-result", str(result), *extra])
    out, err = capsys.readouterr()
    return rc, out, err


def shaped_result(tmp_path: Path) -> Path:
    """The recorded result with the Thinker shape a new --record writes."""
    from omni_pd.sizing import model_map

    rec = json.loads(RESULT.read_text())
    rec["thinker_shape"] = model_map.shape(OMNI["thinker_config"]["text_config"])
    p = tmp_path / "shaped.json"
    p.write_text(json.dumps(rec))
    return p


def test_an_empty_model_info_is_refused(capsys, tmp_path):
    rc, out, err = size(capsys, {}, tmp_path, "--total-devices", "9")
    assert rc == 2
    assert err.startswith(f"error[OPD006]: size: --model-info {tmp_path / 'config.json'} has no Thinker text config "
                          "(none of hidden_size, num_hidden_layers, num_attention_heads")


def test_a_result_without_a_recorded_shape_says_nothing_was_compared(capsys, tmp_path):
    rc, out, err = size(capsys, FIX / "qwen3_omni_config.json", tmp_path, "--total-devices", "9", "--format", "json")
    assert rc == 0, err
    assert json.loads(out)["model_map"]["note"] == (
        f"recorded in {RESULT.name}; not compared with thinker_config.text_config of qwen3_omni_config.json "
        "(the result records no Thinker shape: re-record it with --record)")


def test_a_recorded_shape_is_compared_with_the_model_info(capsys, tmp_path):
    shaped = shaped_result(tmp_path)
    rc, out, err = size(capsys, FIX / "qwen3_omni_config.json", tmp_path, "--total-devices", "9", "--format", "json",
                        result=shaped)
    assert rc == 0, err
    assert json.loads(out)["model_map"]["note"] == (
        "same shape as the Thinker recorded in shaped.json (thinker_config.text_config of qwen3_omni_config.json)")
    big = json.loads(json.dumps(OMNI))
    big["thinker_config"]["text_config"].update({"hidden_size": 8192, "num_hidden_layers": 80})
    rc, out, err = size(capsys, big, tmp_path, "--total-devices", "9", result=shaped)
    assert rc == 2
    assert err.startswith(f"error[OPD006]: size: --from-result {shaped} was recorded for another Thinker "
                          "(Qwen/Qwen3-30B-A3B): hidden_size 8192 vs 2048, num_hidden_layers 80 vs 48\n"), err


def test_missing_talker_and_code2wav_configs_are_refused_not_placed_beyond_the_budget(capsys, tmp_path):
    thinker_only = {"model_type": OMNI["model_type"], "thinker_config": OMNI["thinker_config"]}
    out_file = tmp_path / "sized.yaml"
    rc, out, err = size(capsys, thinker_only, tmp_path, "--total-devices", "8", "--write", str(out_file))
    assert rc == 2
    assert err == (f"error[OPD006]: size: --model-info {tmp_path / 'config.json'} has no talker_config, "
                   "code2wav_config: the talker and code2wav stages of qwen3_omni_moe.yaml cannot be sized or placed\n"
                   "  = help: pass the model's full config.json (the file next to the weights)\n")
    assert not out_file.exists()


def test_device_lists_never_exceed_the_budget():
    from omni_pd.sizing import plan

    class Side:
        def __init__(self, devices):
            self.devices = devices

    class Choice:
        prefill, decode = Side(4), Side(4)

    assert plan.device_lists(Choice(), 1, budget=9) == {"prefill": [0, 1, 2, 3], "decode": [4, 5, 6, 7],
                                                          "downstream": [8]}
    try:
        plan.device_lists(Choice(), 1, budget=8)
    except plan.NoFit as e:
        assert str(e) == "the plan needs 9 devices (prefill 4, decode 4, downstream 1) but the budget is 8"
    else:
        raise AssertionError("a ninth device was planned")
