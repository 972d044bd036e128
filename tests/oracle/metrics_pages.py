"""Prometheus ``/metrics`` pages as vLLM 0.30 and vllm-omni 0.30 render them (issue 10, smoke).

Run with the oracle venv's python (``OMNI_PD_ORACLE_PYTHON``); prints one JSON object
``{name: page text}``. Each page is produced by the real stat loggers and
``prometheus_client.generate_latest`` -- no hand-written exposition:

* ``vllm_decode_*``: a plain ``vllm serve`` decode engine (``PrometheusStatLogger``,
  vllm/v1/metrics/loggers.py; labels ``model_name``, ``engine``), before and after one
  request whose prompt came from a remote prefill (``PrefillStats.num_external_cached_tokens``).
* ``omni_*``: a ``vllm serve --omni`` server; its orchestrator thread records every
  stage's engine stats through ``OmniPrometheusStatLogger``
  (vllm_omni/metrics/stat_logger.py; ``engine`` relabelled ``stage`` + ``replica``,
  engine/orchestrator.py ``_process_llm_stage_outputs`` -> ``record``) into the API
  process's registry, which vLLM's ``/metrics`` route serves. Pages: before any request,
  after one PD request (prefill stage 0 computes the prompt, decode stage 1 loads it and
  recomputes the last token, Talker stage 2 computes its own prompt), and after one
  request where decode recomputed the whole prompt (the transfer did not happen).

The vllm_config is a stand-in with the fields the loggers read (observability, model name
and length, cache, no speculative/LoRA/KV-connector config); the metric families, labels
and exposition are upstream's.
"""

from __future__ import annotations

import json
import time
import types

PROMPT = 127
MODEL = "Qwen/Qwen3-Omni-30B-A3B-Instruct"


def _config(model: str):
    from vllm.config import CacheConfig, ObservabilityConfig

    return types.SimpleNamespace(
        observability_config=ObservabilityConfig(), speculative_config=None, kv_transfer_config=None,
        lora_config=None, cache_config=CacheConfig(), parallel_config=types.SimpleNamespace(),
        model_config=types.SimpleNamespace(served_model_name=model, max_model_len=4096, is_diffusion=False))


def _iteration(prompt: int, local: int, external: int, generated: int = 1):
    from vllm.v1.metrics.stats import IterationStats, PrefillStats

    it = IterationStats()
    ps = PrefillStats()
    ps.num_prompt_tokens, ps.num_computed_tokens = prompt, local
    ps.num_cached_tokens, ps.num_external_cached_tokens = prompt - local, external
    ps.num_local_cached_tokens = prompt - local - external
    it.prompt_token_stats.update_from_output(ps)
    it.num_generation_tokens = generated
    return it


def _page() -> str:
    import prometheus_client
    from vllm.v1.metrics.prometheus import get_prometheus_registry

    return prometheus_client.generate_latest(get_prometheus_registry()).decode()


def main() -> None:
    from vllm.v1.metrics.loggers import PrometheusStatLogger
    from vllm_omni.metrics.stat_logger import OmniPrometheusStatLogger

    pages: dict[str, str] = {}
    plain = PrometheusStatLogger(_config("tiny-qwen2"), engine_indexes=[0])
    pages["vllm_decode_before"] = _page()
    plain.record(None, _iteration(PROMPT, 1, PROMPT - 1, 8), engine_idx=0)
    pages["vllm_decode_after_pd"] = _page()

    # stage_replica_map as the orchestrator builds it: flat index per (stage, replica)
    omni = OmniPrometheusStatLogger(_config(MODEL), {i: (str(i), "0") for i in range(4)})
    pages["omni_before"] = _page()
    omni.record(None, _iteration(PROMPT, PROMPT, 0, 1), engine_idx=0)          # prefill: max_tokens 1
    omni.record(None, _iteration(PROMPT, 1, PROMPT - 1, 8), engine_idx=1)      # decode: KV from prefill
    omni.record(None, _iteration(40, 40, 0, 20), engine_idx=2)                 # Talker
    pages["omni_after_pd"] = _page()
    omni.record(None, _iteration(PROMPT, PROMPT, 0, 1), engine_idx=0)
    omni.record(None, _iteration(PROMPT, PROMPT, 0, 8), engine_idx=1)          # decode recomputed
    pages["omni_after_recompute"] = _page()
    pages["_generated"] = time.strftime("%Y-%m-%d")
    print(json.dumps(pages))


if __name__ == "__main__":
    main()
