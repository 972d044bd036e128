"""Every branch of the encoder-disaggregation rules (OPD616-OPD620), with exact messages,
locations, help lines and related spans (issue 16). The rule examples' golden
(tests/test_rule_branches.py) reaches one branch of each; these pin the others, named by
the mutation run of omni_pd/check/rules/encoder.py (bench/mutation.py).
"""

from __future__ import annotations

from omni_pd.check.rules.encoder import _CONS, _EPD_CPU, _S, _epd
from omni_pd.check.validate import ValidateOptions, options_from_example, validate_text
from rule_found import col as _col, found  # tests/rule_found.py


def _all() -> ValidateOptions:
    return ValidateOptions(all_platforms=True)


_ROCM = "platforms:\n  rocm:\n    stages:\n      - {stage_id: 0, devices: \"2\"}\n"
_BOTH = _CONS.format(s="").replace("ec_consumer", "ec_both")
_NOT_CONSUMER = ("stage 1 (prefill) is not an ec_consumer: it runs the prompt and would encode every image/audio "
                 "again; the encoder stage's outputs are never used")
_DECODE_CONSUMES = ("stage 2 (decode) is an ec_consumer: decode receives the prompt's KV cache from prefill and never "
                    "runs the encoder")
_NOT_CONSUMER_HELP = "give the prefill stage the producer's ec_transfer_config with `ec_role: ec_consumer`"
_DECODE_HELP = "move ec_transfer_config (ec_consumer) to the prefill stage; remove it from decode"


# --- OPD616 the EC consumer is prefill --------------------------------------------------------------

def test_opd616_prefill_with_an_ec_config_but_no_role_points_at_that_config() -> None:
    text = _epd(p=", ec_transfer_config: {ec_connector: ECExampleConnector}")
    assert found(text, "OPD616") == [("error", _NOT_CONSUMER, _col(text, "ec_transfer_config", 1), _NOT_CONSUMER_HELP,
                                      [(3, 97, "the encoder (producer)")])]
    assert _col(text, "ec_producer") == (3, 97)


def test_opd616_a_producing_prefill_is_not_a_consumer_and_every_producer_is_related() -> None:
    text = _epd(p=", ec_transfer_config: {ec_connector: ECExampleConnector, ec_role: ec_producer}")
    assert found(text, "OPD616") == [("error", _NOT_CONSUMER, (4, 120), _NOT_CONSUMER_HELP,
                                      [(3, 97, "the encoder (producer)"), (4, 184, "the encoder (producer)")])]
    assert _col(text, "ec_producer", 1) == (4, 184)


def test_opd616_prefill_without_an_ec_config_points_at_the_stage_and_decodes_ec_both_is_an_error() -> None:
    text = _epd(p="", d=_BOTH)
    assert found(text, "OPD616") == [
        ("error", _NOT_CONSUMER, (4, 5), _NOT_CONSUMER_HELP, [(3, 97, "the encoder (producer)")]),
        ("error", _DECODE_CONSUMES, _col(text, "ec_both"), _DECODE_HELP, [])]


def test_opd616_ec_both_on_prefill_consumes_and_makes_decodes_a_warning() -> None:
    assert found(_epd(p=_BOTH, d=_BOTH), "OPD616") == [("warning", _DECODE_CONSUMES, (5, 184), _DECODE_HELP, [])]
    assert found(_epd(p=_BOTH), "OPD616") == []


def test_opd616_needs_an_encoder_producer_and_a_pd_pair() -> None:
    no_producer = _epd(p="", d=_CONS.format(s="")).replace("ec_role: ec_producer", "ec_role: ec_consumer")
    assert found(no_producer, "OPD616") == []
    e_pd = ("pipeline: llm_1e1pd\nstages:\n"
            "  - {stage_id: 0, ec_transfer_config: {ec_connector: ECExampleConnector, ec_role: ec_producer}}\n"
            "  - {stage_id: 1}\n")
    assert found(e_pd, "OPD616") == []


def test_opd616_a_non_mapping_ec_config_is_no_role() -> None:
    text = _epd(p=", ec_transfer_config: ECExampleConnector")
    assert [(h[1], h[2]) for h in found(text, "OPD616")] == [(_NOT_CONSUMER, (4, 5))]


