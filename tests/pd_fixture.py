"""The two-stage NIXL PD pair the rule tests edit (one copy for every rule test file).

Valid as written: ``validate`` reports no error on it (tests/test_rules.py checks that).
"""

PD = """pipeline: qwen3_omni_moe_pd
async_chunk: false
stages:
  - stage_id: 0
    devices: "0"
    env:
      VLLM_NIXL_SIDE_CHANNEL_PORT: "5600"
    kv_transfer_config:
      kv_connector: NixlConnector
      kv_role: kv_producer
      engine_id: p
  - stage_id: 1
    devices: "1"
    env:
      VLLM_NIXL_SIDE_CHANNEL_PORT: "5601"
    kv_transfer_config:
      kv_connector: NixlConnector
      kv_role: kv_consumer
      engine_id: d
"""
