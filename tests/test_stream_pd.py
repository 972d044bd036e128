"""Streaming under PD (issue 34): the pure pieces, without vllm-omni.

* omni_pd/upstream/stream_pd.py: which stages' kv_transfer_config the async-chunk check may
  ignore (the PD pair only), and the chunk-0 repair (decode's recomputed last prompt token
  replaced by prefill's prompt rows), row for row against what a non-PD Thinker stores;
* omni_pd/compile/stream_pd.py: when a pipeline streams under PD (release, pipeline, switches)
  and the prefill -> decode edge test.

The wrappers that call these inside vllm-omni run in tests/test_oracle_stream_pd.py (oracle
venv) and end to end in tests/test_e2e_omni_stream_pd.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from omni_pd.compile import stream_pd as cstream
from omni_pd.compile.pipelines import load_catalogue
from omni_pd.compile.targets import target as resolve_target
from omni_pd.upstream import stream_pd, talker_pd



class Rows:
    """A stand-in for a [n, H] tensor (the fast suite has no torch): shape, dtype, device,
    ``to``, ``numel``/``element_size``; ``tag`` tells whose rows they are."""

    def __init__(self, n: int, h: int, tag: str, dtype: str = "bf16", device: str = "cpu"):
        self.shape, self.tag, self.dtype, self.device = (n, h), tag, dtype, device

    def to(self, device=None, dtype=None):
        return Rows(self.shape[0], self.shape[1], self.tag, dtype or self.dtype, device or self.device)

    def numel(self) -> int:
        return self.shape[0] * self.shape[1]

    def element_size(self) -> int:
        return {"bf16": 2, "f32": 4}[self.dtype]


@dataclass
class PStage:
    stage_id: int
    extras: dict = field(default_factory=dict)


@dataclass
class DStage:
    stage_id: int
    engine_extras: dict = field(default_factory=dict)


@dataclass
class Deploy:
    stages: list
    async_chunk: bool = True


PIPE = type("P", (), {"stages": (PStage(0, {"is_prefill_only": True}), PStage(1, {"is_decode_only": True}),
                                 PStage(2), PStage(3))})()
KV_P = {"kv_transfer_config": {"kv_connector": "NixlConnector", "kv_role": "kv_producer"}}
KV_D = {"kv_transfer_config": {"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}}


def test_only_the_pd_pair_may_keep_its_kv_transfer_config_with_async_chunk() -> None:
    deploy = Deploy([DStage(0, dict(KV_P)), DStage(1, dict(KV_D)), DStage(2), DStage(3)])
    assert stream_pd.pd_kv_stage_ids(PIPE, deploy) == frozenset({0, 1})
    # a KV transfer into a later stage (AR-to-DiT) stays refused
    ar_to_dit = Deploy([DStage(0, dict(KV_P)), DStage(1, dict(KV_D)), DStage(2, dict(KV_P)), DStage(3)])
    assert stream_pd.pd_kv_stage_ids(PIPE, ar_to_dit) is None
    # a pipeline without a PD pair: nothing to accept
    plain = type("P", (), {"stages": (PStage(0), PStage(1))})()
    assert stream_pd.pd_kv_stage_ids(plain, Deploy([DStage(0, dict(KV_P)), DStage(1)])) is None
    # no kv_transfer_config at all: nothing the original refused
    assert stream_pd.pd_kv_stage_ids(PIPE, Deploy([DStage(i) for i in range(4)])) is None


def test_without_kv_hides_the_pair_and_changes_nothing_given() -> None:
    deploy = Deploy([DStage(0, {**KV_P, "max_num_seqs": 4}), DStage(1, dict(KV_D)), DStage(2, {"x": 1})])
    out = stream_pd.without_kv(deploy, {0, 1})
    assert [s.engine_extras for s in out.stages] == [{"max_num_seqs": 4}, {}, {"x": 1}]
    assert deploy.stages[0].engine_extras == {**KV_P, "max_num_seqs": 4}  # the input is untouched
    assert out.async_chunk is True


def _rows(n: int, h: int, tag: str, dtype: str = "bf16") -> Rows:
    return Rows(n, h, tag, dtype)


def test_chunk0_repair_gives_the_non_pd_stored_payload() -> None:
    """Non-PD: after its prefill step the Thinker stores the P prompt rows of layer 0 and of
    accept_hidden_layer. PD: decode stores one row (its recomputed last prompt token). The repair
    stores prefill's P rows (in decode's dtype), so the next step's concatenation is the non-PD
    chunk 0 row for row."""
    P, H, accept = 5, 4, 3
    prefill = {0: _rows(P, H, "prefill-L0", "f32"), accept: _rows(P, H, "prefill-L3", "f32")}
    bos = _rows(1, H, "tts_bos")
    saved = {"embed": {"prefill": _rows(1, H, "decode-L0"), "tts_bos": bos},
             "hidden_states": {"output": _rows(1, H, "decode-L3")}, "ids": {"prompt": list(range(P))}}
    repaired, why = stream_pd.repair_chunk0(saved, prefill, accept, P)
    assert why == "repaired"
    e, h = repaired["embed"]["prefill"], repaired["hidden_states"]["output"]
    assert (e.tag, e.shape, e.dtype) == ("prefill-L0", (P, H), "bf16")
    assert (h.tag, h.shape, h.dtype) == ("prefill-L3", (P, H), "bf16")
    assert repaired["embed"]["tts_bos"] is bos  # other keys kept
    assert repaired["ids"] == {"prompt": list(range(P))}
    assert saved["embed"]["prefill"].tag == "decode-L0"  # the given payload is not changed


@pytest.mark.parametrize("saved_rows, layers, n_prompt, why", [
    (5, (0, 3), 5, "not-pd-shape"),      # as many rows as prompt tokens: a non-PD store, left alone
    (0, (0, 3), 5, "not-pd-shape"),      # nothing stored
    (1, (0,), 5, "missing-layer"),       # prefill's output lacks accept_hidden_layer
    (1, (0, 3), 6, "prompt-mismatch"),   # prefill's rows are not this prompt's
])
def test_chunk0_repair_leaves_what_it_does_not_recognise(saved_rows, layers, n_prompt, why) -> None:
    H = 4
    saved = {"embed": {"prefill": _rows(saved_rows, H, "d")}, "hidden_states": {"output": _rows(saved_rows, H, "d")}}
    got, reason = stream_pd.repair_chunk0(saved, {i: _rows(5, H, "p") for i in layers}, 3, n_prompt)
    assert (got, reason) == (None, why)


def test_decode_layers_read_back_from_the_request_keys() -> None:
    H = 4
    info = {talker_pd.key_of(0): _rows(3, H, "L0"), talker_pd.key_of(24): _rows(3, H, "L24"), "omni_final_stage_id": 3}
    got = stream_pd.decode_layers(info)
    assert sorted(got) == [0, 24] and got[24].tag == "L24"
    assert stream_pd.decode_layers(None) == {}
    # bytes decode's request carries: 2 layers x P x H x 2 (bf16)
    assert stream_pd.layer_bytes(got) == 2 * 3 * H * 2


def test_qwen3_omni_pd_streams_on_030_only() -> None:
    pipe = load_catalogue().get("qwen3_omni_moe_pd")
    assert cstream.streams(pipe)
    assert cstream.gap(pipe, resolve_target("0.30")) is None
    g = cstream.gap(pipe, resolve_target("0.28"))
    assert (g.where, g.why) == ("release", "vllm-omni 0.28 refuses async_chunk with a kv_transfer_config and "
                                           "omni-pd's compatibility layer does not make it stream there")
    off = cstream.gap(pipe, resolve_target("0.30"), {"OMNI_PD_VLLM_OMNI_STREAM_PD": "0"})
    assert (off.where, off.var) == ("launcher", "OMNI_PD_VLLM_OMNI_STREAM_PD")
    assert cstream.gap(pipe, resolve_target("0.30"), {"OMNI_PD_VLLM_OMNI_COMPAT": "off"}).var == "OMNI_PD_VLLM_OMNI_COMPAT"
    # pipelines without a stage after decode never read async_chunk under PD
    assert not cstream.streams(load_catalogue().get("qwen3_omni_moe_thinker_only_pd"))
    assert not cstream.streams(load_catalogue().get("llm_pd"))


def test_edge_into_decode() -> None:
    assert cstream.edge_into_decode([{"from": 0, "to": 1}, {"from": 1, "to": 2}], 0, 1)
    assert not cstream.edge_into_decode([{"from": 1, "to": 2}], 0, 1)
    assert not cstream.edge_into_decode(None, 0, 1)
