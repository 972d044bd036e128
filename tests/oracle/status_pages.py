"""``/metrics`` pages of a 1P1D NIXL pair as vLLM 0.30 renders them, for ``omni-pd status``.

Run with the oracle venv's python (``OMNI_PD_ORACLE_PYTHON``); prints one JSON object
``{name: page text}``. As tests/oracle/metrics_pages.py: every page is produced by vLLM's
own ``PrometheusStatLogger`` (vllm/v1/metrics/loggers.py) and
``prometheus_client.generate_latest`` -- no hand-written exposition -- here with a
``kv_transfer_config`` naming ``NixlConnector``, so the logger also registers the NIXL
connector's families (vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py
``NixlPromMetrics``: ``vllm:nixl_xfer_time_seconds``, ``vllm:nixl_bytes_transferred``,
``vllm:nixl_num_failed_transfers``, ``vllm:nixl_num_failed_notifications``,
``vllm:nixl_num_kv_expired_reqs``), fed with ``NixlKVConnectorStats`` as the scheduler
hands them over (``SchedulerStats.kv_connector_stats``).

Each engine gets its own logger (a new logger unregisters the previous one's families,
``unregister_vllm_metrics``), and each scenario a page before and after its window:

* ``pd``: prefill finishes 3 requests of 127 prompt tokens at ``max_tokens`` 1 (computes
  them); decode finishes the same 3, loading 126 tokens each from prefill and computing the
  last one, over 3 NIXL transfers of 1 MiB;
* ``fallback``: the router sent the 3 requests to decode alone: prefill counts nothing,
  decode computes all 127 tokens of each;
* ``failing``: 3 requests where 2 NIXL reads failed (decode then recomputed those prompts)
  and prefill's lease expired for 2 (``num_kv_expired_reqs``, tracked on prefill).
"""

from __future__ import annotations

import json
import types

PROMPT = 127
MODEL = "tiny-qwen2"
MiB = 1 << 20


def _config():
    from vllm.config import CacheConfig, KVTransferConfig, ObservabilityConfig

    return types.SimpleNamespace(
        observability_config=ObservabilityConfig(), speculative_config=None,
        kv_transfer_config=KVTransferConfig(kv_connector="NixlConnector", kv_role="kv_both"),
        lora_config=None, cache_config=CacheConfig(), parallel_config=types.SimpleNamespace(),
        model_config=types.SimpleNamespace(served_model_name=MODEL, max_model_len=1024, is_diffusion=False))


def _iteration(n: int, local: int, external: int, generated: int, ttft: float, itl: float, reason: str):
    """``n`` requests of :data:`PROMPT` tokens (``local`` computed, ``external`` loaded
    from prefill each), ``generated`` tokens each, finished with ``reason``."""
    from vllm.v1.engine import FinishReason
    from vllm.v1.metrics.stats import FinishedRequestStats, IterationStats, PrefillStats

    it = IterationStats()
    for _ in range(n):
        ps = PrefillStats()
        ps.num_prompt_tokens, ps.num_computed_tokens = PROMPT, local
        ps.num_cached_tokens, ps.num_external_cached_tokens = PROMPT - local, external
        ps.num_local_cached_tokens = PROMPT - local - external
        it.prompt_token_stats.update_from_output(ps)
        it.num_generation_tokens += generated
        it.time_to_first_tokens_iter.append(ttft)
        it.inter_token_latencies_iter.extend([itl] * (generated - 1))
        it.finished_requests.append(FinishedRequestStats(
            finish_reason=FinishReason[reason], e2e_latency=ttft + itl * (generated - 1), num_prompt_tokens=PROMPT,
            num_generation_tokens=generated, max_tokens_param=generated, num_cached_tokens=PROMPT - local))
    return it


def _sched(kv_usage: float, running: int, waiting: int, transfers: int = 0, failed: int = 0, expired: int = 0):
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import NixlKVConnectorStats
    from vllm.v1.metrics.stats import SchedulerStats

    st = NixlKVConnectorStats()
    for _ in range(transfers):
        st.record_transfer(types.SimpleNamespace(xferDuration=20_000, postDuration=1_000, totalBytes=MiB, descCount=56))
    for _ in range(failed):
        st.record_failed_transfer()
    for _ in range(expired):
        st.record_kv_expired_req()
    return SchedulerStats(num_running_reqs=running, num_waiting_reqs=waiting, kv_cache_usage=kv_usage,
                          kv_connector_stats=st.data)


def _page() -> str:
    import prometheus_client
    from vllm.v1.metrics.prometheus import get_prometheus_registry

    return prometheus_client.generate_latest(get_prometheus_registry()).decode()


def _engine(pages: dict[str, str], name: str, sched, it) -> None:
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    logger = PrometheusStatLogger(_config(), engine_indexes=[0])
    logger.record(_sched(0.0, 0, 0), None, engine_idx=0)
    pages[name + "_before"] = _page()
    logger.record(sched, it, engine_idx=0)
    pages[name + "_after"] = _page()


def main() -> None:
    pages: dict[str, str] = {}
    # pd: prefill computes, decode loads 126 of 127 tokens per request over NIXL
    _engine(pages, "pd_prefill", _sched(0.0, 0, 0), _iteration(3, PROMPT, 0, 1, 0.5, 0.0, "LENGTH"))
    _engine(pages, "pd_decode", _sched(0.25, 1, 0, transfers=3),
            _iteration(3, 1, PROMPT - 1, 8, 0.08, 0.04, "LENGTH"))
    # fallback: prefill never called, decode computes every prompt token
    _engine(pages, "fallback_prefill", _sched(0.0, 0, 0), None)
    _engine(pages, "fallback_decode", _sched(0.25, 1, 2), _iteration(3, PROMPT, 0, 8, 0.6, 0.04, "LENGTH"))
    # failing: 2 of 3 reads failed (decode recomputed those), prefill's lease expired for 2
    _engine(pages, "failing_prefill", _sched(0.0, 0, 0, expired=2), _iteration(3, PROMPT, 0, 1, 0.5, 0.0, "LENGTH"))
    decode = _iteration(1, 1, PROMPT - 1, 8, 0.08, 0.04, "LENGTH")
    recomputed = _iteration(2, PROMPT, 0, 8, 0.6, 0.04, "LENGTH")
    for k in ("computed", "local_cache_hit", "external_kv_transfer", "cached_tokens", "total"):
        setattr(decode.prompt_token_stats, k, getattr(decode.prompt_token_stats, k) + getattr(recomputed.prompt_token_stats, k))
    decode.num_generation_tokens += recomputed.num_generation_tokens
    decode.time_to_first_tokens_iter += recomputed.time_to_first_tokens_iter
    decode.inter_token_latencies_iter += recomputed.inter_token_latencies_iter
    decode.finished_requests += recomputed.finished_requests
    _engine(pages, "failing_decode", _sched(0.25, 0, 0, transfers=1, failed=2), decode)
    print(json.dumps(pages))


if __name__ == "__main__":
    main()
