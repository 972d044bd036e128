"""Branches of the compiler passes (compile/passes/pd_split.py, ascend.py, encoder_split.py)
that the golden expand tests pass through without pinning: which ports the input already
claims, where an error points, which of the Thinker's kv keys survive, when a config counts
as already split, and each refusal's exact code and message (issue 16; measured by
bench/mutation.py, report in bench/MUTATION.md). Values are worked out from the docstrings.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from omni_pd.compile.connectors.base import SideConfig
from omni_pd.compile.expand import expand_document
from omni_pd.compile.passes import pd_split
from omni_pd.compile.passes.pd_split import ExpandOptions
from omni_pd.compile.targets import target
from omni_pd.diagnostics import OmniPdError, Severity
from omni_pd.io import parse_text

LLM = "stages:\n  - stage_id: 0\n    max_model_len: 1024\n    devices: \"0\"\n"


def refusal(text: str, opts: ExpandOptions = ExpandOptions(), **kw) -> tuple:
    with pytest.raises(OmniPdError) as e:
        expand_document(parse_text(text, "in.yaml"), opts, **kw)
    d = e.value.diagnostic
    return d.code, d.message, (d.location.line, d.location.column) if d.location else None, d.help


def stages(text: str, opts: ExpandOptions = ExpandOptions(), **kw):
    from ruamel.yaml import YAML

    res = expand_document(parse_text(text, "in.yaml"), opts, **kw)
    return YAML(typ="safe", pure=True).load(res.text)["stages"], res


# --- _used_ports: every int-valued *port key anywhere in the input ---------------------------------

def test_used_ports_reads_every_key_ending_in_port_at_any_depth() -> None:
    out: list[tuple[int, int]] = []
    pd_split._used_ports({"a_port": 5000, "nested": {"kv_port": "6000", "PORT": 7000, 3: 9000},
                          "list": [{"side_port": 8000}, 4], "flag_port": True, "x_port": {"inner_port": 1},
                          "bad_port": "abc", "zero_port": 0, "big_port": 70000, "neg_port": -1,
                          "port_count": 5, "last_port": 65535}, out)
    # strings that read as ints count, booleans/mappings/0/out-of-range/non-numeric do not,
    # a mapping under a *port key is searched, keys must *end* in port (case-insensitive)
    assert out == [(5000, 1), (6000, 1), (7000, 1), (8000, 1), (1, 1), (65535, 1)]


def test_a_port_already_in_the_input_is_not_given_to_prefill() -> None:
    # the Thinker already names 5601 in its env: prefill takes 5600, decode steps over 5601 to 5602
    text = LLM + "    env: {VLLM_NIXL_SIDE_CHANNEL_PORT: \"5601\"}\n"
    st, _ = stages(text, ExpandOptions(connector="NixlConnector"), pipeline="llm")
    assert [s["env"]["VLLM_NIXL_SIDE_CHANNEL_PORT"] for s in st] == ["5600", "5602"]


# --- _stage_loc: where an error about the Thinker points --------------------------------------------

_LOC = ("pipeline: llm\ntensor_parallel_size: 2\nstages:\n  - stage_id: 0\n    tensor_parallel_size: 1\n"
        "    engine_args:\n      tensor_parallel_size: 4\n    engine_extras:\n      data_parallel_size: 2\n"
        "  - stage_id: 1\n")


@pytest.mark.parametrize("index, keys, top, where", [
    (0, ("tensor_parallel_size",), (), (7, 29)),        # engine_args wins over the flat key
    (0, ("data_parallel_size",), (), (9, 27)),          # engine_extras when nothing else sets it
    (0, ("pipeline_parallel_size",), ("tensor_parallel_size",), (2, 23)),  # a top-level key
    (0, ("nope",), (), (4, 5)),                          # the stage entry
    (None, ("nope",), (), (3, 1)),                       # the stages: key
    (None, ("x",), ("pipeline",), (1, 11)),
    (1, ("kv_transfer_config.kv_connector",), (), (10, 5)),
    (0, ("nope", "tensor_parallel_size"), (), (7, 29)),  # keys tried in order
])
def test_stage_loc_looks_where_vllm_omni_reads_first(index, keys, top, where) -> None:
    loc = pd_split._stage_loc(parse_text(_LOC, "t.yaml"), index, *keys, top=top)
    assert (loc.line, loc.column) == where


def test_stage_loc_without_stages_points_at_the_document_and_without_a_document_nowhere() -> None:
    loc = pd_split._stage_loc(parse_text("a: 1\n", "t.yaml"), None, "x")
    assert (loc.line, loc.column) == (1, 1)
    assert pd_split._stage_loc(None, 0, "x") is None


# --- _merge_user_kv: what of the Thinker's kv_transfer_config both halves keep ----------------------

_CFG = SideConfig(kv_transfer_config={"kv_connector": "MooncakeConnector", "kv_role": "kv_producer", "engine_id": "e",
                                      "kv_connector_extra_config": {"bootstrap_port": 25201}},
                  env={"A": "1"}, env_remove=("B",))
_USER = {"kv_role": "kv_both", "engine_id": "mine", "kv_rank": 0, "kv_parallel_size": 2, "kv_buffer_size": 1e9,
         "kv_buffer_device": "cpu", "kv_connector": "NixlConnector",
         "kv_connector_extra_config": {"mooncake_bootstrap_port": 1, "keep": 2, "bootstrap_port": 3},
         "custom": {"mooncake_bootstrap_port": 5}, "kv_ip": "x"}


def test_merge_keeps_user_keys_under_the_contract_and_drops_unread_paths() -> None:
    got = pd_split._merge_user_kv(_CFG, _USER, target("0.30"), (
        "kv_connector_extra_config.mooncake_bootstrap_port", "custom.mooncake_bootstrap_port", "kv_ip"))
    # role/engine id/rank/parallel size never copied; connector from the contract; the extra
    # config merged key by key with the contract's value winning; `custom` emptied -> dropped
    assert got.kv_transfer_config == {"kv_connector": "MooncakeConnector", "kv_role": "kv_producer", "engine_id": "e",
                                      "kv_connector_extra_config": {"keep": 2, "bootstrap_port": 25201},
                                      "kv_buffer_size": 1e9, "kv_buffer_device": "cpu"}
    assert list(got.kv_transfer_config) == ["kv_connector", "kv_role", "engine_id", "kv_connector_extra_config",
                                            "kv_buffer_size", "kv_buffer_device"]
    assert list(got.kv_transfer_config["kv_connector_extra_config"]) == ["keep", "bootstrap_port"]
    assert (got.env, got.env_remove) == ({"A": "1"}, ("B",))


def test_merge_drops_fields_the_target_release_removed() -> None:
    got = pd_split._merge_user_kv(_CFG, _USER, target("0.32"), ())
    # vLLM 0.32 has no kv_buffer_size / kv_ip; with no unread paths the rest is kept
    assert got.kv_transfer_config == {"kv_connector": "MooncakeConnector", "kv_role": "kv_producer", "engine_id": "e",
                                      "kv_connector_extra_config": {"mooncake_bootstrap_port": 1, "keep": 2,
                                                                    "bootstrap_port": 25201},
                                      "kv_buffer_device": "cpu", "custom": {"mooncake_bootstrap_port": 5}}


def test_merge_without_user_keys_is_the_contract_unchanged() -> None:
    assert pd_split._merge_user_kv(_CFG, None, target("0.30")) is _CFG
    assert pd_split._merge_user_kv(_CFG, {}, target("0.30")) is _CFG


# --- check_not_pd: already split ------------------------------------------------------------------

_KV = "    kv_transfer_config: {{kv_connector: MooncakeConnector, kv_role: {role}}}\n"
_TWO = ("stages:\n  - stage_id: 0\n    devices: \"0\"\n{a}  - stage_id: 1\n    devices: \"1\"\n{b}")


def test_a_producer_consumer_pair_without_a_pd_pipeline_is_already_split() -> None:
    text = _TWO.format(a=_KV.format(role="kv_both"), b=_KV.format(role="kv_consumer"))
    assert refusal(text, pipeline="qwen3_omni_moe_thinker_only")[:3] == (
        "OPD803", "this deploy config is already prefill/decode split; refusing to split it twice", (1, 1))


@pytest.mark.parametrize("a, b", [("kv_producer", "kv_producer"), ("kv_consumer", "kv_consumer"),
                                  ("kv_producer", None), ("kv_both", None)])
def test_roles_that_form_no_pair_are_not_already_split(a, b) -> None:
    # two senders, two receivers, or one kv stage alone (kv_both cannot pair with itself)
    if b is None:
        st, _ = stages(LLM.replace("devices: \"0\"\n", "devices: \"0\"\n" + _KV.format(role=a)), pipeline="llm")
        assert [s["kv_transfer_config"]["kv_role"] for s in st] == ["kv_producer", "kv_consumer"]
        return
    text = "pipeline: qwen3_omni_moe\n" + _TWO.format(a=_KV.format(role=a), b=_KV.format(role=b)) + \
        "  - stage_id: 2\n    devices: \"1\"\n"
    st, _ = stages(text)
    assert [(s["stage_id"], s["kv_transfer_config"]["kv_role"]) for s in st[:3]] == [
        (0, "kv_producer"), (1, "kv_consumer"), (2, b)]


def test_a_pipeline_name_ending_in_pd_is_already_split_at_its_value() -> None:
    assert refusal("pipeline: llm_pd\n" + LLM)[:3] == (
        "OPD803", "this deploy config is already prefill/decode split; refusing to split it twice", (1, 11))


# --- plan_pd_split refusals -----------------------------------------------------------------------

def test_a_pipeline_without_a_thinker_or_llm_stage_is_refused() -> None:
    text = "pipeline: llm_1e1pd\nstages:\n  - {stage_id: 0, devices: \"0\"}\n  - {stage_id: 1, devices: \"1\"}\n"
    assert refusal(text) == (
        "OPD801", "pipeline `llm_1e1pd` has no Thinker (or single LLM) stage to split", (1, 1),
        "PD disaggregation splits the Thinker; choose a pipeline that has one with --pipeline")


def test_an_unknown_connector_in_the_file_is_located_there_with_the_nearest_name() -> None:
    text = LLM + "    kv_transfer_config: {kv_connector: NixlConector}\n"
    code, msg, at, help = refusal(text, pipeline="llm")
    assert (code, msg, at) == ("OPD804", "no connector contract for `NixlConector`", (5, 40))
    assert help.startswith("did you mean NixlConnector? omni-pd can emit: MooncakeConnector, ")


def test_an_unknown_connector_from_the_command_line_has_no_location_and_no_guess() -> None:
    code, msg, at, help = refusal(LLM, ExpandOptions(connector="Zzz"), pipeline="llm")
    assert (code, msg, at) == ("OPD804", "no connector contract for `Zzz`", None)
    assert help.startswith("omni-pd can emit: MooncakeConnector, ")


def test_a_connector_the_target_release_lacks_is_refused() -> None:
    assert refusal(LLM, ExpandOptions(connector="MooncakeConnector"), pipeline="llm", vllm_version="0.11") == (
        "OPD804", "MooncakeConnector is not registered in vLLM 0.11", None, "pick another --connector or --vllm-version")


def test_an_engine_wider_than_omni_pd_places_is_refused() -> None:
    assert refusal(LLM, ExpandOptions(tp=4097), pipeline="llm")[:3] == (
        "OPD805", "cannot place prefill and decode: TP x PP x DP = 4097 devices per engine, more than the 4096 "
                  "omni-pd places", None)


def test_an_engine_exactly_as_wide_as_the_limit_is_placed() -> None:
    st, _ = stages(LLM, ExpandOptions(tp=4096, connector="NixlConnector"), pipeline="llm")
    assert [len(s["devices"].split(",")) for s in st] == [4096, 4096]


def test_overlapping_device_options_are_refused_with_both_lists() -> None:
    assert refusal(LLM, ExpandOptions(prefill_devices=(0, 1), decode_devices=(1, 2), tp=2), pipeline="llm")[:3] == (
        "OPD805", 'cannot place prefill and decode: prefill devices "0,1" and decode devices "1,2" overlap', None)


def test_no_room_for_the_connector_ports_is_refused() -> None:
    assert refusal(LLM, ExpandOptions(connector="NixlConnector", port_base=65535), pipeline="llm") == (
        "OPD805", "cannot allocate NixlConnector ports: no free range of 1 port(s) at or above 65535", None,
        "pass --port-base with a lower free port")


def test_the_last_port_is_usable_for_the_last_range() -> None:
    st, _ = stages(LLM, ExpandOptions(connector="NixlConnector", port_base=65534), pipeline="llm")
    assert [s["env"]["VLLM_NIXL_SIDE_CHANNEL_PORT"] for s in st] == ["65534", "65535"]


# --- notes ----------------------------------------------------------------------------------------

def test_a_thinker_without_devices_is_told_which_devices_it_got() -> None:
    _, res = stages(LLM.replace("    devices: \"0\"\n", ""), pipeline="llm")
    d = next(x for x in res.diagnostics if x.code == "OPD902")
    assert (d.severity, d.message, (d.location.line, d.location.column), d.help) == (
        Severity.INFO, 'the Thinker had no `devices`; prefill gets "0" and decode "1"', (2, 5),
        "pass --prefill-devices/--decode-devices to choose them")


# --- encoder_split ----------------------------------------------------------------------------------

def encoder(text: str, eopts, opts: ExpandOptions = ExpandOptions(), **kw):
    from ruamel.yaml import YAML

    from omni_pd.compile.expand import expand_encoder_document

    res = expand_encoder_document(parse_text(text, "in.yaml"), eopts, opts, **kw)
    return YAML(typ="safe", pure=True).load(res.text)["stages"], res


def encoder_refusal(text: str, eopts, opts: ExpandOptions = ExpandOptions(), **kw) -> tuple:
    from omni_pd.compile.expand import expand_encoder_document

    with pytest.raises(OmniPdError) as e:
        expand_encoder_document(parse_text(text, "in.yaml"), eopts, opts, **kw)
    d = e.value.diagnostic
    return d.code, d.message, (d.location.line, d.location.column) if d.location else None, d.help, d.notes


def _ec(st: dict) -> tuple:
    ec = st["ec_transfer_config"]
    return st.get("devices"), ec["ec_role"], ec["engine_id"], ec["ec_connector_extra_config"]["shared_storage_path"]


def test_1e1pd_encoder_takes_the_next_free_device_and_the_consumer_the_llm_engine_id() -> None:
    from omni_pd.compile.passes.encoder_split import EncoderOptions

    st, res = encoder(LLM, EncoderOptions("1e1pd"), pipeline="llm")
    assert [_ec(s) for s in st] == [("1", "ec_producer", "llm-encoder", "/tmp/omni-pd-ec"),
                                    ("0", "ec_consumer", "llm", "/tmp/omni-pd-ec")]
    assert [d.code for d in res.diagnostics] == []


def test_1e1p1d_consumer_is_prefill_and_the_encoder_goes_past_decode() -> None:
    from omni_pd.compile.passes.encoder_split import EncoderOptions

    st, _ = encoder(LLM, EncoderOptions("1e1p1d"), ExpandOptions(connector="NixlConnector"), pipeline="llm")
    assert [_ec(s) for s in st[:2]] == [("2", "ec_producer", "llm-encoder", "/tmp/omni-pd-ec"),
                                        ("0", "ec_consumer", "llm-prefill", "/tmp/omni-pd-ec")]
    assert (st[2]["devices"], st[2]["kv_transfer_config"]["engine_id"], "ec_transfer_config" in st[2]) == (
        "1", "llm-decode", False)


def test_thinker_engine_ids_and_the_prefix_option() -> None:
    from omni_pd.compile.passes.encoder_split import EncoderOptions

    st, _ = encoder(LLM, EncoderOptions("1e1pd"), pipeline="qwen3_omni_moe_thinker_only")
    assert [s["ec_transfer_config"]["engine_id"] for s in st] == ["omni-thinker-encoder", "omni-thinker"]
    st, _ = encoder(LLM, EncoderOptions("1e1pd"), ExpandOptions(engine_id_prefix="x"), pipeline="llm")
    assert [s["ec_transfer_config"]["engine_id"] for s in st] == ["x-encoder", "x"]


def test_an_llm_without_devices_gives_the_encoder_none() -> None:
    from omni_pd.compile.passes.encoder_split import EncoderOptions

    st, _ = encoder(LLM.replace("    devices: \"0\"\n", ""), EncoderOptions("1e1pd"), pipeline="llm")
    assert [s.get("devices") for s in st] == [None, None]


def test_encoder_devices_given_apart_from_the_llm_need_no_note() -> None:
    from omni_pd.compile.passes.encoder_split import EncoderOptions

    st, res = encoder(LLM, EncoderOptions("1e1pd", encoder_devices=(3,)), pipeline="llm")
    assert [s["devices"] for s in st] == ["3", "0"] and res.diagnostics == ()


def test_encoder_devices_shared_with_the_llm_are_named_sorted() -> None:
    from omni_pd.compile.passes.encoder_split import EncoderOptions

    text = LLM.replace('"0"', '"0,1"') + "    tensor_parallel_size: 2\n"
    st, res = encoder(text, EncoderOptions("1e1pd", encoder_devices=(1, 0)), pipeline="llm")
    assert [s["devices"] for s in st] == ["1,0", "0,1"]
    assert [(d.code, d.severity, d.message, d.help) for d in res.diagnostics] == [(
        "OPD903", Severity.INFO, "the encoder shares device(s) 0, 1 with the language model",
        "fine for a small encoder; give --encoder-devices a free device to keep them apart")]


def test_a_config_with_an_ec_transfer_config_is_already_split() -> None:
    from omni_pd.compile.passes.encoder_split import EncoderOptions

    text = LLM + "    ec_transfer_config: {ec_connector: ECExampleConnector, ec_role: ec_producer}\n"
    assert encoder_refusal(text, EncoderOptions("1e1pd"), pipeline="llm") == (
        "OPD803", "this deploy config already has an encoder stage (ec_transfer_config); refusing to split it twice",
        (1, 1), "run `omni-pd validate` on it instead", [])


def test_an_unknown_layout_is_refused_with_the_layouts() -> None:
    from omni_pd.compile.passes.encoder_split import EncoderOptions

    assert encoder_refusal(LLM, EncoderOptions("2e"), pipeline="llm") == (
        "OPD806", "unknown encoder split `2e`", None, "--encoder-split is one of 1e1pd, 1e1p1d", [])


@pytest.mark.parametrize("pipeline", ["qwen3_omni_moe", "qwen2_5_omni"])
def test_a_full_omni_pipeline_is_refused_pointing_at_its_thinker_only_variant(pipeline) -> None:
    from omni_pd.compile.passes.encoder_split import OMNI_REFUSAL, EncoderOptions

    three = "stages:\n  - {stage_id: 0, devices: \"0\"}\n  - {stage_id: 1, devices: \"1\"}\n  - {stage_id: 2, devices: \"1\"}\n"
    assert encoder_refusal(three, EncoderOptions("1e1pd"), pipeline=pipeline) == (
        "OPD806", f"pipeline `{pipeline}` (thinker -> talker -> code2wav) cannot take an encoder split", (1, 1),
        f"for text output, serve `{pipeline}_thinker_only` (the Thinker alone) with --encoder-split; the encoder "
        "split applies to single-LLM pipelines: llm, qwen2_5_omni_thinker_only, qwen3_omni_moe_thinker_only",
        [OMNI_REFUSAL])


@pytest.mark.parametrize("name, msg", [
    ("ECNope", "omni-pd has no EC connector contract for `ECNope`"),
    ("ECMooncakeConnector", "omni-pd has no EC connector contract for `ECMooncakeConnector` (validate checks it, "
                            "expand does not emit it yet)"),
])
def test_an_ec_connector_without_a_contract_is_refused(name, msg) -> None:
    from omni_pd.compile.passes.encoder_split import EncoderOptions

    assert encoder_refusal(LLM, EncoderOptions("1e1pd", ec_connector=name), pipeline="llm") == (
        "OPD807", msg, None, "omni-pd can emit: ECExampleConnector", [])


def test_an_ec_connector_the_release_lacks_is_refused() -> None:
    from omni_pd.compile.passes.encoder_split import EncoderOptions

    assert encoder_refusal(LLM, EncoderOptions("1e1pd"), pipeline="llm", vllm_version="0.11") == (
        "OPD807", "ECExampleConnector is not registered in vLLM 0.11", None,
        "pick another --ec-connector or --vllm-version", [])


# --- ascend: apply_ascend writes the sides into the tree ----------------------------------------------

_ASCEND_SRC = """stages:
  - stage_id: 0
    devices: "0"
    env: {VLLM_NIXL_SIDE_CHANNEL_PORT: "5600", KEEP: "1", VLLM_NIXL_SIDE_CHANNEL_HOST: h, VLLM_MOONCAKE_BOOTSTRAP_PORT: "8998"}
    kv_transfer_config: {kv_connector: NixlConnector}
  - stage_id: 1
    devices: "1"