def test_opd616_a_string_ec_config_under_engine_args_is_no_role_not_a_crash() -> None:
    # engine_args is an untyped mapping: a non-mapping ec_transfer_config there reaches the rules
    text = _epd(p=", engine_args: {ec_transfer_config: ECExampleConnector}")
    # located at the prefill stage's entry (Context.sloc with no keys), not at its engine_args: block
    assert [(h[1], h[2]) for h in found(text, "OPD616")] == [(_NOT_CONSUMER, _col(text, "{stage_id: 1"))]


def test_opd616_is_said_once_per_file_under_all_platforms() -> None:
    assert [h[1] for h in found(_epd(p="") + _ROCM, "OPD616", opts=_all())] == [_NOT_CONSUMER]


# --- OPD617 shared storage --------------------------------------------------------------------------

def test_opd617_only_the_consumer_sets_a_path_the_producer_is_pointed_at_its_ec_config() -> None:
    text = _epd(p=_CONS.format(s=_S.format("/mnt/x")))
    assert found(text, "OPD617") == [(
        "error", "stage 1 reads encoder outputs from /mnt/x but stage 0 writes them to /tmp: every item would be "
                 "encoded again", _col(text, "shared_storage_path"), "set `shared_storage_path: /tmp` on both sides",
        [(3, 33, "the producer's directory")])]
    assert _col(text, "shared_storage_path") == (4, 225) and _col(text, "ec_transfer_config") == (3, 33)


def test_opd617_every_consumer_with_another_path_is_named() -> None:
    text = _epd(es=_S.format("/mnt/a"), p=_CONS.format(s=_S.format("/mnt/b")), d=_CONS.format(s=_S.format("/mnt/c")))
    rel = [(3, 138, "the producer's directory")]
    assert _col(text, "shared_storage_path") == (3, 138)
    assert found(text, "OPD617") == [
        ("error", "stage 1 reads encoder outputs from /mnt/b but stage 0 writes them to /mnt/a: every item would be "
                  "encoded again", _col(text, "shared_storage_path", 1), "set `shared_storage_path: /mnt/a` on both sides", rel),
        ("error", "stage 2 reads encoder outputs from /mnt/c but stage 0 writes them to /mnt/a: every item would be "
                  "encoded again", _col(text, "shared_storage_path", 2), "set `shared_storage_path: /mnt/a` on both sides", rel)]


def test_opd617_a_consumer_of_another_connector_is_not_compared() -> None:
    text = _epd(es=_S.format("/mnt/a"), p=", ec_transfer_config: {ec_connector: ECCPUConnector, ec_role: ec_consumer}")
    assert found(text, "OPD617") == []


def test_opd617_a_producer_that_also_consumes_is_not_its_own_consumer() -> None:
    # prefill ec_both on /mnt/b: a producer (compared with stage 0, the other producer) and a consumer
    text = _epd(es=_S.format("/mnt/a"), p=_BOTH.replace("ec_both", "ec_both" + _S.format("/mnt/b").replace("{{", "{")
                                                         .replace("}}", "}")))
    got = found(text, "OPD617")
    assert [h[1] for h in got] == [
        "stage 1 reads encoder outputs from /mnt/b but stage 0 writes them to /mnt/a: every item would be encoded again"]


def test_opd617_unknown_connectors_and_connectors_without_storage_are_skipped() -> None:
    for conn in ("NoSuchECConnector", "ECCPUConnector"):
        text = _epd(p=_CONS.format(s=_S.format("/mnt/x"))).replace("ECExampleConnector", conn)
        assert found(text, "OPD617") == [], conn


def test_opd617_both_sides_on_one_host_of_an_inventory_say_nothing() -> None:
    ctx = {"inventory": {"hosts": {"a": {}, "b": {}}, "placement": {"all": "a"}}}
    assert found(_epd(), "OPD617", ctx) == []


def test_opd617_is_said_once_per_file_under_all_platforms() -> None:
    text = _epd(p=_CONS.format(s=_S.format("/mnt/x"))) + _ROCM
    assert len(found(text, "OPD617", opts=_all())) == 1


# --- OPD618 KV config on the encoder ----------------------------------------------------------------

