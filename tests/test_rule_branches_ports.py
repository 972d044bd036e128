"""Every branch of the port rules (OPD501-OPD506, omni_pd/check/rules/ports.py) with exact
messages, locations and help lines (issue 16: each rule had only its doc example, which the
mutation run of bench/mutation.py showed leaves most branches unpinned).

Each test names the branch it pins. The rule-example golden is in tests/test_rule_branches.py.
"""

from __future__ import annotations

import pytest

from omni_pd.check.context import Inventory
from omni_pd.check.validate import ValidateOptions, validate_text
from omni_pd.diagnostics import Severity
from rule_found import found  # tests/rule_found.py

E, W = Severity.ERROR, Severity.WARNING
PD = "pipeline: qwen3_omni_moe_pd\nasync_chunk: false\nstages:\n"
#: a PD pair launched as two plain `vllm serve` engines (runtime `vllm`: per-engine ports)
LLM_PD = "pipeline: llm_pd\nasync_chunk: false\nstages:\n"
NIXL = "{{kv_connector: NixlConnector, kv_role: kv_{role}, engine_id: {eid}{x}}}"
MC = "{{kv_connector: MooncakeConnector, kv_role: kv_{role}, engine_id: {eid}{x}}}"
HELP_504 = "use a free port number between 1024 and 65535"


def hits(text: str, code: str, opts: ValidateOptions | None = None) -> list[tuple]:
    """:func:`rule_found.found` with the severity as a :class:`Severity` (``E``/``W`` here)."""
    return [(Severity(sev), *rest) for sev, *rest in found(text, code, opts=opts)]


def stage(sid: int, kv: str, *, devices: str = "0", extra: str = "", role: str = "producer", eid: str = "p",
          x: str = "") -> str:
    """One flow-style stage line (line ``4 + sid`` of the file)."""
    return (f"  - {{stage_id: {sid}, devices: \"{devices}\"{extra}, kv_transfer_config: "
            + kv.format(role=role, eid=eid, x=x) + "}\n")


def pair(kv: str, p_extra: str = "", d_extra: str = "", *, head: str = PD, p_x: str = "", d_x: str = "",
         p_dev: str = "0", d_dev: str = "1") -> str:
    return head + stage(0, kv, devices=p_dev, extra=p_extra, x=p_x) + \
        stage(1, kv, devices=d_dev, extra=d_extra, role="consumer", eid="d", x=d_x)


def env(**kv: str) -> str:
    return ", env: {" + ", ".join(f"{k}: \"{v}\"" for k, v in kv.items()) + "}"


# --- where a bound port comes from (bound_ports) --------------------------------------------------

def test_opd501_default_nixl_ports_point_at_the_connector_and_name_the_env_default() -> None:
    # no VLLM_NIXL_SIDE_CHANNEL_PORT: both take the default 5600, located at each kv_connector value
    purpose = "NIXL side channel (VLLM_NIXL_SIDE_CHANNEL_PORT default)"
    assert hits(pair(NIXL), "OPD501") == [(
        E, f"port 5600 on the shared host bound by stage 0 ({purpose}, 5600) and stage 1 ({purpose}, 5600)",
        (5, 68), "move stage 1's range to start at 5601 or above", [(4, 68, "stage 0 binds 5600")])]


def test_opd501_nixl_on_vllm_011_spans_tp_ports_from_its_own_default() -> None:
    purpose = "NIXL side channel (VLLM_NIXL_SIDE_CHANNEL_PORT default)"
    text = pair(NIXL, ", tensor_parallel_size: 2", p_dev="0,2")
    assert hits(text, "OPD501", ValidateOptions(vllm_version="0.11")) == [(
        E, f"port 5557 on the shared host bound by stage 0 ({purpose}, 5557-5558) and stage 1 ({purpose}, 5557)",
        (5, 68), "move stage 1's range to start at 5559 or above", [(4, 95, "stage 0 binds 5557-5558")])]


def test_opd501_the_side_of_a_stage_outside_a_pd_pipeline_comes_from_its_kv_role() -> None:
    # no pd_role on a pipeline without a split: the kv_consumer binds no Mooncake bootstrap port,
    # the kv_producer binds its bootstrap_port, which stage 2's API port then clashes with
    x = ", kv_connector_extra_config: {bootstrap_port: 25201}"
    text = ("pipeline: qwen3_omni_moe\nstages:\n" + stage(0, MC, x=x)
            + stage(1, MC, devices="1", role="consumer", eid="d", x=x) + "  - {stage_id: 2, devices: \"2\", port: 25201}\n")
    assert hits(text, "OPD501") == [(
        E, "port 25201 on the shared host bound by stage 0 (Mooncake bootstrap, 25201) and stage 2 (API server --port, "
        "25201)", (5, 39), "move stage 2's range to start at 25202 or above", [(3, 167, "stage 0 binds 25201")])]


def test_opd501_p2pnccl_kv_port_default_spans_tp_and_its_http_port_meets_an_api_port() -> None:
    p2p = "{{kv_connector: P2pNcclConnector, kv_role: kv_{role}, engine_id: {eid}{x}}}"
    text = pair(p2p, ", tensor_parallel_size: 2", ", port: 8100", p_dev="0,1", d_dev="2",
                p_x=", kv_connector_extra_config: {http_port: 8100}")
    for opts in (None, ValidateOptions(vllm_version="0.10")):
        assert hits(text, "OPD501", opts) == [
            (E, "port 8100 on the shared host bound by stage 0 (API server (http_port), 8100) and stage 1 "
                "(API server --port, 8100)", (5, 39), "move stage 1's range to start at 8101 or above",
             [(4, 188, "stage 0 binds 8100")]),
            (E, "port 14579 on the shared host bound by stage 0 (kv_port + rank (P2pNcclConnector), 14579-14580) and "
                "stage 1 (kv_port + rank (P2pNcclConnector), 14579)", (5, 45),
             "move stage 1's range to start at 14581 or above", [(4, 60, "stage 0 binds 14579-14580")])]


