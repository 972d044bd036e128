"""The KV connector contracts (omni_pd/compile/connectors) answer with literal values
derived from the upstream code read, not from the contracts themselves (issue 16: the
property tests compared port ranges with ``contract.ports()``, the code under test).

Upstream facts used (read in vLLM 0.11-0.30 and vllm-omni 0.30.0):

* NIXL binds ``VLLM_NIXL_SIDE_CHANNEL_PORT`` (5557 on 0.11, 5600 from 0.13) plus one port
  per TP worker and DP rank on 0.11 (``dp_rank * tp + tp_rank``), per DP rank from 0.13
  (v1/nixl_connector.py).
* Mooncake: a ``kv_consumer`` binds nothing; a producer binds ``VLLM_MOONCAKE_BOOTSTRAP_PORT``
  (8998) + ``dp_rank * tp + tp_rank`` on 0.13, one port from 0.18. vllm-omni 0.30 gives
  producer replica r ``kv_connector_extra_config.bootstrap_port`` (8998) + r
  (stage_runtime.py ``_prepare_replica_vllm_config``). omni-pd's launcher starts one
  ``vllm serve`` per replica at ``base + r * span``.
* Heterogeneous TP: NIXL < 0.18 decode TP a multiple of prefill TP, from 0.18 either way
  with divisibility; Mooncake < 0.22 equal TP, from 0.22 divisibility.
"""

from __future__ import annotations

import pytest

from omni_pd.compile import connectors
from omni_pd.compile.connectors.base import (Endpoint, PortUse, instance_engine_id, instance_port,
                                              launched_replicas)
from omni_pd.compile.connectors.mooncake import bootstrap_ports, deciding_setting
from omni_pd.compile.targets import target

NIXL = connectors.get("NixlConnector")
MOON = connectors.get("MooncakeConnector")
NP = "VLLM_NIXL_SIDE_CHANNEL_PORT"
MP = "VLLM_MOONCAKE_BOOTSTRAP_PORT"
EXTRA_KEY = "kv_connector_extra_config.bootstrap_port"


# --- registry ------------------------------------------------------------------------------------------

def test_registry_finds_each_module_and_matches_names_case_insensitively() -> None:
    assert {"MooncakeConnector", "NixlConnector", "NixlPushConnector"} <= set(connectors.names())
    assert connectors.names() == sorted(connectors.registry())
    assert connectors.get("nixlconnector") is NIXL and connectors.get("MOONCAKECONNECTOR") is MOON
    assert connectors.get("NoSuchConnector") is None
    for name, c in connectors.registry().items():
        assert c.name == name


def test_transport_packages() -> None:
    assert (NIXL.pip_package, NIXL.import_name, NIXL.port_env) == ("nixl", "nixl", NP)
    assert (MOON.pip_package, MOON.import_name, MOON.port_env) == ("mooncake-transfer-engine", "mooncake.engine", MP)


# --- base helpers ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("raw", "n"), [(None, 1), (0, 1), (1, 1), (3, 3), ("2", 2), ("x", 1), (-2, 1)])
def test_launched_replicas(raw, n) -> None:
    assert launched_replicas(raw) == n


def test_instance_port_and_engine_id() -> None:
    assert [instance_port(6000, 2, r) for r in range(3)] == [6000, 6002, 6004]
    assert instance_port(6000, 0, 2) == 6002  # a zero span still moves each instance by one
    assert instance_engine_id("p", 1, 2) == "p-r1" and instance_engine_id("p", 0, 1) == "p"


# --- NIXL ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("version", "tp", "dp", "span"), [
    ("0.11", 1, 1, 1), ("0.11", 2, 1, 2), ("0.11", 2, 2, 4),
    ("0.13", 2, 1, 1), ("0.13", 2, 2, 2), ("0.30", 4, 1, 1), ("0.30", 1, 3, 3)])
