"""LMCacheConnectorV1 as a PD connector: which LMCache transport moves KV from P to D.

Not an emitting contract (no ``CONNECTOR``: ``expand`` cannot pick it): a PD pair over
LMCache needs an LMCache transport omni-pd does not allocate. The check rules read it
through :func:`transport`.

Facts (vLLM 0.30.0 ``kv_connector/v1/lmcache_connector.py`` and
``lmcache_integration/{utils,vllm_v1_adapter}.py``; LMCache docs "Disaggregated
prefill" and configuration reference):

* ``kv_role`` alone moves nothing between engines: each engine has its own LMCache
  engine, whose local CPU/disk backends are private to it.
* LMCache's configuration comes from ``LMCACHE_CONFIG_FILE`` (YAML), then ``LMCACHE_*``
  environment variables (``LMCACHE_REMOTE_URL`` for ``remote_url``), then
  ``kv_connector_extra_config`` keys prefixed ``lmcache.`` (``lmcache.remote_url``).
* Two transports make decode reuse prefill's KV:

  - **PD mode**: ``enable_pd: true`` on both, ``pd_role: sender`` on prefill and
    ``receiver`` on decode (plus ``pd_proxy_host``/``pd_peer_*`` ports); the proxy puts
    LMCache's ``disagg_spec`` (``receiver_host``, ``receiver_init_port``,
    ``receiver_alloc_port``, ``req_id``) in prefill's ``kv_transfer_params``.
  - **Shared remote backend** (store mode): the same ``remote_url`` on both sides,
    reachable from both hosts; decode looks the prefix up, no request fields needed.

Sources: https://github.com/volcano-sh/kthena/issues/1069,
https://github.com/LMCache/LMCache/issues/4614.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

#: LMCache config keys this module reads -> the environment variable LMCache maps them from
KEYS = {"enable_pd": "LMCACHE_ENABLE_PD", "pd_role": "LMCACHE_PD_ROLE", "remote_url": "LMCACHE_REMOTE_URL"}
CONFIG_FILE_ENV = "LMCACHE_CONFIG_FILE"
#: kv_transfer_params key the PD-mode proxy must give prefill
PD_ROUTING_FIELDS = ("disagg_spec",)
NAMES = frozenset({"LMCacheConnectorV1"})


@dataclass(frozen=True)
class SideConfig:
    """The LMCache settings one engine sees. ``source`` maps each key found to where it
    came from (``env:LMCACHE_REMOTE_URL``, ``extra:lmcache.remote_url``);
    ``config_file``: ``LMCACHE_CONFIG_FILE`` when set (its content is not read)."""

    enable_pd: bool
    pd_role: str | None
    remote_url: str | None
    config_file: str | None
    source: dict[str, str]


def _truthy(v: Any) -> bool:
    return v is True or str(v).strip().lower() in ("1", "true", "yes", "on")


def side_config(kv: dict[str, Any], env: dict[str, Any]) -> SideConfig:
    """LMCache settings of one engine from its environment and ``kv_transfer_config``
    (extra config wins over the environment, as in vLLM's LMCache adapter)."""
    vals: dict[str, Any] = {}
    src: dict[str, str] = {}
    for key, var in KEYS.items():
        if env.get(var) not in (None, ""):
            vals[key], src[key] = env[var], f"env:{var}"
    extra = kv.get("kv_connector_extra_config") or {}
    for key in KEYS:
        if isinstance(extra, dict) and extra.get(f"lmcache.{key}") not in (None, ""):
            vals[key], src[key] = extra[f"lmcache.{key}"], f"extra:lmcache.{key}"
    role = vals.get("pd_role")
    url = vals.get("remote_url")
    cfg = env.get(CONFIG_FILE_ENV)
    return SideConfig(enable_pd=_truthy(vals.get("enable_pd")), pd_role=str(role) if role is not None else None,
                      remote_url=str(url) if url is not None else None,
                      config_file=str(cfg) if cfg not in (None, "") else None, source=src)


def _loopback(url: str) -> bool:
    from urllib.parse import urlsplit

    host = (urlsplit(url).hostname or "").lower() if "://" in url else url.split(":")[0].lower()
    return host in ("localhost", "::1", "0.0.0.0") or host.startswith("127.")  # 127.0.0.0/8, 127.0.0.1 included


Transport = Literal["pd", "store", "none", "unknown"]


@dataclass(frozen=True)
class Verdict:
    """``transport``: ``pd`` (PD mode on both sides), ``store`` (one shared remote
    backend), ``none`` (no transport: decode recomputes) or ``unknown`` (an
    ``LMCACHE_CONFIG_FILE`` omni-pd cannot read decides). ``problem``: why the
    configured transport does not work (roles, different or loopback backends), else None."""

    transport: Transport
    problem: str | None = None


def transport(p: SideConfig, d: SideConfig, same_host: bool) -> Verdict:
    """Which LMCache transport joins prefill ``p`` and decode ``d`` (see :class:`Verdict`)."""
    if p.enable_pd or d.enable_pd:
        if not (p.enable_pd and d.enable_pd):
            off = "decode" if p.enable_pd else "prefill"
            return Verdict("pd", f"LMCache PD mode (enable_pd) is on for one side only; {off} does not have it")
        if (p.pd_role, d.pd_role) != ("sender", "receiver"):
            return Verdict("pd", f"LMCache PD mode needs pd_role sender on prefill and receiver on decode "
                                 f"(got {p.pd_role or 'none'} / {d.pd_role or 'none'})")
        return Verdict("pd")
    if p.remote_url and d.remote_url:
        if p.remote_url != d.remote_url:
            return Verdict("store", f"prefill and decode use different LMCache remote backends "
                                    f"({p.remote_url} / {d.remote_url}): decode never finds prefill's KV")
        if not same_host and _loopback(p.remote_url):
            return Verdict("store", f"remote_url {p.remote_url} is a loopback address and the stages run on two hosts: "
                                    "each host reaches its own store")
        return Verdict("store")
    if p.config_file or d.config_file:
        return Verdict("unknown")
    return Verdict("none")


#: LMCache settings that hold one port per worker of the engine that reads them: LMCache's
#: PD backend takes ``config.pd_peer_init_port[tp_rank]`` (``tp_rank`` = the worker's rank
#: in its engine, ``metadata.worker_id``) for each (LMCache lmcache/v1/storage_backend/
#: pd_backend.py ``PDConfig.from_cache_engine_config``; ``pd_peer_query_port`` in newer
#: releases; ``nixl_peer_*`` are the LMCache <= 0.3 names, aliases in lmcache/v1/config.py
#: ``_CONFIG_ALIASES``). LMCache/LMCache#1381, #1966: too few entries -> IndexError at start.
LMCACHE_RANK_PORTS = ("pd_peer_init_port", "pd_peer_alloc_port", "pd_peer_query_port",
                      "nixl_peer_init_port", "nixl_peer_alloc_port")


@dataclass(frozen=True)
class RankPorts:
    """One LMCache per-rank port setting of a stage. ``keys``: its path under the stage
    (``("kv_transfer_config", "kv_connector_extra_config", "lmcache.pd_peer_init_port")`` or
    ``("env", "LMCACHE_PD_PEER_INIT_PORT")``); ``raw``: the value as written; ``ports``:
    the list LMCache ends up with, None when the shape is one LMCache cannot index
    (a scalar or a string in ``kv_connector_extra_config``: vLLM's LMCache adapter sets
    ``lmcache.*`` values as written, ``_validate_and_set_config_value``)."""

    name: str
    keys: tuple
    raw: Any
    ports: list | None


def lmcache_rank_ports(n: Any) -> list[RankPorts]:
    """The LMCache per-rank port lists stage ``n`` (a ``StageNode``) sets (:data:`LMCACHE_RANK_PORTS`), for
    ``LMCacheConnectorV1`` stages only. Both forms vLLM's LMCache adapter reads: the
    ``lmcache.``-prefixed ``kv_connector_extra_config`` key (a YAML list; it wins) and the
    ``LMCACHE_<KEY>`` environment variable (LMCache's ``_to_int_list``: ``7300`` or
    ``"7300,7301"``). Elements are kept as written (OPD504 checks each is a port). vLLM's
    LMCacheConnectorV1 only (``identify(kv).vllm_row()``): a class another package's
    ``kv_connector_module_path`` loads under that name reads what that package reads."""
    from omni_pd.compile.connectors.identity import identify

    kv = n.kv or {}
    ident = identify(kv)  # LMCacheConnectorV1 is vLLM's on every platform
    if ident is None or ident.vllm_row() != "LMCacheConnectorV1":
        return []
    extra = kv.get("kv_connector_extra_config")
    extra = extra if isinstance(extra, dict) else {}
    out: list[RankPorts] = []
    for key in LMCACHE_RANK_PORTS:
        if f"lmcache.{key}" in extra:
            v = extra[f"lmcache.{key}"]
            out.append(RankPorts(key, ("kv_transfer_config", "kv_connector_extra_config", f"lmcache.{key}"), v,
                                 list(v) if isinstance(v, list) else None))
        elif f"LMCACHE_{key.upper()}" in n.env:
            v = n.env[f"LMCACHE_{key.upper()}"]
            parts = v if isinstance(v, list) else [p.strip() for p in str(v).strip().strip("'\"").split(",") if p.strip()]
            out.append(RankPorts(key, ("env", f"LMCACHE_{key.upper()}"), v, list(parts)))
    return out