@pytest.mark.parametrize("conn", ["MooncakeConnectorV1", "MooncakeLayerwiseConnector"])
def test_opd501_mooncake_v1_before_vllm_011_spans_dp_ranks_and_p2pnccl_does_not(conn: str) -> None:
    # vLLM < 0.11: no contract; kv_port + rank over tp x pp x dp (P2pNccl: tp x pp, dp ranks apart)
    mv1 = "{{kv_connector: " + conn + ", kv_role: kv_{role}, engine_id: {eid}{x}}}"
    p2p = "{{kv_connector: P2pNcclConnector, kv_role: kv_{role}, engine_id: {eid}{x}}}"
    old = ValidateOptions(vllm_version="0.10")
    text = pair(mv1, ", data_parallel_size: 2", p_x=", kv_port: 30000", d_x=", kv_port: 30001")
    wider = len(conn) - len("MooncakeConnectorV1")
    assert hits(text, "OPD501", old) == [(
        E, f"port 30001 on the shared host bound by stage 0 (kv_port + rank ({conn}), 30000-30001) and "
        f"stage 1 (kv_port + rank ({conn}), 30001)", (5, 134 + wider),
        "move stage 1's range to start at 30002 or above", [(4, 157 + wider, "stage 0 binds 30000-30001")])]
    assert hits(pair(p2p, ", data_parallel_size: 2", p_x=", kv_port: 30000", d_x=", kv_port: 30001"),
                "OPD501", old) == []


def test_opd501_replicas_of_one_stage_on_vllm_omni_share_the_side_channel_port() -> None:
    text = pair(NIXL, ", num_replicas: 2" + env(VLLM_NIXL_SIDE_CHANNEL_PORT=5600),
                env(VLLM_NIXL_SIDE_CHANNEL_PORT=5700))
    assert hits(text, "OPD501") == [(
        E, "port 5600 on the shared host bound by stage 0 replica 0 (NIXL side channel, 5600) and stage 0 replica 1 "
        "(NIXL side channel, 5600)", (4, 85),
        "all 2 replicas of stage 0 get the same NIXL side channel port on this runtime: set num_replicas: 1, or place "
        "the replicas on different hosts", [(4, 85, "stage 0 replica 0 binds 5600")])]


def test_opd501_plain_vllm_engines_give_each_replica_its_own_port() -> None:
    # runtime `vllm` (llm_pd): replica r binds base + r, so replica 1 meets decode's 5601
    text = pair(NIXL, ", num_replicas: 2" + env(VLLM_NIXL_SIDE_CHANNEL_PORT=5600),
                env(VLLM_NIXL_SIDE_CHANNEL_PORT=5601), head=LLM_PD)
    assert hits(text, "OPD501") == [(
        E, "port 5601 on the shared host bound by stage 0 replica 1 (NIXL side channel, 5601) and stage 1 "
        "(NIXL side channel, 5601)", (5, 68), "move stage 1's range to start at 5602 or above",
        [(4, 85, "stage 0 replica 1 binds 5601")])]


def test_opd501_names_the_inventory_host_and_ignores_stages_on_other_hosts() -> None:
    text = pair(NIXL, env(VLLM_NIXL_SIDE_CHANNEL_PORT=5600), env(VLLM_NIXL_SIDE_CHANNEL_PORT=5600))
    same = Inventory.from_dict({"hosts": {"a": {"address": "10.0.0.1"}, "b": {"address": "10.0.0.2"}},
                                "placement": {0: "a", 1: "a"}})
    assert hits(text, "OPD501", ValidateOptions(inventory=same)) == [(
        E, "port 5600 on host a bound by stage 0 (NIXL side channel, 5600) and stage 1 (NIXL side channel, 5600)",
        (5, 68), "move stage 1's range to start at 5601 or above", [(4, 68, "stage 0 binds 5600")])]
    apart = Inventory.from_dict({"hosts": {"a": {"address": "10.0.0.1"}, "b": {"address": "10.0.0.2"}},
                                 "placement": {0: "a", 1: "b"}})
    assert hits(text, "OPD501", ValidateOptions(inventory=apart)) == []


_TP2 = ", tensor_parallel_size: 2"
_HCCL = "HCCL listener (HCCL_IF_BASE_PORT default)"


def test_opd501_hccl_listeners_of_multi_rank_npu_engines_default_to_60000() -> None:
    text = pair(NIXL, _TP2 + env(VLLM_NIXL_SIDE_CHANNEL_PORT=5600), _TP2 + env(VLLM_NIXL_SIDE_CHANNEL_PORT=5700),
                p_dev="0,1", d_dev="2,3")
    want = [(E, f"port 60000 on the shared host bound by stage 0 ({_HCCL}, 60000) and stage 1 ({_HCCL}, 60000)",
             (5, 19), "assign distinct HCCL_IF_BASE_PORT per instance (env)", [(4, 19, "stage 0 binds 60000")])]
    assert hits(text, "OPD501", ValidateOptions(platform="npu")) == want
    npu = Inventory.from_dict({"hosts": {"a": {"accelerator": "npu", "count": 8}}, "placement": {"all": "a"}})
    assert hits(text, "OPD501", ValidateOptions(inventory=npu)) == [
        (want[0][0], want[0][1].replace("the shared host", "host a"), *want[0][2:])]
    # not an NPU: no HCCL listener
    cuda = Inventory.from_dict({"hosts": {"a": {"accelerator": "cuda", "count": 8}}, "placement": {"all": "a"}})
    assert hits(text, "OPD501", ValidateOptions(inventory=cuda)) == []
    assert hits(text, "OPD501", ValidateOptions(platform="cuda")) == []
    assert hits(text, "OPD501") == []


def test_opd501_hccl_base_port_from_the_env_is_located_there() -> None:
    text = pair(NIXL, _TP2 + env(VLLM_NIXL_SIDE_CHANNEL_PORT=5600),
                _TP2 + env(VLLM_NIXL_SIDE_CHANNEL_PORT=5700, HCCL_IF_BASE_PORT=60000), p_dev="0,1", d_dev="2,3")
    assert hits(text, "OPD501", ValidateOptions(platform="npu")) == [(
        E, f"port 60000 on the shared host bound by stage 0 ({_HCCL}, 60000) and stage 1 (HCCL listener "
        "(HCCL_IF_BASE_PORT), 60000)", (5, 122), "assign distinct HCCL_IF_BASE_PORT per instance (env)",
        [(4, 19, "stage 0 binds 60000")])]


