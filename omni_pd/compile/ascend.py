"""vllm-ascend as a target: the facts of ``presets/targets/vllm_ascend.yaml`` and the
pure rules omni-pd derives from them (peer blocks, ``kv_port`` spans, HCCL bases, TP).

Every fact there carries the vllm-ascend file:line it was read at (drift-tested by
``tests/test_ascend_facts.py``); this module only reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

#: Ascend connector names omni-pd emits: pull (D reads from P) and layerwise push
PULL = "MooncakeConnectorV1"
PUSH = "MooncakeLayerwiseConnector"


@lru_cache(maxsize=1)
def facts() -> dict[str, Any]:
    """The parsed ``presets/targets/vllm_ascend.yaml``."""
    from omni_pd.resources import data_dir, load_data

    return load_data(data_dir("presets") / "targets" / "vllm_ascend.yaml")


def rules() -> dict[str, Any]:
    return facts()["rules"]


def releases() -> dict[str, str]:
    """vllm-ascend release -> the vLLM ``major.minor`` it runs on (``0.23.0.post1`` -> ``0.23``)."""
    return {str(k): str(v["vllm"]) for k, v in facts()["targets"].items()}


def release_for_vllm(vllm: str) -> str | None:
    """The vllm-ascend release built for vLLM ``vllm`` (``"0.23"``), or None."""
    for rel, base in releases().items():
        if base == vllm:
            return rel
    return None


@dataclass(frozen=True)
class Sizes:
    """Parallel sizes of one engine: ``tp`` tensor, ``dp`` data, ``pp`` pipeline (each >= 1)."""

    tp: int = 1
    dp: int = 1
    pp: int = 1

    @property
    def ranks(self) -> int:
        """Worker processes (NPUs) of the engine: tp * dp * pp."""
        return self.tp * self.dp * self.pp


def is_ascend(name: str | None) -> bool:
    """True for a connector omni-pd knows as vllm-ascend's Mooncake PD connector."""
    return name in rules()["connectors"]


def emits(name: str | None) -> bool:
    """True for a vllm-ascend PD connector ``expand`` writes (``--npu-connector``): a row
    of ``rules.connectors`` without ``emit: false`` (MooncakeHybridConnector is checked by
    validate only: omni-pd has no connector contract for it)."""
    return is_ascend(name) and bool(rules()["connectors"][name].get("emit", True))


def registered(release: str | None = None) -> frozenset[str]:
    """The KV connector names vllm-ascend ``release`` registers in vLLM's factory
    (``extracted.<release>.connectors``, vllm_ascend/distributed/kv_transfer/__init__.py);
    ``release`` None: the names of every release in the table."""
    ex = facts()["extracted"]
    rels = [release] if release is not None else list(ex)
    out: set[str] = set()
    for rel in rels:
        conns = ((ex.get(rel) or {}).get("connectors") or {}).get("value") or {}
        out.update(str(k) for k in conns)
    return frozenset(out)


def peer_blocks_read(name: str, release: str | None = None) -> bool:
    """Whether ``name`` at vllm-ascend ``release`` reads ``kv_connector_extra_config.prefill``
    /``.decode`` (MooncakeConnectorV1: always; MooncakeLayerwiseConnector: before 0.18)."""
    c = rules()["connectors"][name]
    if c["peer_blocks"]:
        return True
    until = c.get("peer_blocks_until")
    if until is None or release is None:
        return False
    from omni_pd.compile.targets import parse_version

    return parse_version(release) < parse_version(until)


def peer_blocks(prefill: Sizes, decode: Sizes) -> dict[str, dict[str, int]]:
    """``kv_connector_extra_config`` blocks from the real sizes, identical on both sides:
    ``{"prefill": {"dp_size", "tp_size"[, "pp_size"]}, "decode": {...}}``; ``pp_size`` only
    when not 1 (the worker defaults it to 1; ``extracted.*.pull_peer_blocks``)."""
    def blk(s: Sizes) -> dict[str, int]:
        out = {"dp_size": s.dp, "tp_size": s.tp}
        if s.pp != 1:
            out["pp_size"] = s.pp
        return out
    return {"prefill": blk(prefill), "decode": blk(decode)}


def kv_port_span(name: str, s: Sizes) -> int:
    """Ports one engine binds from ``kv_port``: side channel ``kv_port + dp_rank*tp*pp``
    plus the device index (pull), ``kv_port + dp_rank*tp`` plus the TP rank (push)."""
    per = rules()["connectors"][name]["port_span"]
    return s.dp * s.tp * (s.pp if per == "dp_tp_pp" else 1)


def transport_range(npus: int) -> tuple[int, int]:
    """``[first, end)`` of the ports AscendDirectTransport picks at random on a host with
    ``npus`` NPUs (vllm-ascend multi-node PD guide)."""
    t = rules()["transport_range"]
    return int(t["base"]), int(t["base"]) + int(t["per_npu"]) * max(int(npus), 1)


def hccl() -> dict[str, Any]:
    """``{"env", "default", "per_rank", "base"}``: HCCL's listener base variable, its CANN
    default, ports reserved per rank and omni-pd's first allocated base."""
    return dict(rules()["hccl"])


def hccl_span(s: Sizes) -> int:
    """Ports omni-pd reserves from an engine's ``HCCL_IF_BASE_PORT`` (per_rank * ranks)."""
    return int(hccl()["per_rank"]) * s.ranks


def tp_error(name: str, p_tp: int, d_tp: int) -> str | None:
    """Why vllm-ascend ``name`` cannot pair prefill TP ``p_tp`` with decode TP ``d_tp``:
    P_tp >= D_tp (worker init raises ValueError) and P_tp % D_tp == 0 (vllm-ascend
    ``docs/source/developer_guide/feature_guide/disaggregated_prefill.md``, limits)."""
    if p_tp < d_tp or p_tp % d_tp:
        return f"vllm-ascend {name} needs prefill TP >= decode TP and divisible by it (got P={p_tp}, D={d_tp})"
    return None


def side_config(name: str, side: str, *, engine_id: str, kv_port: int, prefill: Sizes, decode: Sizes,
                hccl_base: int | None, release: str | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """``(kv_transfer_config, env)`` for one side of an Ascend PD pair.

    ``side``: ``"prefill"`` (``kv_producer``) or ``"decode"`` (``kv_consumer``).
    ``kv_port``: first port of this engine's side-channel range (TCP port). Peer blocks
    come from the real sizes (:func:`peer_blocks`) where ``name`` reads them. ``env``
    holds ``HCCL_IF_BASE_PORT`` when ``hccl_base`` is given (multi-rank engines).
    """
    kv: dict[str, Any] = {"kv_connector": name, "kv_role": "kv_producer" if side == "prefill" else "kv_consumer",
                          "kv_port": int(kv_port), "engine_id": engine_id}
    if peer_blocks_read(name, release):
        kv["kv_connector_extra_config"] = peer_blocks(prefill, decode)
    env = {hccl()["env"]: str(hccl_base)} if hccl_base is not None else {}
    return kv, env
