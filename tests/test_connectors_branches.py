"""Branch tests of the connector modules no other test calls directly: LMCache's transport
verdict (omni_pd/compile/connectors/lmcache.py, read by OPD613/OPD702) and vllm-ascend's
Mooncake connectors (ascend_mooncake.py, ascend_layerwise.py), each method with literal
values (issue 16, mutation survivors).

Upstream facts the values come from:

* LMCache (vLLM 0.30.0 ``kv_connector/v1/lmcache_integration/utils.py``): settings from
  ``LMCACHE_*`` environment variables, overridden by ``kv_connector_extra_config`` keys
  prefixed ``lmcache.``; booleans parsed from ``1/true/yes/on`` (any case); PD mode needs
  ``enable_pd`` on both sides with ``pd_role`` sender (prefill) / receiver (decode); store
  mode one ``remote_url`` both hosts reach.
* vllm-ascend (presets/targets/vllm_ascend.yaml, each fact with its file:line):
  ``MooncakeConnectorV1`` binds ``[kv_port, kv_port + dp*tp*pp)``, ``MooncakeLayerwiseConnector``
  ``[kv_port, kv_port + dp*tp)``; omni-pd's first ``kv_port`` is 36000 (above
  AscendDirectTransport's ``[20000, 36000)`` on a 16-NPU node); peer blocks ``prefill``/``decode``
  read by the pull connector always and by the layerwise one before vllm-ascend 0.18;
  prefill TP >= decode TP and divisible by it.
"""

from __future__ import annotations

import pytest

from omni_pd.compile import connectors
from omni_pd.compile.connectors.base import Endpoint, PortUse, SideConfig
from omni_pd.compile.connectors.lmcache import SideConfig as LmSide, Verdict, _loopback, _truthy, side_config, transport
from omni_pd.compile.targets import target

PULL = connectors.get("MooncakeConnectorV1")
PUSH = connectors.get("MooncakeLayerwiseConnector")


# --- LMCache: settings of one side ---------------------------------------------------------------------

@pytest.mark.parametrize("v", [True, 1, "1", "true", "TRUE", " yes ", "Yes", "on", "ON"])
def test_lmcache_truthy_values(v) -> None:
    assert _truthy(v) is True


@pytest.mark.parametrize("v", [False, None, 0, "0", "false", "no", "off", "", "enabled", "y"])
def test_lmcache_falsy_values(v) -> None:
    assert _truthy(v) is False


def test_lmcache_side_config_from_env_only() -> None:
    env = {"LMCACHE_ENABLE_PD": "True", "LMCACHE_PD_ROLE": "sender", "LMCACHE_REMOTE_URL": "lm://store:65432",
           "LMCACHE_CONFIG_FILE": "/etc/lmcache.yaml"}
    assert side_config({}, env) == LmSide(
        enable_pd=True, pd_role="sender", remote_url="lm://store:65432", config_file="/etc/lmcache.yaml",
        source={"enable_pd": "env:LMCACHE_ENABLE_PD", "pd_role": "env:LMCACHE_PD_ROLE",
                "remote_url": "env:LMCACHE_REMOTE_URL"})


def test_lmcache_extra_config_wins_over_env_and_values_become_strings() -> None:
    kv = {"kv_connector_extra_config": {"lmcache.enable_pd": False, "lmcache.pd_role": "receiver",
                                        "lmcache.remote_url": "redis://cache:6379", "remote_url": "ignored://x"}}
    env = {"LMCACHE_ENABLE_PD": "1", "LMCACHE_PD_ROLE": "sender", "LMCACHE_REMOTE_URL": "lm://other:1"}
    assert side_config(kv, env) == LmSide(
        enable_pd=False, pd_role="receiver", remote_url="redis://cache:6379", config_file=None,
        source={"enable_pd": "extra:lmcache.enable_pd", "pd_role": "extra:lmcache.pd_role",
                "remote_url": "extra:lmcache.remote_url"})
    # a non-string value (YAML int) is carried as its text
    assert side_config({"kv_connector_extra_config": {"lmcache.pd_role": 7}}, {}).pd_role == "7"


