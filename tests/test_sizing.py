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
