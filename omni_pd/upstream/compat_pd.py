"""The vllm-omni compatibility layer's PD wrappers (:mod:`omni_pd.upstream.vllm_omni_compat`
installs them): PD detection over legacy views of typed stage configs, the Mooncake
bootstrap address, decode's ``kv_transfer_params`` (request id, bound prefill replica)
and the chat request's sampling parameters on decode; with the decision helpers
(:func:`legacy_views`, :func:`repair_prefill_kv_params`, :func:`prefill_bootstrap_addr`,
:func:`retarget_decode_params`), plain functions testable without vllm-omni. Split out of
vllm_omni_compat.py in issue 38.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from omni_pd.upstream.compat_table import _once, logger
from omni_pd.upstream.compat_stream import _with_prefill_layers


# --------------------------------------------------------------------------- pure helpers


@dataclass(frozen=True)
class EngineArgsView:
    """What 0.30.0's PD validator reads from ``stage.engine_args``."""

    kv_transfer_config: Any = None
    tensor_parallel_size: int = 1


@dataclass(frozen=True)
class LegacyStageView:
    """A read-only legacy-shaped view of one typed stage config, carrying exactly the
    fields ``vllm_omni/entrypoints/pd_utils.py`` reads: ``is_prefill_only`` /
    ``is_decode_only`` (from ``stage_pipeline_config.extras``), ``engine_input_source``
    (from ``input_sources``), ``engine_args.kv_transfer_config`` (from
    ``connector_config.kv_transfer_config``, the same object, not a copy),
    ``engine_args.tensor_parallel_size`` (from ``parallel_config``), ``stage_id``."""

    stage_id: int
    is_prefill_only: bool
    is_decode_only: bool
    engine_input_source: tuple[int, ...]
    engine_args: EngineArgsView = field(default_factory=EngineArgsView)


def is_typed_stage(stage: Any) -> bool:
    """True for a typed stage config (vllm-omni 0.30 ``BaseVllmOmniStageConfig`` shape:
    ``stage_pipeline_config`` present, no ``engine_args``); False for legacy dicts and
    OmegaConf stage configs, which the originals already read."""
    if isinstance(stage, Mapping):
        return False
    try:
        return hasattr(stage, "stage_pipeline_config") and not hasattr(stage, "engine_args")
    except Exception:  # an OmegaConf node may raise on unknown keys in strict mode
        return False


def legacy_view(stage: Any) -> LegacyStageView:
    """The :class:`LegacyStageView` of one typed stage config."""
    extras = getattr(getattr(stage, "stage_pipeline_config", None), "extras", None) or {}
    kv = getattr(getattr(stage, "connector_config", None), "kv_transfer_config", None)
    tp = getattr(getattr(stage, "parallel_config", None), "tensor_parallel_size", None) or 1
    return LegacyStageView(
        stage_id=int(stage.stage_id),
        is_prefill_only=bool(extras.get("is_prefill_only", False)),
        is_decode_only=bool(extras.get("is_decode_only", False)),
        engine_input_source=tuple(int(i) for i in (getattr(stage, "input_sources", None) or ())),
        engine_args=EngineArgsView(kv_transfer_config=kv, tensor_parallel_size=int(tp)))


def legacy_views(stage_configs: Sequence[Any]) -> list[Any] | None:
    """Stage list with every typed stage replaced by its :class:`LegacyStageView`
    (legacy stages kept as they are); None when no stage is typed, i.e. when the
    original already saw what it reads."""
    stages = list(stage_configs)
    if not any(is_typed_stage(s) for s in stages):
        return None
    return [legacy_view(s) if is_typed_stage(s) else s for s in stages]


def is_engine_args_error(exc: BaseException) -> bool:
    """An ``AttributeError`` raised because a stage config has no ``engine_args``."""
    return isinstance(exc, AttributeError) and (
        getattr(exc, "name", None) == "engine_args" or "'engine_args'" in str(exc))