def test_opd618_an_empty_kv_config_on_the_encoder_is_nothing_to_remove() -> None:
    assert found(_epd(e=", kv_transfer_config: {}"), "OPD618") == []


def test_opd618_is_said_once_per_file_under_all_platforms() -> None:
    text = _epd(e=", kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer, engine_id: e}") + _ROCM
    assert [h[1] for h in found(text, "OPD618", opts=_all())] == [
        "stage 0 is the encoder-only instance (ec_producer) but has a kv_transfer_config (NixlConnector): it runs no "
        "language model and holds no KV cache"]


# --- OPD619 multimodal model ------------------------------------------------------------------------

def test_opd619_a_model_without_a_type_is_named_by_its_source() -> None:
    assert found(_epd(), "OPD619", {"model": {"multimodal": False}}) == [(
        "error", "stage 0 is an encoder-only instance but the model (from --model-info) has no vision or audio encoder",
        (3, 97), "encoder disaggregation is for multimodal models; serve a text model without the encoder stage", [])]


def test_opd619_an_unknown_multimodality_is_not_a_finding() -> None:
    assert found(_epd(), "OPD619", {"model": {"model_type": "x"}}) == []


def test_opd619_is_said_once_per_file_under_all_platforms() -> None:
    opts = options_from_example({"model": {"model_type": "qwen2", "multimodal": False}})
    opts.all_platforms = True
    assert len(found(_epd() + _ROCM, "OPD619", opts=opts)) == 1


# --- OPD620 EC ports --------------------------------------------------------------------------------

_V30 = {"vllm_version": "0.30"}
_EC_HELP = "give the EC connector its own port (VLLM_EC_SIDE_CHANNEL_PORT / ec_port) outside every other range on that host"


def test_opd620_a_port_set_in_env_is_pointed_at_and_not_called_default() -> None:
    text = _EPD_CPU.format(e=", env: {VLLM_EC_SIDE_CHANNEL_PORT: \"5600\"}")
    assert found(text, "OPD620", _V30) == [(
        "error", "port 5600: stage 0's EC side channel (ECCPUConnector) collides with stage 1's NIXL side channel",
        _col(text, "\"5600\""), _EC_HELP, [(4, 68, None)])]
    assert _col(text, "\"5600\"", 1) == (4, 68)


def test_opd620_two_ec_ranges_of_two_stages_collide_once() -> None:
    text = ("pipeline: llm_1e1p1d\nstages:\n"
            "  - {stage_id: 0, ec_transfer_config: {ec_connector: ECCPUConnector, ec_role: ec_producer}}\n"
            "  - {stage_id: 1, env: {VLLM_NIXL_SIDE_CHANNEL_PORT: \"6600\"}, kv_transfer_config: {kv_connector: "
            "NixlConnector, kv_role: kv_producer, engine_id: p}, ec_transfer_config: {ec_connector: ECCPUConnector, "
            "ec_role: ec_both}}\n"
            "  - {stage_id: 2, env: {VLLM_NIXL_SIDE_CHANNEL_PORT: \"6601\"}, kv_transfer_config: {kv_connector: "
            "NixlConnector, kv_role: kv_consumer, engine_id: d}}\n")
    assert found(text, "OPD620", _V30) == [(
        "error", "port 5601: stage 0's EC side channel (ECCPUConnector) default collides with stage 1's EC side "
                 "channel (ECCPUConnector) default", _col(text, "ECCPUConnector"), _EC_HELP,
        [(*_col(text, "ECCPUConnector", 1), None)])]


def test_opd620_the_second_dp_ranks_ec_range_and_the_first_port_they_share() -> None:
    text = ("pipeline: llm_1e1p1d\nstages:\n"
            "  - {stage_id: 0, ec_transfer_config: {ec_connector: ECMooncakeConnector, ec_role: ec_producer}}\n"
            "  - {stage_id: 1, tensor_parallel_size: 2, data_parallel_size: 2, env: {VLLM_NIXL_SIDE_CHANNEL_PORT: "
            "\"5600\"}, kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer, engine_id: p}, "
            "ec_transfer_config: {ec_connector: ECMooncakeConnector, ec_role: ec_consumer}}\n"
            "  - {stage_id: 2, tensor_parallel_size: 2, env: {VLLM_NIXL_SIDE_CHANNEL_PORT: \"14582\"}, "
            "kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_consumer, engine_id: d}}\n")
    # stage 1: DP 2 x TP 2 -> 14579-14580, 14581-14582; decode's NIXL 14582-14583
    assert found(text, "OPD620", _V30) == [(
        "error", "port 14582: stage 1's EC control (ECMooncakeConnector ec_port + rank) default collides with "
                 "stage 2's NIXL side channel", _col(text, "ECMooncakeConnector", 1), _EC_HELP,
        [(*_col(text, "\"14582\""), None)])]


