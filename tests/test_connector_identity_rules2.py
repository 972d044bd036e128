"""Rules outside capability.py judge the connector a stage loads, not the name it writes
(issue 35, family 3: "Which connector is this?").

vLLM's ``KVConnectorFactory.get_connector_class`` imports ``kv_connector_module_path`` when it is
set and takes the class named ``kv_connector`` from it, so ``kv_connector: MooncakeConnector``
with ``kv_connector_module_path: vllm_ascend.distributed.kv_transfer.kv_p2p.mooncake_connector``
is vllm-ascend's pull connector and ``mypkg.connectors`` an out-of-tree class. A fact about vLLM's
connector of that name (a router protocol, routing fields, a known-broken release, a table row)
reads :func:`omni_pd.check.rules.capability.connector_row`; each test runs a rule's own example
with vLLM's class (the verdict kept, also with a ``vllm.*`` module path) and with a foreign one.
"""

from __future__ import annotations

import re

from omni_pd.check.rules import registry
from omni_pd.check.validate import options_from_example, validate_text

ASCEND_MOONCAKE = "vllm_ascend.distributed.kv_transfer.kv_p2p.mooncake_connector"
OOT = "mypkg.connectors"


def with_path(text: str, module: str, connector: str | None = None) -> str:
    """``text`` with ``kv_connector_module_path: module`` beside every ``kv_connector``
    (only ``connector``'s, when given)."""
    pat = re.escape(connector) if connector else r"[A-Za-z0-9_]+"
    return re.sub(rf"kv_connector: ({pat})([,}}])", rf"kv_connector: \1, kv_connector_module_path: {module}\2", text)


def found(code: str, text: str, ctx: dict | None = None) -> list[tuple[str, str]]:
    res = validate_text(text, "pd.yaml", options_from_example(ctx or {}))
    assert [d.message for d in res.diagnostics if d.code == "OPD000"] == []
    return [(d.severity.value, d.message) for d in res.diagnostics if d.code == code]


def example(code: str, name: str | None = None) -> tuple[str, dict]:
    r = registry()[code]
    if name is None:
        return r.fail, r.example_context
    e = next(e for e in r.examples if e.name == name)
    return e.yaml, e.context


def test_opd705_router_protocol_is_the_loaded_connectors():
    text, ctx = example("OPD705")  # vLLM's MooncakeConnector (bootstrap) behind a relay router (pull)
    assert [s for s, _ in found("OPD705", text, ctx)] == ["error"]
    assert found("OPD705", with_path(text, "vllm.distributed.kv_transfer.kv_connector.v1.mooncake_connector"), ctx)
    # vllm-ascend's MooncakeConnector (registered as MooncakeConnectorV1) pulls: a relay router drives it
    assert found("OPD705", with_path(text, ASCEND_MOONCAKE), ctx) == []
    # an out-of-tree class has no contract omni-pd knows: not judged by vLLM's
    assert found("OPD705", with_path(text, OOT), ctx) == []


def test_opd702_routing_fields_and_the_mooncake_engine_id_warning_are_vllms():
    text, ctx = example("OPD702")
    own = validate_text(text, "pd.yaml", options_from_example(ctx)).diagnostics
    assert any("transfer_id" in n for d in own if d.code == "OPD702" for n in d.notes)  # vLLM's Mooncake fields
    asc = validate_text(with_path(text, ASCEND_MOONCAKE), "pd.yaml", options_from_example(ctx)).diagnostics
    notes = [n for d in asc if d.code == "OPD702" for n in d.notes]
    assert notes and not any("transfer_id" in n for n in notes)  # vllm-ascend's pull fields
    assert any("vllm-ascend's MooncakeConnectorV1" in d.message for d in asc if d.code == "OPD702")
    text, ctx = example("OPD702", "Mooncake prefill without engine_id")
    assert [s for s, _ in found("OPD702", text, ctx)] == ["warning"]
    assert found("OPD702", with_path(text, OOT), ctx) == []  # vllm-omni's Mooncake handling is not an OOT class's


def test_opd625_dcp_row_is_vllms_nixl_only():
    text, ctx = example("OPD625")  # vLLM 0.33 NIXL, DCP 2, a GQA model: error
    assert [s for s, _ in found("OPD625", text, ctx)] == ["error"]
    assert [s for s, _ in found("OPD625", with_path(text, "vllm.distributed.kv_transfer.kv_connector.v1.nixl_connector"),
                                ctx)] == ["error"]
    got = found("OPD625", with_path(text, OOT), ctx)
    assert [s for s, _ in got] == ["info"] and f"{OOT}" in got[0][1]  # not in the table: not checked


def test_opd624_draft_kv_is_vllms_nixl_only():
    r = registry()["OPD624"]
    assert found("OPD624", r.fail, r.example_context)
    assert found("OPD624", with_path(r.fail, OOT), r.example_context) == []


