"""`omni-pd launch --platform npu` plans for the vllm-ascend pair (pull and layerwise push,
4 -> 2 TP): exact argv, env (ASCEND_RT_VISIBLE_DEVICES, HCCL_IF_BASE_PORT), the ports
preflight try-binds, the router command; the PD ratio is refused before anything starts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from omni_pd.io import load_file, parse_text
from omni_pd.launch.plan import LaunchOptions, plan_document
from omni_pd.launch.router.sizing import default_workers

GOLDEN = Path(__file__).resolve().parent / "golden" / "ascend"


def _plan(name: str):
    path = GOLDEN / name
    planned = plan_document(load_file(path), str(path), LaunchOptions(model="/models/q", platform="npu"))
    assert planned.plan is not None, [d.message for d in planned.validation.diagnostics]
    return planned.plan


@pytest.mark.parametrize("golden,connector,blocks", [
    ("thinker_tp4_to_2_pull.yaml", "MooncakeConnectorV1",
     ',"kv_connector_extra_config":{"prefill":{"dp_size":1,"tp_size":4},"decode":{"dp_size":1,"tp_size":2}}'),
    ("thinker_tp4_to_2_layerwise.yaml", "MooncakeLayerwiseConnector", ""),
])
def test_npu_plan_argv_env_and_ports(golden, connector, blocks) -> None:
    pre, dec, router = _plan(golden).processes
    assert pre.argv[:10] == ("vllm", "serve", "/models/q", "--host", "127.0.0.1", "--port", "8100",
                             "--served-model-name", "/models/q", "--kv-transfer-config")
    assert pre.argv[10] == ('{"kv_connector":"' + connector + '","engine_id":"omni-thinker-prefill",'
                            '"kv_role":"kv_producer","kv_port":36000' + blocks + "}")
    assert dec.argv[10] == ('{"kv_connector":"' + connector + '","engine_id":"omni-thinker-decode",'
                            '"kv_role":"kv_consumer","kv_port":36004' + blocks + "}")
    assert pre.argv[-2:] == ("--tensor-parallel-size", "4") and dec.argv[-2:] == ("--tensor-parallel-size", "2")
    assert (pre.device_env, pre.devices, dec.devices) == ("ASCEND_RT_VISIBLE_DEVICES", "0,1,2,3", "4,5")
    assert (pre.env["HCCL_IF_BASE_PORT"], dec.env["HCCL_IF_BASE_PORT"]) == ("61000", "61064")
    assert pre.env["ASCEND_RT_VISIBLE_DEVICES"] == "0,1,2,3"
    # the base's CUDA Mooncake env (kept by the overlay's env merge) is not passed to vllm-ascend
    assert dict(pre.env) == {"HCCL_IF_BASE_PORT": "61000", "ASCEND_RT_VISIBLE_DEVICES": "0,1,2,3"}
    assert dict(dec.env) == {"HCCL_IF_BASE_PORT": "61064", "ASCEND_RT_VISIBLE_DEVICES": "4,5"}
    # preflight try-binds every one of these before anything starts
    assert [(u.port, u.purpose) for u in pre.ports] == [
        (8100, "http"), *[(36000 + i, f"kv_port + rank ({connector})[{i}]") for i in range(4)],
        (61000, "HCCL listener (HCCL_IF_BASE_PORT)")]
    assert [(u.port, u.purpose) for u in dec.ports] == [
        (8200, "http"), *[(36004 + i, f"kv_port + rank ({connector})[{i}]") for i in range(2)],
        (61064, "HCCL listener (HCCL_IF_BASE_PORT)")]
    # the router's port is also the layerwise metaserver's (POST /v1/metaserver)
    # the decode-first (layerwise) front keeps its metaserver state in one process: no --workers
    workers = () if connector == "MooncakeLayerwiseConnector" else ("--workers", str(default_workers()))
    assert router.argv == (sys.executable, "-m", "omni_pd.launch.router", "--connector", connector,
                           "--host", "127.0.0.1", "--port", "8000", *workers, "--prefill", "http://127.0.0.1:8100",
                           "--decode", "http://127.0.0.1:8200")
    assert [(u.port, u.purpose) for u in router.ports] == [(8000, "http")]


def test_npu_plan_refuses_a_pd_ratio_vllm_ascend_rejects() -> None:
    text = (GOLDEN / "thinker_tp4_to_2_pull.yaml").read_text()
    # decode TP 4 > prefill TP 2: vllm-ascend's worker raises at init (P_tp >= D_tp)
    bad = (text.replace("tensor_parallel_size: 4", "tensor_parallel_size: X")
               .replace("tensor_parallel_size: 2", "tensor_parallel_size: 4").replace("tensor_parallel_size: X", "tensor_parallel_size: 2"))
    planned = plan_document(parse_text(bad, "bad.yaml"), "bad.yaml", LaunchOptions(model="/m", platform="npu"))
    assert planned.plan is None
    msgs = [d.message for d in planned.validation.errors if d.code == "OPD603"]
    assert msgs == ["vllm-ascend MooncakeConnectorV1 needs prefill TP >= decode TP and divisible by it (got P=2, D=4)"]


def test_npu_plan_drops_every_cuda_connector_variable_the_base_stage_kept(tmp_path) -> None:
    """The base's NIXL variables are as unread by vllm-ascend as Mooncake's bootstrap port:
    none reaches the npu engines (the other env stays)."""
    text = (GOLDEN / "thinker_tp4_to_2_pull.yaml").read_text().replace(
        '      VLLM_MOONCAKE_BOOTSTRAP_PORT: "25201"\n',
        '      VLLM_MOONCAKE_BOOTSTRAP_PORT: "25201"\n      VLLM_NIXL_SIDE_CHANNEL_PORT: "5600"\n'
        '      VLLM_NIXL_SIDE_CHANNEL_HOST: "127.0.0.1"\n      KEEP_ME: "1"\n', 1)
    f = tmp_path / "npu.yaml"
    f.write_text(text)
    planned = plan_document(parse_text(text, str(f)), str(f), LaunchOptions(model="/models/q", platform="npu"))
    assert planned.plan is not None, [d.message for d in planned.validation.diagnostics]
    pre = planned.plan.processes[0]
    assert dict(pre.env) == {"KEEP_ME": "1", "HCCL_IF_BASE_PORT": "61000", "ASCEND_RT_VISIBLE_DEVICES": "0,1,2,3"}


def test_npu_hccl_listener_is_planned_on_the_launch_host() -> None:
    path = GOLDEN / "thinker_tp4_to_2_pull.yaml"
    plan = plan_document(load_file(path), str(path), LaunchOptions(model="/m", platform="npu", host="10.0.0.5")).plan
    assert [(u.port, u.host) for u in plan.processes[0].ports if u.purpose.startswith("HCCL")] == [(61000, "10.0.0.5")]