def test_opd620_ec_ports_before_vllm_030_are_not_known() -> None:
    assert found(_EPD_CPU.format(e=""), "OPD620", {"vllm_version": "0.24"}) == []


def test_opd620_is_said_once_per_file_under_all_platforms() -> None:
    opts = options_from_example(_V30)
    opts.all_platforms = True
    text = _EPD_CPU.format(e="") + _ROCM.replace("devices: \"2\"", "devices: \"3\"")
    assert len(found(text, "OPD620", opts=opts)) == 1


def test_all_platforms_checks_an_overlays_ec_transfer_config_too() -> None:
    # `--platform rocm` reports what the overlay's ec_transfer_config breaks (prefill made a
    # producer: not a consumer, and an encoder-only instance with a KV config);
    # `--all-platforms` ("base + every overlay") must as well
    text = _epd() + ("platforms:\n  rocm:\n    stages:\n      - stage_id: 1\n"
                     "        ec_transfer_config: {ec_connector: ECExampleConnector, ec_role: ec_producer}\n")
    note = ["found with the `platforms.rocm` overlay applied"]
    for code, msg in (("OPD616", _NOT_CONSUMER),
                      ("OPD618", "stage 1 is the encoder-only instance (ec_producer) but has a kv_transfer_config "
                                 "(NixlConnector): it runs no language model and holds no KV cache")):
        assert [h[1] for h in found(text, code, opts=ValidateOptions(platform="rocm"))] == [msg], code
        got = validate_text(text, "t.yaml", ValidateOptions(all_platforms=True)).diagnostics
        assert [(d.message, list(d.notes)) for d in got if d.code == code] == [(msg, note)], code


def _ex(role: str, path: str) -> str:
    return (f", ec_transfer_config: {{ec_connector: ECExampleConnector, ec_role: {role}, "
            f"ec_connector_extra_config: {{shared_storage_path: {path}}}}}")


def test_opd617_an_ec_both_stage_is_a_producer() -> None:
    text = ("pipeline: llm_1e1pd\nstages:\n  - {stage_id: 0" + _ex("ec_both", "/mnt/a") + "}\n"
            "  - {stage_id: 1" + _ex("ec_consumer", "/mnt/b") + "}\n")
    assert found(text, "OPD617") == [(
        "error", "stage 1 reads encoder outputs from /mnt/b but stage 0 writes them to /mnt/a: every item would be "
                 "encoded again", _col(text, "shared_storage_path", 1), "set `shared_storage_path: /mnt/a` on both sides",
        [(*_col(text, "shared_storage_path"), "the producer's directory")])]


def test_opd617_a_producer_without_storage_does_not_end_the_scan_of_producers() -> None:
    # stage 0 produces with ECCPUConnector (no directory); prefill (ec_both) produces on /mnt/b
    text = _epd(p=_ex("ec_both", "/mnt/b"), d=_ex("ec_consumer", "/mnt/c")).replace(
        "ECExampleConnector, ec_role: ec_producer", "ECCPUConnector, ec_role: ec_producer", 1)
    assert [h[1] for h in found(text, "OPD617")] == [
        "stage 2 reads encoder outputs from /mnt/c but stage 1 writes them to /mnt/b: every item would be encoded again"]


def test_opd617_a_consumer_of_another_connector_does_not_end_the_scan_of_consumers() -> None:
    text = _epd(es=_S.format("/mnt/a"), p=", ec_transfer_config: {ec_connector: ECCPUConnector, ec_role: ec_consumer}",
                d=_ex("ec_consumer", "/mnt/c"))
    assert [h[1] for h in found(text, "OPD617")] == [
        "stage 2 reads encoder outputs from /mnt/c but stage 0 writes them to /mnt/a: every item would be encoded again"]