def test_lmcache_empty_values_are_unset_and_fall_back() -> None:
    """An empty env value or extra key counts as not set: the other source (or nothing) decides."""
    env = {"LMCACHE_REMOTE_URL": "", "LMCACHE_PD_ROLE": "", "LMCACHE_ENABLE_PD": "", "LMCACHE_CONFIG_FILE": ""}
    assert side_config({}, env) == LmSide(enable_pd=False, pd_role=None, remote_url=None, config_file=None, source={})
    kv = {"kv_connector_extra_config": {"lmcache.remote_url": "", "lmcache.pd_role": None}}
    got = side_config(kv, {"LMCACHE_REMOTE_URL": "lm://a:1", "LMCACHE_PD_ROLE": "sender"})
    assert (got.remote_url, got.pd_role, got.source) == (
        "lm://a:1", "sender", {"pd_role": "env:LMCACHE_PD_ROLE", "remote_url": "env:LMCACHE_REMOTE_URL"})


def test_lmcache_extra_config_that_is_not_a_mapping_is_ignored() -> None:
    got = side_config({"kv_connector_extra_config": ["lmcache.remote_url"]}, {"LMCACHE_REMOTE_URL": "lm://a:1"})
    assert (got.remote_url, got.source) == ("lm://a:1", {"remote_url": "env:LMCACHE_REMOTE_URL"})
    assert side_config({"kv_connector_extra_config": None}, {}) == LmSide(False, None, None, None, {})


# --- LMCache: loopback backends ------------------------------------------------------------------------

@pytest.mark.parametrize(("url", "loop"), [
    ("lm://localhost:65432", True), ("lm://LOCALHOST:65432", True), ("redis://127.0.0.1:6379", True),
    ("redis://127.1.2.3:6379", True), ("redis://[::1]:6379", True), ("lm://0.0.0.0:65432", True),
    ("localhost:65432", True), ("LocalHost:65432", True), ("127.0.0.5:6379", True), ("0.0.0.0", True),
    ("lm://store:65432", False), ("redis://10.0.0.7:6379", False), ("store:65432", False),
    ("lm://128.0.0.1:1", False), ("lm://", False), ("10.127.0.1:9", False)])
def test_lmcache_loopback(url, loop) -> None:
    assert _loopback(url) is loop


# --- LMCache: the transport verdict --------------------------------------------------------------------

def _side(pd: bool = False, role: str | None = None, url: str | None = None, cfg: str | None = None) -> LmSide:
    return LmSide(enable_pd=pd, pd_role=role, remote_url=url, config_file=cfg, source={})


def test_lmcache_pd_mode_verdicts() -> None:
    assert transport(_side(True, "sender"), _side(True, "receiver"), False) == Verdict("pd")
    assert transport(_side(True, "sender"), _side(), True) == Verdict(
        "pd", "LMCache PD mode (enable_pd) is on for one side only; decode does not have it")
    assert transport(_side(), _side(True, "receiver"), True) == Verdict(
        "pd", "LMCache PD mode (enable_pd) is on for one side only; prefill does not have it")
    assert transport(_side(True, "receiver"), _side(True, "sender"), True) == Verdict(
        "pd", "LMCache PD mode needs pd_role sender on prefill and receiver on decode (got receiver / sender)")
    assert transport(_side(True), _side(True, "receiver"), True) == Verdict(
        "pd", "LMCache PD mode needs pd_role sender on prefill and receiver on decode (got none / receiver)")
    assert transport(_side(True, "sender"), _side(True), True) == Verdict(
        "pd", "LMCache PD mode needs pd_role sender on prefill and receiver on decode (got sender / none)")


def test_lmcache_pd_mode_wins_over_a_shared_store() -> None:
    assert transport(_side(True, "sender", "lm://a:1"), _side(True, "receiver", "lm://b:1"), False) == Verdict("pd")


def test_lmcache_store_verdicts() -> None:
    assert transport(_side(url="lm://store:1"), _side(url="lm://store:1"), False) == Verdict("store")
    assert transport(_side(url="lm://a:1"), _side(url="lm://b:1"), True) == Verdict(
        "store", "prefill and decode use different LMCache remote backends (lm://a:1 / lm://b:1): "
                 "decode never finds prefill's KV")
    assert transport(_side(url="lm://localhost:1"), _side(url="lm://localhost:1"), False) == Verdict(
        "store", "remote_url lm://localhost:1 is a loopback address and the stages run on two hosts: "
                 "each host reaches its own store")
    assert transport(_side(url="lm://localhost:1"), _side(url="lm://localhost:1"), True) == Verdict("store")


