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


def test_a_result_recorded_for_another_device_count_is_refused(capsys):
    """The recording ran AIConfigurator with 8 GPUs for the Thinker: --total-devices 12 (11 after the
    Talker's device) would size 12 devices from an 8-GPU sweep."""
    from omni_pd.cli import _run

    rc = _run([a if a != "9" else "12" for a in ARGS] + ["--from-result", str(RESULT)])
    assert rc == 2
    assert capsys.readouterr().err.splitlines()[0] == (
        f"error[OPD006]: size: --from-result {RESULT} was recorded for 8 Thinker GPUs; --total-devices 12 leaves 11 "
        "(after 1 for the stages downstream)")


def test_missing_aiconfigurator_is_exit_2(capsys):
    try:
        import aiconfigurator  # noqa: F401
        pytest.skip("aiconfigurator is installed here")
    except ImportError:
        pass
    rc, _, err = _size(capsys)
    assert rc == 2 and "AIConfigurator is not installed" in err and "aiconfigurator==0.12.0" in err


# --- --request-rate: instances per side from AIConfigurator's per-instance throughput ------------
Q8 = FIX / "aic_qwen3_8b_h100_vllm.json"


@pytest.mark.parametrize("fixture", [RESULT, Q8])
def test_aiconfigurators_rate_matching_reproduces_every_recorded_row(fixture):
    """The formula omni_pd.sizing.rate inverts is AIConfigurator's: each recorded disagg row's seq/s
    is min(P x (p)seq/s/worker x 0.9, D x (d)seq/s/worker x 0.92), to its 3 decimals."""
    from omni_pd.sizing import rate

    rows = json.loads(fixture.read_text())["best_configs"]["disagg"]
    assert len(rows) >= 2
    for r in rows:
        assert round(rate.served(r, r["(p)workers"], r["(d)workers"]), 3) == pytest.approx(r["seq/s"], abs=1e-3)
        # at the row's own rate: no more instances than the row's (AIConfigurator fills its fixed GPU
        # budget, e.g. row 3 of the 30B run: 4 prefill where 3 x 12.109 serve its 36.226 req/s), still serving it
        f = rate.fit(r, r["seq/s"])
        assert f.prefill_replicas <= r["(p)workers"] and f.decode_replicas <= r["(d)workers"]
        assert f.served >= r["seq/s"] - rate.ROUNDING
    top = rate.fit(rows[0], rows[0]["seq/s"])
    assert (top.prefill_replicas, top.decode_replicas) == (rows[0]["(p)workers"], rows[0]["(d)workers"])


def test_fit_rounds_each_side_up_separately():
    from omni_pd.sizing import rate

    top = json.loads(RESULT.read_text())["best_configs"]["disagg"][0]  # 13.454 / 43.657 req/s per instance
    f = rate.fit(top, 100)  # 100 / (0.9 x 13.454) = 8.26 -> 9; 100 / (0.92 x 43.657) = 2.49 -> 3
    assert f == rate.RateFit(100, 9, 3, 108.977, 13.454, 43.657)  # min(9 x 12.109, 3 x 40.164)
    assert (rate.fit(top, 0.01).prefill_replicas, rate.fit(top, 0.01).decode_replicas) == (1, 1)
    with pytest.raises(ValueError, match="positive"):
        rate.fit(top, 0)


def test_request_rate_sizes_the_headline_row_for_100_req_s(capsys, tmp_path):
    """ISL 4000 / OSL 500 at 100 req/s: 9 prefill (TP1) + 3 decode (TP1 DP4) = 21 Thinker devices,
    + 1 for Talker and Code2Wav; written through expand and validated."""
    from omni_pd.cli import _run
    from omni_pd.io import load_file

    args = [a for a in ARGS if a not in ("--total-devices", "9")] + ["--request-rate", "100", "--from-result", str(RESULT)]
    assert _run(args + ["--format", "json"]) == 0
    s = json.loads(capsys.readouterr().out)
    th = s["thinker"]
    assert (th["prefill"]["replicas"], th["prefill"]["tp"], th["decode"]["replicas"], th["decode"]["dp"]) == (9, 1, 3, 4)
    assert s["request_rate"]["served"] == 108.977 and s["total_devices"] == 22
    assert s["devices"] == {"prefill": list(range(9)), "decode": list(range(9, 21)), "downstream": [21]}
    assert th["tokens_per_s_gpu"] == round(108.977 * 500 / 21, 3) and th["concurrency"] == 3 * 640
    assert (th["ttft_ms"], th["tpot_ms"]) == (133.79, 29.378)  # per instance: unchanged by the count
    out = tmp_path / "sized.yaml"
    assert _run(args + ["--write", str(out)]) == 0, capsys.readouterr().err
    got = [(st.get("num_replicas", 1), st.get("data_parallel_size"), str(st["devices"])) for st in load_file(out).tree["stages"]]
    assert got == [(9, None, "0,1,2,3,4,5,6,7,8"), (3, 4, ",".join(map(str, range(9, 21)))),
                   (1, None, "21"), (1, None, "21")]
    capsys.readouterr()
    assert _run(["validate", str(out)]) == 0, capsys.readouterr().out


def test_request_rate_on_the_qwen3_8b_recording(capsys, tmp_path):
    """Qwen3-8B on h100 (ISL 2000 / OSL 300): 20.905 / 20.695 req/s per instance; 50 req/s ->
    ceil(50 / 18.81) = 3 prefill, ceil(50 / 19.04) = 3 decode, 6 devices, serving 56.444 req/s."""
    from omni_pd.cli import _run

    src = tmp_path / "llm.yaml"
    src.write_text('stages:\n  - stage_id: 0\n    devices: "0"\n')
    mi = tmp_path / "config.json"
    mi.write_text(json.dumps({"hidden_size": 4096}))
    rc = _run(["size", str(src), "--model-info", str(mi), "--system", "h100_sxm", "--request-rate", "50",
               "--text-tokens", "2000", "--output-tokens", "300", "--ttft", "800", "--tpot", "25",
               "--from-result", str(Q8), "--format", "json"])
    s = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert (s["thinker"]["prefill"]["replicas"], s["thinker"]["decode"]["replicas"], s["total_devices"]) == (3, 3, 6)
    assert s["request_rate"]["served"] == round(min(3 * 20.905 * 0.9, 3 * 20.695 * 0.92), 3) == 56.444


@pytest.mark.parametrize("extra,msg", [
    ([], "error[OPD006]: size: give --total-devices N or --request-rate R"),
    (["--total-devices", "9", "--request-rate", "10"], "error[OPD006]: size: give --total-devices or --request-rate, not both"),
    (["--request-rate", "-1"], "error[OPD006]: size: --request-rate must be a positive number of requests per second, not -1"),
])
def test_request_rate_xor_total_devices(capsys, extra, msg):
    from omni_pd.cli import _run

    args = [a for a in ARGS if a not in ("--total-devices", "9")] + extra + ["--from-result", str(RESULT)]
    assert _run(args) == 2
    assert capsys.readouterr().err.splitlines()[0] == msg
