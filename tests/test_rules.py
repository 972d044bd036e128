"""The rule registry: every rule's failing and passing doc example is a test, plus
exact locations (line, column) and messages for a sample of rules."""

from __future__ import annotations

import pytest

from omni_pd.diagnostics import Severity
from omni_pd.check.rules import FAMILIES, registry
from omni_pd.check.validate import ValidateOptions, options_from_example, validate_text
from pd_fixture import PD  # tests/pd_fixture.py

RULES = registry()

#: one-rule modules of omni_pd/check/rules (module -> family of its code)
ONE_RULE_MODULES = {"model_identity": "pd_pair", "hybrid_state": "capability", "router_protocol": "runtime",
                    "known_broken": "capability", "advertised": "ports",
                    "pd_generation": "pd_pair", "nixl_lease": "capability", "stage_edges": "ports",
                    # issue 35
                    "engine_args": "pd_pair",
                    "speculative": "pd_pair", "max_len": "pd_pair", "draft_kv": "capability",
                    "context_parallel": "capability", "device_init": "devices", "router_settings": "runtime",
                    # validate ⊇ vllm-omni's loader (issue 35)
                    "stage_values": "schema",
                    # issue 35 item 7: the launch port plan
                    "planned_ports": "ports",
                    # issue 35: vLLM 0.34 and vllm-omni 0.31+
                    "nixl_mode": "capability", "mooncake_lease": "capability", "multi_role": "capability",
                    "extensible_kv": "capability", "output_types": "schema",
                    # issue 38 split capability.py by capability family (these hold one or two rules)
                    "multi_connector": "capability", "hetero_tp": "capability", "pipeline_parallel": "capability",
                    "lmcache_pd": "capability", "ec_connector": "capability"}


def test_registry_has_every_family_and_stable_codes() -> None:
    fams = {r.family for r in RULES.values()}
    assert fams == set(FAMILIES.values())
    for code, r in RULES.items():
        assert code == r.code and code.startswith("OPD") and len(code) == 6
        assert r.family == {"1": "schema", "2": "topology", "3": "pd_pair", "4": "devices", "5": "ports",
                            "6": "capability", "7": "runtime"}[code[3]]
        # a family's rules live in its module; encoder.py holds the EC topology rules of the
        # capability family (OPD616-OPD619, encoder disaggregation); a one-rule module
        # (yamllint style, issue 22) is listed in ONE_RULE_MODULES with its family
        assert r.check.__module__ in (f"omni_pd.check.rules.{r.family}",
                                      *(("omni_pd.check.rules.encoder",) if r.family == "capability" else ()),
                                      *(f"omni_pd.check.rules.{m}" for m, f in ONE_RULE_MODULES.items() if f == r.family))
        assert r.doc and r.summary and r.fail.strip() and r.passing.strip()
        # the doc names its upstream source
        assert "Source" in r.doc, code


def test_codes_do_not_collide_with_expand_codes() -> None:
    for code in RULES:
        assert not code.startswith(("OPD8", "OPD9", "OPD00")), code


def _requires_vllm(code: str) -> bool:
    if code != "OPD610":
        return False
    import importlib.util

    return importlib.util.find_spec("vllm") is None


@pytest.mark.parametrize("code", list(RULES))
def test_failing_example_triggers_the_rule(code: str) -> None:
    if _requires_vllm(code):
        pytest.skip("vLLM is not installed; OPD610 only runs with vllm.config.KVTransferConfig")
    r = RULES[code]
    res = validate_text(r.fail, "fail.yaml", options_from_example(r.example_context))
    hits = [d for d in res.diagnostics if d.code == code]
    assert hits, [(d.code, d.message) for d in res.diagnostics]
    assert any(d.severity is r.severity for d in hits) or code in ("OPD602", "OPD607", "OPD702")
    for d in hits:
        assert d.help, f"{code}: diagnostic without a help line: {d.message}"
        if d.location is not None and not d.location.file.startswith("<"):
            assert d.location.line is not None