def test_opd501_a_single_rank_npu_engine_has_no_hccl_listener() -> None:
    text = pair(NIXL, env(VLLM_NIXL_SIDE_CHANNEL_PORT=5600), env(VLLM_NIXL_SIDE_CHANNEL_PORT=5700))
    assert hits(text, "OPD501", ValidateOptions(platform="npu")) == []


# --- OPD502 bootstrap port env ignored ------------------------------------------------------------

def test_opd502_unset_bootstrap_port_names_the_default_and_every_replicas_port() -> None:
    # vllm-omni 0.30: replica r binds bootstrap_port (default 8998) + r, whatever the env says
    text = pair(MC, ", num_replicas: 3" + env(VLLM_MOONCAKE_BOOTSTRAP_PORT=25301))
    assert hits(text, "OPD502") == [(
        E, "stage 0: env VLLM_MOONCAKE_BOOTSTRAP_PORT = 25301 is ignored: vllm-omni 0.30 sets it from "
        "kv_connector_extra_config.bootstrap_port (unset, default 8998) plus the replica id, so this stage binds "
        "ports 8998-9000 (replicas 0-2)", (4, 86),
        "write VLLM_MOONCAKE_BOOTSTRAP_PORT: \"8998\" (what the runtime sets for replica 0), or set bootstrap_port: "
        "25301 if that is the port you want", [(4, 131, "bootstrap_port unset: default 8998")])]


def test_opd502_an_env_equal_to_replica_0s_port_or_no_env_is_fine() -> None:
    assert hits(pair(MC, env(VLLM_MOONCAKE_BOOTSTRAP_PORT=8998)), "OPD502") == []
    assert hits(pair(MC, env(VLLM_MOONCAKE_BOOTSTRAP_PORT=" 8998 ")), "OPD502") == []
    assert hits(pair(MC), "OPD502") == []


def test_opd502_where_the_env_decides_there_is_nothing_to_disagree_with() -> None:
    # vllm-omni 0.18-0.28 and plain vLLM read the env itself
    text = pair(MC, env(VLLM_MOONCAKE_BOOTSTRAP_PORT=25301), p_x=", kv_connector_extra_config: {bootstrap_port: 25201}")
    assert len(hits(text, "OPD502")) == 1
    assert hits(text, "OPD502", ValidateOptions(vllm_version="0.18")) == []
    assert hits(text.replace(PD, LLM_PD), "OPD502") == []


def test_opd502_a_consumer_or_another_connector_binds_no_bootstrap_port() -> None:
    e = env(VLLM_MOONCAKE_BOOTSTRAP_PORT=25301)
    assert hits(pair(MC, "", e), "OPD502") == []  # on decode (kv_consumer)
    assert hits(pair(NIXL, e), "OPD502") == []
    # a kv_both engine reads the env like plain vLLM (vllm-omni rewrites kv_producer only): it binds
    # the env's port, which OPD505 names
    both = pair(MC, e, p_x=", kv_connector_extra_config: {mooncake_bootstrap_port: 25201}").replace(
        "kv_producer", "kv_both")
    assert hits(both, "OPD502") == []
    assert [h[1] for h in hits(both, "OPD505")] == [
        "stage 0: kv_connector_extra_config.mooncake_bootstrap_port is read by nothing on vllm-omni 0.30; the "
        "bootstrap port comes from env VLLM_MOONCAKE_BOOTSTRAP_PORT, so this stage binds port 25301"]


# --- OPD505 bootstrap key nothing reads -----------------------------------------------------------

def test_opd505_on_plain_vllm_every_extra_config_key_is_unread_and_the_env_decides() -> None:
    text = pair(MC, env(VLLM_MOONCAKE_BOOTSTRAP_PORT=25301), head=LLM_PD,
                p_x=", kv_connector_extra_config: {bootstrap_port: 25201, mooncake_bootstrap_port: 25201}",
                d_x=", kv_connector_extra_config: {mooncake_bootstrap_port: 25201}")
    said = ("read by nothing on vLLM 0.30; the bootstrap port comes from env VLLM_MOONCAKE_BOOTSTRAP_PORT, so this "
            "stage binds port 25301")
    assert hits(text, "OPD505") == [
        (W, f"stage 0: kv_connector_extra_config.bootstrap_port is {said}", (4, 197),
         "remove bootstrap_port and set env VLLM_MOONCAKE_BOOTSTRAP_PORT: \"25201\"", []),
        (W, f"stage 0: kv_connector_extra_config.mooncake_bootstrap_port is {said}", (4, 220),
         "remove mooncake_bootstrap_port and set env VLLM_MOONCAKE_BOOTSTRAP_PORT: \"25201\"", []),
        (W, "stage 1: kv_connector_extra_config.mooncake_bootstrap_port is read by nothing on vLLM 0.30, and a "
            "kv_consumer binds no bootstrap port", (5, 151), "remove mooncake_bootstrap_port", [])]


def test_opd505_a_key_that_is_not_a_port_is_only_removed() -> None:
    x = ", kv_connector_extra_config: {mooncake_bootstrap_port: none}"
    on_omni = hits(pair(MC, p_x=x), "OPD505")
    assert [(h[1], h[3]) for h in on_omni] == [(
        "stage 0: kv_connector_extra_config.mooncake_bootstrap_port is read by nothing on vllm-omni 0.30; the "
        "bootstrap port comes from kv_connector_extra_config.bootstrap_port, so this stage binds port 8998",
        "rename it to bootstrap_port")]
    on_env = hits(pair(MC, env(VLLM_MOONCAKE_BOOTSTRAP_PORT=25301), p_x=x), "OPD505",
                  ValidateOptions(vllm_version="0.18"))
    assert [(h[1], h[3]) for h in on_env] == [(
        "stage 0: kv_connector_extra_config.mooncake_bootstrap_port is read by nothing on vllm-omni 0.18; the "
        "bootstrap port comes from env VLLM_MOONCAKE_BOOTSTRAP_PORT, so this stage binds port 25301",
        "remove mooncake_bootstrap_port")]


def test_opd505_reads_only_mooncake_stages_and_keeps_scanning_after_one_without_the_key() -> None:
    x = ", kv_connector_extra_config: {mooncake_bootstrap_port: 25201}"
    text = (PD + stage(0, NIXL, x=x) + stage(1, MC, devices="1", role="consumer", eid="d")
            + stage(2, MC, devices="2", role="consumer", eid="d2", x=x))
    assert [(h[1], h[2]) for h in hits(text, "OPD505")] == [(
        "stage 2: kv_connector_extra_config.mooncake_bootstrap_port is read by nothing on vllm-omni 0.30, and a "
        "kv_consumer binds no bootstrap port", (6, 152))]


