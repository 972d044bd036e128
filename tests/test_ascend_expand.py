"""`omni-pd expand` on Ascend NPUs: the vllm-ascend PD pair (pull and layerwise push, equal
TP and 4 -> 2 TP) with exact kv_port ranges, HCCL bases, engine ids and peer blocks; the
output validates clean on npu; the rules behind it (:mod:`omni_pd.compile.ascend`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from omni_pd.check.validate import ValidateOptions, validate_text
from omni_pd.cli import main
from omni_pd.compile import ascend
from omni_pd.compile.connectors import get as get_connector
from omni_pd.compile.targets import target
from omni_pd.diagnostics import Severity
from omni_pd.compile.parse import to_plain
from omni_pd.io import parse_text

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "ascend"
TP4 = str(ROOT / "tests" / "fixtures" / "ascend" / "qwen3_omni_thinker_npu_tp4.yaml")
LW = ["--npu-connector", "MooncakeLayerwiseConnector"]

CASES = [
    (["expand", "-q", *LW], "qwen3_omni_moe_pd_layerwise.yaml", None),
    (["expand", "-q", "--platform", "npu"], "qwen3_omni_moe_pd_platform_npu.yaml", "npu"),
    (["expand", "-q", TP4, "--npu-decode-tp", "2"], "thinker_tp4_to_2_pull.yaml", None),
    (["expand", "-q", TP4, "--npu-decode-tp", "2", *LW], "thinker_tp4_to_2_layerwise.yaml", None),
]


def _run(args, capsys) -> tuple[int, str, str]:
    try:
        rc = main(args)
    except SystemExit as e:
        rc = int(e.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def _npu(text: str, sid: int) -> dict:
    tree = to_plain(parse_text(text).tree)
    return next(s for s in tree["platforms"]["npu"]["stages"] if s["stage_id"] == sid)


@pytest.mark.parametrize("args,golden,platform", CASES)
def test_golden_npu_outputs(args, golden, platform, capsys) -> None:
    rc, out, err = _run(args, capsys)
    assert rc == 0, err
    assert out == (GOLDEN / golden).read_text(encoding="utf-8")
    # every golden validates on each platform it keeps (--platform npu: the base is checked on npu)
    res = validate_text(out, "out.yaml", ValidateOptions(all_platforms=True))
    assert [(d.code, d.message) for d in res.errors] == []


def test_default_expand_gives_the_npu_overlay_the_ascend_pull_pair(capsys) -> None:
    rc, out, err = _run(["expand", "-q"], capsys)
    assert rc == 0, err
    p, d = _npu(out, 0), _npu(out, 1)
    blocks = {"prefill": {"dp_size": 1, "tp_size": 2}, "decode": {"dp_size": 1, "tp_size": 2}}
    assert p["kv_transfer_config"] == {"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_producer", "kv_port": 36000,
                                       "engine_id": "omni-thinker-prefill", "kv_connector_extra_config": blocks}
    assert d["kv_transfer_config"] == {"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_consumer", "kv_port": 36002,
                                       "engine_id": "omni-thinker-decode", "kv_connector_extra_config": blocks}
    # TP2 engines on one host: HCCL bases 16 ports per rank apart (61000 + 16*2)
    assert (p["env"], d["env"]) == ({"HCCL_IF_BASE_PORT": "61000"}, {"HCCL_IF_BASE_PORT": "61032"})
    assert (p["devices"], d["devices"]) == ("0,1", "2,3")


def test_asymmetric_tp_peer_blocks_carry_the_real_sizes(capsys) -> None:
    rc, out, err = _run(["expand", "-q", TP4, "--npu-decode-tp", "2"], capsys)
    assert rc == 0, err
    p, d = _npu(out, 0), _npu(out, 1)
    want = {"prefill": {"dp_size": 1, "tp_size": 4}, "decode": {"dp_size": 1, "tp_size": 2}}
    assert p["kv_transfer_config"]["kv_connector_extra_config"] == want
    assert d["kv_transfer_config"]["kv_connector_extra_config"] == want
    assert (p["kv_transfer_config"]["kv_port"], d["kv_transfer_config"]["kv_port"]) == (36000, 36004)
    assert (d["tensor_parallel_size"], d["devices"]) == (2, "4,5")
    assert (p["env"]["HCCL_IF_BASE_PORT"], d["env"]["HCCL_IF_BASE_PORT"]) == ("61000", "61064")


def test_layerwise_on_vllm_0_30_writes_no_peer_blocks(capsys) -> None:
    # vllm-ascend 0.18+ layerwise reads no peer blocks (peer TP arrives per request)
    rc, out, err = _run(["expand", "-q", *LW], capsys)
    assert rc == 0, err
    assert "kv_connector_extra_config" not in _npu(out, 0)["kv_transfer_config"]


def test_npu_overlay_kv_ports_stay_above_the_transport_range(capsys) -> None:
    rc, out, err = _run(["expand", "-q"], capsys)
    assert rc == 0, err
    end = ascend.transport_range(16)[1]
    assert end == 36000
    assert all(_npu(out, s)["kv_transfer_config"]["kv_port"] >= end for s in (0, 1))


@pytest.mark.parametrize("args,msg", [
    (["expand", "-q", "--npu-decode-tp", "3"],
     "npu overlay: vllm-ascend MooncakeConnectorV1 needs prefill TP >= decode TP and divisible by it (got P=2, D=3)"),
    (["expand", "-q", "--npu-decode-tp", "1"],
     "npu overlay: decode TP 1 != prefill TP 2, but qwen3_omni_moe_pd runs on vllm-omni, whose PD validator "
     "requires equal TP (pd_utils.py)"),
    (["expand", "-q", "--npu-connector", "NixlConnector"],
     "--npu-connector 'NixlConnector' is not a vllm-ascend PD connector"),
])
def test_bad_npu_options_exit_2_with_a_diagnostic(args, msg, capsys) -> None:
    rc, out, err = _run(args, capsys)
    assert rc == 2 and out == ""
    assert msg in err


def test_connector_contracts_bind_their_kv_port_ranges() -> None:
    t = target("0.23")
    pull, push = get_connector("MooncakeConnectorV1"), get_connector("MooncakeLayerwiseConnector")
    kv = {"kv_connector": "MooncakeConnectorV1", "kv_port": "36000"}
    assert [(u.port, u.span, u.key) for u in pull.ports("prefill", kv, {}, 4, 2, t)] == [(36000, 8, "kv_port")]
    assert [(u.port, u.span) for u in pull.ports("prefill", kv, {}, 2, 1, t, replicas=2)] == [(36000, 2), (36002, 2)]
    assert [(u.port, u.span) for u in pull.ports("prefill", kv, {}, 2, 1, t, runtime="vllm-omni", replicas=2)] == [
        (36000, 2), (36000, 2)]
    assert push.hetero_tp_error(4, 2, t) is None
    assert push.hetero_tp_error(2, 4, t) == (
        "vllm-ascend MooncakeLayerwiseConnector needs prefill TP >= decode TP and divisible by it (got P=2, D=4)")
    assert pull.port_span("decode", 2, 1, t, replicas=3) == 6


def test_pull_span_counts_pp_and_push_does_not() -> None:
    s = ascend.Sizes(tp=2, dp=2, pp=2)
    assert (ascend.kv_port_span(ascend.PULL, s), ascend.kv_port_span(ascend.PUSH, s)) == (8, 4)
    assert ascend.peer_blocks(s, ascend.Sizes()) == {"prefill": {"dp_size": 2, "tp_size": 2, "pp_size": 2},
                                                     "decode": {"dp_size": 1, "tp_size": 1}}
    assert ascend.peer_blocks_read(ascend.PUSH, "0.13.0") and not ascend.peer_blocks_read(ascend.PUSH, "0.18.0")


def test_connectors_command_names_the_platform(capsys) -> None:
    rc, out, _ = _run(["connectors"], capsys)
    assert rc == 0
    line = next(ln for ln in out.splitlines() if ln.startswith("MooncakeLayerwiseConnector "))
    assert "npu (vllm-ascend 0.23.0.post1/vLLM 0.23, 0.18.0/vLLM 0.18, 0.13.0/vLLM 0.13)" in line
    assert "cuda, rocm, xpu, cpu (vLLM)" in next(ln for ln in out.splitlines() if ln.startswith("NixlConnector "))


def test_expanded_npu_output_has_no_warning_but_the_talker_note(capsys) -> None:
    rc, out, _ = _run(["expand", "-q"], capsys)
    res = validate_text(out, "out.yaml", ValidateOptions(platform="npu"))
    assert [d.code for d in res.diagnostics if d.severity is not Severity.INFO] == []  # OPD704: the layer covers it


# --- xPyD and the npu overlay (walkthrough: `expand --prefill-replicas 2` wrote an npu
# overlay whose two prefill replicas both bound kv_port 36000-36001, OPD501 under
# `validate --platform npu`, because expand's self-check skipped the overlays) --------

def _npu_stage(text: str, sid: int) -> dict:
    plain = to_plain(parse_text(text, "out.yaml").tree)
    return next(s for s in plain["platforms"]["npu"]["stages"] if s["stage_id"] == sid)


@pytest.mark.parametrize("flags, reduced", [
    (["--prefill-replicas", "2"], {0: 36000}),
    (["--decode-replicas", "2"], {1: 36002}),
    (["--prefill-replicas", "2", "--decode-replicas", "2"], {0: 36000, 1: 36002}),
])
def test_xpyd_npu_overlay_validates_clean_on_npu(tmp_path, capsys, flags, reduced):
    out = tmp_path / "npu2.yaml"
    rc, _, err = _run(["expand", "-q", *flags, "-o", str(out)], capsys)
    assert rc == 0, err
    text = out.read_text()
    side = {0: "prefill", 1: "decode"}
    assert [ln for ln in err.splitlines() if ln.startswith("warning[OPD904]")] == [
        f"warning[OPD904]: npu overlay: the {side[sid]} stage {sid} runs 1 replica on npu (the base keeps 2): "
        f"vllm-omni 0.30 would give every replica the same kv_port + rank (MooncakeConnectorV1) port ({port})"
        for sid, port in reduced.items()]
    for sid in (0, 1):
        st = _npu_stage(text, sid)
        assert st.get("num_replicas") == (1 if sid in reduced else None)
        assert st["kv_transfer_config"]["kv_port"] == (36000 if sid == 0 else 36002)
    npu = validate_text(text, str(out), ValidateOptions(platform="npu"))
    assert [(d.code, d.message) for d in npu.errors] == []
    base = validate_text(text, str(out))
    assert base.errors == []
    plain = to_plain(parse_text(text, "out.yaml").tree)
    assert {s["stage_id"]: s.get("num_replicas") for s in plain["stages"] if s["stage_id"] in (0, 1)} == {
        sid: (2 if [f for f in flags if f.startswith(f"--{side[sid]}-")] else None) for sid in (0, 1)}


def test_xpyd_for_npu_itself_is_refused(tmp_path, capsys):
    out = tmp_path / "npu2.yaml"
    rc, _, err = _run(["expand", "-q", "--platform", "npu", "--decode-replicas", "2", "-o", str(out)], capsys)
    assert rc == 2 and not out.exists()
    assert err.startswith("error[OPD805]: npu: cannot place 2 replicas of the decode stage on one host: vllm-omni "
                          "0.30 gives every replica the same kv_port + rank (MooncakeConnectorV1) port (36002)\n")


def test_self_check_validates_every_overlay(tmp_path, capsys):
    # the overlay the npu pass wrote before: both prefill replicas on kv_port 36000
    from omni_pd.cli.expand_run import self_check as _self_check
    from omni_pd.diagnostics import OmniPdError
    from omni_pd.io import load_file

    out = tmp_path / "npu2.yaml"
    assert _run(["expand", "-q", "--prefill-replicas", "2", "-o", str(out)], capsys)[0] == 0
    text = out.read_text()
    assert text.count("num_replicas: 1\n") == 1
    broken = text.replace("num_replicas: 1\n", "num_replicas: 2\n")
    preset = load_file(ROOT / "presets" / "qwen3_omni_moe.yaml")
    with pytest.raises(OmniPdError) as e:
        _self_check(broken, preset, None, out)
    assert (e.value.diagnostic.code, e.value.exit_code) == ("OPD000", 3)
    assert "error[OPD501]: port 36000 on the shared host bound by stage 0 replica 0" in capsys.readouterr().err
    _self_check(text, preset, None, out)  # the real output passes