def test_opd620_two_kv_ranges_that_collide_are_opd501s_finding_not_opd620s() -> None:
    text = _EPD_CPU.format(e=", env: {VLLM_EC_SIDE_CHANNEL_PORT: \"5602\"}").replace("\"5601\"", "\"5600\"")
    res = validate_text(text, "t.yaml", options_from_example(_V30))
    assert [d.code for d in res.diagnostics if d.code in ("OPD501", "OPD620")] == ["OPD501"]


def test_opd620_a_range_on_another_host_does_not_end_the_scan() -> None:
    ctx = {"vllm_version": "0.30", "inventory": {"hosts": {"a": {}, "b": {}}, "placement": {"all": "a", "1": "b"}}}
    assert [h[1] for h in found(_EPD_CPU.format(e=""), "OPD620", ctx)] == [
        "port 5601: stage 0's EC side channel (ECCPUConnector) default collides with stage 2's NIXL side channel"]


def test_opd620_the_ec_side_is_named_first_when_its_stage_comes_after_the_kv_one() -> None:
    text = ("pipeline: llm_1e1p1d\nstages:\n"
            "  - {stage_id: 0, ec_transfer_config: {ec_connector: ECMooncakeConnector, ec_role: ec_producer}}\n"
            "  - {stage_id: 1, env: {VLLM_NIXL_SIDE_CHANNEL_PORT: \"14579\"}, kv_transfer_config: {kv_connector: "
            "NixlConnector, kv_role: kv_producer, engine_id: p}}\n"
            "  - {stage_id: 2, env: {VLLM_NIXL_SIDE_CHANNEL_PORT: \"5601\"}, kv_transfer_config: {kv_connector: "
            "NixlConnector, kv_role: kv_consumer, engine_id: d}, ec_transfer_config: {ec_connector: "
            "ECMooncakeConnector, ec_role: ec_consumer}}\n")
    assert found(text, "OPD620", _V30) == [(
        "error", "port 14579: stage 2's EC control (ECMooncakeConnector ec_port + rank) default collides with "
                 "stage 1's NIXL side channel", _col(text, "ECMooncakeConnector", 1), _EC_HELP,
        [(*_col(text, "\"14579\""), None)])]


def test_opd620_every_colliding_pair_is_named() -> None:
    # stage 0 and stage 1 (ec_both) both take ECCPUConnector's default 5601, as does decode's NIXL
    text = ("pipeline: llm_1e1p1d\nstages:\n"
            "  - {stage_id: 0, ec_transfer_config: {ec_connector: ECCPUConnector, ec_role: ec_producer}}\n"
            "  - {stage_id: 1, env: {VLLM_NIXL_SIDE_CHANNEL_PORT: \"6600\"}, kv_transfer_config: {kv_connector: "
            "NixlConnector, kv_role: kv_producer, engine_id: p}, ec_transfer_config: {ec_connector: ECCPUConnector, "
            "ec_role: ec_both}}\n"
            "  - {stage_id: 2, env: {VLLM_NIXL_SIDE_CHANNEL_PORT: \"5601\"}, "
            "kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_consumer, engine_id: d}}\n")
    assert sorted(h[1] for h in found(text, "OPD620", _V30)) == [
        "port 5601: stage 0's EC side channel (ECCPUConnector) default collides with stage 1's EC side channel "
        "(ECCPUConnector) default",
        "port 5601: stage 0's EC side channel (ECCPUConnector) default collides with stage 2's NIXL side channel",
        "port 5601: stage 1's EC side channel (ECCPUConnector) default collides with stage 2's NIXL side channel"]