# --- OPD503 cross-host localhost ------------------------------------------------------------------

_APART = Inventory.from_dict({"hosts": {"a": {"address": "10.0.0.1"}, "b": {}}, "placement": {0: "a", 1: "b"}})
_NO_ADDR = Inventory.from_dict({"hosts": {"a": {}, "b": {}}, "placement": {0: "a", 1: "b"}})
_DECODE_ON_B = [(5, 5, "decode (stage 1) on b")]


def test_opd503_nixl_default_host_without_an_env_block_points_at_the_stage() -> None:
    assert hits(pair(NIXL), "OPD503", ValidateOptions(inventory=_NO_ADDR)) == [(
        E, "stage 0 (prefill) on a advertises localhost (default) as its NIXL side channel; decode on b cannot reach it",
        (4, 5), "set env VLLM_NIXL_SIDE_CHANNEL_HOST: <routable IP of a> on the prefill stage", _DECODE_ON_B)]


def test_opd503_nixl_default_host_with_an_env_block_points_at_env() -> None:
    got = hits(pair(NIXL, env(VLLM_NIXL_SIDE_CHANNEL_PORT=5600)), "OPD503", ValidateOptions(inventory=_APART))
    assert [(h[1], h[2], h[3]) for h in got] == [(
        "stage 0 (prefill) on a advertises localhost (default) as its NIXL side channel; decode on b cannot reach it",
        (4, 33), "set env VLLM_NIXL_SIDE_CHANNEL_HOST: 10.0.0.1 on the prefill stage")]


def test_opd503_nixl_loopback_host_in_the_env_points_at_its_value() -> None:
    got = hits(pair(NIXL, env(VLLM_NIXL_SIDE_CHANNEL_HOST="127.0.0.1")), "OPD503", ValidateOptions(inventory=_APART))
    assert [(h[1], h[2]) for h in got] == [(
        "stage 0 (prefill) on a advertises '127.0.0.1' as its NIXL side channel; decode on b cannot reach it", (4, 68))]
    routable = pair(NIXL, env(VLLM_NIXL_SIDE_CHANNEL_HOST="10.0.0.1"))
    assert hits(routable, "OPD503", ValidateOptions(inventory=_APART)) == []


def test_opd503_a_blank_or_empty_host_is_shown_quoted() -> None:
    # a review found "advertises   as its NIXL side channel" for a blank value: the value is quoted as written
    for v, shown in ((" ", "' '"), ("", "''")):
        got = hits(pair(NIXL, env(VLLM_NIXL_SIDE_CHANNEL_HOST=v)), "OPD503", ValidateOptions(inventory=_APART))
        assert [h[1] for h in got] == [
            f"stage 0 (prefill) on a advertises {shown} as its NIXL side channel; decode on b cannot reach it"]
    got = hits(pair(MC, p_x=", kv_ip: \" \""), "OPD503", ValidateOptions(inventory=_APART))
    assert [h[1] for h in got] == [
        "stage 0 (prefill) on a advertises ' ' as its Mooncake bootstrap address; decode on b cannot reach it"]


def test_opd503_mooncake_default_kv_ip_and_a_loopback_kv_ip() -> None:
    got = hits(pair(MC), "OPD503", ValidateOptions(inventory=_APART))
    assert got == [(
        E, "stage 0 (prefill) on a advertises 127.0.0.1 (default kv_ip) as its Mooncake bootstrap address; decode on b "
        "cannot reach it", (4, 33), "set kv_ip: 10.0.0.1 (and env VLLM_HOST_IP) on the prefill stage", _DECODE_ON_B)]
    got = hits(pair(MC, p_x=", kv_ip: localhost"), "OPD503", ValidateOptions(inventory=_NO_ADDR))
    assert [(h[1], h[2], h[3]) for h in got] == [(
        "stage 0 (prefill) on a advertises 'localhost' as its Mooncake bootstrap address; decode on b cannot reach it",
        (4, 130), "set kv_ip: <routable IP of a> (and env VLLM_HOST_IP) on the prefill stage")]
    assert hits(pair(MC, p_x=", kv_ip: 10.0.0.1"), "OPD503", ValidateOptions(inventory=_APART)) == []


_ASC_PAIR = "{{kv_connector: {c}, kv_role: kv_{role}, kv_port: 3600{n}, engine_id: {eid}{x}, kv_connector_extra_config: " \
    "{{prefill: {{tp_size: 1, dp_size: 1}}, decode: {{tp_size: 1, dp_size: 1}}}}}}"


@pytest.mark.parametrize("conn", ["MooncakeConnectorV1", "MooncakeLayerwiseConnector", "MooncakeHybridConnector"])
def test_opd503_vllm_ascend_mooncake_finds_its_host_address_itself(conn: str) -> None:
    # issue 22 / BR-49: vllm-ascend's Mooncake workers advertise vLLM's get_ip() (VLLM_HOST_IP, else the
    # outward interface) and never read kv_ip: a cross-host pair without kv_ip is correct
    kv = _ASC_PAIR.replace("{c}", conn)
    text = LLM_PD + stage(0, kv.replace("{n}", "0"), x="") + stage(1, kv.replace("{n}", "1"), role="consumer", eid="d")
    npu = ValidateOptions(inventory=_APART, platform="npu", vllm_version="0.23")
    assert hits(text, "OPD503", npu) == []
    on_omni = PD + text[len(LLM_PD):]  # vllm-omni's orchestrator relays a kv_ip bootstrap address vllm-ascend ignores
    assert hits(on_omni, "OPD503", npu) == []
    # a loopback VLLM_HOST_IP is what get_ip() returns: decode cannot reach it
    lo = LLM_PD + stage(0, kv.replace("{n}", "0"), extra=env(VLLM_HOST_IP="127.0.0.1")) + \
        stage(1, kv.replace("{n}", "1"), role="consumer", eid="d")
    assert [(h[0], h[1], h[3]) for h in hits(lo, "OPD503", npu)] == [(
        E, "stage 0 (prefill) on a advertises VLLM_HOST_IP='127.0.0.1' as its Mooncake transfer address; decode on b "
        "cannot reach it", "set env VLLM_HOST_IP: 10.0.0.1 on the prefill stage, or remove it (vLLM then picks the "
        "address of the interface that routes outward)")]


