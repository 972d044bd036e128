"""Every branch of the runtime-contract rules (OPD701-OPD704), with exact messages,
locations, help lines and notes (issue 16). The rule examples' golden
(tests/test_rule_branches.py) reaches one branch each; these pin the others: the mutation
run of omni_pd/check/rules/runtime.py (bench/mutation.py) is what named them.
"""

from __future__ import annotations

from omni_pd.check.validate import ValidateOptions, options_from_example
from rule_found import col as _col, found_with_notes as found  # tests/rule_found.py
from omni_pd.check.rules.runtime import _AUDIO_PD, _D, _LMC, _PD
from pd_fixture import PD  # tests/pd_fixture.py


def _sampled(sp: str) -> str:
    """The Mooncake PD pair of the rule examples, prefill's default_sampling_params ``sp``."""
    return (_PD + "  - {stage_id: 0, devices: \"0\", default_sampling_params: " + sp + ", kv_transfer_config: "
            "{kv_connector: MooncakeConnector, kv_role: kv_producer, engine_id: p}}\n" + _D)


# --- OPD701 prefill sampling ------------------------------------------------------------------------

_STOP_HELP = ("the prefill leg runs max_tokens=1, min_tokens<=1, stop=[], stop_token_ids=[], "
              "include_stop_str_in_output=false (decode keeps the originals)")


def test_opd701_stop_and_stop_token_ids_each_get_their_own_warning_at_their_value() -> None:
    text = _sampled("{stop: [\"</s>\"], stop_token_ids: [1]}")
    assert _col(text, "[\"</s>\"]") == (4, 65)
    assert found(text, "OPD701") == [
        ("warning", "prefill stage 0 sets stop: a stop on the one prefill token ends it with reason `stop` and the KV "
                    "send is cancelled", (4, 65), "remove `stop` from the prefill stage; " + _STOP_HELP, [], []),
        ("warning", "prefill stage 0 sets stop_token_ids: a stop on the one prefill token ends it with reason `stop` "
                    "and the KV send is cancelled", _col(text, "[1]"),
         "remove `stop_token_ids` from the prefill stage; " + _STOP_HELP, [], [])]


def test_opd701_include_stop_str_in_output() -> None:
    text = _sampled("{include_stop_str_in_output: true}")
    assert found(text, "OPD701") == [
        ("warning", "prefill stage 0 sets include_stop_str_in_output", _col(text, "true}"),
         "remove it from the prefill stage", [], [])]


def test_opd701_min_tokens_above_one() -> None:
    text = _sampled("{min_tokens: 2}")
    assert found(text, "OPD701") == [
        ("warning", "prefill stage 0 sets min_tokens 2; the prefill leg generates one token", _col(text, "2}"),
         "remove `min_tokens` from the prefill stage (or set it to 1)", [], [])]


def test_opd701_min_tokens_one_empty_stops_and_false_are_what_the_prefill_leg_runs() -> None:
    assert found(_sampled("{min_tokens: 1, stop: [], stop_token_ids: [], include_stop_str_in_output: false}"),
                 "OPD701") == []


def test_opd701_a_min_tokens_that_is_not_a_number_is_left_to_the_schema_and_does_not_crash() -> None:
    assert found(_sampled("{min_tokens: many}"), "OPD701") == []
    assert found(_sampled("{min_tokens: [3]}"), "OPD701") == []


# --- OPD702 routing params --------------------------------------------------------------------------

_NO_RELAY = {"inventory": {"hosts": {"host-a": {}}, "router": {"relays_kv_transfer_params": False}}}


def _relay_help(name: str) -> str:
    return (f"router for {name} must send do_remote_decode to P and forward P's kv_transfer_params "
            "(with do_remote_prefill: true) to D; use vllm-omni's orchestrator or a PD-aware proxy")


def test_opd702_nixl_names_nixls_routing_fields() -> None:
    assert found(PD, "OPD702", _NO_RELAY) == [(
        "error", "the router in the inventory does not relay kv_transfer_params; with NixlConnector decode would "
                 "recompute every prompt", (9, 21), _relay_help("NixlConnector"), [(16, 5, "decode expects them")],
        ["NixlConnector routing fields: remote_block_ids, remote_engine_id, remote_host, remote_port, "
         "remote_request_id, tp_size"])]


def test_opd702_a_connector_omni_pd_does_not_know_gets_the_error_without_a_fields_note() -> None:
    assert found(PD.replace("NixlConnector", "FooConnector"), "OPD702", _NO_RELAY) == [(
        "error", "the router in the inventory does not relay kv_transfer_params; with FooConnector decode would "
                 "recompute every prompt", (9, 21), _relay_help("FooConnector"), [(16, 5, "decode expects them")], [])]


