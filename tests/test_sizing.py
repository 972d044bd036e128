"""omni-pd size: the pure parts (traffic -> tokens, Thinker -> AIConfigurator model, downstream
placement) without AIConfigurator installed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omni_pd.sizing import model_map, plan, traffic

FIX = Path(__file__).parent / "fixtures" / "sizing"
OMNI = json.loads((FIX / "qwen3_omni_config.json").read_text())


@pytest.mark.parametrize("seconds,tokens", [(0, 0), (1, 13), (10, 130), (30, 390),
                                            # 0.5 s = 50 frames -> ceil(ceil(ceil(50/2)/2)/2) = 7; values checked against transformers 5.14.1 _get_feat_extract_output_lengths
                                            (0.5, 7), (1.5, 20), (7.3, 95), (0.01, 1)])
def test_audio_tokens_follow_the_encoder_chunks(seconds, tokens):
    assert traffic.audio_tokens(seconds) == tokens


def test_image_tokens_on_the_32_pixel_grid():
    assert traffic.image_tokens(1280, 704) == 40 * 22
    assert traffic.image_tokens(640, 480) == 20 * 15


def test_traffic_isl_adds_markers_per_clip_and_image():
    t = traffic.Traffic(text_tokens=3000, output_tokens=500, audio_seconds=(30.0,), images=((640, 480),))
    assert t.breakdown() == {"text": 3000, "audio": 390, "image": 300, "markers": 4}
    assert t.isl() == 3694


def test_negative_audio_is_refused():
    with pytest.raises(ValueError, match="audio seconds must be >= 0"):
        traffic.audio_tokens(-1)


QWEN3_30B = {k: OMNI["thinker_config"]["text_config"][k] for k in model_map.SHAPE_KEYS}


def test_the_omni_thinker_maps_to_the_same_shaped_llm():
    text, where = model_map.thinker_text_config(OMNI)
    assert where == "thinker_config.text_config"
    shipped = {"Qwen/Qwen3-30B-A3B": dict(QWEN3_30B), "Qwen/Qwen3-8B": {**QWEN3_30B, "num_experts": None,
                                                                         "hidden_size": 4096, "num_hidden_layers": 36}}
    m = model_map.nearest(text, shipped)
    assert (m.model, m.exact, m.differs) == ("Qwen/Qwen3-30B-A3B", True, {})


def test_a_different_shape_is_refused_naming_the_nearest():
    m = model_map.nearest({**QWEN3_30B, "num_hidden_layers": 24}, {"Qwen/Qwen3-30B-A3B": dict(QWEN3_30B)})
    assert (m.model, m.exact, m.differs) == ("Qwen/Qwen3-30B-A3B", False, {"num_hidden_layers": (24, 48)})


def test_talker_and_code2wav_share_one_device_as_the_preset_does():
    down = plan.downstream_stages(OMNI, {"talker": 0.6, "code2wav": 0.1})
    assert [d.name for d in down] == ["talker", "code2wav"]
    assert 2 * 2**30 < down[0].weight_bytes < 12 * 2**30  # a ~3B MoE Talker in bf16
    assert plan.place_downstream(down, 1, 141 * 2**30) == [["talker", "code2wav"]]


def test_downstream_that_does_not_fit_is_refused():
    down = [plan.Downstream("talker", 0.6, 10 * 2**30), plan.Downstream("code2wav", 0.6, 2**30)]
    assert plan.place_downstream(down, 2, 80 * 2**30) == [["talker"], ["code2wav"]]
    with pytest.raises(plan.NoFit, match="need 2 device"):
        plan.place_downstream(down, 1, 80 * 2**30)
    with pytest.raises(plan.NoFit, match="exceed its reservation"):
        plan.place_downstream([plan.Downstream("talker", 0.1, 10 * 2**30)], 1, 80 * 2**30)


# --- the command, from a recorded AIConfigurator result (no AIConfigurator needed) ---------------
RESULT = FIX / "aic_qwen3_30b_a3b_h200_vllm.json"  # recorded by omni_pd.sizing.aic.run; see its "recorded" key
#: 3306 text + 30 s audio (390) + one 640x480 image (300) + 4 markers = the recorded ISL 4000
ARGS = ["size", "--model-info", str(FIX / "qwen3_omni_config.json"), "--system", "h200_sxm", "--total-devices", "9",
        "--text-tokens", "3306", "--audio-seconds", "30", "--image", "640x480", "--output-tokens", "500",
        "--ttft", "1000", "--tpot", "30"]


def _size(capsys, *extra):
    from omni_pd.cli import _run

    rc = _run(ARGS + list(extra))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_json_reports_aiconfigurators_top_disagg_row_and_why(capsys):
    rc, out, _ = _size(capsys, "--from-result", str(RESULT), "--format", "json")
    assert rc == 0
    s = json.loads(out)
    top = json.loads(RESULT.read_text())["best_configs"]["disagg"][0]
    th = s["thinker"]
    assert (th["prefill"]["replicas"], th["prefill"]["tp"], th["decode"]["replicas"], th["decode"]["dp"]) == \
        (top["(p)workers"], top["(p)tp"], top["(d)workers"], top["(d)dp"]) == (4, 1, 1, 4)
    assert s["perf_database"] == "vllm 0.24.0 on h200_sxm" and s["aiconfigurator"] == "0.12.0"
    assert th["slo"]["decode"]["binding"] is True and th["slo"]["prefill"]["binding"] is False
    assert th["slo"]["decode"]["headroom_ms"] == round(30 - 29.378, 3)
    assert round(s["agg_vs_disagg"]["disagg"] / s["agg_vs_disagg"]["agg"], 2) == 1.05
    assert s["devices"] == {"prefill": [0, 1, 2, 3], "decode": [4, 5, 6, 7], "downstream": [8]}
    assert s["downstream"] == [["talker", "code2wav"]] and len(s["runners_up"]) == 4
    assert s["traffic"] == {"isl": 4000, "breakdown": {"text": 3306, "audio": 390, "image": 300, "markers": 4}}


def test_table_names_the_database_and_the_bound_side(capsys):
    rc, out, _ = _size(capsys, "--from-result", str(RESULT))
    assert rc == 0
    assert "perf database vllm 0.24.0 on h200_sxm" in out and "1.05x the best aggregated" in out
    assert "device 8: talker + code2wav" in out


def test_write_is_validated_like_expand_unequal_tp_is_opd306(capsys, tmp_path):
    out = tmp_path / "sized.yaml"  # row 3: 4x prefill TP1 + 1x decode TP4; an omni pipeline needs equal TP
    rc, _, err = _size(capsys, "--from-result", str(RESULT), "--pick", "3", "--write", str(out))
    assert rc == 2 and "OPD306" in err and not out.exists()


def test_write_sets_replicas_tp_and_devices_through_expand(capsys, tmp_path):
    """Row 3 edited to 4x prefill TP1 + 4x decode TP1 (a shape expand serves): tests the mapping only."""
    from omni_pd.io import load_file

    rec = json.loads(RESULT.read_text())
    rec["best_configs"]["disagg"][3].update({"(d)workers": 4, "(d)tp": 1, "(d)dp": 1})
    res = tmp_path / "edited.json"
    res.write_text(json.dumps(rec))
    out = tmp_path / "sized.yaml"
    rc, _, err = _size(capsys, "--from-result", str(res), "--pick", "3", "--write", str(out))
    assert rc == 0, err
    stages = load_file(out).tree["stages"]
    got = sorted((s.get("num_replicas", 1), s.get("tensor_parallel_size", 1), str(s["devices"])) for s in stages)
    assert got == [(1, 1, "8"), (1, 1, "8"), (4, 1, "0,1,2,3"), (4, 1, "4,5,6,7")], got


def test_write_serves_the_issues_headline_row_decode_dp4(capsys, tmp_path):
    """The issue's example, AIConfigurator's top row: 4 prefill (TP1) + 1 decode (TP1 DP4). The
    written config has exactly that (decode: one instance, data_parallel_size 4 on 4 devices) and
    validate passes it on every platform."""
    from omni_pd.cli import _run
    from omni_pd.io import load_file

    top = json.loads(RESULT.read_text())["best_configs"]["disagg"][0]
    assert (top["(p)workers"], top["(p)tp"], top["(p)dp"], top["(d)workers"], top["(d)tp"], top["(d)dp"]) == \
        (4, 1, 1, 1, 1, 4)
    out = tmp_path / "sized.yaml"
    rc, _, err = _size(capsys, "--from-result", str(RESULT), "--write", str(out))
    assert rc == 0, err
    assert err.splitlines()[-1] == f"wrote {out} (through expand, validated)"
    stages = {s["stage_id"]: s for s in load_file(out).tree["stages"]}
    got = {sid: (s.get("num_replicas", 1), s.get("tensor_parallel_size"), s.get("data_parallel_size"), str(s["devices"]))
           for sid, s in stages.items()}
    assert got == {0: (4, 1, None, "0,1,2,3"), 1: (1, 1, 4, "4,5,6,7"), 2: (1, None, None, "8"), 3: (1, None, None, "8")}
    assert (stages[0]["kv_transfer_config"]["kv_role"], stages[1]["kv_transfer_config"]["kv_role"]) == \
        ("kv_producer", "kv_consumer")
    rc = _run(["validate", str(out), "--all-platforms"])
    assert (rc, capsys.readouterr().out) == (0, f"{out}: ok (0 errors, 0 warnings, 0 info)\n")


def test_write_gives_a_dp1_side_dp1_when_the_thinker_runs_dp2(capsys, tmp_path):
    """AIConfigurator's DP is per side and wins over the Thinker's: a Thinker written with
    data_parallel_size 2 gives the top row's prefill DP 1 (written, so it does not inherit 2) and
    decode DP 4."""
    from omni_pd.cli import _run
    from omni_pd.io import load_file
    from omni_pd.resources import preset_path

    src = tmp_path / "dp2.yaml"
    src.write_text("pipeline: qwen3_omni_moe\n" + preset_path("qwen3_omni_moe").read_text().replace(
        '    devices: "0"\n', '    data_parallel_size: 2\n    devices: "0,1"\n', 1))
    out = tmp_path / "sized.yaml"
    rc = _run([ARGS[0], str(src), *ARGS[1:], "--from-result", str(RESULT), "--write", str(out)])
    err = capsys.readouterr().err
    assert rc == 0, err
    got = [(s.get("num_replicas", 1), s.get("data_parallel_size"), str(s["devices"])) for s in load_file(out).tree["stages"]]
    assert got == [(4, 1, "0,1,2,3"), (1, 4, "4,5,6,7"), (1, None, "8"), (1, None, "8")]
    assert _run(["validate", str(out)]) == 0, capsys.readouterr().out


def test_write_refuses_pipeline_parallel_and_writes_nothing(capsys, tmp_path):
    rec = json.loads(RESULT.read_text())
    rec["best_configs"]["disagg"][0].update({"(d)dp": 2, "(d)pp": 2})
    res = tmp_path / "pp.json"
    res.write_text(json.dumps(rec))
    out = tmp_path / "sized.yaml"
    rc, _, err = _size(capsys, "--from-result", str(res), "--write", str(out))
    assert rc == 2 and not out.exists()
    assert "error[OPD006]: size: row 0 uses PP >1 (prefill pp1, decode pp2); expand has no pipeline-parallel " \
           "option, nothing written" in err


def test_a_result_recorded_for_other_traffic_is_refused(capsys):
    from omni_pd.cli import _run

    rc = _run([a if a != "3306" else "3000" for a in ARGS] + ["--from-result", str(RESULT)])
    assert rc == 2 and "was recorded for" in capsys.readouterr().err


def test_missing_aiconfigurator_is_exit_2(capsys):
    try:
        import aiconfigurator  # noqa: F401
        pytest.skip("aiconfigurator is installed here")
    except ImportError:
        pass
    rc, _, err = _size(capsys)
    assert rc == 2 and "AIConfigurator is not installed" in err and "aiconfigurator==0.12.0" in err