def test_opd503_plain_vllm_serve_mooncake_takes_the_bootstrap_address_from_the_router() -> None:
    # vLLM's MooncakeConnector reads no kv_ip (decode gets remote_bootstrap_addr in kv_transfer_params);
    # only vllm-omni's orchestrator builds it from kv_ip (test above: default kv_ip is an error there)
    assert hits(pair(MC, head=LLM_PD), "OPD503", ValidateOptions(inventory=_APART)) == []
    got = hits(pair(MC, head=LLM_PD, p_x="", p_extra=env(VLLM_HOST_IP="localhost")), "OPD503",
               ValidateOptions(inventory=_APART))
    assert [h[1] for h in got] == ["stage 0 (prefill) on a advertises VLLM_HOST_IP='localhost' as its Mooncake "
                                   "transfer address; decode on b cannot reach it"]


def test_opd503_same_host_or_another_connector_is_not_its_finding() -> None:
    same = Inventory.from_dict({"hosts": {"a": {}, "b": {}}, "placement": {"all": "a"}})
    assert hits(pair(NIXL), "OPD503", ValidateOptions(inventory=same)) == []
    assert hits(pair(MC), "OPD503") == []  # no inventory: one host
    p2p = "{{kv_connector: P2pNcclConnector, kv_role: kv_{role}, engine_id: {eid}{x}}}"
    assert hits(pair(p2p), "OPD503", ValidateOptions(inventory=_APART)) == []


# --- OPD504 port not in 1..65535 ------------------------------------------------------------------

def _bad(what: str, v: str, at: tuple) -> tuple:
    return (E, f"stage 0: {what} = {v} is not a port (1..65535)", at, HELP_504, [])


def test_opd504_kv_port_bounds_are_1_and_65535() -> None:
    e = env(VLLM_NIXL_SIDE_CHANNEL_PORT=5600)
    for port, want in (("0", [_bad("kv_port", "0", (4, 172))]), ("1", []), ("65535", []),
                       ("65536", [_bad("kv_port", "65536", (4, 172))])):
        assert hits(pair(NIXL, e, p_x=f", kv_port: {port}"), "OPD504") == want, port


def test_opd504_extra_config_port_keys_and_env_port_vars_are_checked_others_not() -> None:
    text = pair(NIXL, env(VLLM_NIXL_SIDE_CHANNEL_PORT=5600, MY_PORT="x", HOST_NAME="0", PORTS="0"),
                p_x=", kv_connector_extra_config: {http_port: abc, other: 0, port_count: 0, proxy_port: \"65536\"}")
    assert hits(text, "OPD504") == [
        _bad("MY_PORT", "'x'", (4, 85)),
        _bad("http_port", "'abc'", (4, 244)),
        _bad("proxy_port", "'65536'", (4, 286))]


def test_opd504_replicas_past_65535_each_named_with_the_start_that_fits() -> None:
    text = pair(NIXL, ", num_replicas: 3" + env(VLLM_NIXL_SIDE_CHANNEL_PORT=65535),
                env(VLLM_NIXL_SIDE_CHANNEL_PORT=5700), head=LLM_PD)
    assert hits(text, "OPD504") == [
        (E, "stage 0 replica 1 would bind NIXL side channel port 65536 (base + replica id), past 65535", (4, 85),
         "start the range at 65534 or lower", []),
        (E, "stage 0 replica 2 would bind NIXL side channel port 65537 (base + replica id), past 65535", (4, 85),
         "start the range at 65533 or lower", [])]
    assert [h[1][:50] for h in hits(text.replace("65535", "65534"), "OPD504")] == [
        "stage 0 replica 2 would bind NIXL side channel por"]
    assert hits(text.replace("65535", "65533"), "OPD504") == []


def test_opd504_a_range_running_past_65535() -> None:
    # NIXL on vLLM 0.11 binds tp x dp side-channel ports from the base
    text = pair(NIXL, ", tensor_parallel_size: 2" + env(VLLM_NIXL_SIDE_CHANNEL_PORT=65535),
                env(VLLM_NIXL_SIDE_CHANNEL_PORT=5700), p_dev="0,1", d_dev="2")
    old = ValidateOptions(vllm_version="0.11")
    assert hits(text, "OPD504", old) == [
        (E, "stage 0: NIXL side channel range 65535-65536 runs past 65535", (4, 95), "start the range lower", [])]
    assert hits(text.replace("65535", "65534"), "OPD504", old) == []


# --- OPD506 vllm-ascend kv_port range inside AscendDirectTransport's ports ------------------------

_ASC = "{{kv_connector: MooncakeConnectorV1, kv_role: kv_{role}, engine_id: {eid}{x}}}"
_NPU = ValidateOptions(platform="npu")


def _asc(p0: int, p1: int, hccl: str = "61000") -> str:
    blocks = ", kv_connector_extra_config: {prefill: {dp_size: 1, tp_size: 2}, decode: {dp_size: 1, tp_size: 2}}"
    return pair(_ASC, _TP2 + env(HCCL_IF_BASE_PORT=hccl), _TP2 + env(HCCL_IF_BASE_PORT=61032), p_dev="0,1",
                d_dev="2,3", p_x=f", kv_port: {p0}" + blocks, d_x=f", kv_port: {p1}" + blocks)


def _inside(sid: int, lo: int, hi: int, npus: int, at: tuple, hi_: int = 36000) -> tuple:
    return (E, f"stage {sid}: MooncakeConnectorV1 kv_port range {lo}-{hi} overlaps AscendDirectTransport's random "
               f"ports [20000, {hi_}) on a {npus}-NPU node", at,
            f"move kv_port to {hi_} or above (omni-pd expand allocates from 36000)", [])


def test_opd506_range_edges_of_20000_and_36000_on_a_16_npu_node() -> None:
    # [kv_port, kv_port + 2) against [20000, 36000): 19998-19999 and 36000-36001 are outside
    assert [h[1] for h in hits(_asc(19998, 36000), "OPD506", _NPU)] == []
    assert hits(_asc(19999, 35999), "OPD506", _NPU) == [_inside(0, 19999, 20000, 16, (4, 196)),
                                                        _inside(1, 35999, 36000, 16, (5, 196))]