def repair_prefill_kv_params(req_id: str, params: Any) -> dict[str, Any] | None:
    """Prefill ``kv_transfer_params`` with ``remote_request_id`` = ``req_id`` added, or
    None when they need no repair (already carry it) or cannot be repaired (no
    ``transfer_id``: not the Mooncake shape). vllm-omni 0.30's ``OmniARScheduler``
    (core/sched/omni_ar_scheduler.py) returns ``{transfer_id, num_transfer_tokens}`` for
    Mooncake; vLLM 0.30's Mooncake decode side reads only ``remote_engine_id``,
    ``remote_bootstrap_addr`` and ``transfer_id``, so the id is informative only."""
    if not isinstance(params, Mapping) or "remote_request_id" in params or not params.get("transfer_id"):
        return None
    return {**params, "remote_request_id": req_id}


def mooncake_endpoint(client: Any) -> tuple[str, str | None] | None:
    """(bootstrap address, engine id) of one Mooncake prefill replica's client, from its
    ``vllm_config.kv_transfer_config`` as ``StageRuntime._prepare_replica_vllm_config``
    wrote it (address ``http://ip:bootstrap_port+r``, engine id ``{id}-s{stage}-r{r}``);
    None for other connectors or a client without one."""
    kv = getattr(getattr(client, "vllm_config", None), "kv_transfer_config", None)
    if kv is None or getattr(kv, "kv_connector", None) != "MooncakeConnector":
        return None
    extra = getattr(kv, "kv_connector_extra_config", None)
    addr = extra.get("bootstrap_addr") if isinstance(extra, Mapping) else None
    return (str(addr), getattr(kv, "engine_id", None)) if addr else None


def retarget_decode_params(params: Mapping[str, Any], endpoint: tuple[str, str | None] | None,
                           default_addr: str | None, default_engine_id: str | None) -> dict[str, Any] | None:
    """Decode ``kv_transfer_params`` pointed at the prefill replica that ran the request.

    vllm-omni 0.30's orchestrator keeps one ``_pd_bootstrap_addr``/``_pd_prefill_engine_id``,
    its prefill stage's replica 0's, so with ``num_replicas`` > 1 a request prefilled on
    replica *r* would be told to pull from replica 0. Returns the params with
    ``remote_bootstrap_addr``/``remote_engine_id`` replaced by ``endpoint``'s when they are
    exactly the orchestrator's single defaults (so values the prefill side returned, as
    NIXL does, or a fixed upstream's per-replica values are kept); None when nothing
    changes."""
    if endpoint is None or params.get("remote_bootstrap_addr") != default_addr or default_addr is None:
        return None
    addr, engine_id = endpoint
    out = {**params, "remote_bootstrap_addr": addr}
    if engine_id and params.get("remote_engine_id") == default_engine_id:
        out["remote_engine_id"] = engine_id
    return None if out == dict(params) else out


def prefill_bootstrap_addr(stage_clients: Sequence[Any], prefill_idx: int) -> str | None:
    """The Mooncake bootstrap address (``http://ip:port``) the prefill stage's first
    replica binds: ``kv_transfer_config.kv_connector_extra_config["bootstrap_addr"]`` of
    its client's ``vllm_config``, as ``StageRuntime._prepare_replica_vllm_config``
    (engine/stage_runtime.py) writes it for a ``kv_producer`` Mooncake replica. None for
    other connectors or when the client is absent."""
    try:
        client = stage_clients[prefill_idx]
    except (IndexError, TypeError):
        return None
    kv = getattr(getattr(client, "vllm_config", None), "kv_transfer_config", None)
    extra = getattr(kv, "kv_connector_extra_config", None)
    if isinstance(kv, Mapping):
        extra = kv.get("kv_connector_extra_config")
    addr = extra.get("bootstrap_addr") if isinstance(extra, Mapping) else None
    return str(addr) if addr else None


# --------------------------------------------------------------------------- wrappers