def test_opd702_a_router_that_relays_or_does_not_say_is_not_an_error() -> None:
    for router in ({"relays_kv_transfer_params": True}, {}):
        assert found(PD, "OPD702", {"inventory": {"hosts": {"host-a": {}}, "router": router}}) == []


def test_opd702_waits_for_both_kv_configs() -> None:
    mc = PD.replace("NixlConnector", "MooncakeConnector").replace("      engine_id: p\n", "")
    p_kv = "    kv_transfer_config:\n      kv_connector: MooncakeConnector\n      kv_role: kv_producer\n"
    d_kv = "    kv_transfer_config:\n      kv_connector: MooncakeConnector\n      kv_role: kv_consumer\n      engine_id: d\n"
    assert p_kv in mc and d_kv in mc
    # neither the relay error nor the engine_id warning: OPD301 reports the missing side
    assert found(mc.replace(d_kv, ""), "OPD702", _NO_RELAY) == []
    assert found(mc.replace(p_kv, ""), "OPD702", _NO_RELAY) == []


def test_opd702_mooncake_without_engine_id_warns_next_to_the_relay_error() -> None:
    text = PD.replace("NixlConnector", "MooncakeConnector").replace("      engine_id: p\n", "")
    assert found(text, "OPD702", _NO_RELAY) == [
        ("warning", "prefill stage 0 has no engine_id: vllm-omni cannot send remote_engine_id to decode", (8, 5),
         "add `engine_id: omni-thinker-prefill` to the prefill kv_transfer_config", [], []),
        ("error", "the router in the inventory does not relay kv_transfer_params; with MooncakeConnector decode would "
                  "recompute every prompt", (9, 21), _relay_help("MooncakeConnector"), [(15, 5, "decode expects them")],
         ["MooncakeConnector routing fields: transfer_id, remote_bootstrap_addr, remote_engine_id"])]


def test_opd702_only_mooncake_needs_prefills_engine_id() -> None:
    assert found(PD.replace("      engine_id: p\n", ""), "OPD702") == []
    # decode's engine_id is not the one vllm-omni sends
    assert found(PD.replace("NixlConnector", "MooncakeConnector").replace("      engine_id: d\n", ""), "OPD702") == []


def test_opd702_lmcache_pd_mode_is_an_error_only_with_a_router_that_does_not_relay() -> None:
    text = _LMC.format(e="")
    for ctx in ({}, {"inventory": {"hosts": {"host-a": {}}}},
                {"inventory": {"hosts": {"host-a": {}}, "router": {"relays_kv_transfer_params": True}}},
                {"inventory": {"hosts": {"host-a": {}}, "router": {}}}):
        assert found(text, "OPD702", ctx) == [], ctx
    assert [h[1] for h in found(text, "OPD702", _NO_RELAY)] == [
        "the router in the inventory does not carry kv_transfer_params; with LMCacheConnectorV1 decode would recompute "
        "every prompt"]


# --- OPD703 verify the transfer ---------------------------------------------------------------------

_VERIFY_HELP = ("`omni-pd launch --smoke` checks it; by hand: send one request and check that decode's "
                "vllm:prompt_tokens_by_source_total{source=\"external_kv_transfer\"} grew")


def test_opd703_every_reason_that_applies_is_named_in_order() -> None:
    ctx = {"model": {"attention": "hybrid"},
           "inventory": {"hosts": {"host-a": {}, "host-b": {}}, "placement": {"all": "host-a", "1": "host-b"},
                         "router": {"relays_kv_transfer_params": True}}}
    assert found(PD, "OPD703", ctx) == [(
        "info", "PD pair stage 0 -> 1: prefill runs on host-a and decode on host-b; a hybrid-attention model decides "
                "its physical block size at start; the inventory's router is not omni-pd's and must relay "
                "kv_transfer_params: only a real transfer shows the KV arrives; do not report ready before one "
                "prefill -> decode transfer succeeded", (16, 5), _VERIFY_HELP, [], [])]


def test_opd703_omni_pds_own_router_is_not_called_someone_elses() -> None:
    # `router: {kind: omni-pd}` is omni-pd's router: the "not omni-pd's" reason does not apply
    ctx = {"inventory": {"hosts": {"host-a": {}, "host-b": {}}, "placement": {"all": "host-a", "1": "host-b"},
                         "router": {"kind": "omni-pd"}}}
    [(_, msg, *_)] = found(PD, "OPD703", ctx)
    assert msg.startswith("PD pair stage 0 -> 1: prefill runs on host-a and decode on host-b: only a real transfer")
    ctx["inventory"]["placement"] = {"all": "host-a"}
    assert found(PD, "OPD703", ctx) == []