def test_opd506_the_inventorys_npu_count_sets_the_upper_end() -> None:
    inv = Inventory.from_dict({"hosts": {"a": {"accelerator": "npu", "count": 4}}, "placement": {"all": "a"}})
    assert hits(_asc(23999, 24000), "OPD506", ValidateOptions(platform="npu", inventory=inv)) == [
        _inside(0, 23999, 24000, 4, (4, 196), hi_=24000)]
    # a host without a count: 16
    inv = Inventory.from_dict({"hosts": {"a": {"accelerator": "npu"}}, "placement": {"all": "a"}})
    assert [h[1][-23:] for h in hits(_asc(35000, 36000), "OPD506", ValidateOptions(platform="npu", inventory=inv))] \
        == ["36000) on a 16-NPU node"]


def test_opd506_only_kv_port_ranges_of_ascend_connectors_count() -> None:
    # the HCCL listener at 30000 is inside the transport range, but it is not a kv_port (OPD501's)
    assert hits(_asc(36000, 36002, hccl="30000"), "OPD506", _NPU) == []
    # a NIXL stage binding inside the range is not an Ascend transport user
    text = pair(NIXL, env(VLLM_NIXL_SIDE_CHANNEL_PORT=30000), env(VLLM_NIXL_SIDE_CHANNEL_PORT=30001))
    assert hits(text, "OPD506", _NPU) == []


# --- the side and runtime a stage's ports are computed for ----------------------------------------

def test_a_pd_decode_stage_without_kv_role_binds_no_bootstrap_port() -> None:
    # the pipeline's side (decode) stands in for the missing kv_role (OPD302 reports that): a
    # kv_consumer runs no bootstrap server, so decode does not meet prefill's default 8998
    text = pair(MC).replace("kv_role: kv_consumer, ", "")
    assert hits(text, "OPD501") == []


def test_a_stage_outside_a_pd_pipeline_without_kv_role_is_taken_as_the_producer() -> None:
    text = ("pipeline: qwen3_omni_moe\nstages:\n" + stage(0, MC).replace("kv_role: kv_producer, ", "")
            + "  - {stage_id: 1, devices: \"1\", port: 8998}\n")
    assert hits(text, "OPD501") == [(
        E, "port 8998 on the shared host bound by stage 0 (Mooncake bootstrap (kv_connector_extra_config.bootstrap_port "
        "default), 8998) and stage 1 (API server --port, 8998)", (4, 39), "move stage 1's range to start at 8999 or "
        "above", [(3, 68, "stage 0 binds 8998")])]


def test_every_catalogued_pipeline_runs_on_one_of_the_two_runtimes_the_rules_know() -> None:
    # runtime_of returns Pipeline.runtime as is: llm_pd's engines are plain `vllm serve`
    from omni_pd.compile.pipelines import load_catalogue

    cat = load_catalogue()
    assert {cat.get(n).runtime for n in cat.names()} == {"vllm", "vllm-omni"}
    assert (cat.get("llm_pd").runtime, cat.get("qwen3_omni_moe_pd").runtime) == ("vllm", "vllm-omni")


def test_opd506_an_empty_kv_port_range_binds_nothing() -> None:
    # a global --tensor-parallel-size 0 leaves no rank (vLLM refuses it): no range to overlap
    opts = ValidateOptions(platform="npu", cli={"tensor_parallel_size": 0})
    assert hits(_asc(30000, 30002), "OPD506", opts) == []


# --- OPD501's scan of the sorted ranges -----------------------------------------------------------

def test_opd501_adjacent_ranges_do_not_overlap_and_one_port_in_does() -> None:
    # vLLM 0.11 NIXL at TP 2 binds [5600, 5602)
    old = ValidateOptions(vllm_version="0.11")
    text = pair(NIXL, ", tensor_parallel_size: 2" + env(VLLM_NIXL_SIDE_CHANNEL_PORT=5600),
                env(VLLM_NIXL_SIDE_CHANNEL_PORT=5602), p_dev="0,2")
    assert hits(text, "OPD501", old) == []
    assert hits(text.replace("5602", "5601"), "OPD501", old) == [(
        E, "port 5601 on the shared host bound by stage 0 (NIXL side channel, 5600-5601) and stage 1 (NIXL side "
        "channel, 5601)", (5, 68), "move stage 1's range to start at 5602 or above", [(4, 95, "stage 0 binds 5600-5601")])]


def test_opd501_every_pair_of_three_stages_on_one_port_is_reported() -> None:
    text = (PD + stage(0, NIXL, extra=env(VLLM_NIXL_SIDE_CHANNEL_PORT=5600))
            + stage(1, NIXL, devices="1", role="consumer", eid="d", extra=env(VLLM_NIXL_SIDE_CHANNEL_PORT=5600))
            + "  - {stage_id: 2, devices: \"2\", port: 5600}\n")
    nixl, api = "NIXL side channel, 5600", "API server --port, 5600"
    assert hits(text, "OPD501") == [
        (E, f"port 5600 on the shared host bound by stage 0 ({nixl}) and stage 1 ({nixl})", (5, 68),
         "move stage 1's range to start at 5601 or above", [(4, 68, "stage 0 binds 5600")]),
        (E, f"port 5600 on the shared host bound by stage 0 ({nixl}) and stage 2 ({api})", (6, 39),
         "move stage 2's range to start at 5601 or above", [(4, 68, "stage 0 binds 5600")]),
        (E, f"port 5600 on the shared host bound by stage 1 ({nixl}) and stage 2 ({api})", (6, 39),
         "move stage 2's range to start at 5601 or above", [(5, 68, "stage 1 binds 5600")])]


def test_opd501_one_engine_binding_its_api_port_and_side_channel_on_one_port() -> None:
    # both sockets are bound by the same `vllm serve` process: the second bind fails (EADDRINUSE)
    text = pair(NIXL, ", port: 5600" + env(VLLM_NIXL_SIDE_CHANNEL_PORT=5600), env(VLLM_NIXL_SIDE_CHANNEL_PORT=5700),
                head=LLM_PD)
    assert hits(text, "OPD501") == [(
        E, "port 5600 on the shared host bound by stage 0 (NIXL side channel, 5600) and stage 0 (API server --port, "
        "5600)", (4, 39), "one engine binds both: move stage 0's API server --port off 5600",
        [(4, 80, "stage 0 binds 5600")])]