@pytest.mark.parametrize("code", list(RULES))
def test_passing_example_is_clean_for_the_rule(code: str) -> None:
    if _requires_vllm(code):  # it would pass because the rule checks nothing (tests/test_rule_branches.py runs it)
        pytest.skip("vLLM is not installed; OPD610 only runs with vllm.config.KVTransferConfig")
    r = RULES[code]
    ctx = r.pass_context if r.pass_context is not None else r.example_context
    res = validate_text(r.passing, "pass.yaml", options_from_example(ctx))
    assert code not in res.codes(), [(d.code, d.message) for d in res.diagnostics if d.code == code]


EXAMPLES = [pytest.param(code, i, id=f"{code}-{e.name}") for code, r in RULES.items() for i, e in enumerate(r.examples)]


@pytest.mark.parametrize(("code", "i"), EXAMPLES)
def test_branch_examples(code: str, i: int) -> None:
    """Each extra example of a rule (one per branch) fires or stays clean as it says."""
    r = RULES[code]
    e = r.examples[i]
    res = validate_text(e.yaml, "example.yaml", options_from_example(e.context))
    hits = [d for d in res.diagnostics if d.code == code]
    if e.fires:
        want = e.severity or r.severity
        ok = [d for d in hits if d.severity is want and (e.contains is None or e.contains in d.message)]
        assert ok, (e.name, [(d.code, d.severity.value, d.message) for d in res.diagnostics])
        assert all(d.help for d in ok), e.name
    else:
        bad = [d for d in hits if d.severity in (Severity.ERROR, Severity.WARNING)]
        assert not bad, (e.name, [d.message for d in bad])


def _one(text: str, code: str, opts: ValidateOptions | None = None):
    res = validate_text(text, "t.yaml", opts)
    hits = [d for d in res.diagnostics if d.code == code]
    assert len(hits) == 1, [(d.code, d.message) for d in res.diagnostics]
    return hits[0]




def test_clean_pd_pair_has_no_errors_or_warnings() -> None:
    res = validate_text(PD, "t.yaml")
    # nothing: omni-pd's compatibility layer gives the Talker its prompt rows on vllm-omni 0.30 (OPD704)
    assert [(d.code, d.severity) for d in res.diagnostics] == []


def test_connector_mismatch_located_at_decode_value_with_prefill_related() -> None:
    d = _one(PD.replace("kv_connector: NixlConnector\n      kv_role: kv_consumer",
                        "kv_connector: MooncakeConnector\n      kv_role: kv_consumer"), "OPD304")
    assert d.message == "prefill and decode use different KV connectors"
    assert (d.location.line, d.location.column) == (17, 21)
    assert d.label == "decode uses MooncakeConnector"
    assert [(r.line, r.column, r.label) for r in d.related] == [(9, 21, "prefill (stage 0) uses NixlConnector")]
    assert d.help == "use the same kv_connector on both stages of the PD pair"


def test_reversed_roles_located_at_each_kv_role() -> None:
    text = PD.replace("kv_role: kv_producer", "kv_role: TMP").replace("kv_role: kv_consumer", "kv_role: kv_producer") \
             .replace("kv_role: TMP", "kv_role: kv_consumer")
    res = validate_text(text, "t.yaml")
    hits = [d for d in res.diagnostics if d.code == "OPD302"]
    assert [(d.location.line, d.location.column) for d in hits] == [(10, 16), (18, 16)]
    assert hits[0].message == "prefill stage 0 has kv_role kv_consumer (roles are reversed)"
    assert hits[0].help == "write `kv_role: kv_producer` on the prefill stage"


def test_port_conflict_located_at_env_value() -> None:
    d = _one(PD.replace('"5601"', '"5600"'), "OPD501")
    assert (d.location.line, d.location.column) == (15, 36)
    assert d.message == ("port 5600 on the shared host bound by stage 0 (NIXL side channel, 5600) "
                         "and stage 1 (NIXL side channel, 5600)")
    assert (d.related[0].line, d.related[0].column) == (7, 36)


