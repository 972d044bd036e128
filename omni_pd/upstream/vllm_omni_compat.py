"""Make vllm-omni 0.30.x switch prefill/decode disaggregation on for typed stage configs, and speak under PD.

vllm-omni 0.30.0's serve path (``vllm serve M --omni --deploy-config F`` and the
offline ``Omni`` class) resolves a deploy file into typed stage configs
(``vllm_omni/config/omni_config.py`` ``VllmOmniARStageConfig`` ...), while its PD code
reads legacy attributes those objects do not have. Left alone, a four-stage PD deploy
starts cleanly and runs the Thinker twice per request (docs/upstream/vllm-omni-0.30-pd-detection.md).

This module wraps eight upstream functions (the table in
``presets/targets/vllm_omni_compat.yaml``). Each wrapper calls the original first and
steps in only on the failure shape that release is known for, so an upstream fix takes
over by itself (the Talker merge checks the shape on its input instead, see below):

* ``PDDisaggregationMixin.detect_pd_separation_from_stage_configs`` (staticmethod,
  ``vllm_omni/entrypoints/pd_utils.py``): when it returns None, it is run again over
  read-only legacy views of the typed stage configs (:func:`legacy_views`).
* ``PDDisaggregationMixin._validate_pd_separation_config`` and
  ``_get_pd_connector_info``: on ``AttributeError`` for ``engine_args`` they are run
  again with ``self.stage_configs`` replaced by those views (nothing is set on ``self``).
* ``OmniEngineBase._detect_pd_config`` (``vllm_omni/engine/omni_engine_base.py``): a
  None ``bootstrap_addr`` is filled from the prefill client's
  ``kv_transfer_config.kv_connector_extra_config["bootstrap_addr"]``, written by
  ``vllm_omni/engine/stage_runtime.py`` ``StageRuntime._prepare_replica_vllm_config``.
* ``OrchestratorBase._build_pd_decode_params`` (``vllm_omni/engine/orchestrator.py``):
  when it refuses prefill params that carry ``transfer_id`` but no
  ``remote_request_id`` (vLLM 0.30's Mooncake connector returns none), the request id
  is supplied and the original runs again; when its Mooncake address and engine id are
  the orchestrator's single (replica 0) ones but the request was prefilled on replica
  *r* > 0, they are replaced by replica *r*'s.

The Talker handoff under PD (issue 21; the seam and why, with its bytes per request, in
:mod:`omni_pd.upstream.talker_pd`), three wrappers that act only together and have their
own switch ``OMNI_PD_VLLM_OMNI_TALKER_PD=0``:

* ``OrchestratorBase._route_output`` (async; orchestrator thread of the API process):
  after the original, a finished prefill output that left
  ``pd_prefill_multimodal_output`` None has it set from ``outputs[0].multimodal_output``
  (0.30.0 reads the attribute from the vLLM ``RequestOutput``, where it never is).
* ``stage_input_processors/qwen3_omni.py`` ``thinker2talker_token_only`` (module
  function; orchestrator): after the original, prefill's layer rows from the bridge state
  go onto the Talker prompt's ``additional_information`` (:func:`talker_pd.attach`).
* ``Qwen3OmniMoeForConditionalGeneration.talker_preprocess_prefill`` (Talker worker):
  when those rows are present and decode's payload has the PD shape, the original gets
  prefill's rows followed by decode's rows without its first
  (:func:`talker_pd.merge_payload`), else the payload unchanged; the rows are released.

No attribute is ever added to an upstream class or stage config: about twenty
``getattr(stage, "engine_args", None)`` fallbacks elsewhere in vllm-omni would change
behaviour if the typed configs grew legacy attributes.

:func:`install` is called by omni-pd's plugin entry points
(``omni_pd/upstream/vllm_plugin.py``) in every vllm-omni process. It is gated: only the
vllm-omni release series listed in the table are patched; a missing wrapped function or
one whose parameters differ from the recorded signature makes it refuse with one warning
and patch nothing (a Talker patch: its switch's group is left out, the rest installed);
``OMNI_PD_VLLM_OMNI_COMPAT=0`` turns it off; a second call patches
nothing more. It logs one line saying what it patched and why.

The decision helpers (:func:`legacy_views`, :func:`repair_prefill_kv_params`,
:func:`prefill_bootstrap_addr`, :func:`retarget_decode_params`, :func:`plan`) are plain functions, testable without
vllm-omni.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Environment switch: ``0`` (or ``false``/``off``/``no``) turns the layer off.
ENV_SWITCH = "OMNI_PD_VLLM_OMNI_COMPAT"
#: Marker attribute on every wrapper: the patch name (idempotence, introspection).
MARK = "__omni_pd_compat__"

# vLLM configures the ``vllm`` logger (handler, format); a child of it is visible in
# ``vllm serve`` output next to vllm-omni's own PD lines.
logger = logging.getLogger("vllm.omni_pd.compat")


# --------------------------------------------------------------------------- table


@dataclass(frozen=True)
class Patch:
    """One row of ``presets/targets/vllm_omni_compat.yaml`` ``patches``.

    ``target``: ``module:Class.attr``; ``kind``: ``staticmethod`` or ``function``;
    ``signature``: parameter list as :func:`signature_of` renders it, e.g.
    ``(self, req_id, sp)``; ``why``/``source``: the upstream fact (file and function)."""

    name: str
    target: str
    kind: str
    signature: str
    why: str
    source: str
    steps_in: str = ""
    #: a finer environment switch (``OMNI_PD_VLLM_OMNI_TALKER_PD``): ``0`` skips this patch
    switch: str = ""

    @property
    def module(self) -> str:
        return self.target.split(":", 1)[0]

    @property
    def owner_and_attr(self) -> tuple[str, str]:
        """(class path inside the module, attribute); the class path is ``""`` for a
        module-level function (``module:function``)."""
        qual = self.target.split(":", 1)[1]
        owner, _, attr = qual.rpartition(".")
        return owner, attr


@dataclass(frozen=True)
class CompatTable:
    """The parsed table: patches by name and, per vllm-omni release series
    (``"0.30"``), the names of the patches it needs."""

    patches: dict[str, Patch]
    versions: dict[str, tuple[str, ...]]

    def needed(self, version: str) -> tuple[Patch, ...]:
        """Patches release ``version`` (``"0.30.0"``, ``"0.30.1.dev3"``) needs; () when
        its series is not listed. Raises ``KeyError`` for a name missing from ``patches``."""
        return tuple(self.patches[n] for n in self.versions.get(release_series(version), ()))


def release_series(version: str) -> str:
    """``major.minor`` of a version string: ``"0.30.0rc1"`` -> ``"0.30"``."""
    parts = version.split(".")
    minor = "".join(ch for ch in (parts[1] if len(parts) > 1 else "") if ch.isdigit())
    return f"{parts[0]}.{minor}"


def parse_table(data: Mapping[str, Any]) -> CompatTable:
    """A :class:`CompatTable` from the YAML document's data. Raises ``ValueError`` when a
    version lists a patch the table does not define."""
    patches = {name: Patch(name=name, **{k: str(v) for k, v in row.items()})
               for name, row in (data.get("patches") or {}).items()}
    versions = {str(k): tuple(v.get("patches") or ()) for k, v in (data.get("versions") or {}).items()}
    for series, names in versions.items():
        unknown = [n for n in names if n not in patches]
        if unknown:
            raise ValueError(f"vllm_omni_compat.yaml: version {series} lists unknown patches {unknown}")
    return CompatTable(patches, versions)


def load_table() -> CompatTable:
    """The bundled table (``presets/targets/vllm_omni_compat.yaml``)."""
    from ..resources import data_dir, load_data

    return parse_table(load_data(data_dir("presets") / "targets" / "vllm_omni_compat.yaml"))


def signature_of(fn: Callable[..., Any]) -> str:
    """``fn``'s parameter list without annotations and defaults: ``(self, req_id, sp)``.
    Keyword-only and variadic parameters keep their ``*``/``**`` marks."""
    out: list[str] = []
    star = False
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            out.append("*" + p.name)
            star = True
        elif p.kind is p.VAR_KEYWORD:
            out.append("**" + p.name)
        else:
            if p.kind is p.KEYWORD_ONLY and not star:
                out.append("*")
                star = True
            out.append(p.name)
    return "(" + ", ".join(out) + ")"


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


#: prefill's client rows of a finished prefill output, held for the one ``_route_output``
#: call that submits decode (key: ``(id(orchestrator), request id)``); streaming PD only
_HELD_PREFILL_ROWS: dict[tuple[int, str], Any] = {}


def _stream_decode_request_installed() -> bool:
    """Whether the ``stream_decode_request`` wrapper is in place (the one that moves the
    layers from ``extra_args`` onto the request); without it they must not be attached."""
    import sys

    mod = sys.modules.get("vllm_omni.engine.orchestrator")
    fn = getattr(mod, "build_engine_core_request_from_tokens", None)
    return getattr(fn, MARK, None) == "stream_decode_request"


def _with_prefill_layers(self: Any, req_id: str, sp: Any) -> Any:
    """Streaming PD (``async_chunk`` on): put prefill's layers on decode's cloned params
    (``stream_pd.PARAMS_KEY``) for ``build_engine_core_request_from_tokens`` to move onto
    the request; ``sp`` unchanged otherwise."""
    from omni_pd.upstream import stream_pd, talker_pd

    mm = _HELD_PREFILL_ROWS.pop((id(self), req_id), None)
    if mm is None or not getattr(self, "async_chunk", False) or not _stream_decode_request_installed():
        return sp
    layers = talker_pd.prefill_layers(mm)
    if layers and isinstance(getattr(sp, "extra_args", None), dict):
        sp.extra_args[stream_pd.PARAMS_KEY] = layers
    return sp


def _completion_mm_output(output: Any) -> Any:
    """``output.outputs[0].multimodal_output`` (where vllm-omni 0.30's output processor
    attaches a stage's rows, outputs/output_processor.py ``_new_completion_output``), or None."""
    try:
        return getattr(output.outputs[0], "multimodal_output", None)
    except (AttributeError, IndexError, TypeError):
        return None


def _wrap_prefill_rows(orig: Callable[..., Any]) -> Callable[..., Any]:
    async def _route_output(self, stage_id, replica_id, output, req_state, stage_metrics):
        # The orchestrator's dispatcher awaits one _route_output at a time
        # (engine/orchestrator.py _handle_processed_outputs), and decode is submitted by
        # this very call, so decode's output is routed only after this returns.
        pair = getattr(self, "_pd_pair", None)
        prefill_done = pair is not None and stage_id == pair[0] and getattr(output, "finished", False)
        streaming = bool(getattr(self, "async_chunk", False))
        key = (id(self), str(getattr(output, "request_id", "")))
        if prefill_done and streaming:  # streaming PD: decode's request takes prefill's rows (stream_pd)
            mm = _completion_mm_output(output)
            if mm:
                _HELD_PREFILL_ROWS[key] = mm
        try:
            result = await orig(self, stage_id, replica_id, output, req_state, stage_metrics)
        finally:
            _HELD_PREFILL_ROWS.pop(key, None)
        if (prefill_done and not streaming
                and getattr(req_state, "pd_prefill_multimodal_output", False) is None):
            mm = _completion_mm_output(output)
            if mm:
                req_state.pd_prefill_multimodal_output = mm
                _once(logger, logging.INFO, "omni-pd compat: keeping prefill's rows from outputs[0].multimodal_output "
                      "(upstream read RequestOutput.multimodal_output, which is None)")
        return result
    return _route_output


def _wrap_talker_input(orig: Callable[..., Any]) -> Callable[..., Any]:
    from omni_pd.upstream import talker_pd

    def thinker2talker_token_only(source_outputs, prompt=None, requires_multimodal_data=False,
                                  streaming_context=None):
        prompts = orig(source_outputs, prompt, requires_multimodal_data, streaming_context)
        bridge = getattr(streaming_context, "bridge_states", None)
        by_req = bridge.get(talker_pd.BRIDGE_KEY) if isinstance(bridge, dict) else None
        if not by_req or getattr(streaming_context, "enabled", False):
            return prompts
        for i, (out, tp) in enumerate(zip(source_outputs, prompts)):
            mm = by_req.pop(str(getattr(out, "request_id", f"idx-{i}")), None)
            info = talker_pd.attach(tp.get("additional_information"), talker_pd.prefill_layers(mm),
                                    len(getattr(out, "prompt_token_ids", None) or ()))
            if info is not None:
                tp["additional_information"] = info
        return prompts
    return thinker2talker_token_only


def _wrap_talker_prefill(orig: Callable[..., Any]) -> Callable[..., Any]:
    from omni_pd.upstream import talker_pd

    def talker_preprocess_prefill(self, input_ids, input_embeds, payload):
        accept = getattr(getattr(self, "talker_config", None), "accept_hidden_layer", None)
        merged, why = talker_pd.merge_payload(payload, -1 if accept is None else int(accept))
        if merged is None:
            if why not in ("not-pd-shape", "no-prefill-rows"):
                _once(logger, logging.WARNING, f"omni-pd compat: prefill rows on the Talker request not merged "
                      f"({why}); the Talker is conditioned as upstream builds it")
            ids, embeds, update = orig(self, input_ids, input_embeds, payload)
            update.update(talker_pd.release(payload))
            return ids, embeds, update
        ids, embeds, update = orig(self, input_ids, input_embeds, merged)
        # the merged rows replace decode's in the request buffer (a later chunk of a
        # chunked prefill then sees the non-PD shape) and prefill's copy is released
        update.setdefault("embed", {})["prefill"] = merged["embed"]["prefill"]
        update.setdefault("hidden_states", {})["output"] = merged["hidden_states"]["output"]
        update.update(talker_pd.release(payload))
        _once(logger, logging.INFO, "omni-pd compat: Talker prefill under PD gets prefill's prompt rows followed by "
              "decode's rows without the recomputed last prompt token")
        return ids, embeds, update
    return talker_preprocess_prefill


def _wrap_async_chunk_support(orig: Callable[..., Any]) -> Callable[..., Any]:
    from omni_pd.upstream import stream_pd

    def _validate_async_chunk_support(pipeline, deploy):
        try:
            return orig(pipeline, deploy)
        except ValueError as e:
            ids = stream_pd.pd_kv_stage_ids(pipeline, deploy) if stream_pd.ASYNC_CHUNK_REFUSAL in str(e) else None
            if ids is None:
                raise
        _once(logger, logging.INFO, "omni-pd compat: async_chunk kept on for the prefill/decode pair (vllm-omni "
              "0.30 refuses any kv_transfer_config with it; the check is for AR-to-DiT transfer)")
        return orig(pipeline, stream_pd.without_kv(deploy, ids))
    return _validate_async_chunk_support


def _wrap_decode_request(orig: Callable[..., Any]) -> Callable[..., Any]:
    from omni_pd.upstream import stream_pd, talker_pd

    def build_engine_core_request_from_tokens(request_id, prompt, params, arrival_time=None, model_config=None,
                                              resumable=False, mm_features=None):
        extra = getattr(params, "extra_args", None)
        layers = extra.pop(stream_pd.PARAMS_KEY, None) if isinstance(extra, dict) else None
        if layers and isinstance(prompt, Mapping):
            info = dict(prompt.get("additional_information") or {})
            info.update({talker_pd.key_of(i): t for i, t in sorted(layers.items())})
            prompt = {**prompt, "additional_information": info}
            _once(logger, logging.INFO, "omni-pd compat: streaming PD, decode's request carries prefill's prompt rows "
                  f"(layers {sorted(layers)}) for its first Talker chunk")
        return orig(request_id, prompt, params, arrival_time, model_config, resumable, mm_features)
    return build_engine_core_request_from_tokens


def _wrap_stream_chunk0(orig: Callable[..., Any]) -> Callable[..., Any]:
    from omni_pd.upstream import stream_pd

    def thinker2talker_async_chunk(transfer_manager, multimodal_output, request, is_finished=False):
        rid = getattr(request, "external_req_id", None)
        first = (rid is not None and transfer_manager.put_req_chunk[rid] == 0
                 and transfer_manager.request_payload.get(rid) is None)
        out = orig(transfer_manager, multimodal_output, request, is_finished)
        if not first or out is not None:
            return out
        saved = transfer_manager.request_payload.get(rid)
        info = getattr(request, "additional_information", None)
        if saved is None or info is None:
            return out
        from vllm_omni.engine.serialization import deserialize_additional_information

        layers = stream_pd.decode_layers(deserialize_additional_information(info))
        if not layers:
            return out
        # the layer the original itself reads (its module's helper: model config's talker_config)
        accept = int(orig.__globals__["_get_accept_hidden_layer_index"](transfer_manager))
        repaired, why = stream_pd.repair_chunk0(saved, layers, accept, len(getattr(request, "prompt_token_ids", ()) or ()))
        if repaired is None:
            _once(logger, logging.WARNING, f"omni-pd compat: decode's first Talker chunk not given prefill's rows ({why}); "
                  "the Talker is conditioned as upstream builds it")
            return out
        transfer_manager.request_payload[rid] = repaired
        _once(logger, logging.INFO, "omni-pd compat: streaming PD, decode's first Talker chunk holds prefill's prompt "
              "rows in place of its recomputed last prompt token")
        return out
    return thinker2talker_async_chunk


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


WRAPPERS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "pd_detect": _wrap_detect,
    "pd_validate": _wrap_over_views,
    "pd_connector_info": _wrap_over_views,
    "engine_bootstrap_addr": _wrap_engine_bootstrap,
    "decode_kv_params": _wrap_decode_params,
    "pd_prefill_rows": _wrap_prefill_rows,
    "talker_prefill_rows": _wrap_talker_input,
    "talker_prefill_merge": _wrap_talker_prefill,
    "stream_async_chunk_ok": _wrap_async_chunk_support,
    "stream_decode_request": _wrap_decode_request,
    "stream_chunk0": _wrap_stream_chunk0,
    "pd_request_params": _wrap_request_params,
}


