"""Capability rules read the row of the connector a stage loads (issue 35, "connector identity").

vLLM's ``KVConnectorFactory`` imports ``kv_connector_module_path`` when it is set and takes the
class named ``kv_connector`` from it, so ``kv_connector: MooncakeConnector`` with another package's
module path is that package's connector. The per-connector rows of omni_pd/check/rules/capability.py
and hetero_tp.py (TP pairing, buffer devices, MLA, fp8 over NIXL, block size, required extra
keys) key on :func:`omni_pd.check.rules.capability.connector_row`, not on the name as written.
"""

from __future__ import annotations

from omni_pd.check.validate import ValidateOptions, validate_text


def pair(connector: str, module: str | None = None, p_extra: str = "", d_extra: str = "") -> str:
    path = f", kv_connector_module_path: {module}" if module else ""
    return ("pipeline: qwen3_omni_moe_pd\nasync_chunk: false\nstages:\n"
            f"  - {{stage_id: 0, devices: \"0,1\"{p_extra}, kv_transfer_config: {{kv_connector: {connector}{path}, "
            "kv_role: kv_producer, engine_id: p}}\n"
            f"  - {{stage_id: 1, devices: \"2\"{d_extra}, kv_transfer_config: {{kv_connector: {connector}{path}, "
            "kv_role: kv_consumer, engine_id: d}}\n")


def codes(text: str, **opts) -> set[str]:
    return {d.code for d in validate_text(text, "pd.yaml", ValidateOptions(**opts)).diagnostics
            if d.severity.value == "error"}


def test_vllms_mooncake_row_judges_vllms_class_only():
    text = pair("MooncakeConnector", None, ", tensor_parallel_size: 2", ", tensor_parallel_size: 1")
    assert "OPD603" in codes(text, vllm_version="0.18")  # vLLM 0.18's MooncakeConnector: equal TP only
    other = pair("MooncakeConnector", "my_pkg.mooncake", ", tensor_parallel_size: 2", ", tensor_parallel_size: 1")
    assert "OPD603" not in codes(other, vllm_version="0.18")  # my_pkg's class: vLLM's row says nothing of it


def test_a_buffer_device_is_judged_by_the_loaded_connector():
    bad = pair("NixlConnector").replace("engine_id: p}", "engine_id: p, kv_buffer_device: tpu}")
    found = codes(bad)
    assert found, "vLLM's NixlConnector refuses a tpu buffer on cuda"
    other = pair("NixlConnector", "my_pkg.nixl").replace("engine_id: p}", "engine_id: p, kv_buffer_device: tpu}")
    assert codes(other) < found
