"""Runs inside the vllm-omni oracle venv (``python tests/oracle/dp_probe.py DEPLOY.yaml``):
the deploy file through vllm-omni 0.30.0's serve-path resolver (``resolve_omni_config``,
with vLLM's and vllm-omni's plugins loaded first, as ``vllm serve --omni`` loads them, so
omni-pd's compatibility layer registers the ``*_pd`` pipelines), and per stage the
parallel sizes vllm-omni gives its engine and the devices one replica takes
(``engine/stage_init_utils.py`` ``get_stage_devices_per_replica``: TP x local DP x PP).
Prints one line ``DP-PROBE <json list>``; tests/test_expand_dp.py asserts on it.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from omni_pd.upstream.vllm_oracle import _install_standins

_install_standins()


def main() -> int:
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    import vllm_omni.plugins as omni_plugins

    omni_plugins.load_omni_general_plugins()
    from vllm_omni.config.resolver import resolve_omni_config
    from vllm_omni.engine.stage_init_utils import get_stage_devices_per_replica

    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "config.json").write_text(json.dumps({"model_type": sys.argv[2] if len(sys.argv) > 2
                                                        else "qwen3_omni_moe"}))
        res = resolve_omni_config(tmp, trust_remote_code=False, cli_overrides={}, deploy_config_path=sys.argv[1],
                                  stage_overrides=None, strategy_config_path=None)

    def get(obj, key):
        return obj.get(key) if hasattr(obj, "get") else getattr(obj, key, None)

    out = [{"stage": s.stage_id, "tp": get(s.parallel_config, "tensor_parallel_size"),
            "dp": get(s.parallel_config, "data_parallel_size"), "per_replica": get_stage_devices_per_replica(s),
            "devices": get(s.runtime_config, "devices"), "replicas": get(s.runtime_config, "num_replicas")}
           for s in res.stage_configs]
    print("DP-PROBE " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
