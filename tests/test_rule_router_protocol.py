"""OPD705 router-protocol and the inventory's router kind (issue 22, BR-52)."""

from __future__ import annotations

import pytest

from omni_pd.check.context import ROUTER_KINDS, Inventory
from omni_pd.check.rules.router_protocol import speaks, table
from omni_pd.check.validate import ValidateOptions, validate_text
from omni_pd.compile import connectors
from omni_pd.diagnostics import Severity

PAIR = ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
        "  - stage_id: 0\n    devices: \"0\"\n"
        "    kv_transfer_config: {{kv_connector: {c}, kv_role: kv_producer, engine_id: p0}}\n"
        "  - stage_id: 1\n    devices: \"1\"\n"
        "    kv_transfer_config: {{kv_connector: {c}, kv_role: kv_consumer, engine_id: d0}}\n")


def _hits(c: str, router: dict, platform: str | None = None):
    inv = Inventory.from_dict({"hosts": {"host-a": {}}, "router": router})
    res = validate_text(PAIR.format(c=c), "pair.yaml", ValidateOptions(inventory=inv, platform=platform))
    return [d for d in res.diagnostics if d.code == "OPD705"]


def test_nixl_relay_in_front_of_mooncake_exact() -> None:
    hits = _hits("MooncakeConnector", {"relays_kv_transfer_params": True})
    assert [(h.severity, h.message) for h in hits] == [(
        Severity.ERROR, "MooncakeConnector (bootstrap): prefill returns no kv_transfer_params to relay; the router must "
        "create a transfer_id and send decode remote_bootstrap_addr/remote_engine_id from the prefill's bootstrap "
        "server, both legs at once; the inventory's router (relay) speaks pull")]
    assert (hits[0].location.line, hits[0].location.column) == (6, 40)  # the MooncakeConnector value
    assert hits[0].help.startswith("run `omni-pd launch` (its router speaks pull, bootstrap and push_front), "
                                   "or a router that speaks bootstrap: vllm-router (--kv-connector mooncake)")


@pytest.mark.parametrize(("c", "router", "fires"), [
    ("NixlConnector", {"relays_kv_transfer_params": True}, False),
    ("MooncakeConnector", {"kind": "omni-pd"}, False),
    ("MooncakeConnector", {"kind": "vllm-router"}, False),
    ("MooncakeConnector", {"kind": "vllm-router", "protocols": ["pull"]}, True),
    ("MooncakeConnector", {"kind": "none"}, False),
    ("MooncakeConnector", {"relays_kv_transfer_params": False}, False),  # OPD702's finding
    ("NixlConnector", {"kind": "dynamo"}, False),
])
def test_router_kinds(c: str, router: dict, fires: bool) -> None:
    assert bool(_hits(c, router)) is fires


def test_prefill_first_router_before_decode_first_connector() -> None:
    hits = _hits("MooncakeLayerwiseConnector", {"kind": "llm-d"}, platform="npu")
    assert len(hits) == 1 and hits[0].message.startswith("MooncakeLayerwiseConnector (push_front): the request must go "
                                                         "to decode first")
    assert _hits("MooncakeLayerwiseConnector", {"kind": "omni-pd"}, platform="npu") == []


def test_inventory_refuses_an_unknown_router_kind() -> None:
    with pytest.raises(ValueError, match="router.kind must be one of omni-pd, vllm-router, llm-d, dynamo, relay, none"):
        Inventory.from_dict({"hosts": {}, "router": {"kind": "nginx"}})


def test_table_kinds_are_the_inventory_kinds_and_protocols_are_the_contracts() -> None:
    t = table()
    assert tuple(t["kinds"]) == ROUTER_KINDS
    protos = {c.router_protocol for c in connectors.registry().values() if c.router_protocol}
    assert set(speaks({"kind": "omni-pd"})) == protos == set(t["needs"])
    for kind, row in t["kinds"].items():
        assert set(row["speaks"] or {}) <= protos, kind
        assert all(v.get("source") for v in (row["speaks"] or {}).values()), kind