def test_opd620_names_the_first_port_two_ranges_share() -> None:
    # prefill's ec_port 14579-14580 (TP 2) and decode's 14578-14579 share 14579
    text = ("pipeline: llm_1e1p1d\nstages:\n"
            "  - {stage_id: 0, ec_transfer_config: {ec_connector: ECMooncakeConnector, ec_role: ec_producer}}\n"
            "  - {stage_id: 1, tensor_parallel_size: 2, env: {VLLM_NIXL_SIDE_CHANNEL_PORT: \"5600\"}, kv_transfer_config: "
            "{kv_connector: NixlConnector, kv_role: kv_producer, engine_id: p}, ec_transfer_config: {ec_connector: "
            "ECMooncakeConnector, ec_role: ec_consumer}}\n"
            "  - {stage_id: 2, tensor_parallel_size: 2, env: {VLLM_NIXL_SIDE_CHANNEL_PORT: \"5602\"}, kv_transfer_config: "
            "{kv_connector: NixlConnector, kv_role: kv_consumer, engine_id: d}, ec_transfer_config: {ec_connector: "
            "ECMooncakeConnector, ec_role: ec_consumer, ec_port: 14578}}\n")
    assert [h[1] for h in found(text, "OPD620", _V30)] == [
        "port 14579: stage 1's EC control (ECMooncakeConnector ec_port + rank) default collides with stage 2's EC "
        "control (ECMooncakeConnector ec_port + rank)"]


def test_opd620_a_stage_pair_already_reported_does_not_end_the_scan() -> None:
    # stage 1 binds 5601 twice (its API port and its NIXL side channel: OPD501's finding); the
    # EC port collides with stage 1 once, and with stage 2 after it
    text = ("pipeline: llm_1e1p1d\nstages:\n"
            "  - {stage_id: 0, ec_transfer_config: {ec_connector: ECCPUConnector, ec_role: ec_producer}}\n"
            "  - {stage_id: 1, port: 5601, env: {VLLM_NIXL_SIDE_CHANNEL_PORT: \"5601\"}, kv_transfer_config: "
            "{kv_connector: NixlConnector, kv_role: kv_producer, engine_id: p}}\n"
            "  - {stage_id: 2, env: {VLLM_NIXL_SIDE_CHANNEL_PORT: \"5601\"}, kv_transfer_config: {kv_connector: "
            "NixlConnector, kv_role: kv_consumer, engine_id: d}}\n")
    assert [h[1] for h in found(text, "OPD620", _V30)] == [
        "port 5601: stage 0's EC side channel (ECCPUConnector) default collides with stage 1's NIXL side channel",
        "port 5601: stage 0's EC side channel (ECCPUConnector) default collides with stage 2's NIXL side channel"]


def _mc(p_par: str, d_par: str, d_port: str) -> str:
    return ("pipeline: llm_1e1p1d\nstages:\n"
            "  - {stage_id: 0, ec_transfer_config: {ec_connector: ECMooncakeConnector, ec_role: ec_producer}}\n"
            "  - {stage_id: 1, " + p_par + ", env: {VLLM_NIXL_SIDE_CHANNEL_PORT: \"5600\"}, kv_transfer_config: "
            "{kv_connector: NixlConnector, kv_role: kv_producer, engine_id: p}, ec_transfer_config: {ec_connector: "
            "ECMooncakeConnector, ec_role: ec_consumer}}\n"
            "  - {stage_id: 2, " + d_par + ", env: {VLLM_NIXL_SIDE_CHANNEL_PORT: \"5610\"}, kv_transfer_config: "
            "{kv_connector: NixlConnector, kv_role: kv_consumer, engine_id: d}, ec_transfer_config: {ec_connector: "
            "ECMooncakeConnector, ec_role: ec_consumer, ec_port: " + d_port + "}}\n")


def test_opd620_one_range_over_two_of_another_stage_is_two_findings() -> None:
    msg = ("port {}: stage 1's EC control (ECMooncakeConnector ec_port + rank) default collides with stage 2's EC "
           "control (ECMooncakeConnector ec_port + rank)")
    # prefill's DP ranks 14579 and 14580 (TP 1) inside decode's 14579-14582 (TP 4)
    assert [h[1] for h in found(_mc("data_parallel_size: 2", "tensor_parallel_size: 4", "14579"), "OPD620", _V30)] == [
        msg.format(14579), msg.format(14580)]
    # prefill's 14579-14582 (TP 4) over decode's DP ranks 14580 and 14581
    assert [h[1] for h in found(_mc("tensor_parallel_size: 4", "data_parallel_size: 2", "14580"), "OPD620", _V30)] == [
        msg.format(14580), msg.format(14581)]
