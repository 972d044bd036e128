"""OPD507 and its table presets/targets/advertised_addresses.yaml (issue 22: cross-host
addresses for every transport that advertises one)."""

from __future__ import annotations

import pytest

from rule_found import col, found_with_notes  # tests/rule_found.py

from omni_pd.check.rules import registry
from omni_pd.check.rules.advertised import _epd
from omni_pd.compile.advertised import listeners
from omni_pd.resources import data_dir, load_data

INV = {"inventory": {"hosts": {"host-a": {"address": "10.0.0.1"}, "host-b": {"address": "10.0.0.2"}},
                     "placement": {0: "host-a", 1: "host-b", 2: "host-b"}}}


def test_ec_cpu_producer_default_localhost_exact() -> None:
    text = _epd()
    assert found_with_notes(text, "OPD507", INV) == [(
        "error", "stage 0 (ec_producer) on host-a advertises localhost (default) as its ECCPUConnector address "
        "(env VLLM_EC_SIDE_CHANNEL_HOST); stage 1 on host-b cannot reach it", col(text, "{stage_id: 0"),
        "set env VLLM_EC_SIDE_CHANNEL_HOST: 10.0.0.1 on stage 0", [(*col(text, "{stage_id: 1"), "stage 1 (ec_consumer) on host-b")],
        ["source: vllm 0.30.0 vllm/envs.py:230 VLLM_EC_SIDE_CHANNEL_HOST (default localhost)",
         "source: vllm 0.30.0 vllm/distributed/ec_transfer/ec_connector/cpu/scheduler/__init__.py:164-166: the "
         "producer's peer host is VLLM_EC_SIDE_CHANNEL_HOST",
         "source: vllm 0.34.0 vllm/envs.py:1861-1865 (default \"\") and ec_connector/cpu/scheduler/__init__.py:176-190: "
         "an empty host is get_ip(), the host's routable address"])]


@pytest.mark.parametrize("version, fires", [("0.33", True), ("0.34", False)])
def test_ec_cpu_default_host_is_the_hosts_own_address_from_0_34(version, fires) -> None:
    """vLLM 0.34 changed VLLM_EC_SIDE_CHANNEL_HOST's default from localhost to "" (get_ip()):
    an unset host is routable there; a written localhost stays an error on both releases."""
    assert bool(found_with_notes(_epd(), "OPD507", {**INV, "vllm_version": version})) is fires
    local = _epd(e=", env: {VLLM_EC_SIDE_CHANNEL_HOST: localhost}")
    assert len(found_with_notes(local, "OPD507", {**INV, "vllm_version": version})) == 1
    empty = _epd(e=", env: {VLLM_EC_SIDE_CHANNEL_HOST: ''}")
    assert bool(found_with_notes(empty, "OPD507", {**INV, "vllm_version": version})) is fires


def test_a_written_loopback_is_located_at_its_value_and_the_routable_one_passes() -> None:
    text = _epd(e=", env: {VLLM_EC_SIDE_CHANNEL_HOST: 127.0.0.1}")
    got = found_with_notes(text, "OPD507", INV)
    assert [(g[1].split(" as its")[0], g[2]) for g in got] == [
        ("stage 0 (ec_producer) on host-a advertises '127.0.0.1'", col(text, "127.0.0.1"))]
    assert found_with_notes(_epd(e=", env: {VLLM_EC_SIDE_CHANNEL_HOST: 10.0.0.1}"), "OPD507", INV) == []


def test_without_an_inventory_every_stage_shares_one_host() -> None:
    assert found_with_notes(_epd(), "OPD507", {}) == []


def test_the_kv_side_channel_rows_stay_opd503s() -> None:
    # NIXL prefill advertising localhost to decode on another host: OPD503 reports it, OPD507 does not
    text = _epd(e=", env: {VLLM_EC_SIDE_CHANNEL_HOST: 10.0.0.1}").replace(
        ", env: {VLLM_NIXL_SIDE_CHANNEL_HOST: 10.0.0.2}", "")
    inv = {"inventory": {"hosts": {"a": {}, "b": {}}, "placement": {0: "a", 1: "a", 2: "b"}}}
    assert found_with_notes(text, "OPD507", inv) == []
    assert len(found_with_notes(text, "OPD503", inv)) == 1
    owned = {row.id for row in listeners() if row.checked_by}
    assert owned == {"nixl-side-channel", "mooncake-bootstrap-kv-ip", "mooncake-transfer-host-ip"}
    assert {row.checked_by for row in listeners() if row.checked_by} <= set(registry())


def test_every_row_is_complete_and_names_registered_connectors() -> None:
    ec = set(load_data(data_dir("presets") / "targets" / "ec_connectors.yaml")["connectors"])
    from omni_pd.compile import ascend
    from omni_pd.resources import load_data as _ld

    # every name vLLM's KVConnectorFactory registers in any release omni-pd knows, and vllm-ascend's
    kv = set(_ld(data_dir("presets") / "targets" / "vllm.yaml")["kv_connectors"]) | set(ascend.registered())
    for row in listeners():
        assert row.sources, row.id
        assert row.config in ("kv_transfer_config", "ec_transfer_config"), row.id
        assert set(row.advertiser) | set(row.dialed_by) <= {"kv_producer", "kv_consumer", "kv_both", "ec_producer",
                                                            "ec_consumer", "ec_both"}, row.id
        if row.config == "ec_transfer_config":
            assert set(row.connectors) <= ec, row.id
        else:
            assert set(row.connectors) <= kv, row.id
        assert row.in_config == (row.setting is not None), row.id
    assert len({row.id for row in listeners()}) == len(listeners())