def test_nixl_span_per_version_tp_dp(version, tp, dp, span) -> None:
    t = target(version)
    assert NIXL.port_span("prefill", tp, dp, t) == span
    assert NIXL.port_span("decode", tp, dp, t) == span
    assert NIXL.port_span("prefill", tp, dp, t, runtime="vllm", replicas=3) == 3 * span
    assert NIXL.port_span("prefill", tp, dp, t, runtime="vllm-omni", replicas=3) == span


def test_nixl_default_base_per_version() -> None:
    assert NIXL.default_port_base(target("0.11")) == 5557
    assert NIXL.default_port_base(target("0.30")) == 5600


def test_nixl_configure() -> None:
    got = NIXL.configure(Endpoint("decode", "d", "10.0.0.2", tp=2, port_base=5610, kv_buffer_device="cpu"),
                         target("0.30"))
    assert got.kv_transfer_config == {"kv_connector": "NixlConnector", "kv_role": "kv_consumer", "engine_id": "d",
                                      "kv_buffer_device": "cpu"}
    assert got.env == {"VLLM_NIXL_SIDE_CHANNEL_HOST": "10.0.0.2", NP: "5610"} and got.env_remove == ()
    assert NIXL.configure(Endpoint("prefill", "p", "h"), target("0.11")).env[NP] == "5557"


def test_nixl_ports_on_the_launcher_and_under_vllm_omni() -> None:
    t = target("0.11")
    assert NIXL.ports("prefill", {}, {NP: "6000"}, 2, 1, t, runtime="vllm", replicas=2) == [
        PortUse(6000, 2, "NIXL side channel", NP, replica=0, key=NP),
        PortUse(6002, 2, "NIXL side channel", NP, replica=1, key=NP)]
    assert NIXL.ports("prefill", {}, {NP: 6000}, 2, 1, t, runtime="vllm-omni", replicas=2) == [
        PortUse(6000, 2, "NIXL side channel", NP, replica=0, key=NP),
        PortUse(6000, 2, "NIXL side channel", NP, replica=1, key=NP)]
    assert NIXL.ports("decode", {}, {}, 1, 2, target("0.30")) == [
        PortUse(5600, 2, "NIXL side channel", NP, replica=0, key=None)]
    assert NIXL.ports("decode", {}, None, 1, 1, target("0.30")) == [
        PortUse(5600, 1, "NIXL side channel", NP, replica=0, key=None)]
    assert NIXL.ports("decode", {}, {NP: "port"}, 1, 1, target("0.30")) == []


@pytest.mark.parametrize(("version", "p", "d", "err"), [
    ("0.13", 2, 2, None), ("0.13", 2, 4, None),
    ("0.13", 4, 2, "NixlConnector on vLLM 0.13 needs decode TP to be a multiple of prefill TP"),
    ("0.13", 2, 3, "NixlConnector on vLLM 0.13 needs decode TP to be a multiple of prefill TP"),
    ("0.18", 4, 2, None), ("0.18", 2, 4, None),
    ("0.30", 2, 3, "NixlConnector needs one TP size to divide the other (got 2 and 3)"),
    ("0.30", 3, 2, "NixlConnector needs one TP size to divide the other (got 3 and 2)")])
def test_nixl_heterogeneous_tp(version, p, d, err) -> None:
    assert NIXL.hetero_tp_error(p, d, target(version)) == err


# --- Mooncake ------------------------------------------------------------------------------------------------

def test_mooncake_span() -> None:
    assert MOON.port_span("decode", 2, 2, target("0.30"), runtime="vllm", replicas=3) == 0
    assert MOON.port_span("prefill", 2, 2, target("0.13")) == 4
    assert MOON.port_span("prefill", 2, 2, target("0.18")) == 1
    assert MOON.port_span("prefill", 1, 1, target("0.30"), runtime="vllm", replicas=3) == 3
    assert MOON.port_span("prefill", 2, 2, target("0.13"), runtime="vllm", replicas=2) == 8
    assert MOON.port_span("prefill", 1, 1, target("0.30"), runtime="vllm-omni", replicas=4) == 4
    assert MOON.port_span("prefill", 1, 1, target("0.18"), runtime="vllm-omni", replicas=4) == 1
    assert MOON.default_port_base(target("0.30")) == 25201