# --------------------------------------------------------------------------- install


@dataclass
class InstallReport:
    """What :func:`install` did. ``status``: ``patched``, ``already`` (an earlier call
    patched), ``off`` (env switch), ``not-needed`` (release not in the table, or no
    vllm-omni), ``refused`` (a wrapped function missing or changed; nothing patched).
    ``patched``: names patched by this call; ``problems``: why it refused, or why a switch's group was left out."""

    status: str
    version: str | None = None
    patched: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()
    message: str = ""


_SAID: set[tuple[str, str]] = set()


def _once(log: logging.Logger, level: int, msg: str) -> None:
    """Log ``msg`` once per process and logger: vllm-omni loads plugins several times
    (vLLM's group, its own group, every ``OmniEngineArgs``), the log line is one."""
    if (log.name, msg) not in _SAID:
        _SAID.add((log.name, msg))
        log.log(level, msg)


def env_disabled(environ: Mapping[str, str], name: str = ENV_SWITCH) -> bool:
    """True when ``name`` (default ``OMNI_PD_VLLM_OMNI_COMPAT``) is ``0``/``false``/``off``/``no``."""
    return environ.get(name, "").strip().lower() in ("0", "false", "off", "no")



def _resolve(p: Patch, importer: Callable[[str], Any]) -> tuple[Any, Any, Any]:
    """(owner class, raw attribute from its ``__dict__``, plain function) of ``p``.
    Raises ``LookupError`` with a located reason."""
    try:
        mod = importer(p.module)
    except Exception as e:  # ImportError, or anything the module raises at import
        raise LookupError(f"{p.module}: cannot import ({type(e).__name__}: {e})") from e
    owner_name, attr = p.owner_and_attr
    owner: Any = mod
    for part in owner_name.split(".") if owner_name else ():
        owner = getattr(owner, part, None)
        if owner is None:
            raise LookupError(f"{p.target}: {owner_name} is missing")
    raw = vars(owner).get(attr) if isinstance(owner, type) or owner is mod else None
    if raw is None:
        raise LookupError(f"{p.target}: {attr} is missing")
    if p.kind == "staticmethod":
        if not isinstance(raw, staticmethod):
            raise LookupError(f"{p.target}: is no longer a staticmethod")
        fn = raw.__func__
    else:
        if not inspect.isfunction(raw):
            raise LookupError(f"{p.target}: is no longer a plain method ({type(raw).__name__})")
        fn = raw
    return owner, raw, fn


