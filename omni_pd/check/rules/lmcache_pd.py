"""LMCacheConnectorV1 as the PD transport (OPD613, CAP-LMCACHE-PD, capability family):
both sides must agree on one transport, LMCache's own P/D mode or one remote backend both
hosts reach (:mod:`omni_pd.compile.connectors.lmcache` holds the facts and the verdict;
issue 38 split it out of omni_pd/check/rules/capability.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from omni_pd.diagnostics import Diagnostic, Severity
from omni_pd.check.rules import Context, Example, Rule, rule
from omni_pd.check.rules.capability import _PD, connector_row, loaded_rows

if TYPE_CHECKING:
    from omni_pd.compile.topology import StageNode


_LMC = ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
        "  - {{stage_id: 0, devices: \"0\"{pe}, kv_transfer_config: {{kv_connector: LMCacheConnectorV1, kv_role: kv_producer{px}}}}}\n"
        "  - {{stage_id: 1, devices: \"1\"{de}, kv_transfer_config: {{kv_connector: LMCacheConnectorV1, kv_role: kv_consumer{dx}}}}}\n")


def _lmc(pe: str = "", de: str = "", px: str = "", dx: str = "") -> str:  # pragma: no mutate block (runs at import only)
    return _LMC.format(pe=pe, de=de, px=px, dx=dx)


_REDIS = ", env: {{LMCACHE_REMOTE_URL: \"{u}\"}}"
_TWO_HOSTS = {"inventory": {"hosts": {"host-a": {"address": "10.0.0.1"}, "host-b": {"address": "10.0.0.2"}},
                            "placement": {"0": "host-a", "1": "host-b"}}}


def _lmcache_sides(ctx: Context) -> "tuple[StageNode, StageNode] | None":
    """The PD pair when vLLM's LMCacheConnectorV1 is its transfer connector (MultiConnector:
    the only child that could move KV), by the loaded classes (``capability.loaded_rows``): a
    class another package's ``kv_connector_module_path`` loads under that name is not vLLM's
    LMCache adapter and is not judged."""
    from omni_pd.compile.connectors import lmcache

    pair = ctx.pd_pair
    if pair is None or not (pair[0].kv and pair[1].kv):
        return None
    names = {row for n in pair for row, _ in loaded_rows(ctx, n)}
    movers = {n for n in names if n not in ("OffloadingConnector", "SimpleCPUOffloadConnector", "LMCacheMPConnector")}
    return pair if movers and movers <= lmcache.NAMES else None


def lmcache_verdict(ctx: Context) -> Any:
    """:class:`omni_pd.compile.connectors.lmcache.Verdict` for the pair, or None when
    LMCache is not the pair's transfer connector."""
    from omni_pd.compile.connectors import lmcache

    pair = _lmcache_sides(ctx)
    if pair is None:
        return None
    p, d = pair

    def side(n: "StageNode") -> Any:
        kv = n.kv or {}
        kids = (kv.get("kv_connector_extra_config") or {}).get("connectors")
        if connector_row(ctx, n) == "MultiConnector" and isinstance(kids, list):
            kv = next((c for c in kids if isinstance(c, dict) and connector_row(ctx, n, c) in lmcache.NAMES), kv)
        return lmcache.side_config(kv, {**ctx.env, **n.env})

    return lmcache.transport(side(p), side(d), ctx.host_of(p) == ctx.host_of(d))