def test_opd315_handshake_row_is_vllms_nixl_only():
    r = registry()["OPD315"]
    got = found("OPD315", r.fail, r.example_context)
    assert [s for s, _ in got] == ["error"]
    other = found("OPD315", with_path(r.fail, OOT), r.example_context)
    assert [s for s, _ in other] == ["warning"] and "not pinned" in other[0][1]  # the unknown-connector warning


def test_opd622_known_broken_rows_name_vllms_classes():
    r = registry()["OPD622"]
    assert found("OPD622", r.fail, r.example_context)
    assert found("OPD622", with_path(r.fail, OOT), r.example_context) == []


def test_opd317_shared_store_condition_names_vllms_lmcache_classes():
    text, ctx = example("OPD317", "block-hash algorithm differs over a shared LMCache store")
    assert found("OPD317", text, ctx)
    assert found("OPD317", with_path(text, OOT), ctx) == []  # not known to share a hash-keyed store


def test_opd404_counts_vllms_p2pnccl_buffer_only():
    text = ("pipeline: llm\nstages:\n  - {stage_id: 0, devices: \"0\", gpu_memory_utilization: 0.95, kv_transfer_config: "
            "{kv_connector: P2pNcclConnector, kv_role: kv_both, kv_buffer_size: 8589934592}}\n")
    ctx = {"inventory": {"hosts": {"h": {"memory_gib": 80}}}}
    assert found("OPD404", text, ctx)  # vLLM's P2pNccl allocates kv_buffer_size on the device
    assert found("OPD404", with_path(text, OOT), ctx) == []


def test_opd502_opd505_bootstrap_port_facts_are_vllms_mooncake():
    for code in ("OPD502", "OPD505"):
        r = registry()[code]
        assert found(code, r.fail, r.example_context), code
        assert found(code, with_path(r.fail, "vllm.distributed.kv_transfer.kv_connector.v1.mooncake_connector"),
                     r.example_context), code
        # vllm-ascend's MooncakeConnector runs no vllm-omni bootstrap server; an OOT class reads its own keys
        assert found(code, with_path(r.fail, ASCEND_MOONCAKE), r.example_context) == [], code
        assert found(code, with_path(r.fail, OOT), r.example_context) == [], code


def test_opd503_the_nixl_side_channel_is_vllms_nixls():
    r = registry()["OPD503"]  # vLLM's NIXL prefill advertising localhost across hosts
    assert found("OPD503", r.fail, r.example_context)
    assert found("OPD503", with_path(r.fail, OOT), r.example_context) == []


def test_opd506_judges_vllm_ascends_class_under_vllms_name():
    r = registry()["OPD506"]
    ascend = r.fail.replace("MooncakeConnectorV1", "MooncakeConnector")
    assert found("OPD506", with_path(ascend, ASCEND_MOONCAKE), r.example_context)  # vllm-ascend's kv_port range
    assert found("OPD506", with_path(r.fail, OOT), r.example_context) == []  # not vllm-ascend's class
    assert found("OPD506", r.fail, r.example_context)


def pair(connector: str, p_path: str | None = None, d_path: str | None = None) -> str:
    def kv(role: str, eid: str, path: str | None) -> str:
        mod = f", kv_connector_module_path: {path}" if path else ""
        return f"{{kv_connector: {connector}{mod}, kv_role: {role}, engine_id: {eid}}}"
    return ("pipeline: qwen3_omni_moe_pd\nasync_chunk: false\nstages:\n"
            f"  - {{stage_id: 0, devices: \"0\", kv_transfer_config: {kv('kv_producer', 'p', p_path)}}}\n"
            f"  - {{stage_id: 1, devices: \"1\", kv_transfer_config: {kv('kv_consumer', 'd', d_path)}}}\n")


def test_opd304_one_name_from_two_packages_is_two_connectors():
    assert found("OPD304", pair("MooncakeConnector")) == []
    # vLLM's own class by module path is the registry's class: the same connector
    vllm_path = "vllm.distributed.kv_transfer.kv_connector.v1.mooncake_connector"
    assert found("OPD304", pair("MooncakeConnector", vllm_path, None)) == []
    got = found("OPD304", pair("MooncakeConnector", None, ASCEND_MOONCAKE))
    assert [s for s, _ in got] == ["error"] and "different module paths" in got[0][1]
    res = validate_text(pair("MooncakeConnector", None, ASCEND_MOONCAKE), "pd.yaml", options_from_example({}))
    d = next(x for x in res.diagnostics if x.code == "OPD304")
    assert "vllm-ascend's MooncakeConnectorV1" in (d.label or "") and "kv_connector_module_path" in (d.help or "")
    assert found("OPD304", pair("MooncakeConnector", OOT, OOT)) == []  # both sides load mypkg's class


def test_opd303_nixls_kv_both_deprecation_is_vllms():
    r = registry()["OPD303"]
    assert any("deprecated for NixlConnector" in m for _, m in found("OPD303", r.fail, r.example_context))
    other = found("OPD303", with_path(r.fail, OOT), r.example_context)
    assert other and not any("deprecated" in m for _, m in other)