def test_opd703_two_hosts_with_both_sides_on_one_of_them_and_a_plain_model_say_nothing() -> None:
    ctx = {"model": {"attention": "GQA"},
           "inventory": {"hosts": {"host-a": {}, "host-b": {}}, "placement": {"all": "host-a"}}}
    assert found(PD, "OPD703", ctx) == []


def test_opd703_needs_a_pd_pair() -> None:
    assert found("pipeline: qwen3_omni_moe\nstages:\n  - stage_id: 0\n", "OPD703",
                 {"model": {"attention": "hybrid"}}) == []


def test_opd703_is_said_once_per_file_under_all_platforms() -> None:
    text = PD + "platforms:\n  rocm:\n    stages:\n      - {stage_id: 0, devices: \"0\"}\n"
    opts = options_from_example({"model": {"attention": "hybrid"}})
    opts.all_platforms = True
    assert [h[1] for h in found(text, "OPD703", opts=opts)] == [
        "PD pair stage 0 -> 1: a hybrid-attention model decides its physical block size at start: only a real "
        "transfer shows the KV arrives; do not report ready before one prefill -> decode transfer succeeded"]


# --- OPD704 Talker conditioning under PD ------------------------------------------------------------

_TALKER_MSG = ("the Talker (stage 2) is conditioned by the PD decode stage 1, which computes no prompt rows, and "
               "omni-pd's compatibility layer is switched off in the launcher environment (OMNI_PD_VLLM_OMNI_COMPAT=0): "
               "audio answers fail or are conditioned on the wrong rows")
#: OPD704 fires only where omni-pd's vllm-omni compatibility layer cannot act: here it is off
_OFF = {"OMNI_PD_VLLM_OMNI_COMPAT": "0"}


def test_opd704_pipeline_from_the_option_points_at_decodes_kv_transfer_config() -> None:
    text = _AUDIO_PD.replace("pipeline: qwen3_omni_moe_pd\n", "")
    got = found(text, "OPD704", opts=ValidateOptions(pipeline="qwen3_omni_moe_pd", env=_OFF))
    decode_kv = _col(text, "kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_consumer")
    assert decode_kv == (4, 33)
    assert [(h[1], h[2], h[4]) for h in got] == [(_TALKER_MSG, decode_kv, [(5, 5, "Talker")])]


def test_opd704_a_talker_the_deploy_file_does_not_list_has_no_related_entry() -> None:
    text = _AUDIO_PD.split("  - {stage_id: 2")[0]  # the pipeline still has the Talker
    assert [(h[1], h[2], h[4]) for h in found(text, "OPD704", opts=ValidateOptions(env=_OFF))] == [
        (_TALKER_MSG, (1, 11), [])]
    assert found(text, "OPD704") == []  # the layer covers vllm-omni 0.30 and is on


def test_opd704_is_said_once_per_file_under_all_platforms() -> None:
    text = _AUDIO_PD + "platforms:\n  rocm:\n    stages:\n      - {stage_id: 0, devices: \"0\"}\n"
    assert [h[1] for h in found(text, "OPD704", opts=ValidateOptions(all_platforms=True, env=_OFF))] == [_TALKER_MSG]


def test_opd704_needs_a_pd_pair() -> None:
    three = ("pipeline: qwen3_omni_moe\nstages:\n  - {stage_id: 0, devices: \"0\"}\n  - {stage_id: 1, devices: \"1\"}\n"
             "  - {stage_id: 2, devices: \"2\"}\n")
    assert found(three, "OPD704", opts=ValidateOptions(env=_OFF)) == []


def test_opd702_a_prefill_without_kv_connector_is_not_named_by_an_empty_string() -> None:
    # OPD304 reports the missing kv_connector; OPD702 still reports the router, without a
    # blank where the connector's name would be ("with  decode", "router for  must")
    text = PD.replace("      kv_connector: NixlConnector\n      kv_role: kv_producer", "      kv_role: kv_producer")
    assert found(text, "OPD702", _NO_RELAY) == [(
        "error", "the router in the inventory does not relay kv_transfer_params; decode would recompute every prompt",
        (8, 5), "the router must send do_remote_decode to P and forward P's kv_transfer_params (with "
                "do_remote_prefill: true) to D; use vllm-omni's orchestrator or a PD-aware proxy",
        [(15, 5, "decode expects them")], [])]


def test_opd702_lmcache_with_only_a_config_file_is_not_known_to_need_a_relay() -> None:
    # LMCACHE_CONFIG_FILE: omni-pd cannot tell PD mode from a shared store, so no error
    text = _LMC.format(e=", env: {LMCACHE_CONFIG_FILE: /etc/lmcache.yaml}")
    assert found(text, "OPD702", _NO_RELAY) == []
