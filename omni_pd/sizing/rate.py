"""A target request rate -> instances per side, by inverting AIConfigurator's own rate matching.

AIConfigurator 0.12.0 rates a disaggregated deployment of ``P`` prefill and ``D`` decode
instances (``aiconfigurator/sdk/picking.py`` ``build_disagg_summary_dict``, the same arithmetic
in ``sdk/sweep.py`` and ``DisaggInferenceSession._get_disagg_summary_dict``) as::

    seq/s = min(P * (p)seq/s/worker * 0.9, D * (d)seq/s/worker * 0.92)

``(p)seq/s/worker`` / ``(d)seq/s/worker`` are columns of every disagg row it returns (requests per
second one instance of that side serves at the row's batch size and SLO), 0.9 / 0.92 its
rate-matching degradation factors (``sdk/task_v2.py`` ``rate_match_prefill_degradation`` /
``rate_match_decode_degradation``, defaults of ``cli_default``). A row's per-instance figures do
not depend on how many instances run, so the fewest instances that serve ``R`` req/s are::

    P = ceil(R / (0.9 * (p)seq/s/worker)),  D = ceil(R / (0.92 * (d)seq/s/worker))

(a target within 0.0005 req/s of a multiple counts as served: AIConfigurator rounds its req/s
columns to 3 decimals), and the Thinker's devices ``P * tp*pp*dp (prefill) + D * tp*pp*dp (decode)``. Pure functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping

from omni_pd.sizing.plan import ThinkerChoice

#: ``rate_match_prefill_degradation`` / ``rate_match_decode_degradation`` (aiconfigurator 0.12.0 sdk/task_v2.py)
PREFILL_DEGRADATION = 0.9
DECODE_DEGRADATION = 0.92


@dataclass(frozen=True)
class RateFit:
    """How a disagg row scales to ``target`` req/s: instances per side and what they serve.

    ``served`` is AIConfigurator's ``seq/s`` formula for the scaled row (>= ``target``);
    ``prefill_per_instance``/``decode_per_instance`` the row's ``(p)``/``(d)seq/s/worker``.
    """

    target: float
    prefill_replicas: int
    decode_replicas: int
    served: float
    prefill_per_instance: float
    decode_per_instance: float


def served(row: Mapping[str, Any], prefill: int, decode: int) -> float:
    """AIConfigurator's ``seq/s`` of ``row``'s instances run ``prefill`` x ``decode`` times (req/s)."""
    return min(prefill * float(row["(p)seq/s/worker"]) * PREFILL_DEGRADATION,
               decode * float(row["(d)seq/s/worker"]) * DECODE_DEGRADATION)


#: AIConfigurator rounds its req/s columns to 3 decimals: a rate within half of that is served
ROUNDING = 5e-4


def _instances(target: float, per_instance: float) -> int:
    return max(1, math.ceil((target - ROUNDING) / per_instance))


def fit(row: Mapping[str, Any], target: float) -> RateFit:
    """The fewest instances of each side of ``row`` that serve ``target`` req/s.

    Raises ValueError for a non-positive target or a row without per-instance throughput."""
    if not (math.isfinite(target) and target > 0):
        raise ValueError(f"--request-rate must be a positive number of requests per second, not {target:g}")
    p, d = float(row.get("(p)seq/s/worker") or 0), float(row.get("(d)seq/s/worker") or 0)
    if p <= 0 or d <= 0:
        raise ValueError("the AIConfigurator row has no (p)seq/s/worker / (d)seq/s/worker to scale")
    pw, dw = _instances(target, PREFILL_DEGRADATION * p), _instances(target, DECODE_DEGRADATION * d)
    return RateFit(target, pw, dw, round(served(row, pw, dw), 3), p, d)


def scaled(c: ThinkerChoice, row: Mapping[str, Any], f: RateFit, osl: int) -> ThinkerChoice:
    """``c`` with ``f``'s instance counts and AIConfigurator's throughput columns recomputed for
    them (``tokens/s/gpu = seq/s * osl / GPUs``, ``concurrency`` = per decode instance x D); TTFT
    and TPOT are per instance and stay."""
    out = replace(c, prefill=replace(c.prefill, replicas=f.prefill_replicas),
                  decode=replace(c.decode, replicas=f.decode_replicas))
    per_decode = float(row["concurrency"]) / int(row["(d)workers"])
    return replace(out, tokens_per_s_gpu=round(f.served * osl / out.devices, 3),
                   concurrency=per_decode * f.decode_replicas)