def test_opd312_judges_vllm_ascends_class_under_vllms_name():
    r = registry()["OPD312"]
    assert found("OPD312", r.fail, r.example_context)
    ascend = with_path(r.fail.replace("MooncakeConnectorV1", "MooncakeConnector"), ASCEND_MOONCAKE)
    assert found("OPD312", ascend, r.example_context)  # vllm-ascend's worker asserts the blocks
    assert found("OPD312", with_path(r.fail, OOT), r.example_context) == []  # not vllm-ascend's class


def test_opd301_help_copies_the_other_sides_module_path():
    text = pair("MooncakeConnector", OOT, OOT).replace(
        f"kv_transfer_config: {{kv_connector: MooncakeConnector, kv_connector_module_path: {OOT}, kv_role: kv_consumer, "
        "engine_id: d}", "max_model_len: 4096")
    res = validate_text(text, "pd.yaml", options_from_example({}))
    helps = [d.help for d in res.diagnostics if d.code == "OPD301"]
    assert helps and f"kv_connector_module_path: {OOT}" in helps[0]


def test_opd602_multiconnector_facts_key_on_each_childs_loaded_class():
    from omni_pd.check.rules.multi_connector import _multi

    two = _multi(["NixlConnector", "MooncakeConnector"])  # two of vLLM's handoff children
    assert any("two P->D handoff children" in m for _, m in found("OPD602", two, {"vllm_version": "0.30"}))
    oot = two.replace("{kv_connector: MooncakeConnector, kv_role",
                      f"{{kv_connector: MooncakeConnector, kv_connector_module_path: {OOT}, kv_role")
    assert not any("two P->D handoff children" in m for _, m in found("OPD602", oot, {"vllm_version": "0.30"}))
    # an out-of-tree class named MultiConnector is not vLLM's: its extra config is its own
    empty = ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
             "  - {stage_id: 0, devices: \"0\", kv_transfer_config: {kv_connector: MultiConnector, kv_role: kv_producer, "
             "engine_id: p}}\n"
             "  - {stage_id: 1, devices: \"1\", kv_transfer_config: {kv_connector: MultiConnector, kv_role: kv_consumer, "
             "engine_id: d}}\n")
    assert found("OPD602", empty)
    assert found("OPD602", with_path(empty, OOT)) == []


def test_all_platforms_checks_a_base_of_vllm_ascend_classes_on_npu(monkeypatch):
    import omni_pd.check.validate as v
    from omni_pd.check.validate import ValidateOptions

    seen: list = []
    real = v._base_platform
    monkeypatch.setattr(v, "_base_platform", lambda cfg, pipe: seen.append(real(cfg, pipe)) or seen[-1])
    for conn, path in (("MooncakeConnectorV1", None), ("MooncakeConnector", ASCEND_MOONCAKE),
                       ("MooncakeConnectorV1", OOT), ("MooncakeConnector", None)):
        validate_text(pair(conn, path, path), "pd.yaml", ValidateOptions(all_platforms=True))
    # vllm-ascend's class by name or by its module path runs on npu only; an OOT class and vLLM's do not
    assert seen == ["npu", "npu", None, None]


def test_opd613_lmcache_transport_is_vllms_lmcache_adapter():
    r = registry()["OPD613"]
    assert found("OPD613", r.fail, r.example_context)
    assert found("OPD613", with_path(r.fail, OOT), r.example_context) == []  # not vLLM's LMCache adapter


def test_opd621_hybrid_state_row_is_the_loaded_connectors():
    """OPD621 reads hybrid_kv.yaml's row of the class loaded: vLLM's MooncakeConnector on 0.21
    cannot move a GDN model's state (error); the same name from an out-of-tree module path has no
    row, so it is 'not pinned' (info), naming the class as loaded."""
    text, ctx = example("OPD621")
    assert [s for s, _ in found("OPD621", text, ctx)] == ["error"]
    assert [s for s, _ in found("OPD621", with_path(text, "vllm.distributed.kv_transfer.kv_connector.v1"
                                                          ".mooncake.mooncake_connector"), ctx)] == ["error"]
    oot = found("OPD621", with_path(text, OOT), ctx)
    assert [s for s, _ in oot] == ["info"]
    assert oot[0][1].startswith(f"MooncakeConnector from {OOT} (out-of-tree) on vLLM 0.21: moving the")


def test_opd612_pipeline_parallel_row_is_the_loaded_connectors():
    """OPD612 reads kv_pp.yaml's row of the class loaded: vLLM's pull NIXL with PP on decode is an
    error on 0.30; an out-of-tree NixlConnector has no row (info: no fact for it)."""
    text, ctx = example("OPD612")
    assert {s for s, _ in found("OPD612", text, ctx)} == {"error"}
    oot = found("OPD612", with_path(text, OOT), ctx)
    assert oot and {s for s, _ in oot} == {"info"}
    assert all(f"over NixlConnector from {OOT} (out-of-tree):" in m for _, m in oot)