def test_lmcache_one_sided_store_or_config_file() -> None:
    """A remote_url on one side only is no store transport; an LMCACHE_CONFIG_FILE on either
    side may set one omni-pd cannot read."""
    assert transport(_side(url="lm://a:1"), _side(), False) == Verdict("none")
    assert transport(_side(), _side(url="lm://a:1"), False) == Verdict("none")
    assert transport(_side(cfg="/p.yaml"), _side(), False) == Verdict("unknown")
    assert transport(_side(), _side(cfg="/d.yaml"), False) == Verdict("unknown")
    assert transport(_side(url="lm://a:1", cfg="/p.yaml"), _side(), False) == Verdict("unknown")
    assert transport(_side(), _side(), False) == Verdict("none")


# --- vllm-ascend MooncakeConnectorV1 / MooncakeLayerwiseConnector --------------------------------------

def test_ascend_contract_attributes() -> None:
    assert (PULL.name, PULL.router_protocol, PULL.platforms, PULL.pip_package, PULL.import_name) == (
        "MooncakeConnectorV1", "pull", ("npu",), "mooncake-transfer-engine", "mooncake.engine")
    assert PULL.routing_fields == ("remote_engine_id", "remote_host", "remote_port", "remote_block_ids")
    assert dict(PULL.router_prefill_params) == {"do_remote_decode": True, "do_remote_prefill": False,
                                                "remote_engine_id": None, "remote_block_ids": None,
                                                "remote_host": None, "remote_port": None}
    assert (PUSH.name, PUSH.router_protocol, PUSH.routing_fields, PUSH.platforms) == (
        "MooncakeLayerwiseConnector", "push_front", ("metaserver",), ("npu",))


@pytest.mark.parametrize("c", [PULL, PUSH], ids=["pull", "push"])
def test_ascend_default_port_base(c) -> None:
    assert c.default_port_base(target("0.23")) == 36000
    assert c.default_port_base(target("0.13")) == 36000


@pytest.mark.parametrize(("c", "tp", "dp", "replicas", "span"), [
    (PULL, 1, 1, 1, 1), (PULL, 2, 3, 1, 6), (PULL, 4, 2, 3, 24), (PULL, 2, 1, 0, 2), (PULL, 2, 1, "2", 4),
    (PUSH, 1, 1, 1, 1), (PUSH, 2, 3, 1, 6), (PUSH, 4, 1, 2, 8)])
def test_ascend_port_span(c, tp, dp, replicas, span) -> None:
    """One engine binds dp*tp ports (pp is 1 here); a stage of ``replicas`` engines reserves
    that many ranges, on either side and runtime."""
    t = target("0.23")
    assert c.port_span("prefill", tp, dp, t, replicas=replicas) == span
    assert c.port_span("prefill", tp, dp, t) == tp * dp  # one engine by default
    assert c.port_span("decode", tp, dp, t, runtime="vllm-omni", replicas=replicas) == span


def _blocks(tp: int, dp: int) -> dict:
    return {"prefill": {"dp_size": dp, "tp_size": tp}, "decode": {"dp_size": dp, "tp_size": tp}}


def test_ascend_pull_configure_writes_kv_port_engine_id_and_symmetric_peer_blocks() -> None:
    t = target("0.23")
    assert PULL.configure(Endpoint("prefill", "p-0", "10.0.0.1", tp=4, dp=2, port_base=37000), t) == SideConfig(
        kv_transfer_config={"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_producer", "kv_port": 37000,
                            "engine_id": "p-0", "kv_connector_extra_config": _blocks(4, 2)}, env={})
    # no port decided: the connector's default base
    assert PULL.configure(Endpoint("decode", "d-0", "10.0.0.2", tp=2), t) == SideConfig(
        kv_transfer_config={"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_consumer", "kv_port": 36000,
                            "engine_id": "d-0", "kv_connector_extra_config": _blocks(2, 1)}, env={})


@pytest.mark.parametrize(("vllm", "blocks"), [("0.13", True), ("0.18", False), ("0.23", False), ("0.30", False)])
def test_ascend_layerwise_peer_blocks_only_before_vllm_ascend_018(vllm, blocks) -> None:
    """vllm-ascend 0.13.0 (on vLLM 0.13) asserts the peer blocks; from 0.18.0 decode sends its TP
    per request. vLLM 0.30 has no vllm-ascend release: no blocks."""
    kv = {"kv_connector": "MooncakeLayerwiseConnector", "kv_role": "kv_producer", "kv_port": 36100, "engine_id": "p"}
    if blocks:
        kv["kv_connector_extra_config"] = _blocks(2, 1)
    assert PUSH.configure(Endpoint("prefill", "p", "h", tp=2, port_base=36100), target(vllm)) == SideConfig(
        kv_transfer_config=kv, env={})