def test_nixl_side_channel_range_per_vllm_version() -> None:
    """0.11 binds one side-channel port per TP worker: TP2 at 5600 overlaps 5601."""
    text = PD.replace('devices: "0"\n', 'devices: "0,2"\n    tensor_parallel_size: 2\n', 1) \
             .replace('devices: "1"\n', 'devices: "1,3"\n    tensor_parallel_size: 2\n', 1)
    assert "OPD501" not in validate_text(text, "t.yaml", ValidateOptions(vllm_version="0.30")).codes()
    assert "OPD501" in validate_text(text, "t.yaml", ValidateOptions(vllm_version="0.11")).codes()


STREAM_PD = (PD.replace("async_chunk: false", "async_chunk: true")
             + "  - {stage_id: 2, devices: \"2\"}\nedges:\n  - {from: 1, to: 2}\n")


def test_streaming_pd_pair_is_clean_where_the_layer_covers_the_release() -> None:
    """vllm-omni 0.30 (omni-pd's compat table lists the stream_* patches): no OPD310, no OPD307."""
    res = validate_text(STREAM_PD, "t.yaml", ValidateOptions(vllm_version="0.30"))
    assert [d.code for d in res.diagnostics if d.code in ("OPD310", "OPD307")] == []


def test_async_chunk_located_at_value() -> None:
    """An uncovered release: the error sits on async_chunk's value and says how to get the one-piece answer."""
    d = _one(STREAM_PD, "OPD310", ValidateOptions(vllm_version="0.28"))
    assert (d.location.line, d.location.column) == (2, 14)
    assert d.message == ("async_chunk is on (vllm-omni's default) with a prefill/decode pair: vllm-omni 0.28 refuses "
                         "async_chunk with a kv_transfer_config and omni-pd's compatibility layer does not make it "
                         "stream there")
    assert d.help == ("target a release it covers (`--vllm-version 0.30`), or `omni-pd expand --no-stream` "
                      "(or `async_chunk: false` in the input) for the one-piece answer")


def test_async_chunk_edge_into_decode_is_located_at_edges() -> None:
    """A covered release with a prefill -> decode stage edge: decode would be a prewarmed chunk receiver."""
    text = STREAM_PD.replace("edges:\n", "edges:\n  - {from: 0, to: 1}\n")
    d = _one(text, "OPD310", ValidateOptions(vllm_version="0.30"))
    assert d.location.line == text.splitlines().index("edges:") + 1
    assert d.help.startswith("remove `- {from: 0, to: 1}` from `edges:`")


def test_world_size_message_and_location() -> None:
    d = _one("stages:\n  - stage_id: 0\n    devices: \"0\"\n    tensor_parallel_size: 2\n", "OPD401")
    assert d.message == ("stage 0: tensor_parallel_size 2 x pipeline_parallel_size 1 x data_parallel_size 1 "
                         "= 2 devices, but devices has 1 entry")
    assert (d.location.line, d.location.column) == (3, 14)


def test_memory_budget_counts_each_tp_rank_on_its_device() -> None:
    text = ("stages:\n"
            "  - {stage_id: 0, devices: \"0,1\", tensor_parallel_size: 2, gpu_memory_utilization: 0.5}\n"
            "  - {stage_id: 1, devices: \"1\", gpu_memory_utilization: 0.6}\n"
            "  - {stage_id: 2, devices: \"1\", gpu_memory_utilization: 0.1}\n")
    d = _one(text, "OPD404")
    assert d.message == "physical GPU 1: 0.5 (stage 0, TP rank 1) + 0.6 (stage 1) + 0.1 (stage 2) = 1.20 > 1.0"
    assert (d.location.line, d.location.column) == (4, 57)
    assert [r.line for r in d.related] == [2, 3]