def plan(patches: Sequence[Patch], importer: Callable[[str], Any] = importlib.import_module
         ) -> tuple[list[tuple[Patch, Any, Any]], list[str]]:
    """Resolve every patch: (``[(patch, owner class, original function)]`` still to
    patch, problems). A function already wrapped by omni-pd is skipped; a missing one or
    one whose :func:`signature_of` differs from the recorded ``signature`` is a problem."""
    todo: list[tuple[Patch, Any, Any]] = []
    problems: list[str] = []
    for p in patches:
        try:
            owner, _raw, fn = _resolve(p, importer)
        except LookupError as e:
            problems.append(str(e))
            continue
        if getattr(fn, MARK, None) == p.name:
            continue
        got = signature_of(fn)
        if got != p.signature:
            problems.append(f"{p.target}: signature {got}, omni-pd expects {p.signature}")
            continue
        todo.append((p, owner, fn))
    return todo, problems


def _installed_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm-omni")
    except PackageNotFoundError:
        return None


def install(*, version: str | None = None, table: CompatTable | None = None,
            environ: Mapping[str, str] | None = None,
            importer: Callable[[str], Any] = importlib.import_module,
            log: logging.Logger | None = None) -> InstallReport:
    """Patch the functions the installed vllm-omni release needs (see the module doc).

    ``version`` defaults to the installed ``vllm-omni`` distribution's, ``table`` to
    :func:`load_table`, ``environ`` to ``os.environ``; ``importer`` imports a module by
    name (tests pass fakes). All or nothing per group: when a function the PD detection
    patches (no ``switch``) wrap is missing or has another signature, nothing is patched and
    one warning lists why; when one of a switch's group (the Talker handoff) is, that group
    is left out and the rest is installed, with a warning. Logs one line (INFO when it
    patched everything it needs, WARNING when it refused or left a group out). Never raises for an upstream shape
    it does not know; raises ``ValueError`` only for a broken bundled table."""
    log = log or logger
    environ = os.environ if environ is None else environ
    if env_disabled(environ):
        msg = f"omni-pd: vllm-omni PD compatibility layer off ({ENV_SWITCH}={environ.get(ENV_SWITCH)})"
        _once(log, logging.INFO, msg)
        return InstallReport("off", version, message=msg)
    version = version if version is not None else _installed_version()
    if version is None:
        return InstallReport("not-needed", None, message="vllm-omni is not installed")
    table = table if table is not None else load_table()
    needed = table.needed(version)
    skipped = tuple(p for p in needed if p.switch and env_disabled(environ, p.switch))
    needed = tuple(p for p in needed if p not in skipped)
    if not needed and not skipped:
        msg = f"omni-pd: vllm-omni {version} needs no PD compatibility patch (not in vllm_omni_compat.yaml)"
        _once(log, logging.DEBUG, msg)
        return InstallReport("not-needed", version, message=msg)
    # all or nothing per group: the patches without a switch (PD detection) are one group, each
    # switch's patches another; a group with a problem is left out whole. Without the first group
    # the others have nothing to act on, so its problem refuses everything.
    core = tuple(p for p in needed if not p.switch)
    todo, problems = plan(core, importer)
    if problems:
        msg = (f"omni-pd: vllm-omni {version} PD compatibility layer NOT installed, nothing patched: "
               + "; ".join(problems) + ". PD may not switch on for *_pd pipelines: check with "
               "`omni-pd validate --against-vllm-omni` (docs/upstream/README.md)")
        _once(log, logging.WARNING, msg)
        return InstallReport("refused", version, problems=tuple(problems), message=msg)
    left_out: list[str] = []
    for switch in dict.fromkeys(p.switch for p in needed if p.switch):
        group = tuple(p for p in needed if p.switch == switch)
        group_todo, group_problems = plan(group, importer)
        if group_problems:
            problems += group_problems
            left_out.append(f"{', '.join(p.name for p in group)} NOT installed ({'; '.join(group_problems)})")
            needed = tuple(p for p in needed if p not in group)
        else:
            todo += group_todo
    off = sorted({p.switch for p in skipped})
    off_note = (f"; off by {', '.join(f'{k}={environ.get(k)}' for k in off)}: "
                + ", ".join(p.name for p in skipped)) if skipped else ""
    if not todo and not needed:  # every patch it needs is switched off
        msg = f"omni-pd: vllm-omni {version} PD compatibility layer: nothing patched{off_note}"
        _once(log, logging.INFO, msg)
        return InstallReport("off", version, message=msg)
    if not todo:
        return InstallReport("already", version, message="already installed")
    for p, owner, fn in todo:
        wrapper = WRAPPERS[p.name](fn)
        wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
        setattr(wrapper, MARK, p.name)
        wrapper.__qualname__ = fn.__qualname__
        wrapper.__doc__ = fn.__doc__
        setattr(owner, p.owner_and_attr[1], staticmethod(wrapper) if p.kind == "staticmethod" else wrapper)
    msg = (f"omni-pd: vllm-omni {version} PD compatibility layer on ({ENV_SWITCH}=0 turns it off): "
           + "; ".join(f"{p.target.split(':')[1]} ({p.why})" for p, _, _ in todo) + off_note
           + "".join(f"; {x}" for x in left_out))
    log.log(logging.WARNING if left_out else logging.INFO, msg)
    return InstallReport("patched", version, patched=tuple(p.name for p, _, _ in todo),
                         problems=tuple(problems), message=msg)


def installed(importer: Callable[[str], Any] = importlib.import_module,
              table: CompatTable | None = None) -> dict[str, bool]:
    """Patch name -> whether omni-pd's wrapper is in place now (every patch in the
    table, whatever the release)."""
    table = table if table is not None else load_table()
    out = {}
    for name, p in table.patches.items():
        try:
            _, _, fn = _resolve(p, importer)
        except LookupError:
            out[name] = False
            continue
        out[name] = getattr(fn, MARK, None) == name
    return out
