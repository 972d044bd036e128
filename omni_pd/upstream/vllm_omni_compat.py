"""Make vllm-omni 0.30.x switch prefill/decode disaggregation on for typed stage configs, and speak under PD.

vllm-omni 0.30.0's serve path (``vllm serve M --omni --deploy-config F`` and the
offline ``Omni`` class) resolves a deploy file into typed stage configs
(``vllm_omni/config/omni_config.py`` ``VllmOmniARStageConfig`` ...), while its PD code
reads legacy attributes those objects do not have. Left alone, a four-stage PD deploy
starts cleanly and runs the Thinker twice per request (docs/upstream/vllm-omni-0.30-pd-detection.md).

This layer wraps eight upstream functions (the table in
``presets/targets/vllm_omni_compat.yaml``, read by :mod:`omni_pd.upstream.compat_table`;
the wrappers are in :mod:`omni_pd.upstream.compat_pd` and, for the Talker handoff and
streaming PD, :mod:`omni_pd.upstream.compat_stream`; this module installs them). Each
wrapper calls the original first and steps in only on the failure shape that release is known for, so an upstream fix takes
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

The decision helpers (:func:`omni_pd.upstream.compat_pd.legacy_views`,
:func:`~omni_pd.upstream.compat_pd.repair_prefill_kv_params`,
:func:`~omni_pd.upstream.compat_pd.prefill_bootstrap_addr`,
:func:`~omni_pd.upstream.compat_pd.retarget_decode_params`, and :func:`plan` here) are plain
functions, testable without vllm-omni.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from omni_pd.upstream.compat_pd import (_wrap_decode_params, _wrap_detect, _wrap_engine_bootstrap,
                                       _wrap_over_views, _wrap_request_params)
from omni_pd.upstream.compat_stream import (_wrap_async_chunk_support, _wrap_decode_request, _wrap_prefill_rows,
                                           _wrap_stream_chunk0, _wrap_talker_input, _wrap_talker_prefill)
from omni_pd.upstream.compat_table import (ENV_SWITCH, MARK, CompatTable, Patch, _once, env_disabled, load_table,
                                          logger, signature_of)




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