def test_memory_budget_maps_logical_to_physical_devices() -> None:
    """CUDA_VISIBLE_DEVICES=3,3 is nonsense, but 2,3 with stages on logical 0 and 1 are distinct."""
    text = "stages:\n  - {stage_id: 0, devices: \"0\", gpu_memory_utilization: 0.6}\n" \
           "  - {stage_id: 1, devices: \"1\", gpu_memory_utilization: 0.6}\n"
    assert "OPD404" not in validate_text(text, "t.yaml", ValidateOptions(env={"CUDA_VISIBLE_DEVICES": "2,3"})).codes()
    res = validate_text(text, "t.yaml", ValidateOptions(env={"CUDA_VISIBLE_DEVICES": "5"}))
    assert "OPD402" in res.codes()


def test_unknown_connector_suggests_the_rename() -> None:
    res = validate_text(PD.replace("NixlConnector", "SharedStorageConnector"), "t.yaml")
    hits = [d for d in res.diagnostics if d.code == "OPD601"]
    assert [h.location.line for h in hits] == [9, 17]
    assert hits[0].message == ("stage 0: SharedStorageConnector is not registered in vLLM 0.30 (assumed: no "
                               "--vllm-version given; pass --vllm-version X.Y); did you mean ExampleConnector?")
    res = validate_text(PD.replace("NixlConnector", "NIXLConnector"), "t.yaml")
    assert "did you mean NixlConnector?" in [d for d in res.diagnostics if d.code == "OPD601"][0].message


def test_kv_field_removed_in_032_is_an_error_there_and_fine_before() -> None:
    text = PD.replace("engine_id: p\n", "engine_id: p\n      kv_ip: 10.0.0.1\n")
    d = _one(text, "OPD609", ValidateOptions(vllm_version="0.32"))
    assert d.severity is Severity.ERROR and (d.location.line, d.location.column) == (12, 7)
    assert "OPD609" not in validate_text(text, "t.yaml", ValidateOptions(vllm_version="0.30")).codes()


def test_all_pydantic_errors_are_reported_not_just_the_first() -> None:
    text = ("stages:\n  - stage_id: 0\n    tensor_parallel_size: two\n"
            "  - stage_id: 1\n    gpu_memory_utilization: lots\n")
    res = validate_text(text, "t.yaml")
    hits = [d for d in res.diagnostics if d.code == "OPD101"]
    assert [(d.location.line, d.location.column) for d in hits] == [(3, 27), (5, 29)]
    assert hits[0].message == "`tensor_parallel_size` must be an integer, found 'two'"


def test_unknown_top_level_key_suggests_nearest() -> None:
    d = _one("pipelne: qwen3_omni_moe\nstages:\n  - stage_id: 0\n", "OPD103")
    assert d.help == "did you mean `pipeline`?" and (d.location.line, d.location.column) == (1, 1)


def test_legacy_file_is_explained_and_input_sources_checked() -> None:
    # before vllm-omni 0.28, --stage-configs-path loads the file as written: stage 0's missing
    # engine_input_source crashes the orchestrator (no default); from 0.28 the file is refused
    # and its migrated form takes the pipeline's sources, so OPD201 has nothing to say there
    text = ("stage_args:\n  - stage_id: 0\n    runtime: {devices: \"0\"}\n"
            "  - stage_id: 1\n    engine_input_source: [0]\n")
    found = lambda v: [(d.code, d.severity, d.location.line)  # noqa: E731
                       for d in validate_text(text, "t.yaml", ValidateOptions(vllm_version=v)).diagnostics
                       if d.code in ("OPD102", "OPD201")]
    assert found("0.26") == [("OPD102", Severity.WARNING, 1), ("OPD201", Severity.ERROR, 2)]
    assert found("0.30") == [("OPD102", Severity.ERROR, 1)]


def test_explain_text_has_both_examples() -> None:
    text = RULES["OPD304"].explain()
    assert text.startswith("OPD304 pd-connector-mismatch (error, pd_pair)")
    assert "Fails:" in text and "Passes:" in text and "MooncakeConnector" in text


# --- Mooncake bootstrap port: the key the runtime reads, replica ranges (OPD501/502/505) ------