class _ViewedSelf:
    """``self`` for an original method, with ``stage_configs`` replaced by legacy views;
    every other attribute is the real object's. Refuses writes, so the upstream object
    is never changed through it."""

    __slots__ = ("_target", "stage_configs")

    def __init__(self, target: Any, views: list[Any]) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "stage_configs", views)

    def __getattr__(self, name: str) -> Any:
        return getattr(object.__getattribute__(self, "_target"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"omni-pd compat view is read-only (tried to set {name!r})")


def _wrap_detect(orig: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
    def detect_pd_separation_from_stage_configs(stage_configs):
        pair = orig(stage_configs)
        if pair is not None:
            return pair
        views = legacy_views(stage_configs)
        return orig(views) if views is not None else None
    return detect_pd_separation_from_stage_configs


def _wrap_over_views(orig: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def method(self):
        try:
            return orig(self)
        except AttributeError as e:
            views = legacy_views(self.stage_configs) if is_engine_args_error(e) else None
            if views is None:
                raise
        return orig(_ViewedSelf(self, views))
    method.__name__ = orig.__name__
    return method


def _wrap_engine_bootstrap(orig: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def _detect_pd_config(self):
        cfg = orig(self)
        if not cfg or cfg.get("bootstrap_addr") or cfg.get("pd_pair") is None:
            return cfg
        addr = prefill_bootstrap_addr(getattr(self, "stage_clients", None) or [], cfg["pd_pair"][0])
        if addr is None:
            return cfg
        logger.info("omni-pd compat: PD bootstrap address %s (prefill stage-%d client's kv_connector_extra_config)",
                    addr, cfg["pd_pair"][0])
        return {**cfg, "bootstrap_addr": addr}
    return _detect_pd_config


def _retarget_to_bound_replica(self: Any, req_id: str, sp: Any) -> Any:
    """``sp`` with its decode ``kv_transfer_params`` pointed at the prefill replica the
    request is bound to (:func:`retarget_decode_params`); ``sp`` itself otherwise."""
    try:
        pool = self.stage_pools[self._pd_pair[0]]
        replica = pool.get_bound_replica_id(req_id)
        client = pool.clients[replica] if replica else None
    except (AttributeError, IndexError, KeyError, TypeError):
        return sp
    params = (getattr(sp, "extra_args", None) or {}).get("kv_transfer_params")
    if client is None or not isinstance(params, Mapping):
        return sp
    new = retarget_decode_params(params, mooncake_endpoint(client), self._pd_bootstrap_addr,
                                 self._pd_prefill_engine_id)
    if new is not None:
        sp.extra_args["kv_transfer_params"] = new
    return sp


def _wrap_decode_params(orig: Callable[[Any, str, Any], Any]) -> Callable[[Any, str, Any], Any]:
    def _build_pd_decode_params(self, req_id, sp):
        stored = getattr(self, "_pd_kv_params", {}).get(req_id)
        snapshot = dict(stored) if isinstance(stored, Mapping) else stored
        try:
            return _with_prefill_layers(self, req_id, _retarget_to_bound_replica(self, req_id, orig(self, req_id, sp)))
        except RuntimeError as e:
            repaired = repair_prefill_kv_params(req_id, snapshot) if "remote_request_id" in str(e) else None
            if repaired is None:
                raise
        self._pd_kv_params[req_id] = repaired
        return _with_prefill_layers(self, req_id, _retarget_to_bound_replica(self, req_id, orig(self, req_id, sp)))
    return _build_pd_decode_params


def _pd_pair_of(engine_client: Any) -> tuple[int, int] | None:
    """The (prefill, decode) stage pair vllm-omni's PD mixin detected, or None."""
    get = getattr(engine_client, "_get_pd_separation_pair", None)
    try:
        pair = get() if callable(get) else None
    except Exception:  # noqa: BLE001 - no pair known: leave the request as upstream builds it
        return None
    return (int(pair[0]), int(pair[1])) if pair else None


def _wrap_request_params(orig: Callable[..., Any]) -> Callable[..., Any]:
    def _build_sampling_params_list_from_request(self, request):
        out = orig(self, request)
        pair = _pd_pair_of(getattr(self, "engine_client", None))
        if pair is None or not isinstance(out, list):
            return out
        p, d = pair
        try:
            comprehension = self._get_comprehension_stage_index()
            default = list(self.engine_client.default_sampling_params_list)[d]
        except (AttributeError, IndexError, TypeError, ValueError):
            return out
        if comprehension != p or d >= len(out):
            return out
        if isinstance(default, Mapping):
            from vllm import SamplingParams

            default = SamplingParams(**default)
        out[d] = self._apply_request_overrides(default, request)
        _once(logger, logging.INFO, "omni-pd compat: the chat request's sampling parameters (max_tokens, temperature, "
              "...) apply to the decode stage too, over its own defaults (upstream applied them to prefill only)")
        return out
    return _build_sampling_params_list_from_request