def test_mooncake_deciding_setting() -> None:
    t = target("0.30")
    assert deciding_setting({"kv_role": "kv_producer"}, t, "vllm-omni") == EXTRA_KEY
    assert deciding_setting({"kv_role": "kv_both"}, t, "vllm-omni") == "env"
    assert deciding_setting({"kv_role": "kv_producer"}, t, "vllm") == "env"
    assert deciding_setting(None, t, "vllm-omni") == "env"
    assert deciding_setting({"kv_role": "kv_producer"}, target("0.18"), "vllm-omni") == "env"


def test_mooncake_configure() -> None:
    t = target("0.30")
    p = MOON.configure(Endpoint("prefill", "p", "10.0.0.1", runtime="vllm-omni", kv_buffer_device="cuda"), t)
    assert p.kv_transfer_config == {"kv_connector": "MooncakeConnector", "kv_role": "kv_producer", "engine_id": "p",
                                    "kv_ip": "10.0.0.1", "kv_buffer_device": "cuda",
                                    "kv_connector_extra_config": {"bootstrap_port": 25201}}
    assert (p.env, p.env_remove) == ({MP: "25201"}, ())
    d = MOON.configure(Endpoint("decode", "d", "10.0.0.1", runtime="vllm-omni"), t)
    assert d.kv_transfer_config == {"kv_connector": "MooncakeConnector", "kv_role": "kv_consumer", "engine_id": "d",
                                    "kv_ip": "10.0.0.1"}
    assert (d.env, d.env_remove) == ({}, (MP,))
    v = MOON.configure(Endpoint("prefill", "p", "h", port_base=30000), t)
    assert "kv_connector_extra_config" not in v.kv_transfer_config and v.env == {MP: "30000"}


def test_mooncake_bootstrap_ports() -> None:
    t = target("0.30")
    prod = {"kv_role": "kv_producer", "kv_connector_extra_config": {"bootstrap_port": 30000}}
    assert bootstrap_ports(prod, {MP: "1"}, 1, 1, t, "vllm-omni", 3) == [
        PortUse(30000 + r, 1, "Mooncake bootstrap", MP, replica=r, key=EXTRA_KEY) for r in range(3)]
    assert bootstrap_ports(prod, {MP: "31000"}, 1, 1, t, "vllm", 2) == [
        PortUse(31000, 1, "Mooncake bootstrap", MP, replica=0, key=MP),
        PortUse(31001, 1, "Mooncake bootstrap", MP, replica=1, key=MP)]
    both = {"kv_role": "kv_both"}
    assert bootstrap_ports(both, {MP: "32000"}, 1, 1, t, "vllm-omni", 2) == [
        PortUse(32000, 1, "Mooncake bootstrap", MP, replica=0, key=MP),
        PortUse(32000, 1, "Mooncake bootstrap", MP, replica=1, key=MP)]
    assert bootstrap_ports({"kv_role": "kv_producer"}, {}, 2, 2, target("0.13"), "vllm", 1) == [
        PortUse(8998, 4, "Mooncake bootstrap (env VLLM_MOONCAKE_BOOTSTRAP_PORT default)", MP, replica=0, key=None)]
    assert bootstrap_ports({"kv_role": "kv_consumer"}, {MP: "1"}, 1, 1, t) == []
    assert bootstrap_ports({"kv_role": "kv_producer"}, {MP: True}, 1, 1, t) == []
    assert bootstrap_ports({"kv_role": "kv_producer"}, {MP: " 9000 "}, 1, 1, t)[0].port == 9000
    assert bootstrap_ports(None, None, 1, 1, t)[0].port == 8998