MC = """pipeline: qwen3_omni_moe_pd
async_chunk: false
stages:
  - stage_id: 0
    devices: "0"
    num_replicas: 2
    env:
      VLLM_MOONCAKE_BOOTSTRAP_PORT: "25301"
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_producer
      engine_id: p
      kv_connector_extra_config:
        bootstrap_port: 25201
  - stage_id: 1
    devices: "1"
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_consumer
      engine_id: d
"""


def test_env_bootstrap_port_overwritten_by_vllm_omni_is_an_error() -> None:
    d = _one(MC, "OPD502")
    assert d.severity is Severity.ERROR
    assert d.message == ("stage 0: env VLLM_MOONCAKE_BOOTSTRAP_PORT = 25301 is ignored: vllm-omni 0.30 sets it from "
                         "kv_connector_extra_config.bootstrap_port plus the replica id, so this stage binds "
                         "ports 25201-25202 (replicas 0-1)")
    assert (d.location.line, d.location.column) == (8, 37)
    assert [(r.line, r.column, r.label) for r in d.related] == [(14, 25, "bootstrap_port 25201")]
    assert d.help == ('write VLLM_MOONCAKE_BOOTSTRAP_PORT: "25201" (what the runtime sets for replica 0), '
                      "or set bootstrap_port: 25301 if that is the port you want")
    # agreeing values, or a runtime where the env is what decides: no OPD502
    assert "OPD502" not in validate_text(MC.replace('"25301"', '"25201"'), "t.yaml").codes()
    assert "OPD502" not in validate_text(MC, "t.yaml", ValidateOptions(vllm_version="0.28")).codes()
    plain = MC.replace("qwen3_omni_moe_pd", "llm_pd")  # plain `vllm serve` engines
    assert "OPD502" not in validate_text(plain, "t.yaml").codes()


def test_env_bootstrap_port_with_bootstrap_port_unset_names_the_default() -> None:
    text = MC.replace("      kv_connector_extra_config:\n        bootstrap_port: 25201\n", "")
    d = _one(text, "OPD502")
    assert d.message == ("stage 0: env VLLM_MOONCAKE_BOOTSTRAP_PORT = 25301 is ignored: vllm-omni 0.30 sets it from "
                         "kv_connector_extra_config.bootstrap_port (unset, default 8998) plus the replica id, "
                         "so this stage binds ports 8998-8999 (replicas 0-1)")
    assert [(r.line, r.label) for r in d.related] == [(10, "bootstrap_port unset: default 8998")]


def test_replica_range_hitting_another_port_is_a_conflict() -> None:
    # 3 replicas bind 25201-25203; decode's API port 25203 is inside the range
    text = MC.replace('"25301"', '"25201"').replace("num_replicas: 2", "num_replicas: 3") \
             .replace('devices: "1"\n', 'devices: "1"\n    port: 25203\n')
    d = _one(text, "OPD501")
    assert d.message == ("port 25203 on the shared host bound by stage 0 replica 2 (Mooncake bootstrap, 25203) "
                         "and stage 1 (API server --port, 25203)")
    assert (d.location.line, d.location.column) == (17, 11)
    assert [(r.line, r.column, r.label) for r in d.related] == [(14, 25, "stage 0 replica 2 binds 25203")]
    assert d.help == "move stage 1's range to start at 25204 or above"
    # one replica fewer and the range ends at 25202
    assert "OPD501" not in validate_text(text.replace("num_replicas: 3", "num_replicas: 2"), "t.yaml").codes()
    # vllm-omni 0.28 gives every replica the env port 25201: no range reaching 25203 (the replicas
    # collide with each other instead, test_replicas_sharing_one_port_collide)
    old = validate_text(text, "t.yaml", ValidateOptions(vllm_version="0.28"))
    assert [d.message for d in old.diagnostics if d.code == "OPD501" and "25203" in d.message] == []


