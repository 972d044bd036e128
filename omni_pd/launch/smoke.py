"""``omni-pd launch --smoke``: one request through the entrypoint, then proof the KV moved.

Silent recompute is the classic PD failure: decode answers correctly but computed the
prompt itself because the transfer never happened. So the smoke check reads decode's
Prometheus ``/metrics`` before and after one greedy completion and requires a counter
that only grows when KV arrives from prefill (:data:`KV_RECEIVED`). stdlib only.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from dataclasses import dataclass
from typing import TextIO

#: decode-side counters that grow only with KV received from a remote prefill
#: (vLLM v1 metrics: vllm/v1/metrics/loggers.py `prompt_tokens_by_source`,
#: NIXL connector stats `nixl_xfer_time_seconds`)
KV_RECEIVED = (
    re.compile(r'^vllm:prompt_tokens_by_source_total\{[^}]*source="external_kv_transfer"[^}]*\}\s+(\S+)'),
    re.compile(r"^vllm:nixl_xfer_time_seconds_count(?:\{[^}]*\})?\s+(\S+)"),
)
#: long enough that whole KV blocks move (CPU block size is 128 tokens)
PROMPT = " ".join(f"def f{i}(x): return x * {i}" for i in range(60))


def kv_received(metrics_text: str) -> float:
    """Sum of the :data:`KV_RECEIVED` counters in a Prometheus text page."""
    total = 0.0
    for line in metrics_text.splitlines():
        for rx in KV_RECEIVED:
            m = rx.match(line)
            if m:
                try:
                    total += float(m.group(1))
                except ValueError:
                    pass
    return total


def _get(url: str, timeout: float) -> str:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as r:
        return r.read().decode("utf-8", "replace")


def _post(url: str, body: dict, timeout: float) -> dict:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with opener.open(req, timeout=timeout) as r:
        return json.loads(r.read())


@dataclass
class SmokeResult:
    """``text``: the completion; ``kv_before``/``kv_after``: :func:`kv_received` of
    decode's metrics; ``seconds``: request latency."""

    text: str
    kv_before: float
    kv_after: float
    seconds: float

    @property
    def kv_moved(self) -> bool:
        return self.kv_after > self.kv_before


def smoke(entrypoint: str, model: str, decode_metrics: str | None, *, max_tokens: int = 8,
          timeout_s: float = 300.0) -> SmokeResult:
    """One greedy completion through ``entrypoint`` and decode's KV counters around it.

    Raises ``OSError``/``urllib.error.URLError`` when a server does not answer."""
    before = kv_received(_get(decode_metrics, 30)) if decode_metrics else 0.0
    t0 = time.monotonic()
    r = _post(entrypoint.rstrip("/") + "/v1/completions",
              {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0}, timeout_s)
    dt = time.monotonic() - t0
    text = (r.get("choices") or [{}])[0].get("text", "")
    after = kv_received(_get(decode_metrics, 30)) if decode_metrics else 0.0
    return SmokeResult(text=text, kv_before=before, kv_after=after, seconds=dt)


def smoke_check(entrypoint: str, model: str, decode_metrics: str | None, out: TextIO) -> int:
    """:func:`smoke` as a readiness callback: 0 when the KV moved (or cannot be
    measured: no decode metrics URL), 1 otherwise; prints one line either way."""
    try:
        res = smoke(entrypoint, model, decode_metrics)
    except Exception as e:  # any failure of the request is a failed smoke test
        out.write(f"smoke: request failed: {type(e).__name__}: {e}\n")
        return 1
    if decode_metrics is None:
        out.write(f"smoke: completion in {res.seconds:.2f} s: {res.text!r} (KV transfer not measurable here)\n")
        return 0
    if not res.kv_moved:
        out.write(f"smoke: FAILED: decode answered {res.text!r} but its KV-received counters did not grow "
                  f"({res.kv_before:g} -> {res.kv_after:g}): it recomputed the prompt instead of using prefill's KV\n")
        return 1
    out.write(f"smoke: ok in {res.seconds:.2f} s: {res.text!r}; decode received KV from prefill "
              f"(counters {res.kv_before:g} -> {res.kv_after:g})\n")
    return 0