def test_mooncake_ports_take_the_role_from_the_side() -> None:
    t = target("0.30")
    assert MOON.ports("decode", {}, {MP: "9000"}, 1, 1, t) == []
    assert MOON.ports("prefill", {}, {MP: "9000"}, 1, 1, t) == [
        PortUse(9000, 1, "Mooncake bootstrap", MP, replica=0, key=MP)]


@pytest.mark.parametrize(("version", "p", "d", "err"), [
    ("0.18", 2, 2, None),
    ("0.18", 1, 2, "MooncakeConnector on vLLM 0.18 needs equal TP on prefill and decode"),
    ("0.22", 2, 4, None), ("0.30", 4, 2, None),
    ("0.30", 2, 3, "MooncakeConnector needs one TP size to divide the other (got 2 and 3)")])
def test_mooncake_heterogeneous_tp(version, p, d, err) -> None:
    assert MOON.hetero_tp_error(p, d, target(version)) == err


# --- defaults (survivors of bench/mutation.py on the connector modules) -----------------------------------

def test_default_runtime_is_omni_pds_launcher_and_default_replicas_one() -> None:
    t = target("0.30")
    assert NIXL.port_span("prefill", 1, 1, t, replicas=3) == 3
    assert [u.port for u in NIXL.ports("prefill", {}, {NP: "6000"}, 1, 1, t, replicas=2)] == [6000, 6001]
    assert len(bootstrap_ports({"kv_role": "kv_producer"}, {}, 1, 1, t)) == 1
    assert MOON.port_span("prefill", 1, 1, t, runtime="vllm-omni", replicas=1) == 1
    assert MOON.port_span("prefill", 1, 1, t, runtime="vllm-omni") == 1


def test_mooncake_ports_pass_tp_and_dp_and_treat_other_sides_as_producers() -> None:
    assert MOON.ports("prefill", {}, {}, 2, 2, target("0.13")) == [
        PortUse(8998, 4, "Mooncake bootstrap (env VLLM_MOONCAKE_BOOTSTRAP_PORT default)", MP, replica=0, key=None)]
    assert [u.port for u in MOON.ports("encoder", {}, {MP: "9100"}, 1, 1, target("0.30"))] == [9100]
    # as a producer, vllm-omni 0.30 reads kv_connector_extra_config.bootstrap_port, not the env
    assert [u.port for u in MOON.ports("encoder", {"kv_connector_extra_config": {"bootstrap_port": 9200}},
                                       {MP: "9100"}, 1, 1, target("0.30"), runtime="vllm-omni")] == [9200]


def test_unread_keys_per_runtime() -> None:
    t = target("0.30")
    assert MOON.unread_keys(t) == ("kv_connector_extra_config.mooncake_bootstrap_port",
                                   "kv_connector_extra_config.bootstrap_port")
    assert MOON.unread_keys(t, "vllm-omni") == ("kv_connector_extra_config.mooncake_bootstrap_port",)
    assert NIXL.unread_keys(t) == () and NIXL.unread_keys(t, "vllm-omni") == ()


def test_the_base_contract_binds_nothing_and_wants_equal_tp() -> None:
    from omni_pd.compile.connectors.base import KVConnector

    class Bare(KVConnector):
        name = "BareConnector"

    b, t = Bare(), target("0.30")
    assert b.default_port_base(t) is None
    assert b.port_span("prefill", 2, 2, t) == 0 and b.port_span("prefill", 2, 2, t, runtime="vllm", replicas=3) == 0
    assert b.ports("prefill", {}, {}, 2, 2, t) == [] and b.unread_keys(t) == ()
    assert b.hetero_tp_error(1, 2, t) == "BareConnector needs equal tensor parallel size on prefill and decode"
    assert b.hetero_tp_error(2, 2, t) is None
    with pytest.raises(NotImplementedError):
        b.configure(Endpoint("prefill", "p", "h"), t)