@rule("OPD613", "lmcache-pd-transport", Severity.ERROR,
      "an LMCacheConnectorV1 PD pair has no LMCache transport (PD mode or one shared remote backend)",
      fail=_lmc(), passing=_lmc(pe=_REDIS.format(u="redis://kv-store:6379"), de=_REDIS.format(u="redis://kv-store:6379")),
      example_context=_TWO_HOSTS, labels=("CAP-LMCACHE-PD",),
      examples=(
          Example("PD mode through lmcache.* extra config", _lmc(
              px=", kv_connector_extra_config: {lmcache.enable_pd: true, lmcache.pd_role: sender}",
              dx=", kv_connector_extra_config: {lmcache.enable_pd: true, lmcache.pd_role: receiver}"), False, _TWO_HOSTS),
          Example("PD mode through LMCACHE_* env", _lmc(
              pe=", env: {LMCACHE_ENABLE_PD: \"True\", LMCACHE_PD_ROLE: sender}",
              de=", env: {LMCACHE_ENABLE_PD: \"True\", LMCACHE_PD_ROLE: receiver}"), False, _TWO_HOSTS),
          Example("PD mode with reversed pd_role", _lmc(
              px=", kv_connector_extra_config: {lmcache.enable_pd: true, lmcache.pd_role: receiver}",
              dx=", kv_connector_extra_config: {lmcache.enable_pd: true, lmcache.pd_role: sender}"), True, _TWO_HOSTS,
              contains="pd_role sender on prefill"),
          Example("PD mode on one side only", _lmc(
              px=", kv_connector_extra_config: {lmcache.enable_pd: true, lmcache.pd_role: sender}"), True, _TWO_HOSTS,
              contains="one side only"),
          Example("different remote backends", _lmc(pe=_REDIS.format(u="redis://a:6379"), de=_REDIS.format(u="redis://b:6379")),
                  True, _TWO_HOSTS, contains="different LMCache remote backends"),
          Example("loopback remote backend across two hosts", _lmc(
              pe=_REDIS.format(u="redis://localhost:6379"), de=_REDIS.format(u="redis://localhost:6379")), True, _TWO_HOSTS,
              contains="loopback"),
          Example("loopback remote backend on one host", _lmc(
              pe=_REDIS.format(u="redis://localhost:6379"), de=_REDIS.format(u="redis://localhost:6379")), False),
          Example("launcher environment shared by both engines", _lmc(), False,
                  {"env": {"LMCACHE_REMOTE_URL": "redis://kv-store:6379"}}),
          Example("LMCACHE_CONFIG_FILE: not readable here, info", _lmc(
              pe=", env: {LMCACHE_CONFIG_FILE: /etc/lmc-p.yaml}", de=", env: {LMCACHE_CONFIG_FILE: /etc/lmc-d.yaml}"), True,
              _TWO_HOSTS, severity=Severity.INFO),
          Example("no transport on one host either", _lmc(), True, contains="no LMCache PD mode"),
          Example("the LMCache maintainers' shape: NIXL hands off, LMCacheMPConnector reuses", _PD.replace(
              "qwen3_omni_moe_pd", "llm_pd") +
              "  - {stage_id: 0, devices: \"0\", kv_transfer_config: {kv_connector: MultiConnector, kv_role: kv_producer, "
              "kv_connector_extra_config: {connectors: [{kv_connector: NixlConnector, kv_role: kv_producer}, "
              "{kv_connector: LMCacheMPConnector, kv_role: kv_producer}]}}}\n"
              "  - {stage_id: 1, devices: \"1\", kv_transfer_config: {kv_connector: MultiConnector, kv_role: kv_consumer, "
              "kv_connector_extra_config: {connectors: [{kv_connector: NixlConnector, kv_role: kv_consumer}, "
              "{kv_connector: LMCacheMPConnector, kv_role: kv_consumer}]}}}\n", False, _TWO_HOSTS),
      ))
def lmcache_pd_transport(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """``kv_role`` alone does not make LMCacheConnectorV1 move KV between engines: each
    engine's LMCache backends are its own. A PD pair over it needs LMCache's PD mode
    (``enable_pd: true`` on both, ``pd_role: sender`` on prefill and ``receiver`` on
    decode, and a proxy that gives prefill LMCache's ``disagg_spec``) or one remote
    backend both sides reach (the same ``remote_url`` / ``LMCACHE_REMOTE_URL``, not a
    loopback address across hosts). Without either, answers stay right and decode
    recomputes every prompt. Settings are read from the stage and launcher
    environment (``LMCACHE_*``) and ``kv_connector_extra_config`` ``lmcache.*`` keys;
    an ``LMCACHE_CONFIG_FILE`` omni-pd cannot read gives an info. The LMCache
    maintainers' supported shape is MultiConnector(NixlConnector, LMCacheMPConnector),
    which this rule leaves alone. Only vLLM's LMCacheConnectorV1 (the adapter above) is judged:
    a class another package's ``kv_connector_module_path`` loads under that name is not. Sources: https://github.com/volcano-sh/kthena/issues/1069,
    https://github.com/LMCache/LMCache/issues/4614; vLLM 0.30.0
    kv_connector/v1/lmcache_integration/vllm_v1_adapter.py (``lmcache.`` extra keys,
    ``disagg_spec``) and utils.py (``LMCACHE_CONFIG_FILE``, environment)."""
    v = lmcache_verdict(ctx)
    if v is None:
        return
    p, d = ctx.pd_pair  # type: ignore[misc]
    two = ctx.host_of(p) != ctx.host_of(d)
    where = ctx.sloc(p, "kv_transfer_config", "kv_connector", value=True)
    rel = [ctx.sloc(d, "kv_transfer_config", "kv_connector", value=True, label="decode")]
    if v.transport == "unknown":
        yield r.diag("LMCacheConnectorV1 PD pair: the LMCache transport is set in LMCACHE_CONFIG_FILE, which omni-pd "
                     "does not read", where, severity=Severity.INFO, related=rel,
                     help="make sure the files set enable_pd with pd_role sender/receiver, or the same remote_url on both sides")
    elif v.transport == "none":
        hosts = " on two hosts" if two else ""
        yield r.diag(f"LMCacheConnectorV1 P/D pair{hosts} with no LMCache PD mode (enable_pd/pd_role) and no shared remote "
                     "backend: decode recomputes every prompt", where, related=rel,
                     help="use MultiConnector with NixlConnector (P->D handoff) and LMCacheMPConnector (reuse), or set "
                          "LMCache PD mode (lmcache.enable_pd: true, lmcache.pd_role: sender / receiver) with LMCache's PD "
                          "proxy, or one shared backend (the same LMCACHE_REMOTE_URL on both sides)")
    elif v.problem:
        yield r.diag(f"LMCacheConnectorV1 P/D pair: {v.problem}", where, related=rel,
                     help="set enable_pd on both with pd_role sender (prefill) / receiver (decode)" if v.transport == "pd"
                     else "point both sides at one remote backend both hosts reach (same LMCACHE_REMOTE_URL)")
