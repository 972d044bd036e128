"""The port plan and the launch plan read the connector a stage LOADS, not the name it writes.

vLLM's ``KVConnectorFactory.get_connector_class`` (kv_connector/factory.py, every release
0.11-0.34) takes the class named ``kv_connector`` from ``kv_connector_module_path`` when one is
set. ``kv_connector: MooncakeConnector`` with vllm-ascend's module path is therefore
vllm-ascend's pull connector (registered there as ``MooncakeConnectorV1``): it binds a side
channel at ``kv_port`` + rank and serves no Mooncake bootstrap port. The port plan (one for
validate's OPD510, launch and render: omni_pd/compile/port_plan.py) used to look the contract up
by ``kv_connector`` alone, so it reserved vLLM's bootstrap port, gave the router a prefill
bootstrap port nothing listened on, and missed the ``kv_port`` ranges.
"""

from __future__ import annotations

from pathlib import Path

from omni_pd.compile import connectors
from omni_pd.io import load_file
from omni_pd.launch.plan import LaunchOptions, plan_document

ASCEND_PULL = "vllm_ascend.distributed.kv_transfer.kv_p2p.mooncake_connector"
SIZES = "{prefill: {dp_size: 1, tp_size: 1}, decode: {dp_size: 1, tp_size: 1}}"


def _pd(tmp_path: Path, module_path: str | None) -> Path:
    mp = f"\n      kv_connector_module_path: {module_path}" if module_path else ""
    stages = []
    for sid, role, port in ((0, "kv_producer", 36000), (1, "kv_consumer", 36100)):
        env = '\n    env: {VLLM_MOONCAKE_BOOTSTRAP_PORT: "25201"}' if sid == 0 else ""
        stages.append(f"""  - stage_id: {sid}
    max_model_len: 1024
    devices: "{sid}"{env}
    kv_transfer_config:
      kv_connector: MooncakeConnector{mp}
      kv_role: {role}
      kv_port: {port}
      engine_id: {"pd"[sid]}
      kv_connector_extra_config: {SIZES}""")
    f = tmp_path / "pd.yaml"
    f.write_text("pipeline: llm_pd\nasync_chunk: false\nstages:\n" + "\n".join(stages)
                 + "\nedges:\n  - {from: 0, to: 1}\n")
    return f


def _plan(path: Path, platform: str):
    planned = plan_document(load_file(path), str(path), LaunchOptions(model="m", platform=platform))
    assert planned.plan is not None, [d.message for d in planned.validation.diagnostics]
    return {p.name: p for p in planned.plan.processes}


def _ports(p) -> list[tuple[int, str]]:
    return [(u.port, u.purpose) for u in p.ports]


def test_contract_of_reads_the_module_path():
    kv = {"kv_connector": "MooncakeConnector", "kv_connector_module_path": ASCEND_PULL}
    assert connectors.contract_of(kv, "npu").name == "MooncakeConnectorV1"
    assert connectors.row_name(kv, "npu") == "MooncakeConnectorV1"
    # vLLM's own module path is vLLM's connector; no module path is the registry name
    assert connectors.contract_of({**kv, "kv_connector_module_path": "vllm.distributed.kv_transfer.kv_connector.v1"
                                   ".mooncake.mooncake_connector"}).name == "MooncakeConnector"
    assert connectors.contract_of({"kv_connector": "MooncakeConnector"}).name == "MooncakeConnector"
    # a class only an out-of-tree module path names: no contract, its name as written
    oot = {"kv_connector": "MooncakeConnector", "kv_connector_module_path": "my_pkg.conn"}
    assert connectors.contract_of(oot) is None
    assert connectors.row_name(oot) == "MooncakeConnector"
    assert connectors.row_name(None) == "" and connectors.contract_of({}) is None


def test_vllm_ascend_module_path_plans_kv_port_side_channels_not_a_bootstrap_port(tmp_path):
    procs = _plan(_pd(tmp_path, ASCEND_PULL), "npu")
    assert _ports(procs["prefill-0"]) == [(8100, "http"), (36000, "kv_port + rank (MooncakeConnectorV1)")]
    assert _ports(procs["decode-0"]) == [(8200, "http"), (36100, "kv_port + rank (MooncakeConnectorV1)")]
    router = procs["router"].argv
    assert router[router.index("--connector") + 1] == "MooncakeConnectorV1"
    # no bootstrap port for the router, and vLLM's bootstrap variable (unread by vllm-ascend) dropped
    assert router[router.index("--prefill") + 1] == "http://127.0.0.1:8100"
    assert "VLLM_MOONCAKE_BOOTSTRAP_PORT" not in procs["prefill-0"].env


def test_without_a_module_path_the_same_file_is_vllms_mooncake(tmp_path):
    """The same stages without the module path load vLLM's MooncakeConnector on cuda: prefill's
    bootstrap port from its env, given to the router; no kv_port listener (vLLM reads kv_port
    for P2pNcclConnector only)."""
    procs = _plan(_pd(tmp_path, None), "cuda")
    assert _ports(procs["prefill-0"]) == [(8100, "http"), (25201, "Mooncake bootstrap")]
    assert _ports(procs["decode-0"]) == [(8200, "http")]
    router = procs["router"].argv
    assert router[router.index("--connector") + 1] == "MooncakeConnector"
    assert router[router.index("--prefill") + 1] == "http://127.0.0.1:8100,25201"
