"""`omni-pd expand`: golden outputs and one test per compiler rule, with exact values."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from omni_pd.cli import main
from omni_pd.compile.expand import expand_document
from omni_pd.diagnostics import OmniPdError, Severity
from omni_pd.io import load_file, parse_text
from omni_pd.compile.passes.pd_split import ExpandOptions
from omni_pd.resources import preset_path

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
PRESET = preset_path("qwen3_omni_moe")
FIX = ROOT / "tests" / "fixtures"


def run_cli(args, capsys, cwd=ROOT):
    old = os.getcwd()
    os.chdir(cwd)
    try:
        rc = main(args)
    finally:
        os.chdir(old)
    out, err = capsys.readouterr()
    return rc, out, err


def expand(text_or_path=PRESET, opts=ExpandOptions(), name="qwen3_omni_moe.yaml", **kw):
    """Expand a path, or YAML text (by default read as a copy of vllm-omni's qwen3_omni_moe.yaml)."""
    doc = load_file(text_or_path) if isinstance(text_or_path, Path) else parse_text(text_or_path, name)
    return expand_document(doc, opts, schema_ref="s.json", **kw)


def stage(res, sid):
    return next(s for s in res.config.stages if s.stage_id == sid)


def overlay(res, platform, sid):
    return next(o for o in res.config.platforms[platform].stages if o.stage_id == sid)


# --- golden ------------------------------------------------------------------------------

@pytest.mark.parametrize("args,golden", [
    (["expand", "-q"], "qwen3_omni_moe_pd.yaml"),
    (["expand", "-q", "--connector", "NixlConnector", "--kv-buffer-device", "cpu"], "qwen3_omni_moe_pd_nixl.yaml"),
])
def test_golden_bundled_preset(args, golden, capsys):
    rc, out, err = run_cli(args, capsys)
    assert rc == 0, err
    assert out == (GOLDEN / golden).read_text(encoding="utf-8")


def test_expand_is_deterministic():
    assert expand().text == expand().text


def test_default_input_streams_without_a_note(capsys):
    """The preset streams (async_chunk: true) and vllm-omni 0.30 is covered by omni-pd's layer: kept, silent."""
    rc, out, err = run_cli(["expand"], capsys)
    assert rc == 0
    assert "OPD901" not in err
    assert "\nasync_chunk: true\n" in out


def test_no_stream_reports_async_chunk_info(capsys):
    rc, out, err = run_cli(["expand", "--no-stream"], capsys)
    assert rc == 0
    assert ("info[OPD901]: async_chunk set to false (--no-stream): the answer's audio comes in one piece after "
            "the text") in err
    assert "qwen3_omni_moe.yaml:6:14" in err
    assert "\nasync_chunk: false\n" in out and "  - {from: 0, to: 1}\n" in out


def test_release_that_cannot_stream_gives_streaming_up_with_a_warning(capsys, monkeypatch):
    """A release whose Talker handoff omni-pd covers but whose streaming it does not (no stream_* rows, as a
    release listed before issue 34 would be): expand writes the one-piece file and says why (a warning,
    exit 0: the file it writes works)."""
    from omni_pd.compile import stream_pd

    monkeypatch.setattr(stream_pd, "covered_pipelines", lambda series: ())
    rc, out, err = run_cli(["expand"], capsys)
    assert rc == 0, err
    assert ("warning[OPD901]: async_chunk set to false: vllm-omni 0.30 refuses async_chunk with a "
            "kv_transfer_config and omni-pd's compatibility layer does not make it stream there; the answer's "
            "audio comes in one piece after the text") in err
    assert "help: target a release it covers (`--vllm-version 0.30`), or `omni-pd expand --no-stream`" in err
    assert "\nasync_chunk: false\n" in out and "  - {from: 0, to: 1}\n" in out


# --- ids, roles, sources -------------------------------------------------------------------

def test_stage_ids_roles_and_pipeline():
    res = expand()
    assert [s.stage_id for s in res.config.stages] == [0, 1, 2, 3]
    assert res.config.pipeline == "qwen3_omni_moe_pd"
    assert res.config.async_chunk is True  # the preset streams; omni-pd's layer keeps it under PD
    roles = [(s.stage_id, s.role, s.pd_role, s.input_sources) for s in res.topology.stages]
    assert roles == [(0, "thinker", "prefill", ()), (1, "thinker", "decode", (0,)),
                     (2, "talker", None, (1,)), (3, "code2wav", None, (2,))]
    assert [(s.stage_id, s.final_output_type) for s in res.topology.stages if s.final_output] == [
        (1, "text"), (3, "audio")]


def test_connector_keys_and_edges_remapped():
    res = expand()
    assert stage(res, 2).input_connectors == {"from_stage_1": "connector_of_shared_memory"}
    assert stage(res, 3).input_connectors == {"from_stage_2": "connector_of_shared_memory"}
    assert stage(res, 0).input_connectors is None and stage(res, 1).input_connectors is None
    # streaming: no prefill -> decode stage edge (it would make decode a prewarmed chunk receiver)
    assert [(e.from_, e.to) for e in res.config.edges] == [(1, 2), (2, 3)]
    one_piece = expand(opts=ExpandOptions(stream=False))
    assert one_piece.config.async_chunk is False
    assert [(e.from_, e.to) for e in one_piece.config.edges] == [(0, 1), (1, 2), (2, 3)]


def test_existing_edges_and_output_connectors_are_remapped():
    text = """\
pipeline: qwen3_omni_moe
stages:
  - stage_id: 0
    devices: "0"
    output_connectors: {to_stage_1: shm}
  - stage_id: 1
    devices: "1"
    input_connectors: {from_stage_0: shm}
  - stage_id: 2
    devices: "1"
edges:
  - {from: 0, to: 1, window_size: -1, max_inflight: 1}
  - {from: 1, to: 2, window_size: -1, max_inflight: 1}
"""
    res = expand(text)
    assert stage(res, 0).output_connectors is None
    assert stage(res, 1).output_connectors == {"to_stage_2": "shm"}
    assert stage(res, 2).input_connectors == {"from_stage_1": "shm"}
    assert [(e.from_, e.to, e.window_size, e.max_inflight) for e in res.config.edges] == [
        (1, 2, -1, 1), (2, 3, -1, 1)]
    one_piece = expand(text, opts=ExpandOptions(stream=False))
    assert [(e.from_, e.to, e.window_size, e.max_inflight) for e in one_piece.config.edges] == [
        (0, 1, -1, 1), (1, 2, -1, 1), (2, 3, -1, 1)]


def test_thinker_fields_copied_to_both_halves_and_prefill_not_async():
    res = expand()
    p, d = stage(res, 0), stage(res, 1)
    for s in (p, d):
        assert s.max_num_batched_tokens == 32768 and s.max_num_seqs == 64
        assert s.gpu_memory_utilization == 0.9
        assert s.model_extra["moe_backend"] == "triton"
        assert s.default_sampling_params == {"temperature": 0.0, "max_tokens": 2048}
    assert p.async_scheduling is False
    assert d.async_scheduling is None


def test_downstream_stages_untouched_except_id_devices_sources():
    src = load_file(PRESET)
    from omni_pd.compile.parse import parse_config

    before = parse_config(src)
    res = expand()
    for old, new in ((1, 2), (2, 3)):
        a = next(s for s in before.stages if s.stage_id == old).model_dump(exclude={"stage_id", "devices", "input_connectors"})
        b = stage(res, new).model_dump(exclude={"stage_id", "devices", "input_connectors"})
        assert a == b


# --- kv_transfer_config, env, ports ------------------------------------------------------------

def test_mooncake_contract_on_both_sides():
    # vllm-omni 0.30 reads kv_connector_extra_config.bootstrap_port on kv_producer replicas and
    # overwrites their env with it (stage_runtime.py _prepare_replica_vllm_config); decode binds none
    res = expand()
    p, d = stage(res, 0), stage(res, 1)
    assert p.kv_transfer_config.model_dump(exclude_none=True) == {
        "kv_connector": "MooncakeConnector", "kv_role": "kv_producer", "engine_id": "omni-thinker-prefill",
        "kv_ip": "127.0.0.1", "kv_connector_extra_config": {"bootstrap_port": 25201}}
    assert d.kv_transfer_config.model_dump(exclude_none=True) == {
        "kv_connector": "MooncakeConnector", "kv_role": "kv_consumer", "engine_id": "omni-thinker-decode",
        "kv_ip": "127.0.0.1"}
    assert p.env == {"VLLM_MOONCAKE_BOOTSTRAP_PORT": "25201"}
    assert d.env is None
    assert "mooncake_bootstrap_port" not in res.text


LLM = Path(__file__).resolve().parent / "fixtures" / "llm.yaml"


@pytest.mark.parametrize("src,pipeline,version,extra", [
    (PRESET, None, "0.30", {"bootstrap_port": 25201}),   # vllm-omni 0.30: the extra-config key decides
    (PRESET, None, "0.33", {"bootstrap_port": 25201}),   # newest facts carry forward
    (PRESET, None, "0.28", None),                        # vllm-omni 0.18-0.28: the env decides
    (LLM, "llm", "0.30", None),                          # plain vllm serve: only the env is read
    (LLM, "llm", "0.33", None),
])
def test_emitted_bootstrap_key_per_target(src, pipeline, version, extra, monkeypatch):
    # the Talker handoff at this release is OPD704's (expand refuses it; tests/test_talker_pd.py): here the Thinker's facts
    monkeypatch.setattr("omni_pd.compile.talker_pd.gap", lambda *a: None)
    res = expand(src, pipeline=pipeline, vllm_version=version)
    p, d = stage(res, 0), stage(res, 1)
    assert p.env == {"VLLM_MOONCAKE_BOOTSTRAP_PORT": "25201"}
    assert p.kv_transfer_config.model_dump(exclude_none=True).get("kv_connector_extra_config") == extra
    assert d.env is None and d.kv_transfer_config.kv_connector_extra_config is None
    assert "mooncake_bootstrap_port" not in res.text


def test_unread_bootstrap_keys_in_the_thinker_are_not_copied():
    text = PRESET.read_text().replace(
        "    devices: \"0\"\n",
        "    devices: \"0\"\n    env: {VLLM_MOONCAKE_BOOTSTRAP_PORT: \"25201\"}\n    kv_transfer_config: {kv_connector: "
        "MooncakeConnector, kv_connector_extra_config: {mooncake_bootstrap_port: 25201, num_workers: 4}}\n", 1)
    res = expand(text)
    p, d = stage(res, 0), stage(res, 1)
    # the Thinker's own 25201 is taken in the input, so the allocation moves on; the recipe key
    # no runtime reads is dropped, other extra keys stay
    assert p.kv_transfer_config.kv_connector_extra_config == {"bootstrap_port": 25202, "num_workers": 4}
    assert p.env == {"VLLM_MOONCAKE_BOOTSTRAP_PORT": "25202"}
    assert d.kv_transfer_config.kv_connector_extra_config == {"num_workers": 4}
    assert d.env == {}  # the copied bootstrap port is removed from decode (a kv_consumer binds none)


@pytest.mark.parametrize("replicas,version,want_port,want_range", [
    # vllm-omni 0.30 binds bootstrap_port + r for r < num_replicas: 3 replicas need 25201-25203, and the
    # Talker's API port 25203 pushes the whole range to 25204-25206
    (3, "0.30", 25204, (25204, 25206)),
    (1, "0.30", 25201, (25201, 25201)),
    (1, "0.28", 25201, (25201, 25201)),  # vllm-omni 0.28: the env port, one engine
])
def test_replica_range_is_reserved_clear_of_other_ports(replicas, version, want_port, want_range, monkeypatch):
    # the Talker handoff at this release is OPD704's (expand refuses it; tests/test_talker_pd.py): here the Thinker's facts
    monkeypatch.setattr("omni_pd.compile.talker_pd.gap", lambda *a: None)
    text = PRESET.read_text().replace("    devices: \"0\"\n", f"    devices: \"0\"\n    num_replicas: {replicas}\n", 1)
    text = text.replace("    devices: \"1\"\n", "    devices: \"1\"\n    port: 25203\n", 1)
    res = expand(text, vllm_version=version)
    p = stage(res, 0)
    assert p.env == {"VLLM_MOONCAKE_BOOTSTRAP_PORT": str(want_port)}
    assert res.plan.prefill.env == {"VLLM_MOONCAKE_BOOTSTRAP_PORT": str(want_port)}
    from omni_pd.compile import connectors
    from omni_pd.compile.targets import target

    bound = connectors.get("MooncakeConnector").ports(
        "prefill", p.kv_transfer_config.model_dump(exclude_none=True), p.env, 1, 1, target(version),
        runtime="vllm-omni", replicas=replicas)
    ports = sorted({b.port for b in bound})
    assert (ports[0], ports[-1]) == want_range and len(bound) == replicas


def test_nixl_contract_and_side_channel_ranges_per_dp():
    text = PRESET.read_text().replace("    devices: \"0\"\n", "    devices: \"0,1\"\n    data_parallel_size: 2\n", 1)
    res = expand(text, ExpandOptions(connector="NixlConnector"))
    p, d = stage(res, 0), stage(res, 1)
    assert p.env == {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": "5600"}
    assert d.env == {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": "5602"}
    # the talker shared device 1 with the Thinker in this input: it keeps sharing it with prefill
    assert (p.devices, d.devices, stage(res, 2).devices) == ("0,1", "2,3", "1")
    assert p.kv_transfer_config.kv_role == "kv_producer" and d.kv_transfer_config.kv_role == "kv_consumer"


def test_nixl_on_vllm_011_reserves_one_port_per_tp_rank(monkeypatch):
    # the Talker handoff at this release is OPD704's (expand refuses it; tests/test_talker_pd.py): here the Thinker's facts
    monkeypatch.setattr("omni_pd.compile.talker_pd.gap", lambda *a: None)
    res = expand(PRESET, ExpandOptions(connector="NixlConnector", tp=2), vllm_version="0.11")
    # 0.11 binds one side-channel port per TP rank; the ranges are sized for the widest
    # Thinker TP of any platform (the preset's xpu overlay runs TP 4): 5557-5560, 5561-5564
    assert stage(res, 0).env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5557"
    assert stage(res, 1).env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5561"


def test_ports_already_used_in_the_input_are_skipped():
    text = PRESET.read_text().replace(
        "    devices: \"1\"\n    input_connectors:\n      from_stage_0",
        "    devices: \"1\"\n    env: {VLLM_MOONCAKE_BOOTSTRAP_PORT: \"25201\"}\n    input_connectors:\n      from_stage_0", 1)
    res = expand(text)
    assert stage(res, 0).env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] == "25202"
    assert stage(res, 0).kv_transfer_config.kv_connector_extra_config == {"bootstrap_port": 25202}
    assert stage(res, 1).env is None  # decode (kv_consumer) binds no bootstrap port
    assert stage(res, 2).env == {"VLLM_MOONCAKE_BOOTSTRAP_PORT": "25201"}


@pytest.mark.parametrize("version,has_legacy", [("0.30", True), ("0.31", True), ("0.32", False), ("0.33", False)])
def test_vllm_version_decides_legacy_kv_fields(version, has_legacy):
    kv = stage(expand(PRESET, vllm_version=version), 0).kv_transfer_config.model_dump(exclude_none=True)
    assert ("kv_ip" in kv) is has_legacy
    assert not {"kv_rank", "kv_parallel_size", "kv_buffer_size"} & set(kv)


def test_thinker_kv_transfer_config_picks_connector_and_keeps_user_keys():
    text = PRESET.read_text().replace(
        "    devices: \"0\"\n",
        "    devices: \"0\"\n    kv_transfer_config: {kv_connector: NixlConnector, kv_buffer_device: cpu,"
        " kv_role: kv_both, kv_rank: 0}\n", 1)
    res = expand(text, vllm_version="0.33")
    kv = stage(res, 1).kv_transfer_config.model_dump(exclude_none=True)
    assert kv == {"kv_connector": "NixlConnector", "kv_role": "kv_consumer", "engine_id": "omni-thinker-decode",
                  "kv_buffer_device": "cpu"}


# --- devices ---------------------------------------------------------------------------------

def test_base_devices_prefill_keeps_thinker_decode_next_downstream_follow():
    res = expand()
    assert [stage(res, i).devices for i in range(4)] == ["0", "1", "2", "2"]


@pytest.mark.parametrize("platform,expected", [
    ("npu", {0: "0,1", 1: "2,3", 2: "4", 3: "4"}),
    ("xpu", {0: "0,1,2,3", 1: "4,5,6,7", 2: "8", 3: "8"}),
])
def test_platform_overlays_devices_shifted_and_tp_equal(platform, expected):
    res = expand()
    got = {o.stage_id: o.devices for o in res.config.platforms[platform].stages}
    assert got == expected
    assert overlay(res, platform, 0).tensor_parallel_size == overlay(res, platform, 1).tensor_parallel_size


def test_overlays_without_devices_are_remapped_only():
    res = expand()
    assert [o.stage_id for o in res.config.platforms["cuda"].stages] == [0, 1]
    assert overlay(res, "cuda", 1).compilation_config == {"custom_ops": ["+rotary_embedding"]}
    assert [o.stage_id for o in res.config.platforms["musa"].stages] == [2, 3]
    assert [o.stage_id for o in res.config.platforms["rocm"].stages] == [3]
    assert overlay(res, "rocm", 3).enforce_eager is True


def test_tp_option_grows_both_halves():
    res = expand(PRESET, ExpandOptions(tp=2))
    assert [stage(res, i).devices for i in range(4)] == ["0,1", "2,3", "4", "4"]
    assert stage(res, 0).tensor_parallel_size == stage(res, 1).tensor_parallel_size == 2


def test_explicit_device_options():
    res = expand(PRESET, ExpandOptions(prefill_devices=(2,), decode_devices=(3,), downstream_devices=(0,)))
    assert [stage(res, i).devices for i in range(4)] == ["2", "3", "0", "0"]
    res = expand(PRESET, ExpandOptions(decode_devices=(5,)))
    assert [stage(res, i).devices for i in range(4)] == ["0", "5", "1", "1"]


def test_cli_device_options(capsys):
    rc, out, err = run_cli(["expand", "-q", "--tp", "2", "--prefill-devices", "0,1", "--decode-devices", "4,5"], capsys)
    assert rc == 0, err
    cfg = parse_text(out)
    from omni_pd.compile.parse import parse_config

    c = parse_config(cfg)
    assert [s.devices for s in c.stages] == ["0,1", "4,5", "2", "2"]


def test_qwen2_5_omni_code2wav_keeps_sharing_with_prefill():
    text = """\
async_chunk: false
stages:
  - {stage_id: 0, devices: "0", gpu_memory_utilization: 0.8}
  - {stage_id: 1, devices: "1", gpu_memory_utilization: 0.8}
  - {stage_id: 2, devices: "0", gpu_memory_utilization: 0.15}
"""
    # the Talker handoff of Qwen2.5-Omni is OPD704's (expand refuses it; tests/test_talker_pd.py): here the devices
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("omni_pd.compile.talker_pd.gap", lambda *a: None)
        res = expand(text, pipeline="qwen2_5_omni")
    assert [s.devices for s in res.config.stages] == ["0", "1", "2", "0"]
    # async_chunk was already false: nothing given up
    assert [(d.code, d.severity, d.location.line if d.location else None) for d in res.diagnostics] == []


def test_single_stage_llm_becomes_prefill_decode_pair():
    res = expand("stages:\n  - stage_id: 0\n    devices: \"0\"\n    tensor_parallel_size: 1\n",
                 ExpandOptions(connector="NixlConnector"), name="llama.yaml")
    assert res.config.pipeline == "llm_pd"
    assert [(s.stage_id, s.devices, s.kv_transfer_config.kv_role) for s in res.config.stages] == [
        (0, "0", "kv_producer"), (1, "1", "kv_consumer")]
    assert [(e.from_, e.to) for e in res.config.edges] == [(0, 1)]
    assert stage(res, 0).kv_transfer_config.engine_id == "llm-prefill"
    # plain `vllm serve` engines read no async_chunk: no OPD901 about vllm-omni's routing
    assert res.diagnostics == ()


@pytest.mark.parametrize("text, pipeline, said, streams", [
    ("stages:\n  - stage_id: 0\n    devices: \"0\"\n", None, False, False),                          # llm, no key
    (PRESET.read_text(), "qwen3_omni_moe", False, True),  # vllm-omni's three stages streamed: kept (0.30)
    ("stages:\n  - stage_id: 0\n    devices: \"0\"\n", "qwen3_omni_moe_thinker_only", False, False),  # vllm serve
], ids=["llm", "qwen3_omni_moe", "thinker_only"])
def test_async_chunk_note_is_scoped_to_what_the_file_or_vllm_omni_reads(text, pipeline, said, streams):
    res = expand(text, name="model.yaml", pipeline=pipeline)
    assert [d.code for d in res.diagnostics if d.code == "OPD901"] == (["OPD901"] if said else [])
    assert res.config.async_chunk is streams


def test_thinker_without_devices_gets_some():
    res = expand("pipeline: qwen3_omni_moe\nstages:\n  - stage_id: 1\n    devices: \"0\"\n")
    assert [s.stage_id for s in res.config.stages] == [0, 1, 2]
    assert [s.devices for s in res.config.stages] == ["1", "2", "0"]
    assert sorted(d.code for d in res.diagnostics) == ["OPD902"]  # streaming kept: no OPD901


# --- YAML round trip ---------------------------------------------------------------------------

def test_input_comments_survive():
    out = expand().text
    for line in PRESET.read_text().splitlines():
        if "#" in line:
            comment = line[line.index("#"):]
            assert comment in out, comment


def test_schema_header_and_labels():
    out = expand().text.splitlines()
    assert out[0] == "# yaml-language-server: $schema=s.json"
    assert "  - stage_id: 0  # thinker prefill (KV producer), split from stage 0" in out
    assert "  - stage_id: 2   # talker" in out  # the user's own comment wins downstream


def test_expanding_a_pd_config_is_refused():
    with pytest.raises(OmniPdError) as e:
        expand(expand().text)
    assert e.value.diagnostic.code == "OPD803"
    assert e.value.diagnostic.location.line == 10  # the `pipeline:` value


# --- CLI: errors, files ---------------------------------------------------------------------------

@pytest.mark.parametrize("content,code,where,message", [
    ("stages: [\n", "OPD002", ":2:1", "invalid YAML"),
    ("stages:\n  - stage_id: 0\n    tensor_parallel_size: two\n", "OPD101", ":3:27",
     "`tensor_parallel_size` must be an integer, found 'two'"),
    ("a: 1\na: 2\n", "OPD003", ":2:1", "duplicate key"),
    ("pipeline: qwen3_omni_mo\nstages:\n  - {stage_id: 0}\n", "OPD802", ":1:11", "unknown pipeline `qwen3_omni_mo`"),
    ("stage_args:\n  - stage_id: 0\n", "OPD102", ":1:1", "legacy `stage_args` file"),
    ("- 1\n- 2\n", "OPD004", ":1:1", "expected a mapping"),
    ("stages:\n  - {stage_id: 0}\n  - {stage_id: 1}\n", "OPD802", ":1:1", "cannot tell which pipeline"),
])
def test_bad_input_is_a_located_error_with_exit_2(tmp_path, capsys, content, code, where, message):
    f = tmp_path / "bad.yaml"
    f.write_text(content)
    rc, out, err = run_cli(["expand", str(f)], capsys)
    assert rc == 2
    assert out == ""
    assert err.startswith(f"error[{code}]: ")
    assert message in err.splitlines()[0]
    assert f"{f}{where}" in err
    assert "Traceback" not in err


def test_duplicate_key_names_both_locations(tmp_path, capsys):
    f = tmp_path / "dup.yaml"
    f.write_text("stages: []\nasync_chunk: true\nasync_chunk: false\n")
    rc, _, err = run_cli(["expand", str(f)], capsys)
    assert rc == 2
    assert f"--> {f}:3:1" in err
    assert f"first defined here: {f}:2:1" in err


def test_missing_file_and_bad_option(tmp_path, capsys):
    rc, _, err = run_cli(["expand", str(tmp_path / "nope.yaml")], capsys)
    assert rc == 2 and "error[OPD001]: file not found" in err
    rc, _, err = run_cli(["expand", "--decode-devices", "a,b"], capsys)
    assert rc == 2 and "--decode-devices" in err
    rc, _, err = run_cli(["expand", "--connector", "NIXLConnector"], capsys)
    assert rc == 0  # case-insensitive fallback finds NixlConnector
    rc, _, err = run_cli(["expand", "--connector", "PyNcclConnector"], capsys)
    assert rc == 2 and "error[OPD804]" in err


def test_non_utf8_input(tmp_path, capsys):
    f = tmp_path / "latin1.yaml"
    f.write_bytes(b"stages: []\n# caf\xe9\n")
    rc, _, err = run_cli(["expand", str(f)], capsys)
    assert rc == 2 and "not UTF-8" in err and f"{f}:2" in err


def test_output_written_atomically_and_input_never_overwritten(tmp_path, capsys):
    src = tmp_path / "qwen3_omni_moe.yaml"
    src.write_text(PRESET.read_text())
    before = src.read_bytes()
    rc, _, err = run_cli(["expand", str(src), "-o", str(src)], capsys)
    assert rc == 2 and "refusing to overwrite the input file" in err
    assert src.read_bytes() == before
    out = tmp_path / "out.yaml"
    rc, stdout, err = run_cli(["expand", str(src), "-o", str(out)], capsys)
    assert rc == 0 and stdout == ""
    assert out.read_text().startswith("# yaml-language-server: $schema=")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.yaml", "qwen3_omni_moe.yaml"]  # no temp files left


def test_failed_run_leaves_no_output(tmp_path, capsys):
    out = tmp_path / "out.yaml"
    rc, _, _ = run_cli(["expand", str(tmp_path / "missing.yaml"), "-o", str(out)], capsys)
    assert rc == 2 and not out.exists()


# --- schema ---------------------------------------------------------------------------------------

def test_checked_in_schema_matches_model():
    from omni_pd.compile.model import json_schema

    checked_in = json.loads((ROOT / "schemas" / "omni-pd-deploy.schema.json").read_text())
    assert checked_in == json_schema(), "schema drifted: run `omni-pd schema -o schemas/omni-pd-deploy.schema.json`"


@pytest.mark.parametrize("golden", ["qwen3_omni_moe_pd.yaml", "qwen3_omni_moe_pd_nixl.yaml"])
def test_expanded_output_validates_against_published_schema(golden):
    import jsonschema

    from omni_pd.compile.parse import to_plain

    schema = json.loads((ROOT / "schemas" / "omni-pd-deploy.schema.json").read_text())
    data = to_plain(parse_text((GOLDEN / golden).read_text()).tree)
    jsonschema.validate(data, schema)
    bad = dict(data, stages=[dict(data["stages"][0], tensor_parallel_size="two")])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


# --- the $schema header names a file next to the output (issue 13 item 9) ---------------------------

HEADER = "# yaml-language-server: $schema=omni-pd-deploy.schema.json"


@pytest.mark.parametrize("where", ["stdout", "output below cwd", "output elsewhere"])
def test_schema_header_is_the_same_from_every_directory(tmp_path, capsys, where):
    """The header used to be a relative path to omni-pd's own copy of the schema, or the
    absolute path of it (site-packages after a normal install) when that was not below
    the output's folder: output that differed by machine and working directory."""
    (tmp_path / "cwd" / "sub").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    out = {"stdout": None, "output below cwd": tmp_path / "cwd" / "sub" / "pd.yaml",
           "output elsewhere": tmp_path / "elsewhere" / "pd.yaml"}[where]
    rc, stdout, err = run_cli(["expand", "-q", str(PRESET)] + (["-o", str(out)] if out else []), capsys,
                              cwd=tmp_path / "cwd")
    assert rc == 0, err
    text = stdout if out is None else out.read_text()
    assert text.splitlines()[0] == HEADER
    assert text.splitlines()[1:] == (GOLDEN / "qwen3_omni_moe_pd.yaml").read_text().splitlines()[1:]


@pytest.mark.parametrize("ref, first", [
    ("https://example.org/omni-pd/0.1/omni-pd-deploy.schema.json",
     "# yaml-language-server: $schema=https://example.org/omni-pd/0.1/omni-pd-deploy.schema.json"),
    ("../schemas/deploy.json", "# yaml-language-server: $schema=../schemas/deploy.json"),
    ("", "# Generated by `omni-pd expand` from qwen3_omni_moe.yaml (qwen3_omni_moe -> qwen3_omni_moe_pd); "
         "do not edit by hand, re-run omni-pd."),
])
def test_schema_ref_is_written_verbatim_or_dropped(capsys, ref, first):
    rc, out, err = run_cli(["expand", "-q", "--schema-ref", ref], capsys)
    assert rc == 0, err
    assert out.splitlines()[0] == first
    assert out.count("yaml-language-server") == (1 if ref else 0)


def test_schema_written_next_to_the_output_is_what_the_header_names_and_validates_it(tmp_path, capsys):
    """What yaml-language-server does with the header: resolve a relative path against the
    YAML file, load that schema and validate the file with it."""
    import jsonschema

    from omni_pd.compile.parse import to_plain

    out = tmp_path / "deploy" / "pd.yaml"
    out.parent.mkdir()
    rc, _, err = run_cli(["expand", str(PRESET), "-o", str(out)], capsys)
    assert rc == 0
    where = out.parent / "omni-pd-deploy.schema.json"
    assert err.splitlines()[-1] == (f"note: the $schema header names {where}, which does not exist; "
                                    f"write it with: omni-pd schema -o {where}")
    assert run_cli(["schema", "-o", str(out.parent)], capsys) == (0, "", f"wrote {where}\n")
    assert where.read_text() == (ROOT / "schemas" / "omni-pd-deploy.schema.json").read_text()
    rc, _, err = run_cli(["expand", str(PRESET), "-o", str(out)], capsys)
    assert rc == 0 and "note: the $schema header" not in err
    ref = out.read_text().splitlines()[0].split("$schema=", 1)[1]
    schema = json.loads((out.parent / ref).read_text())
    jsonschema.validate(to_plain(parse_text(out.read_text()).tree), schema)


def test_bootstrap_facts_carry_a_source_per_runtime_and_version():
    from omni_pd.compile.targets import RUNTIMES, target

    for runtime in RUNTIMES:
        for v in ("0.13", "0.18", "0.28", "0.30", "0.33"):
            f = target(v).mooncake_bootstrap(runtime)
            assert f.source and (f.key == "env" or f.extra_key), (runtime, v)
            assert f.default == 8998 and "mooncake_bootstrap_port" in "".join(f.unread_keys)
    new = target("0.30").mooncake_bootstrap("vllm-omni")
    assert (new.extra_key, new.replica_offset, new.env_overwritten) == ("bootstrap_port", True, True)
    assert "_prepare_replica_vllm_config" in new.source
    assert target("0.28").mooncake_bootstrap("vllm-omni").key == "env"
    assert target("0.30").mooncake_bootstrap("vllm").key == "env"
    with pytest.raises(ValueError):
        target("0.30").mooncake_bootstrap("sglang")


def test_a_stage_id_written_as_a_string_is_refused_before_any_rewrite():
    # vllm-omni 0.30 keeps stage_id '1' a string (StageDeployConfig is not coerced), so its PD check
    # then finds no stage 1 (the oracle: "Stage-1 is marked for PD but has no 'kv_transfer_config'");
    # expand refuses it at the key instead of shifting it (it used to read '1' as 1, pydantic's lax int)
    with pytest.raises(OmniPdError) as e:
        expand("stages:\n  - stage_id: '1'\n")
    d = e.value.diagnostic
    assert (d.code, d.message, d.location.line, d.location.column) == (
        "OPD101", "`stage_id` must be an integer, found '1'", 2, 15)


@pytest.mark.parametrize("connector,version,what", [
    ("NixlConnector", "0.30", "NIXL side channel port (5600)"),
    ("MooncakeConnector", "0.28", "Mooncake bootstrap port (25201)"),
])
def test_replicas_that_would_share_one_port_are_refused(connector, version, what):
    # the runtime hands every replica the stage's env unchanged: no port in the file can separate them
    text = PRESET.read_text().replace("    devices: \"0\"\n", "    devices: \"0\"\n    num_replicas: 2\n", 1)
    with pytest.raises(OmniPdError) as e:
        expand(text, ExpandOptions(connector=connector), vllm_version=version)
    d = e.value.diagnostic
    assert (d.code, d.message) == ("OPD805", f"cannot place 2 replicas of the prefill stage on one host: "
                                             f"vllm-omni {version} gives every replica the same {what}")
    assert (d.location.line, d.location.column) == (25, 19)


def test_a_base_config_child_is_refused_at_its_base_config_key(tmp_path, capsys):
    """expand rewrites the stages it reads, so a file whose stages come from base_config
    (vllm-omni merges them at load time) is refused, located, with nothing written; it
    used to be split as an `llm` file and fail expand's own self-check (exit 3, fuzz)."""
    src = tmp_path / "child.yaml"
    src.write_text("base_config: qwen3_omni_moe.yaml\nasync_chunk: false\n")
    out = tmp_path / "out.yaml"
    assert main(["expand", str(src), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "error[OPD808]: expand takes a flat deploy config; this one takes its stages from base_config " \
           "`qwen3_omni_moe.yaml`" in err
    assert f"--> {src}:1:14" in err
    assert not out.exists()


# --- --stream / --no-stream (issue 34) ---------------------------------------------------------------

CPU_FIXTURE = Path(__file__).resolve().parent / "fixtures" / "qwen3_omni_moe_cpu.yaml"


def test_stream_turns_vllm_omnis_streaming_on_where_the_input_turns_it_off(capsys):
    """The CPU rehearsal's deploy says `async_chunk: false` (the one-piece reference); --stream gives the
    streaming PD file the README rehearses: async_chunk true, no 0 -> 1 edge, the comment saying why."""
    rc, out, err = run_cli(["expand", "-q", str(CPU_FIXTURE), "--stream", "--mooncake-protocol", "tcp"], capsys)
    assert rc == 0, err
    assert "\nasync_chunk: true\n" in out
    assert "  - {from: 1, to: 2}\n  - {from: 2, to: 3}\n" in out
    assert "edges:\n  # no 0 -> 1: the KV connector carries that hop" in out
    rc, plain, err = run_cli(["expand", "-q", str(CPU_FIXTURE), "--mooncake-protocol", "tcp"], capsys)
    assert rc == 0 and "\nasync_chunk: false\n" in plain and "  - {from: 0, to: 1}\n" in plain


@pytest.mark.parametrize("args, message", [
    (["--vllm-version", "0.28"], "--stream: vllm-omni 0.28 refuses async_chunk with a kv_transfer_config and omni-pd's "
                                 "compatibility layer does not make it stream there"),
    (["--pipeline", "llm"], "--stream: llm_pd has no stage after decode that streams (plain vllm serve engines never "
                            "read async_chunk)"),
], ids=["uncovered-release", "no-talker"])
def test_stream_where_the_pair_cannot_stream_is_a_usage_error(capsys, args, message):
    src = [str(Path(__file__).resolve().parent / "fixtures" / "llm.yaml")] if "llm" in args else [str(CPU_FIXTURE)]
    rc, out, err = run_cli(["expand", *src, "--stream", *args], capsys)
    assert (rc, out) == (2, "")
    assert f"error[OPD006]: {message}" in err