@pytest.mark.parametrize("c", [PULL, PUSH], ids=["pull", "push"])
def test_ascend_ports_per_runtime(c) -> None:
    """omni-pd's launcher gives instance r ``kv_port + r*span``; on vllm-omni every replica reads
    the same ``kv_port``. The value may be a string; no (integer) kv_port binds nothing."""
    t = target("0.23")
    purpose = f"kv_port + rank ({c.name})"
    assert c.ports("prefill", {"kv_port": "37000"}, {}, 2, 2, t, runtime="vllm", replicas=3) == [
        PortUse(37000, 4, purpose, None, replica=0, key="kv_port"),
        PortUse(37004, 4, purpose, None, replica=1, key="kv_port"),
        PortUse(37008, 4, purpose, None, replica=2, key="kv_port")]
    assert c.ports("decode", {"kv_port": 37000}, {}, 2, 1, t, runtime="vllm-omni", replicas=2) == [
        PortUse(37000, 2, purpose, None, replica=0, key="kv_port"),
        PortUse(37000, 2, purpose, None, replica=1, key="kv_port")]
    assert c.ports("prefill", {"kv_port": 37000}, {}, 1, 1, t) == [PortUse(37000, 1, purpose, None, 0, "kv_port")]
    assert c.ports("prefill", {"kv_port": 37000}, {}, 1, 1, t, replicas=0) == [
        PortUse(37000, 1, purpose, None, 0, "kv_port")]
    assert c.ports("prefill", {}, {}, 2, 2, t) == []
    assert c.ports("prefill", None, {}, 2, 2, t) == []
    assert c.ports("prefill", {"kv_port": True}, {}, 2, 2, t) == []
    assert c.ports("prefill", {"kv_port": "x"}, {}, 2, 2, t) == []


@pytest.mark.parametrize("c", [PULL, PUSH], ids=["pull", "push"])
def test_ascend_hetero_tp(c) -> None:
    t = target("0.23")
    assert c.hetero_tp_error(4, 2, t) is None and c.hetero_tp_error(2, 2, t) is None
    assert c.hetero_tp_error(2, 4, t) == (
        f"vllm-ascend {c.name} needs prefill TP >= decode TP and divisible by it (got P=2, D=4)")
    assert c.hetero_tp_error(4, 3, t) == (
        f"vllm-ascend {c.name} needs prefill TP >= decode TP and divisible by it (got P=4, D=3)")


# --- MooncakeConnector.unread_keys per side: the deciding extra key is read for a kv_producer only ---

@pytest.mark.parametrize("version,runtime,side,want", [
    # vllm-omni 0.30 reads kv_connector_extra_config.bootstrap_port for a kv_producer only
    # (stage_runtime.py _prepare_replica_vllm_config): unread on decode, read on prefill
    ("0.30", "vllm-omni", "decode", ("kv_connector_extra_config.mooncake_bootstrap_port",
                                     "kv_connector_extra_config.bootstrap_port")),
    ("0.30", "vllm-omni", "prefill", ("kv_connector_extra_config.mooncake_bootstrap_port",)),
    ("0.30", "vllm-omni", None, ("kv_connector_extra_config.mooncake_bootstrap_port",)),
    # where the env var decides (plain vLLM; vllm-omni 0.28) both keys are unread on every side
    ("0.30", "vllm", "decode", ("kv_connector_extra_config.mooncake_bootstrap_port",
                                "kv_connector_extra_config.bootstrap_port")),
    ("0.28", "vllm-omni", "decode", ("kv_connector_extra_config.mooncake_bootstrap_port",
                                     "kv_connector_extra_config.bootstrap_port")),
])
def test_mooncake_unread_keys_per_side(version, runtime, side, want) -> None:
    moon = connectors.get("MooncakeConnector")
    assert moon.unread_keys(target(version), runtime, side=side) == want


def test_base_and_nixl_unread_keys_take_a_side() -> None:
    for name in ("NixlConnector",):
        assert connectors.get(name).unread_keys(target("0.30"), "vllm-omni", side="decode") == ()