_P2P = "{{kv_connector: P2pNcclConnector, kv_role: kv_{role}, engine_id: {eid}{x}}}"


def test_opd501_p2pnccl_http_port_is_its_own_socket_unless_it_is_the_api_port() -> None:
    http = ", kv_connector_extra_config: {http_port: 8100}"
    kv = ("port 14579 on the shared host bound by stage 0 (kv_port + rank (P2pNcclConnector), 14579) and stage 1 "
          "(kv_port + rank (P2pNcclConnector), 14579)")
    # API on 8000, http_port 8100: decode's API port 8100 meets the http_port
    got = hits(pair(_P2P, ", port: 8000", ", port: 8100", p_x=http), "OPD501")
    assert [(g[1], g[2], g[4]) for g in got] == [
        ("port 8100 on the shared host bound by stage 0 (API server (http_port), 8100) and stage 1 (API server --port, "
         "8100)", (5, 39), [(4, 173, "stage 0 binds 8100")]),
        (kv, (5, 45), [(4, 45, "stage 0 binds 14579")])]
    # http_port equal to the stage's own API port is that one socket, not a second bind
    assert [g[1] for g in hits(pair(_P2P, ", port: 8100", ", port: 8200", p_x=http), "OPD501")] == [kv]


def test_opd501_hccl_base_port_from_the_env_is_the_port_bound() -> None:
    text = pair(NIXL, _TP2 + env(VLLM_NIXL_SIDE_CHANNEL_PORT=5600, HCCL_IF_BASE_PORT=61000),
                _TP2 + env(VLLM_NIXL_SIDE_CHANNEL_PORT=5700, HCCL_IF_BASE_PORT=61000), p_dev="0,1", d_dev="2,3")
    hccl = "HCCL listener (HCCL_IF_BASE_PORT), 61000"
    assert hits(text, "OPD501", ValidateOptions(platform="npu")) == [(
        E, f"port 61000 on the shared host bound by stage 0 ({hccl}) and stage 1 ({hccl})", (5, 122),
        "assign distinct HCCL_IF_BASE_PORT per instance (env)", [(4, 122, "stage 0 binds 61000")])]


def test_opd501_hccl_listeners_for_dp_or_pp_ranks_too() -> None:
    want = (f"port 60000 on the shared host bound by stage 0 ({_HCCL}, 60000) and stage 1 ({_HCCL}, 60000)")
    for size in (", data_parallel_size: 2", ", pipeline_parallel_size: 2"):
        text = pair(NIXL, size + env(VLLM_NIXL_SIDE_CHANNEL_PORT=5600), size + env(VLLM_NIXL_SIDE_CHANNEL_PORT=5700),
                    p_dev="0,1", d_dev="2,3")
        assert [g[1] for g in hits(text, "OPD501", ValidateOptions(platform="npu"))] == [want], size


def test_opd501_the_later_range_is_shown_whole_and_the_related_span_keeps_file_and_path() -> None:
    text = pair(NIXL, env(VLLM_NIXL_SIDE_CHANNEL_PORT=5600),
                ", tensor_parallel_size: 2" + env(VLLM_NIXL_SIDE_CHANNEL_PORT=5600), d_dev="1,2")
    opts = ValidateOptions(vllm_version="0.11")
    assert [(g[1], g[2]) for g in hits(text, "OPD501", opts)] == [(
        "port 5600 on the shared host bound by stage 0 (NIXL side channel, 5600) and stage 1 (NIXL side channel, "
        "5600-5601)", (5, 95))]
    (d,) = [d for d in validate_text(text, "t.yaml", opts).diagnostics if d.code == "OPD501"]
    assert [(r.file, r.path) for r in d.related] == [("t.yaml", ("stages", 0, "env", "VLLM_NIXL_SIDE_CHANNEL_PORT"))]


def test_opd505_names_the_whole_range_when_the_bootstrap_range_spans_tp() -> None:
    # vLLM 0.13-0.17 binds dp x tp bootstrap ports per engine; omni-pd's launcher starts replica r at base + r x span:
    # replica 0 binds 25301-25302, replica 1 25303-25304 (a review found "ports 25301-25303 (replicas 0-1)": the
    # first port of each replica shown as the range)
    text = pair(MC, ", tensor_parallel_size: 2, num_replicas: 2" + env(VLLM_MOONCAKE_BOOTSTRAP_PORT=25301),
                head=LLM_PD, p_dev="0,1,2,3", d_dev="4", p_x=", kv_connector_extra_config: {mooncake_bootstrap_port: 25201}")
    assert [g[1] for g in hits(text, "OPD505", ValidateOptions(vllm_version="0.13"))] == [
        "stage 0: kv_connector_extra_config.mooncake_bootstrap_port is read by nothing on vLLM 0.13; the bootstrap "
        "port comes from env VLLM_MOONCAKE_BOOTSTRAP_PORT, so this stage binds ports 25301-25304 (replicas 0-1, "
        "2 ports each)"]
    one = pair(MC, ", tensor_parallel_size: 2" + env(VLLM_MOONCAKE_BOOTSTRAP_PORT=25301), head=LLM_PD, p_dev="0,1",
               d_dev="2", p_x=", kv_connector_extra_config: {mooncake_bootstrap_port: 25201}")
    assert [g[1] for g in hits(one, "OPD505", ValidateOptions(vllm_version="0.13"))] == [
        "stage 0: kv_connector_extra_config.mooncake_bootstrap_port is read by nothing on vLLM 0.13; the bootstrap "
        "port comes from env VLLM_MOONCAKE_BOOTSTRAP_PORT, so this stage binds ports 25301-25302"]