def test_replicas_sharing_one_port_collide() -> None:
    # vllm-omni 0.28 (env decides, no replica offset) and NIXL everywhere: every replica binds the same port
    d = _one(MC.replace('"25301"', '"25201"'), "OPD501", ValidateOptions(vllm_version="0.28"))
    assert d.message == ("port 25301 on the shared host bound by stage 0 replica 0 (Mooncake bootstrap, 25301) "
                         "and stage 0 replica 1 (Mooncake bootstrap, 25301)").replace("25301", "25201")
    assert d.help == ("all 2 replicas of stage 0 get the same Mooncake bootstrap port on this runtime: "
                      "set num_replicas: 1, or place the replicas on different hosts")
    nixl = PD.replace('devices: "0"\n', 'devices: "0"\n    num_replicas: 2\n', 1)
    d = _one(nixl, "OPD501")
    assert d.message == ("port 5600 on the shared host bound by stage 0 replica 0 (NIXL side channel, 5600) "
                         "and stage 0 replica 1 (NIXL side channel, 5600)")


def test_unread_recipe_key_is_a_warning_naming_the_key_to_use() -> None:
    text = MC.replace('"25301"', '"25201"').replace("bootstrap_port: 25201", "mooncake_bootstrap_port: 25201")
    res = validate_text(text, "t.yaml")
    d = next(x for x in res.diagnostics if x.code == "OPD505")
    assert d.severity is Severity.WARNING
    assert d.message == ("stage 0: kv_connector_extra_config.mooncake_bootstrap_port is read by nothing on "
                         "vllm-omni 0.30; the bootstrap port comes from kv_connector_extra_config.bootstrap_port, "
                         "so this stage binds ports 8998-8999 (replicas 0-1)")
    assert (d.location.line, d.location.column) == (14, 9)
    assert d.help == "rename it to bootstrap_port: 25201"
    # ... and the env it was meant to agree with is ignored: 8998 is bound, not 25201
    assert "OPD502" in res.codes()
    # plain `vllm serve` engines: the env decides, so the fix is the env
    plain = text.replace("qwen3_omni_moe_pd", "llm_pd")
    d = _one(plain, "OPD505")
    assert d.message == ("stage 0: kv_connector_extra_config.mooncake_bootstrap_port is read by nothing on "
                         "vLLM 0.30; the bootstrap port comes from env VLLM_MOONCAKE_BOOTSTRAP_PORT, "
                         "so this stage binds ports 25201-25202 (replicas 0-1)")  # xPyD: one vllm serve each
    assert d.help == 'remove mooncake_bootstrap_port and set env VLLM_MOONCAKE_BOOTSTRAP_PORT: "25201"'
    # on decode (kv_consumer) it is simply noise
    dec = MC.replace('"25301"', '"25201"').replace("engine_id: d\n",
                                                   "engine_id: d\n      kv_connector_extra_config: {mooncake_bootstrap_port: 25202}\n")
    d = _one(dec, "OPD505")
    assert d.message == ("stage 1: kv_connector_extra_config.mooncake_bootstrap_port is read by nothing on "
                         "vllm-omni 0.30, and a kv_consumer binds no bootstrap port")
    assert d.help == "remove mooncake_bootstrap_port"


def test_lmcache_routing_advice_is_not_nixl_advice() -> None:
    """OPD702 on an LMCache pair names LMCache's disagg_spec, never NIXL's request fields."""
    r = RULES["OPD702"]
    e = next(x for x in r.examples if x.name.startswith("LMCache without"))
    d = _one(e.yaml, "OPD702", options_from_example(e.context))
    text = " ".join([d.message, d.help or ""] + d.notes)
    assert "disagg_spec" in text and "do_remote" not in text and "NIXL" not in text


def test_replica_range_past_the_last_port_is_invalid() -> None:
    text = MC.replace('"25301"', '"65535"').replace("bootstrap_port: 25201", "bootstrap_port: 65535")
    d = _one(text, "OPD504")
    assert d.message == "stage 0 replica 1 would bind Mooncake bootstrap port 65536 (base + replica id), past 65535"
    assert d.help == "start the range at 65534 or lower"
    assert "OPD504" not in validate_text(text.replace("num_replicas: 2", "num_replicas: 1"), "t.yaml").codes()