platforms:
  npu:
    stages:
      - stage_id: 0
        devices: "0"
      - stage_id: x
      - stage_id: 3
"""
_NPU_KV = {"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_producer",
           "kv_connector_extra_config": {"prefill": {"tp_size": 1, "dp_size": 1}, "decode": {"tp_size": 1, "dp_size": 1}}}
_NPU_KV_TEXT = """kv_transfer_config:
{i}  kv_connector: MooncakeConnectorV1
{i}  kv_role: {role}
{i}  kv_connector_extra_config:
{i}    prefill: {{tp_size: 1, dp_size: 1}}
{i}    decode: {{tp_size: 1, dp_size: 1}}
"""


def _apply(src: str, sides, base: bool) -> str:
    import io

    from ruamel.yaml import YAML

    from omni_pd.compile.passes.ascend import apply_ascend

    y = YAML()
    tree = y.load(src)
    apply_ascend(tree, sides, base=base)
    buf = io.StringIO()
    y.dump(tree, buf)
    return buf.getvalue()


def test_apply_ascend_inserts_missing_overlay_entries_in_stage_id_order() -> None:
    from omni_pd.compile.passes.ascend import AscendSide

    sides = [AscendSide(1, _NPU_KV, {"HCCL_IF_BASE_PORT": "61000"}),
             AscendSide(2, dict(_NPU_KV, kv_role="kv_consumer"), {"HCCL_IF_BASE_PORT": "61016"},
                        {"tensor_parallel_size": 2, "devices": "4,5"})]
    got = _apply(_ASCEND_SRC, sides, base=False)
    # entries 1 and 2 go between 0 and 3 (a non-numeric id does not count); env before the
    # kv config; devices double-quoted; peer blocks in flow style; the base is untouched
    assert got.split("platforms:\n")[1] == (
        "  npu:\n    stages:\n    - stage_id: 0\n      devices: '0'\n"
        "    - stage_id: 1\n      env:\n        HCCL_IF_BASE_PORT: \"61000\"\n      "
        + _NPU_KV_TEXT.format(i="      ", role="kv_producer")
        + "    - stage_id: 2\n      tensor_parallel_size: 2\n      devices: \"4,5\"\n      env:\n"
          "        HCCL_IF_BASE_PORT: \"61016\"\n      "
        + _NPU_KV_TEXT.format(i="      ", role="kv_consumer")
        + "    - stage_id: x\n    - stage_id: 3\n")
    from ruamel.yaml import YAML

    assert YAML(typ="safe", pure=True).load(got)["stages"] == YAML(typ="safe", pure=True).load(_ASCEND_SRC)["stages"]


def test_apply_ascend_on_the_base_replaces_the_cuda_connector_and_its_port_env() -> None:
    from omni_pd.compile.passes.ascend import AscendSide

    sides = [AscendSide(0, _NPU_KV, {"HCCL_IF_BASE_PORT": "61000"}),
             AscendSide(1, dict(_NPU_KV, kv_role="kv_consumer"), {"HCCL_IF_BASE_PORT": "61016"})]
    got = _apply(_ASCEND_SRC, sides, base=True)
    assert got.split("platforms:\n")[0] == (
        "stages:\n- stage_id: 0\n  devices: '0'\n  env: {KEEP: '1', HCCL_IF_BASE_PORT: \"61000\"}\n  "
        + _NPU_KV_TEXT.format(i="  ", role="kv_producer")
        + "- stage_id: 1\n  devices: '1'\n  env:\n    HCCL_IF_BASE_PORT: \"61016\"\n  "
        + _NPU_KV_TEXT.format(i="  ", role="kv_consumer"))
    assert got.split("platforms:\n")[1] == (
        "  npu:\n    stages:\n    - stage_id: 0\n      devices: '0'\n    - stage_id: x\n    - stage_id: 3\n")


def test_apply_ascend_creates_the_npu_overlay_when_the_file_has_none() -> None:
    from omni_pd.compile.passes.ascend import AscendSide

    got = _apply("stages:\n  - stage_id: 0\n", [AscendSide(0, _NPU_KV, {"A": "1"})], base=False)
    assert got == ("stages:\n- stage_id: 0\nplatforms:\n  npu:\n    stages:\n    - stage_id: 0\n      env:\n"
                   "        A: \"1\"\n      " + _NPU_KV_TEXT.format(i="      ", role="kv_producer"))


# --- ascend: plan_ascend ------------------------------------------------------------------------------

_NPU_PD = ("pipeline: qwen3_omni_moe_thinker_only_pd\nstages:\n"
           "  - {stage_id: 0, devices: \"0,1\", num_replicas: 2, kv_transfer_config: {kv_connector: MooncakeConnector,"
           " kv_role: kv_producer, engine_id: p}}\n"
           "  - {stage_id: 1, devices: \"2\", kv_transfer_config: {kv_connector: MooncakeConnector,"
           " kv_role: kv_consumer, engine_id: d}}\n")


def _npu_topo(text: str):
    from omni_pd.compile.parse import parse_config
    from omni_pd.compile.pipelines import load_catalogue
    from omni_pd.compile.topology import resolve

    cfg = parse_config(parse_text(text, "pd.yaml"))
    return resolve(cfg, load_catalogue().get(cfg.pipeline), "npu", None)


def test_plan_ascend_refuses_a_connector_that_is_not_vllm_ascends() -> None:
    from omni_pd.compile.passes.ascend import plan_ascend

    with pytest.raises(OmniPdError) as e:
        plan_ascend(_npu_topo(_NPU_PD), "NixlConnector")
    d = e.value.diagnostic
    assert (d.code, d.severity, d.message, d.help, d.location) == (
        "OPD804", Severity.ERROR, "NixlConnector is not a vllm-ascend PD connector",
        "on npu use MooncakeConnectorV1 (pull) or MooncakeLayerwiseConnector (layerwise push)", None)


def test_plan_ascend_refuses_replicas_sharing_a_port_unless_writing_an_overlay() -> None:
    from omni_pd.compile.passes.ascend import plan_ascend

    why = "vllm-omni 0.30 gives every replica the same kv_port + rank (MooncakeConnectorV1) port (36000)"
    with pytest.raises(OmniPdError) as e:  # overlay=False is the default: the base file runs on npu
        plan_ascend(_npu_topo(_NPU_PD), "MooncakeConnectorV1")
    assert (e.value.diagnostic.code, e.value.diagnostic.message) == (
        "OPD805", f"npu: cannot place 2 replicas of the prefill stage on one host: {why}")
    sides = plan_ascend(_npu_topo(_NPU_PD), "MooncakeConnectorV1", overlay=True)
    assert [(s.stage_id, s.settings, [(n.code, n.message) for n in s.notes]) for s in sides] == [
        # the one replica left keeps one engine's devices of the pool "0,1" (else OPD401 on npu)
        (0, {"num_replicas": 1, "devices": "0"}, [("OPD904", "npu overlay: the prefill stage 0 runs 1 replica on npu (the base keeps "
                                             "2): " + why.replace("gives", "would give"))]),
        (1, {}, [])]
    assert sides[0].notes[0].help == "to serve xPyD on npu, place the replicas on different hosts"
    # the one replica left reserves one range: decode follows at 36001 / HCCL 61016
    assert [(s.kv["kv_port"], s.env["HCCL_IF_BASE_PORT"]) for s in sides] == [(36000, "61000"), (36001, "61016")]


def _sides(text: str, **kw) -> list[tuple]:
    from omni_pd.compile.passes.ascend import plan_ascend

    return [(s.stage_id, s.kv, s.env, s.settings) for s in plan_ascend(_npu_topo(text), "MooncakeConnectorV1", **kw)]


_ONE = _NPU_PD.replace("num_replicas: 2, ", "")


def _v1(role: str, port: int, eid: str, prefill: dict) -> dict:
    return {"kv_connector": "MooncakeConnectorV1", "kv_role": role, "kv_port": port, "engine_id": eid,
            "kv_connector_extra_config": {"prefill": prefill, "decode": {"dp_size": 1, "tp_size": 1}}}


def test_plan_ascend_sizes_peer_blocks_ports_and_hccl_from_prefill_dp() -> None:
    # prefill DP 2: its block says dp_size 2, it binds kv_port 36000-36001 and HCCL 2 x 16
    # ports from 61000, so decode starts at 36002 and 61032
    got = _sides(_ONE.replace('devices: "0,1", ', 'devices: "0,1", data_parallel_size: 2, '))
    blk = {"dp_size": 2, "tp_size": 1}
    assert got == [(0, _v1("kv_producer", 36000, "p", blk), {"HCCL_IF_BASE_PORT": "61000"}, {}),
                   (1, _v1("kv_consumer", 36002, "d", blk), {"HCCL_IF_BASE_PORT": "61032"}, {})]


def test_plan_ascend_writes_prefill_pp_into_the_peer_blocks() -> None:
    got = _sides(_ONE.replace('devices: "0,1", ', 'devices: "0,1", pipeline_parallel_size: 2, '))
    blk = {"dp_size": 1, "tp_size": 1, "pp_size": 2}
    assert got == [(0, _v1("kv_producer", 36000, "p", blk), {"HCCL_IF_BASE_PORT": "61000"}, {}),
                   (1, _v1("kv_consumer", 36002, "d", blk), {"HCCL_IF_BASE_PORT": "61032"}, {})]


def test_plan_ascend_refuses_a_decode_tp_above_prefills() -> None:
    from omni_pd.compile.passes.ascend import plan_ascend

    text = _ONE.replace('devices: "0,1", ', 'devices: "0", ').replace(
        'devices: "2", ', 'devices: "2,3", tensor_parallel_size: 2, ')
    with pytest.raises(OmniPdError) as e:
        plan_ascend(_npu_topo(text), "MooncakeConnectorV1")
    d = e.value.diagnostic
    assert (d.code, d.severity, d.message, d.help) == (
        "OPD805", Severity.ERROR,
        "npu overlay: vllm-ascend MooncakeConnectorV1 needs prefill TP >= decode TP and divisible by it (got P=1, D=2)",
        "give prefill the larger TP, a multiple of decode's (vllm-ascend's PD limits)")


def test_plan_ascend_names_the_target_release_in_the_replica_refusal() -> None:
    from omni_pd.compile.passes.ascend import plan_ascend

    with pytest.raises(OmniPdError) as e:
        plan_ascend(_npu_topo(_NPU_PD), "MooncakeConnectorV1", target=target("0.28"))
    assert e.value.diagnostic.message == (
        "npu: cannot place 2 replicas of the prefill stage on one host: vllm-omni 0.28 gives every replica the same "
        "kv_port + rank (MooncakeConnectorV1) port (36000)")


def test_plan_ascend_kv_port_and_hccl_bases_can_be_given() -> None:
    blk = {"dp_size": 1, "tp_size": 1}
    assert _sides(_ONE, kv_port_base=40000, hccl_base=62000) == [
        (0, _v1("kv_producer", 40000, "p", blk), {"HCCL_IF_BASE_PORT": "62000"}, {}),
        (1, _v1("kv_consumer", 40001, "d", blk), {"HCCL_IF_BASE_PORT": "62016"}, {})]


@pytest.mark.parametrize("extra, block", [("data_parallel_size: 2", {"dp_size": 2, "tp_size": 1}),
                                          ("pipeline_parallel_size: 2", {"dp_size": 1, "tp_size": 1, "pp_size": 2})])
def test_a_lower_decode_tp_keeps_decodes_dp_and_pp_and_its_first_devices(extra, block) -> None:
    text = _ONE.replace('devices: "0,1", ', 'devices: "0,1", tensor_parallel_size: 2, ').replace(
        'devices: "2", ', f'devices: "2,3,4,5", tensor_parallel_size: 2, {extra}, ')
    got = _sides(text, decode_tp=1)
    p_blk = {"dp_size": 1, "tp_size": 2}
    assert got[1] == (1, {**_v1("kv_consumer", 36002, "d", p_blk),
                          "kv_connector_extra_config": {"prefill": p_blk, "decode": block}},
                      {"HCCL_IF_BASE_PORT": "61032"}, {"tensor_parallel_size": 1, "devices": "2,3"})


def test_a_lower_decode_tp_on_a_vllm_omni_pipeline_is_refused_naming_prefills_tp() -> None:
    from omni_pd.compile.passes.ascend import plan_ascend

    # prefill TP 4, decode TP 2 in the file: vllm-omni's PD validator compares decode with
    # prefill, so the message names prefill's 4 (it named decode's own 2 as "prefill TP")
    text = _ONE.replace("qwen3_omni_moe_thinker_only_pd", "qwen3_omni_moe_pd").replace(
        'devices: "0,1", ', 'devices: "0,1,2,3", tensor_parallel_size: 4, ').replace(
        'devices: "2", ', 'devices: "4,5", tensor_parallel_size: 2, ')
    with pytest.raises(OmniPdError) as e:
        plan_ascend(_npu_topo(text), "MooncakeConnectorV1", decode_tp=1)
    d = e.value.diagnostic
    assert (d.code, d.message, d.help) == (
        "OPD805", "npu overlay: decode TP 1 != prefill TP 4, but qwen3_omni_moe_pd runs on vllm-omni, whose PD "
                  "validator requires equal TP (pd_utils.py)",
        "asymmetric TP needs a pipeline launched as plain vllm serve engines (e.g. *_thinker_only)")


# --- check_replicas_apart -----------------------------------------------------------------------------

@pytest.mark.parametrize("side, role, version, refused", [
    ("decode", "kv_consumer", "0.28", False),   # a Mooncake consumer binds no bootstrap port
    ("prefill", "kv_producer", "0.30", False),  # vllm-omni 0.30: bootstrap_port + replica id
    ("prefill", "kv_producer", "0.28", True),   # vllm-omni 0.28: every replica the same env port
])
def test_replicas_of_one_side_must_bind_different_ports(side, role, version, refused) -> None:
    from omni_pd.compile import connectors

    cfg = SideConfig(kv_transfer_config={"kv_connector": "MooncakeConnector", "kv_role": role, "engine_id": "x"},
                     env={"VLLM_MOONCAKE_BOOTSTRAP_PORT": "25201"})
    args = (connectors.get("MooncakeConnector"), side, cfg, 1, 1, target(version), "vllm-omni", 2, None)
    if not refused:
        assert pd_split.check_replicas_apart(*args) is None
        return
    with pytest.raises(OmniPdError) as e:
        pd_split.check_replicas_apart(*args)
    d = e.value.diagnostic
    assert (d.code, d.message, d.help) == (
        "OPD805", "cannot place 2 replicas of the prefill stage on one host: vllm-omni 0.28 gives every replica the "
                  "same Mooncake bootstrap port (25201)",
        "set num_replicas: 1 on the Thinker (one engine per side), or serve the replicas from different hosts")


def test_plan_ascend_writes_layerwise_peer_blocks_only_for_the_release_that_reads_them() -> None:
    from omni_pd.compile.passes.ascend import plan_ascend

    blk = {"prefill": {"dp_size": 1, "tp_size": 1}, "decode": {"dp_size": 1, "tp_size": 1}}
    old = plan_ascend(_npu_topo(_ONE), "MooncakeLayerwiseConnector", release="0.13")
    new = plan_ascend(_npu_topo(_ONE), "MooncakeLayerwiseConnector")
    assert [(s.kv["kv_port"], s.kv.get("kv_connector_extra_config")) for s in old] == [(36000, blk), (36001, blk)]
    assert [(s.kv["kv_port"], s.kv.get("kv_connector_extra_config")) for s in new] == [(36000, None), (36001, None)]


def test_an_already_pd_config_is_refused_at_its_pipeline_value_by_the_encoder_split_too() -> None:
    from omni_pd.compile.passes.encoder_split import EncoderOptions

    assert encoder_refusal("pipeline: llm_pd\n" + LLM, EncoderOptions("1e1pd"))[:3] == (
        "OPD803", "this deploy config is already prefill/decode split; refusing to split it twice", (1, 11))


def test_plan_encoder_split_without_a_document_refuses_without_a_location() -> None:
    from omni_pd.compile.expand import _front
    from omni_pd.compile.passes.encoder_split import EncoderOptions, plan_encoder_split

    text = LLM + "    ec_transfer_config: {ec_connector: ECExampleConnector, ec_role: ec_producer}\n"
    cat, tgt, topo = _front(parse_text(text, "in.yaml"), None, "llm", None)
    with pytest.raises(OmniPdError) as e:
        plan_encoder_split(topo, cat, tgt, EncoderOptions("1e1pd"))
    assert (e.value.diagnostic.code, e.value.diagnostic.location) == ("OPD803", None)


def test_a_two_stage_plain_vllm_pipeline_is_refused_without_the_vllm_omni_reason() -> None:
    # a custom catalogue entry: two stages, plain `vllm serve`, no *_thinker_only variant
    from omni_pd.compile.expand import expand_encoder_document
    from omni_pd.compile.passes.encoder_split import EncoderOptions
    from omni_pd.compile.pipelines import Catalogue, load_catalogue, pipeline_from_dict

    two = pipeline_from_dict({"name": "llm_then_tts", "runtime": "vllm", "stages": [
        {"stage_id": 0, "role": "llm", "final_output": True},
        {"stage_id": 1, "role": "tts", "input_sources": [0], "final_output": True}]})
    cat = Catalogue({**load_catalogue().pipelines, two.name: two})
    text = "stages:\n  - {stage_id: 0, devices: \"0\"}\n  - {stage_id: 1, devices: \"1\"}\n"
    with pytest.raises(OmniPdError) as e:
        expand_encoder_document(parse_text(text, "in.yaml"), EncoderOptions("1e1pd"), ExpandOptions(),
                                pipeline="llm_then_tts", catalogue=cat)
    d = e.value.diagnostic
    assert (d.code, d.message, (d.location.line, d.location.column), d.help, d.notes) == (
        "OPD806", "pipeline `llm_then_tts` (llm -> tts) cannot take an encoder split", (1, 1),
        "the encoder split applies to single-LLM pipelines: llm, qwen2_5_omni_thinker_only, "
        "qwen3_omni_moe_thinker_only", [])


def test_1e1p1d_pd_half_notes_are_located_in_the_input() -> None:
    from omni_pd.compile.passes.encoder_split import EncoderOptions

    _, res = encoder(LLM.replace("    devices: \"0\"\n", ""), EncoderOptions("1e1p1d"),
                     ExpandOptions(connector="NixlConnector"), pipeline="llm")
    assert [(d.code, d.message, (d.location.line, d.location.column)) for d in res.diagnostics] == [
        ("OPD902", 'the Thinker had no `devices`; prefill gets "0" and decode "1"', (2, 5))]


def test_a_catalogue_without_the_encoder_variant_derives_it() -> None:
    # a custom single-LLM pipeline: load_catalogue() adds <name>_1e1pd only for its own files
    from omni_pd.compile.passes.encoder_split import EncoderOptions
    from omni_pd.compile.pipelines import Catalogue, load_catalogue, pipeline_from_dict

    solo = pipeline_from_dict({"name": "solo", "runtime": "vllm",
                               "stages": [{"stage_id": 0, "role": "llm", "final_output": True}]})
    st, res = encoder(LLM, EncoderOptions("1e1pd"), pipeline="solo",
                      catalogue=Catalogue({**load_catalogue().pipelines, solo.name: solo}))
    assert res.text.splitlines()[2] == "pipeline: solo_1e1pd"
    assert [_ec(s) for s in st] == [("1", "ec_producer", "llm-encoder", "/tmp/omni-pd-ec"),
                                    ("0", "ec_consumer", "llm", "/tmp/omni-pd-ec")]


def test_1e1p1d_encoder_devices_are_checked_against_decodes_new_devices() -> None:
    # decode is placed on 1 by the PD half; the input never named device 1
    from omni_pd.compile.passes.encoder_split import EncoderOptions

    st, res = encoder(LLM, EncoderOptions("1e1p1d", encoder_devices=(1,)), ExpandOptions(connector="NixlConnector"),
                      pipeline="llm")
    assert [s["devices"] for s in st] == ["1", "0", "1"]
    assert [(d.code, d.message) for d in res.diagnostics] == [
        ("OPD903", "the encoder shares device(s) 1 with the language model")]


# --- plan_pd_split: a custom catalogue, per-side TP device counts --------------------------------------

def test_a_catalogue_without_the_pd_variant_derives_it() -> None:
    # a custom single-LLM pipeline: load_catalogue() adds <name>_pd only for its own files
    from omni_pd.compile.pipelines import Catalogue, load_catalogue, pipeline_from_dict

    solo = pipeline_from_dict({"name": "solo", "runtime": "vllm",
                               "stages": [{"stage_id": 0, "role": "llm", "final_output": True}]})
    st, res = stages(LLM, ExpandOptions(connector="NixlConnector"), pipeline="solo",
                     catalogue=Catalogue({**load_catalogue().pipelines, solo.name: solo}))
    assert res.text.splitlines()[2] == "pipeline: solo_pd"
    assert [(s["stage_id"], s["devices"], s["kv_transfer_config"]["kv_role"], s["kv_transfer_config"]["engine_id"],
             s["env"]["VLLM_NIXL_SIDE_CHANNEL_PORT"]) for s in st] == [
        (0, "0", "kv_producer", "llm-prefill", "5600"), (1, "1", "kv_consumer", "llm-decode", "5601")]


def test_decode_devices_must_match_decodes_own_tp_when_the_sides_differ() -> None:
    opts = ExpandOptions(connector="NixlConnector", prefill_tp=1, decode_tp=2)
    # expand's option check (issue 24 item 2) names the flag the TP came from, before the split runs
    assert refusal(LLM, replace(opts, decode_devices=(1,)), pipeline="llm") == (
        "OPD805", "--decode-devices lists 1 device(s); decode needs 2 (TP 2 from --decode-tp x PP 1 x DP 1)", None,
        'give --decode-devices 2 device(s), e.g. "0,1", or a tensor parallel size that fits the list')
    # plan_pd_split called directly keeps its own check of decode's own TP
    with pytest.raises(OmniPdError) as e:
        _plan(LLM, "llm", replace(opts, decode_devices=(1,)))
    assert (e.value.diagnostic.code, e.value.diagnostic.message) == (
        "OPD805", "--decode-devices lists 1 device(s); decode at TP 2 needs 2")
    st, _ = stages(LLM, replace(opts, decode_devices=(3, 4)), pipeline="llm")
    assert [(s["tensor_parallel_size"], s["devices"]) for s in st] == [(1, "0"), (2, "3,4")]


def test_merge_one_unread_path_keeps_the_keys_after_it_and_empty_user_mappings() -> None:
    # a dropped top-level key and an emptied mapping are skipped, not the end of the copy;
    # a mapping no unread path names is kept even when empty; a non-mapping value under a
    # key some unread path names is copied as is
    user = {"kv_ip": "x", "kv_connector_extra_config": {"mooncake_bootstrap_port": 1}, "other": {},
            "kv_buffer_device": "cpu"}
    got = pd_split._merge_user_kv(_CFG, user, target("0.30"),
                                  ("kv_ip", "kv_connector_extra_config.mooncake_bootstrap_port"))
    assert got.kv_transfer_config == {"kv_connector": "MooncakeConnector", "kv_role": "kv_producer", "engine_id": "e",
                                      "kv_connector_extra_config": {"bootstrap_port": 25201}, "other": {},
                                      "kv_buffer_device": "cpu"}
    odd = pd_split._merge_user_kv(_CFG, {"custom": "text", "kv_buffer_device": "cpu"}, target("0.30"),
                                  ("custom.mooncake_bootstrap_port",))
    assert odd.kv_transfer_config["custom"] == "text" and odd.kv_transfer_config["kv_buffer_device"] == "cpu"


def test_stage_ranges_are_the_other_stages_connector_ranges() -> None:
    from omni_pd.compile.parse import parse_config
    from omni_pd.compile.pipelines import load_catalogue
    from omni_pd.compile.topology import resolve

    text = ("pipeline: qwen3_omni_moe\nstages:\n"
            "  - {stage_id: 0, devices: \"0\", kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_both},"
            " env: {VLLM_NIXL_SIDE_CHANNEL_PORT: \"5700\"}}\n"
            "  - {stage_id: 1, devices: \"1\", kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_consumer},"
            " env: {VLLM_NIXL_SIDE_CHANNEL_PORT: \"5600\"}}\n"
            "  - {stage_id: 2, devices: \"1\"}\n")
    doc = parse_text(text, "in.yaml")
    topo = resolve(parse_config(doc), load_catalogue().get("qwen3_omni_moe"), None, doc)
    # the split stage (0) is left out; stage 1's NIXL port is kept; stage 2 has no connector
    assert pd_split._stage_ranges(topo, 0, target("0.30"), "vllm-omni") == [(5600, 1)]
    assert pd_split._stage_ranges(topo, 1, target("0.30"), "vllm-omni") == [(5700, 1)]


def test_replicas_sharing_a_port_are_refused_at_the_thinkers_num_replicas() -> None:
    text = "stages:\n  - stage_id: 0\n    devices: \"0,1\"\n    num_replicas: 2\n"
    assert refusal(text, vllm_version="0.28", pipeline="qwen3_omni_moe_thinker_only") == (
        "OPD805", "cannot place 2 replicas of the prefill stage on one host: vllm-omni 0.28 gives every replica the "
                  "same Mooncake bootstrap port (25201)", (4, 19),
        "set num_replicas: 1 on the Thinker (one engine per side), or serve the replicas from different hosts")


def _ranges(stage: str, runtime: str = "vllm", version: str = "0.30") -> list:
    from omni_pd.compile.parse import parse_config
    from omni_pd.compile.pipelines import load_catalogue
    from omni_pd.compile.topology import resolve

    doc = parse_text("stages:\n  - {stage_id: 0, " + stage + "}\n", "in.yaml")
    topo = resolve(parse_config(doc), load_catalogue().get("llm"), None, doc)
    return pd_split._stage_ranges(topo, -1, target(version), runtime)  # -1: no stage is the split one


@pytest.mark.parametrize("stage, runtime, version, want", [
    # no kv_role: a Mooncake stage counts as a producer (it binds its bootstrap port); a consumer binds none
    ('kv_transfer_config: {kv_connector: MooncakeConnector}, env: {VLLM_MOONCAKE_BOOTSTRAP_PORT: "25300"}',
     "vllm", "0.30", [(25300, 1)]),
    ('kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_consumer}, '
     'env: {VLLM_MOONCAKE_BOOTSTRAP_PORT: "25300"}', "vllm", "0.30", []),
    # vllm-omni 0.30 reads the extra-config key (the stage's kv), not the env
    ("kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_producer, "
     "kv_connector_extra_config: {bootstrap_port: 26000}}", "vllm-omni", "0.30", [(26000, 1)]),
    # the stage's env port, TP x DP wide on vLLM 0.11, one range per replica
    ('kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer}, env: {VLLM_NIXL_SIDE_CHANNEL_PORT: '
     '"5650"}', "vllm", "0.30", [(5650, 1)]),
    ('kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer}, tensor_parallel_size: 2, '
     'env: {VLLM_NIXL_SIDE_CHANNEL_PORT: "5650"}', "vllm", "0.11", [(5650, 2)]),
    ('kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer}, data_parallel_size: 2, '
     'env: {VLLM_NIXL_SIDE_CHANNEL_PORT: "5650"}', "vllm", "0.11", [(5650, 2)]),
    ('kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer}, num_replicas: 2, '
     'env: {VLLM_NIXL_SIDE_CHANNEL_PORT: "5650"}', "vllm", "0.30", [(5650, 1), (5651, 1)]),
    # only TCP ports count
    ('kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer}, env: {VLLM_NIXL_SIDE_CHANNEL_PORT: '
     '"65535"}', "vllm", "0.30", [(65535, 1)]),
    ('kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer}, env: {VLLM_NIXL_SIDE_CHANNEL_PORT: '
     '"65536"}', "vllm", "0.30", []),
    ('kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer}, env: {VLLM_NIXL_SIDE_CHANNEL_PORT: '
     '"1"}', "vllm", "0.30", [(1, 1)]),
    ('kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer}, env: {VLLM_NIXL_SIDE_CHANNEL_PORT: '
     '"0"}', "vllm", "0.30", []),
])
def test_stage_ranges_per_role_runtime_width_replica_and_bounds(stage, runtime, version, want) -> None:
    assert _ranges(stage, runtime, version) == want


@pytest.mark.parametrize("platforms, want", [
    ("  cpu:\n    stages:\n      - {stage_id: 0, max_model_len: 512}\n", {}),  # places nothing: inherits the base
    ("  cpu: {}\n", {}),                                                       # no stages at all
    ("  cpu:\n    stages:\n      - {stage_id: 0, devices: \"3\"}\n", {"cpu": {1: (4,)}}),  # decode after prefill's 3
])
def test_only_overlays_that_place_stages_get_overlay_devices(platforms, want) -> None:
    from omni_pd.compile.parse import parse_config
    from omni_pd.compile.pipelines import load_catalogue
    from omni_pd.compile.topology import resolve

    doc = parse_text("stages:\n  - {stage_id: 0, devices: \"0\"}\nplatforms:\n" + platforms, "in.yaml")
    cat = load_catalogue()
    topo = resolve(parse_config(doc), cat.get("llm"), None, doc)
    plan = pd_split.plan_pd_split(topo, cat, target(None), ExpandOptions(connector="NixlConnector"), doc)
    assert plan.overlay_devices == want


def test_check_tp_pair_refusals_exactly() -> None:
    # no TP option given (the sides' TPs came from the file): no option prefix; OPD603 keeps
    # the connector's location
    with pytest.raises(OmniPdError) as e:
        pd_split.check_tp_pair("MooncakeConnector", 2, 1, target("0.30"), "vllm-omni", (None, None), None)
    d = e.value.diagnostic
    assert (d.code, d.message, d.location, d.help) == (
        "OPD306", "tensor_parallel_size differs: prefill 2, decode 1; vllm-omni's PD validator requires them equal "
                  "(vllm_omni/entrypoints/pd_utils.py)", None,
        "serve per-side TP from a pipeline launched as plain vllm serve engines (llm, *_thinker_only), or give "
        "both sides the same TP")
    from omni_pd.diagnostics import Location

    loc = Location("in.yaml", 3, 7)
    with pytest.raises(OmniPdError) as e:
        pd_split.check_tp_pair("MooncakeConnector", 3, 2, target("0.30"), "vllm", (3, 2), loc)
    d = e.value.diagnostic
    assert (d.code, d.message, d.location) == (
        "OPD603", "--prefill-tp 3 --decode-tp 2: MooncakeConnector needs one TP size to divide the other (got 3 and 2)",
        loc)


@pytest.mark.parametrize("text, where", [
    (LLM + "    tensor_parallel_size: 5000\n", (5, 27)),                                 # the stage's key
    ("tensor_parallel_size: 1\ndata_parallel_size: 5000\n" + LLM, (2, 21)),            # a top-level DP
])
def test_an_engine_too_wide_from_the_file_is_located_at_its_parallel_size(text, where) -> None:
    assert refusal(text, pipeline="llm") == (
        "OPD805", "cannot place prefill and decode: TP x PP x DP = 5000 devices per engine, more than the 4096 "
                  "omni-pd places", where, "parallel sizes must be at least 1 and fit the host's devices")


def test_used_ports_stops_at_65535() -> None:
    out: list[tuple[int, int]] = []
    pd_split._used_ports({"a_port": 65536, "b_port": "65535"}, out)
    assert out == [(65535, 1)]


def test_prefill_keeps_the_thinkers_whole_device_list_unless_its_tp_is_given() -> None:
    two = LLM.replace('"0"', '"0,1"')
    st, _ = stages(two, ExpandOptions(connector="NixlConnector"), pipeline="llm")
    assert [s["devices"] for s in st] == ["0,1", "2,3"]
    st, _ = stages(two, ExpandOptions(connector="NixlConnector", decode_tp=2), pipeline="llm")
    assert [(s["devices"], s.get("tensor_parallel_size")) for s in st] == [("0,1", None), ("2,3", 2)]
    st, _ = stages(two, ExpandOptions(connector="NixlConnector", prefill_tp=1), pipeline="llm")
    assert [s["devices"] for s in st] == ["0", "1"]  # prefill at TP 1: one device, decode the next


def test_a_connector_the_release_lacks_is_located_where_the_file_names_it() -> None:
    assert refusal(LLM + "    kv_transfer_config: {kv_connector: MooncakeConnector}\n", vllm_version="0.11",
                   pipeline="llm") == ("OPD804", "MooncakeConnector is not registered in vLLM 0.11", (5, 40),
                                       "pick another --connector or --vllm-version")


def test_the_plan_records_the_tp_option() -> None:
    from omni_pd.compile.parse import parse_config
    from omni_pd.compile.pipelines import load_catalogue
    from omni_pd.compile.topology import resolve

    doc = parse_text(LLM, "in.yaml")
    cat = load_catalogue()
    topo = resolve(parse_config(doc), cat.get("llm"), None, doc)
    assert pd_split.plan_pd_split(topo, cat, target(None), ExpandOptions(connector="NixlConnector", tp=2), doc).tp == 2


_B = 'stages:\n  - {stage_id: 0, devices: "0"}\n'
_Q = ('pipeline: qwen3_omni_moe\nstages:\n  - {stage_id: 0, devices: "0"}\n  - {stage_id: 1, devices: "1"}\n'
      '  - {stage_id: 2, devices: "1"}\n')


@pytest.mark.parametrize("base, overlay, pipeline, opts, want", [
    # each side's TP (x DP) devices on the platform too
    (_B, '{stage_id: 0, devices: "3"}', "llm", dict(prefill_tp=2, decode_tp=2), {0: (3, 4), 1: (5, 6)}),
    (_B, '{stage_id: 0, devices: "3,4", data_parallel_size: 2}', "llm", dict(prefill_tp=2, decode_tp=2),
     {0: (3, 4, 5, 6), 1: (7, 8, 9, 10)}),
    (_B, '{stage_id: 0, devices: "3"}', "llm", dict(decode_tp=2), {1: (4, 5)}),
    # the overlay's own TP (flat, engine_args or engine_extras) wins: its devices as written
    (_B, '{stage_id: 0, devices: "3", engine_args: {tensor_parallel_size: 1}}', "llm", dict(prefill_tp=2, decode_tp=2),
     {1: (4,)}),
    (_B, '{stage_id: 0, devices: "3", engine_extras: {tensor_parallel_size: 1}}', "llm",
     dict(prefill_tp=2, decode_tp=2), {1: (4,)}),
    # a Thinker given more devices than TP x PP x DP on the platform (two replicas): prefill keeps
    # all of them, as in the base split, and decode gets as many after them
    (_B, '{stage_id: 0, devices: "3,4", num_replicas: 2}', "llm", {}, {1: (5, 6)}),
    # an overlay without a Thinker entry: nothing moves (with a TP option too: its own TP is then not looked up)
    (_Q, '{stage_id: 1, devices: "5"}', "qwen3_omni_moe", {}, {}),
    (_Q, '{stage_id: 1, devices: "5"}', "qwen3_omni_moe", dict(tp=1), {}),
])
def test_overlay_devices_per_side_tp_and_the_overlays_own_tp(base, overlay, pipeline, opts, want) -> None:
    from omni_pd.compile.parse import parse_config
    from omni_pd.compile.pipelines import load_catalogue
    from omni_pd.compile.topology import resolve

    doc = parse_text(base + "platforms:\n  cpu:\n    stages:\n      - " + overlay + "\n", "in.yaml")
    cat = load_catalogue()
    topo = resolve(parse_config(doc), cat.get(pipeline), None, doc)
    plan = pd_split.plan_pd_split(topo, cat, target(None), ExpandOptions(connector="NixlConnector", **opts), doc)
    assert plan.overlay_devices == {"cpu": want}


def test_no_thinker_without_a_document_is_refused_without_a_location() -> None:
    from omni_pd.compile.parse import parse_config
    from omni_pd.compile.pipelines import load_catalogue
    from omni_pd.compile.topology import resolve

    doc = parse_text("stages:\n  - {stage_id: 0, devices: \"0\"}\n  - {stage_id: 1, devices: \"1\"}\n", "in.yaml")
    cat = load_catalogue()
    topo = resolve(parse_config(doc), cat.get("llm_1e1pd"), None, doc)
    with pytest.raises(OmniPdError) as e:
        pd_split.plan_pd_split(topo, cat, target(None), ExpandOptions())
    assert (e.value.diagnostic.code, e.value.diagnostic.location) == ("OPD801", None)


_901_NOTES = ["without omni-pd's streaming patches vllm-omni refuses async_chunk with a kv_transfer_config "
              "(config/omni_config.py) and would prewarm decode with a placeholder prompt (engine/orchestrator.py)"]


def _901(res) -> list:
    return [(d.code, d.severity, d.message, (d.location.line, d.location.column) if d.location else None, d.notes)
            for d in res.diagnostics if d.code == "OPD901"]


def test_opd901_when_streaming_is_given_up_or_a_one_stage_vllm_omni_pipeline_needs_it_off() -> None:
    import re

    from omni_pd.compile.pipelines import Catalogue, load_catalogue, pipeline_from_dict
    from omni_pd.resources import preset_path

    q3 = preset_path("qwen3_omni_moe").read_text()
    piece = "async_chunk set to false (--no-stream): the answer's audio comes in one piece after the text"
    # the preset says async_chunk: true (line 6): on vllm-omni 0.30 the pair streams, nothing to say
    _, res = stages(q3, pipeline="qwen3_omni_moe")
    assert _901(res) == [] and res.plan.stream is True
    _, res = stages(q3, ExpandOptions(stream=False), pipeline="qwen3_omni_moe")  # --no-stream
    assert _901(res) == [("OPD901", Severity.INFO, piece, (6, 14), _901_NOTES)]
    _, res = stages(re.sub(r"(?m)^async_chunk:.*\n", "", q3), ExpandOptions(stream=False),
                    pipeline="qwen3_omni_moe")  # vllm-omni's default: on
    assert _901(res) == [("OPD901", Severity.INFO, piece, None, _901_NOTES)]
    _, res = stages(q3.replace("async_chunk: true", "async_chunk: false"), pipeline="qwen3_omni_moe")
    assert _901(res) == []
    # one stage: nothing streamed; said only when vllm-omni (whose orchestrator reads the key) serves it
    solo = pipeline_from_dict({"name": "solo", "runtime": "vllm-omni",
                               "stages": [{"stage_id": 0, "role": "thinker", "final_output": True}]})
    cat = Catalogue({**load_catalogue().pipelines, solo.name: solo})
    _, res = stages(LLM, ExpandOptions(connector="NixlConnector"), pipeline="solo", catalogue=cat)
    assert _901(res) == [("OPD901", Severity.INFO, "async_chunk set to false (prefill/decode routing needs it off)",
                          None, _901_NOTES)]
    _, res = stages("async_chunk: false\n" + LLM, ExpandOptions(connector="NixlConnector"), pipeline="solo",
                    catalogue=cat)
    assert _901(res) == []
    for pipeline in ("llm", "qwen3_omni_moe_thinker_only"):  # launched as plain vllm serve engines
        _, res = stages("async_chunk: true\n" + LLM, pipeline=pipeline)
        assert _901(res) == [], pipeline


def test_an_overlay_thinker_without_devices_gets_its_whole_engine_on_each_side() -> None:
    # the Thinker (TP 2) has devices neither in the base nor in the rocm overlay, which moves
    # the Talker to 5: on rocm prefill starts after every device in use there (2 and 5) and
    # each side gets TP x PP x DP = 2 devices, as in the base split (it gave one before)
    text = ('pipeline: qwen3_omni_moe\nstages:\n  - {stage_id: 0, tensor_parallel_size: 2}\n'
            '  - {stage_id: 1, devices: "1"}\n  - {stage_id: 2, devices: "2"}\n'
            'platforms:\n  rocm:\n    stages:\n      - {stage_id: 1, devices: "5"}\n')
    _, res = stages(text, ExpandOptions(connector="NixlConnector"))
    assert res.plan.base_devices == {0: (3, 4), 1: (5, 6), 2: (1,), 3: (2,)}
    assert res.plan.overlay_devices == {"rocm": {0: (6, 7), 1: (8, 9)}}


# --- refusals and values only the expand goldens pinned (mutation run at 0c9a320) ------------------

@pytest.mark.parametrize("opts, flag", [(ExpandOptions(tp=1, prefill_tp=2), "--prefill-tp"),
                                        (ExpandOptions(tp=1, decode_tp=2), "--decode-tp")])
def test_a_side_tp_contradicting_tp_names_its_own_option(opts, flag) -> None:
    assert refusal(LLM, opts, pipeline="llm") == (
        "OPD006", f"{flag} 2 contradicts --tp 1 (--tp sets both prefill and decode)", None,
        f"drop --tp and give --prefill-tp and --decode-tp, or give {flag} 1")


_803 = ("OPD803", "this deploy config is already prefill/decode split; refusing to split it twice")
_803_HELP = "run `omni-pd validate` on it instead, or expand the original three-stage config"


@pytest.mark.parametrize("a, b", [("kv_producer", "kv_consumer"), ("kv_consumer", "kv_producer"),
                                  ("kv_producer", "kv_both"), ("kv_both", "kv_both")])
def test_every_sender_receiver_pair_is_already_split(a, b) -> None:
    # vLLM's role sets: a sender is kv_producer or kv_both, a receiver kv_consumer or kv_both;
    # two different stages forming one pair means the file was split already
    text = _TWO.format(a=_KV.format(role=a), b=_KV.format(role=b))
    assert refusal(text, pipeline="qwen3_omni_moe_thinker_only") == (*_803, (1, 1), _803_HELP)


def test_a_pair_written_under_engine_extras_is_already_split() -> None:
    # vllm-omni forwards engine_extras to the engine: the roles count there too
    kv = "    engine_extras:\n      kv_transfer_config: {{kv_connector: MooncakeConnector, kv_role: {role}}}\n"
    text = _TWO.format(a=kv.format(role="kv_producer"), b=kv.format(role="kv_consumer"))
    assert refusal(text, pipeline="qwen3_omni_moe_thinker_only") == (*_803, (1, 1), _803_HELP)


def test_already_split_by_the_pipeline_option_or_by_the_files_pipeline_name() -> None:
    # --pipeline names a PD pipeline (the file names none): located at the document
    assert refusal(LLM, pipeline="llm_pd") == (*_803, (1, 1), _803_HELP)
    # the file says llm_pd (no --pipeline, or --pipeline llm_pd): the file's own name refuses, at its value
    assert refusal("pipeline: llm_pd\n" + LLM) == (*_803, (1, 11), _803_HELP)
    assert refusal("pipeline: llm_pd\n" + LLM, pipeline="llm_pd") == (*_803, (1, 11), _803_HELP)
    # --pipeline llm against the file's llm_pd is a usage error before any split (issue 24 item 1)
    assert refusal("pipeline: llm_pd\n" + LLM, pipeline="llm") == (
        "OPD006", "--pipeline llm: the file names pipeline `llm_pd`", (1, 11),
        "--pipeline only names the pipeline of a file without a `pipeline:` key; drop --pipeline to use `llm_pd`, "
        "or change the file's `pipeline:` to `llm`")


def _plan(text: str, pipeline: str, opts: ExpandOptions = ExpandOptions(connector="NixlConnector"),
          with_doc: bool = True, version: str | None = None):
    from omni_pd.compile.parse import parse_config
    from omni_pd.compile.pipelines import load_catalogue
    from omni_pd.compile.topology import resolve

    doc = parse_text(text, "in.yaml")
    cat = load_catalogue()
    topo = resolve(parse_config(doc), cat.get(pipeline), None, doc)
    return pd_split.plan_pd_split(topo, cat, target(version), opts, doc if with_doc else None)


def test_without_a_document_refusals_and_notes_have_no_location() -> None:
    with pytest.raises(OmniPdError) as e:
        _plan(LLM, "llm_pd", with_doc=False)
    assert (e.value.diagnostic.code, e.value.diagnostic.location) == ("OPD803", None)
    plan = _plan(LLM.replace("    devices: \"0\"\n", ""), "llm", with_doc=False)
    assert [(d.code, d.message, d.location) for d in plan.diagnostics] == [
        ("OPD902", 'the Thinker had no `devices`; prefill gets "0" and decode "1"', None)]


def test_an_engine_of_zero_devices_is_refused_without_the_upper_bound() -> None:
    # tensor_parallel_size 0 under engine_args (the model bounds only the flat key by 1)
    assert refusal(LLM + "    engine_args: {tensor_parallel_size: 0}\n", pipeline="llm") == (
        "OPD805", "cannot place prefill and decode: TP x PP x DP = 0 devices per engine", (5, 41),
        "parallel sizes must be at least 1 and fit the host's devices")


def test_xpyd_device_options_are_counted_per_instance_times_engine() -> None:
    # 2 decode instances of 1 device: 3 listed is refused naming the decode option
    assert refusal(LLM, ExpandOptions(connector="NixlConnector", decode_replicas=2, decode_devices=(1, 2, 3)),
                   pipeline="llm") == (
        "OPD805", "--decode-devices lists 3 device(s); 2 are needed (2 instance(s) x 1 device(s) each)", None,
        "give --decode-devices every instance's devices, instance r on the r-th 1 of them")
    # 2 prefill instances at TP 2 need 2 x 2 = 4 devices: the four given are taken as they are
    st, _ = stages(LLM, ExpandOptions(connector="NixlConnector", tp=2, prefill_replicas=2,
                                      prefill_devices=(0, 1, 2, 3)), pipeline="llm")
    assert [(s["devices"], s.get("num_replicas")) for s in st] == [("0,1,2,3", 2), ("4,5", None)]


def test_prefill_and_downstream_device_options_place_those_stages() -> None:
    st, _ = stages(LLM, ExpandOptions(connector="NixlConnector", prefill_devices=(5,)), pipeline="llm")
    assert [s["devices"] for s in st] == ["5", "6"]  # decode: the next device above prefill's
    st, _ = stages(_Q, ExpandOptions(connector="NixlConnector", downstream_devices=(7,)))
    assert [s["devices"] for s in st] == ["0", "1", "7", "7"]
    st, _ = stages(_Q, ExpandOptions(connector="NixlConnector"))
    assert [s["devices"] for s in st] == ["0", "1", "2", "2"]  # without it the Talker moves past decode


def test_the_thinkers_own_connector_range_is_free_for_the_new_pair() -> None:
    # vLLM 0.11: a NIXL engine binds TP x DP = 2 side-channel ports. The Thinker's own env port
    # 5601 is reserved (it is in the input), its range [5601, 5603) is not: the Thinker is
    # what gets split. From 5600: [5600, 5602) hits 5601, so prefill 5602, decode 5604
    text = LLM.replace('"0"', '"0,1"') + '    tensor_parallel_size: 2\n    env: {VLLM_NIXL_SIDE_CHANNEL_PORT: "5601"}\n' \
        "    kv_transfer_config: {kv_connector: NixlConnector}\n"
    st, _ = stages(text, ExpandOptions(port_base=5600), pipeline="llm", vllm_version="0.11")
    assert [s["env"]["VLLM_NIXL_SIDE_CHANNEL_PORT"] for s in st] == ["5602", "5604"]


def test_mooncake_engine_ids_and_a_bootstrap_port_for_prefill_only() -> None:
    # vllm-omni 0.30: prefill's bootstrap_port (extra config) and env from --port-base; a
    # kv_consumer runs no bootstrap server, so decode gets neither
    st, res = stages(LLM, ExpandOptions(port_base=30000), pipeline="qwen3_omni_moe_thinker_only")
    assert [(s["kv_transfer_config"]["engine_id"], s["kv_transfer_config"].get("kv_connector_extra_config"),
             s.get("env")) for s in st] == [
        ("omni-thinker-prefill", {"bootstrap_port": 30000}, {"VLLM_MOONCAKE_BOOTSTRAP_PORT": "30000"}),
        ("omni-thinker-decode", None, None)]
    assert (res.plan.prefill_engine_id, res.plan.decode_engine_id) == ("omni-thinker-prefill", "omni-thinker-decode")
    # plain vLLM (the llm pipeline) reads only the env
    st, _ = stages(LLM, ExpandOptions(port_base=30000), pipeline="llm")
    assert [(s["kv_transfer_config"]["engine_id"], s["kv_transfer_config"].get("kv_connector_extra_config"),
             s.get("env")) for s in st] == [
        ("llm-prefill", None, {"VLLM_MOONCAKE_BOOTSTRAP_PORT": "30000"}), ("llm-decode", None, None)]


def test_both_sides_keep_the_thinkers_kv_keys_after_the_contracts_in_order() -> None:
    # the contract's fields first, in its order (the Thinker's kv_buffer_device is one of
    # them), then the Thinker's other keys; the unread mooncake_bootstrap_port is dropped
    kv = ("    kv_transfer_config: {kv_connector: MooncakeConnector, kv_connector_extra_config: "
          "{mooncake_bootstrap_port: 1, x: 1}, kv_load_failure_policy: recompute, kv_buffer_device: cpu}\n")
    st, _ = stages(LLM + kv, pipeline="qwen3_omni_moe_thinker_only")
    assert [list(s["kv_transfer_config"].items()) for s in st] == [
        [("kv_connector", "MooncakeConnector"), ("kv_role", "kv_producer"), ("engine_id", "omni-thinker-prefill"),
         ("kv_ip", "127.0.0.1"), ("kv_buffer_device", "cpu"),
         ("kv_connector_extra_config", {"x": 1, "bootstrap_port": 25201}), ("kv_load_failure_policy", "recompute")],
        [("kv_connector", "MooncakeConnector"), ("kv_role", "kv_consumer"), ("engine_id", "omni-thinker-decode"),
         ("kv_ip", "127.0.0.1"), ("kv_buffer_device", "cpu"), ("kv_connector_extra_config", {"x": 1}),
         ("kv_load_failure_policy", "recompute")]]


def test_a_platform_that_widens_the_thinker_widens_both_connector_ranges() -> None:
    # vLLM 0.11 NIXL binds TP x DP ports per engine: rocm runs the Thinker at TP 2, so each
    # side reserves 2 from 5557 (0.11's default) although the base runs TP 1
    text = LLM + "platforms:\n  rocm:\n    stages:\n      - {stage_id: 0, tensor_parallel_size: 2}\n"
    st, _ = stages(text, ExpandOptions(connector="NixlConnector"), pipeline="llm", vllm_version="0.11")
    assert [s["env"]["VLLM_NIXL_SIDE_CHANNEL_PORT"] for s in st] == ["5557", "5559"]
    # omni-pd's launcher starts one engine per replica from consecutive ranges: 2 replicas on
    # rocm -> 2 ports per side
    text = LLM + "platforms:\n  rocm:\n    stages:\n      - {stage_id: 0, num_replicas: 2}\n"
    st, _ = stages(text, ExpandOptions(connector="NixlConnector"), pipeline="llm")
    assert [s["env"]["VLLM_NIXL_SIDE_CHANNEL_PORT"] for s in st] == ["5600", "5602"]


def test_replicas_sharing_a_port_are_refused_before_the_port_range_is_sized() -> None:
    # vllm-omni hands every replica the stage's NIXL port: 2 prefill replicas are refused for
    # sharing 65534, not for a 2-port range that would not fit below 65535
    assert refusal(LLM, ExpandOptions(connector="NixlConnector", prefill_replicas=2, port_base=65534),
                   pipeline="qwen3_omni_moe_thinker_only")[:3] == (
        "OPD805", "cannot place 2 replicas of the prefill stage on one host: vllm-omni 0.30 gives every replica the "
                  "same NIXL side channel port (65534)", None)


def test_replicas_given_on_the_command_line_are_refused_naming_the_option() -> None:
    assert refusal(LLM, ExpandOptions(connector="NixlConnector", decode_replicas=2),
                   pipeline="qwen3_omni_moe_thinker_only") == (
        "OPD805", "cannot place 2 replicas of the decode stage on one host: vllm-omni 0.30 gives every replica the "
                  "same NIXL side channel port (5601)", None,
        "give --decode-replicas 1 (one engine per side), or serve the replicas from different hosts")


def test_decode_replicas_of_a_mooncake_consumer_need_no_port() -> None:
    # vllm-omni 0.28 gives every replica the same env port, but a kv_consumer binds none:
    # 2 decode instances pass and prefill (1 instance) is not checked as if it had 2
    st, _ = stages(LLM, ExpandOptions(decode_replicas=2), pipeline="qwen3_omni_moe_thinker_only",
                   vllm_version="0.28")
    assert [(s["devices"], s.get("num_replicas")) for s in st] == [("0", None), ("1,2", 2)]


def test_opd901_for_a_one_stage_pipeline_that_asked_for_async_chunk_and_a_two_stage_one() -> None:
    from omni_pd.compile.pipelines import Catalogue, load_catalogue, pipeline_from_dict

    solo = pipeline_from_dict({"name": "solo", "runtime": "vllm-omni",
                               "stages": [{"stage_id": 0, "role": "thinker", "final_output": True}]})
    duo = pipeline_from_dict({"name": "duo", "runtime": "vllm-omni",
                              "stages": [{"stage_id": 0, "role": "thinker"},
                                         {"stage_id": 1, "role": "talker", "final_output": True}]})
    cat = Catalogue({**load_catalogue().pipelines, "solo": solo, "duo": duo})
    # one stage streams nothing even with async_chunk: true
    _, res = stages("async_chunk: true\n" + LLM, ExpandOptions(connector="NixlConnector"), pipeline="solo",
                    catalogue=cat)
    assert _901(res) == [("OPD901", Severity.INFO, "async_chunk set to false (prefill/decode routing needs it off)",
                          (1, 14), _901_NOTES)]
    # two stages stream chunks from the Thinker to the next stage
    _, res = stages("async_chunk: true\n" + LLM + '  - {stage_id: 1, devices: "1"}\n',
                    ExpandOptions(connector="NixlConnector"), pipeline="duo", catalogue=cat)
    assert _901(res) == [("OPD901", Severity.INFO, "async_chunk set to false: streaming of audio chunks between "
                          "stages is given up", (1, 14), _901_NOTES)]


# --- the Thinker's Mooncake bootstrap_port is a prefill setting: decode does not carry it -----------
# vllm-omni 0.30 reads kv_connector_extra_config.bootstrap_port only for a MooncakeConnector
# kv_producer (vllm_omni/engine/stage_runtime.py StageRuntime._prepare_replica_vllm_config); a
# kv_consumer binds no bootstrap server (vLLM mooncake_connector.py), so a copied port on decode is
# read by nothing. Prefill keeps its own allocated port; other extra keys reach both halves.

_MC_THINKER = ("    devices: \"0\"\n    kv_transfer_config: {kv_connector: MooncakeConnector, "
               "kv_connector_extra_config: {bootstrap_port: 25201, num_workers: 4}}\n")


@pytest.mark.parametrize("version,prefill_extra", [
    # 0.30: the Thinker's 25201 is taken in the input, so prefill's allocation moves to 25202
    ("0.30", {"bootstrap_port": 25202, "num_workers": 4}),
    # 0.28: the port is the env var; the extra key is unread on every side and dropped from both
    ("0.28", {"num_workers": 4}),
])
def test_decode_does_not_carry_the_thinkers_bootstrap_port(version, prefill_extra, monkeypatch) -> None:
    from omni_pd.resources import preset_path

    # the Talker handoff at this release is OPD704's (expand refuses it; tests/test_talker_pd.py): here the Thinker's facts
    monkeypatch.setattr("omni_pd.compile.talker_pd.gap", lambda *a: None)

    text = preset_path("qwen3_omni_moe").read_text().replace("    devices: \"0\"\n", _MC_THINKER, 1)
    got, res = stages(text, vllm_version=version, pipeline="qwen3_omni_moe")
    p, d = got[0], got[1]
    assert p["kv_transfer_config"]["kv_role"] == "kv_producer"
    assert p["kv_transfer_config"]["kv_connector_extra_config"] == prefill_extra
    assert d["kv_transfer_config"]["kv_role"] == "kv_consumer"
    assert d["kv_transfer_config"]["kv_connector_extra_config"] == {"num_workers": 4}
    assert res.plan.decode.kv_transfer_config["kv_connector_extra_config"] == {"num_workers": 4}


def test_validate_opd505_agrees_with_expand_on_decodes_bootstrap_port() -> None:
    # validate warns (OPD505) about the key expand drops from decode, and expand's own output is clean
    from rule_found import found  # tests/rule_found.py
    from omni_pd.resources import preset_path

    pd = ("pipeline: qwen3_omni_moe_pd\nasync_chunk: false\nstages:\n"
          "  - {stage_id: 0, devices: \"0\", kv_transfer_config: {kv_connector: MooncakeConnector, "
          "kv_role: kv_producer, engine_id: p, kv_connector_extra_config: {bootstrap_port: 25201}}}\n"
          "  - {stage_id: 1, devices: \"1\", kv_transfer_config: {kv_connector: MooncakeConnector, "
          "kv_role: kv_consumer, engine_id: d, kv_connector_extra_config: {bootstrap_port: 25201}}}\n")
    assert [(sev, msg, help_) for sev, msg, _, help_, *_ in found(pd, "OPD505")] == [(
        "warning", "stage 1: kv_connector_extra_config.bootstrap_port is read by nothing on vllm-omni 0.30, and a "
             "kv_consumer binds no bootstrap port", "remove bootstrap_port")]
    text = preset_path("qwen3_omni_moe").read_text().replace("    devices: \"0\"\n", _MC_THINKER, 1)
    _, res = stages(text, pipeline="qwen3_omni_moe")
    assert found(res.text, "OPD505") == []
