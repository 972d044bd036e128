"""Which AIConfigurator model stands for the Thinker's language model.

PD splits the Thinker only; its LLM is ``thinker_config.text_config`` of a Qwen3-Omni config.json
(a plain LLM config.json is its own text config). AIConfigurator models a model from the config it
ships (``aiconfigurator_core/model_configs/<org>--<name>_config.json``); the Thinker is the same
compute as a shipped model when the fields that set its FLOPs, weight and KV bytes are equal
(:data:`SHAPE_KEYS`). Otherwise the adapter refuses and names the nearest shipped model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

#: fields of a text config that fix per-token compute, weight bytes and KV bytes
SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
              "intermediate_size", "num_experts", "num_experts_per_tok", "moe_intermediate_size")


def thinker_text_config(cfg: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """The LLM text config PD splits and where it was found (``"thinker_config.text_config"``, ...)."""
    th = cfg.get("thinker_config")
    if isinstance(th, dict):
        tc = th.get("text_config")
        return (dict(tc), "thinker_config.text_config") if isinstance(tc, dict) else (dict(th), "thinker_config")
    tc = cfg.get("text_config")
    return (dict(tc), "text_config") if isinstance(tc, dict) else (dict(cfg), "config.json")


def shape(text: Mapping[str, Any]) -> dict[str, Any]:
    """The :data:`SHAPE_KEYS` of a text config; ``head_dim`` defaults to hidden/heads, a dense
    model's expert fields to None; ``num_local_experts`` counts as ``num_experts``."""
    s = {k: text.get(k) for k in SHAPE_KEYS}
    if s["num_experts"] is None:
        s["num_experts"] = text.get("num_local_experts")
    if s["head_dim"] is None and s["hidden_size"] and s["num_attention_heads"]:
        s["head_dim"] = s["hidden_size"] // s["num_attention_heads"]
    if not s["num_experts"]:
        s["num_experts"] = s["num_experts_per_tok"] = s["moe_intermediate_size"] = None
    else:
        s["intermediate_size"] = None  # routed-expert models: the dense width is unused by Qwen3-MoE layers
    return s


@dataclass(frozen=True)
class Match:
    """``model``: the nearest shipped AIConfigurator model; ``exact``: same shape; ``differs``:
    ``{key: (thinker, shipped)}`` where not."""

    model: str
    exact: bool
    differs: dict[str, tuple[Any, Any]]


def nearest(text: Mapping[str, Any], shipped: Mapping[str, Mapping[str, Any]]) -> Match:
    """The shipped model (``{model id: its config.json}``) whose shape differs in the fewest keys,
    ties broken by the relative distance of the numbers. Raises ValueError when ``shipped`` is empty."""
    if not shipped:
        raise ValueError("no AIConfigurator model configs to compare with")
    want = shape(text)

    def cost(cfg: Mapping[str, Any]) -> tuple[int, float]:
        got = shape(thinker_text_config(cfg)[0])
        n = sum(want[k] != got[k] for k in SHAPE_KEYS)
        rel = sum(abs((want[k] or 0) - (got[k] or 0)) / max(want[k] or 0, got[k] or 0, 1) for k in SHAPE_KEYS)
        return n, rel

    best = min(sorted(shipped), key=lambda m: cost(shipped[m]))
    got = shape(thinker_text_config(shipped[best])[0])
    diff = {k: (want[k], got[k]) for k in SHAPE_KEYS if want[k] != got[k]}
    return Match(best, not diff, diff)