def test_ports_text_of_replicas_that_are_not_back_to_back() -> None:
    from omni_pd.check.rules.ports import _ports_text
    from omni_pd.compile.connectors.base import PortUse

    same = [PortUse(8998, 1, "Mooncake bootstrap", replica=r) for r in range(2)]
    assert _ports_text(same) == "ports 8998 (replica 0), 8998 (replica 1)"
    gap = [PortUse(25301, 2, "b", replica=0), PortUse(25401, 2, "b", replica=1)]
    assert _ports_text(gap) == "ports 25301-25302 (replica 0), 25401-25402 (replica 1)"
    mixed = [PortUse(25301, 2, "b", replica=0), PortUse(25303, 1, "b", replica=1)]
    assert _ports_text(mixed) == "ports 25301-25302 (replica 0), 25303 (replica 1)"
    assert _ports_text([PortUse(25201 + r, 1, "b", replica=r) for r in range(3)]) == "ports 25201-25203 (replicas 0-2)"


def test_opd502_stages_without_a_disagreement_do_not_end_the_scan() -> None:
    # stage 0 runs no Mooncake bootstrap server, stage 1's env is unset; stage 2's env is ignored
    text = ("pipeline: qwen3_omni_moe\nstages:\n" + stage(0, NIXL) + stage(1, MC, devices="1", eid="p1")
            + stage(2, MC, devices="2", eid="p2", extra=env(VLLM_MOONCAKE_BOOTSTRAP_PORT=25301),
                    x=", kv_connector_extra_config: {bootstrap_port: 25401}"))
    assert hits(text, "OPD502") == [(
        E, "stage 2: env VLLM_MOONCAKE_BOOTSTRAP_PORT = 25301 is ignored: vllm-omni 0.30 sets it from "
        "kv_connector_extra_config.bootstrap_port plus the replica id, so this stage binds port 25401", (5, 69),
        "write VLLM_MOONCAKE_BOOTSTRAP_PORT: \"25401\" (what the runtime sets for replica 0), or set bootstrap_port: "
        "25301 if that is the port you want", [(5, 214, "bootstrap_port 25401")])]


def test_opd505_checks_every_unread_key_not_only_the_first() -> None:
    # plain vLLM reads neither mooncake_bootstrap_port (listed first) nor bootstrap_port
    text = pair(MC, env(VLLM_MOONCAKE_BOOTSTRAP_PORT=25301), head=LLM_PD,
                p_x=", kv_connector_extra_config: {bootstrap_port: 25201}")
    assert [(g[1], g[2]) for g in hits(text, "OPD505")] == [(
        "stage 0: kv_connector_extra_config.bootstrap_port is read by nothing on vLLM 0.30; the bootstrap port comes "
        "from env VLLM_MOONCAKE_BOOTSTRAP_PORT, so this stage binds port 25301", (4, 197))]


def test_opd503_placement_on_hosts_the_inventory_does_not_describe() -> None:
    # an inventory with placement only: no address to suggest, and no crash looking one up
    bare = Inventory.from_dict({"placement": {0: "a", 1: "b"}})
    assert [(g[1], g[3]) for g in hits(pair(NIXL), "OPD503", ValidateOptions(inventory=bare))] == [(
        "stage 0 (prefill) on a advertises localhost (default) as its NIXL side channel; decode on b cannot reach it",
        "set env VLLM_NIXL_SIDE_CHANNEL_HOST: <routable IP of a> on the prefill stage")]


def test_opd504_a_base_port_past_65535_is_one_finding_not_also_a_range() -> None:
    text = pair(NIXL, env(VLLM_NIXL_SIDE_CHANNEL_PORT=65536), env(VLLM_NIXL_SIDE_CHANNEL_PORT=5700))
    assert hits(text, "OPD504") == [_bad("VLLM_NIXL_SIDE_CHANNEL_PORT", "'65536'", (4, 68))]


def test_opd506_a_stage_of_another_connector_does_not_end_the_scan() -> None:
    text = ("pipeline: qwen3_omni_moe\nstages:\n" + stage(0, NIXL)
            + stage(1, _ASC, devices="1", x=", kv_port: 30000"))
    assert [(g[1], g[2]) for g in hits(text, "OPD506", _NPU)] == [(
        "stage 1: MooncakeConnectorV1 kv_port 30000 overlaps AscendDirectTransport's random ports "
        "[20000, 36000) on a 16-NPU node", (4, 134))]


def test_opd506_prints_one_port_and_a_range_as_opd501_does() -> None:
    # a review found "kv_port range 30000-30000" for a one-port range (OPD501 prints 30000): one formatter
    from omni_pd.check.rules.ports import port_range

    assert (port_range(30000, 1), port_range(30000, 2), port_range(30000, 4)) == ("30000", "30000-30001", "30000-30003")
    text = ("pipeline: qwen3_omni_moe\nstages:\n" + stage(0, NIXL)
            + stage(1, _ASC, devices="1,2", extra=", tensor_parallel_size: 2", x=", kv_port: 30000"))
    assert [g[1] for g in hits(text, "OPD506", _NPU)] == [
        "stage 1: MooncakeConnectorV1 kv_port range 30000-30001 overlaps AscendDirectTransport's random ports "
        "[20000, 36000) on a 16-NPU node"]


def test_opd504_lmcache_per_rank_port_lists_are_checked_element_by_element() -> None:
    # issue 22 / BR-50: `[7300, 7301]` was "not a port"; a list is LMCache's shape, each element a port
    from omni_pd.check.rules.capability import _lmc_rx

    assert hits(_lmc_rx("[7300, 7301]", "[7400, 7401]"), "OPD504") == []
    text = _lmc_rx("[7300, 70000]", "[7400, x]")
    assert [(h[0], h[1], h[3]) for h in hits(text, "OPD504")] == [
        (E, "stage 1: lmcache.pd_peer_init_port = [7300, 70000] holds 70000, not a port (1..65535)",
         "one port per rank, each a free port number between 1024 and 65535"),
        (E, "stage 1: lmcache.pd_peer_alloc_port = [7400, 'x'] holds 'x', not a port (1..65535)",
         "one port per rank, each a free port number between 1024 and 65535")]
    # a scalar there is OPD608's finding (LMCache cannot index it), not a second one here
    assert hits(_lmc_rx("7300", "[7400, 7401]"), "OPD504") == []
    # the scalar LMCache ports stay ports: pd_proxy_port 0 is still refused
    assert [h[1] for h in hits(_lmc_rx("[7300, 7301]", "[7400, 7401]").replace("pd_proxy_port: 7500", "pd_proxy_port: 0"),
                               "OPD504")] == ["stage 0: lmcache.pd_proxy_port = 0 is not a port (1..65535)"]
