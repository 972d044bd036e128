"""vllm-omni general plugin: register the PD variant of every catalogued pipeline.

vllm-omni's PD detector (``PDDisaggregationMixin.detect_pd_separation_from_stage_configs``
in vllm_omni/entrypoints/pd_utils.py) only sees ``is_prefill_only`` /
``is_decode_only`` when they are top-level keys of the runtime stage config, i.e. when
they come from the pipeline stage's ``extras`` (a deploy-level key would land in
``engine_args``). So a four-stage PD deploy needs a four-stage ``PipelineConfig``
registered under ``<name>_pd``. This module derives it at import time from vllm-omni's
own frozen pipeline object, so it follows upstream changes, and refuses when the
upstream shape is not what omni-pd's catalogue expects.

Entry point: group ``vllm_omni.general_plugins`` (vllm_omni/plugins/__init__.py loads
it in every vllm-omni process), name ``omni_pd``, value ``omni_pd.upstream.vllm_plugin:register``.
Nothing here is imported unless vllm-omni is installed.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
from typing import Any

logger = logging.getLogger("omni_pd.upstream.vllm_plugin")


class PipelineShapeError(ValueError):
    """The upstream pipeline's stages do not match omni-pd's catalogue entry."""


def derive_pd_pipeline(upstream: Any, expected: Any) -> Any:
    """The PD variant of an upstream ``PipelineConfig`` (a frozen dataclass).

    ``expected``: omni-pd's :class:`~omni_pd.compile.pipelines.Pipeline` for the same name.
    The split stage becomes prefill (``extras.is_prefill_only``, no final output, no
    next-stage processors) and decode (``extras.is_decode_only``, input = prefill);
    later stages shift their ids and input sources by one. Raises
    :class:`PipelineShapeError` when stage ids, input sources or the split stage's
    ``model_stage`` differ from ``expected``.
    """
    from omni_pd.compile.pipelines import IdMap

    t = expected.split_stage
    if t is None:
        raise PipelineShapeError(f"{expected.name}: no Thinker/LLM stage in the catalogue entry")
    got = [(s.stage_id, tuple(s.input_sources)) for s in upstream.stages]
    want = [(s.stage_id, tuple(s.input_sources)) for s in expected.stages]
    if got != want:
        raise PipelineShapeError(f"{expected.name}: upstream stages {got} differ from omni-pd's catalogue {want}")
    up_t = next(s for s in upstream.stages if s.stage_id == t.stage_id)
    if getattr(up_t, "model_stage", t.model_stage) != t.model_stage:
        raise PipelineShapeError(
            f"{expected.name}: stage {t.stage_id} is {up_t.model_stage!r} upstream, catalogue says {t.model_stage!r}")
    ids = IdMap(t.stage_id)
    stages = []
    for s in upstream.stages:
        if s.stage_id == t.stage_id:
            stages.append(dataclasses.replace(
                s, final_output=False, final_output_type=None,
                custom_process_next_stage_input_func=None, async_chunk_process_next_stage_input_func=None,
                extras={**dict(s.extras or {}), "is_prefill_only": True}))
            stages.append(dataclasses.replace(
                s, stage_id=ids.decode, input_sources=(ids.prefill,),
                extras={**dict(s.extras or {}), "is_decode_only": True}))
        else:
            stages.append(dataclasses.replace(
                s, stage_id=ids.shift(s.stage_id),
                input_sources=tuple(ids.as_source(k) for k in s.input_sources)))
    fields = {f.name for f in dataclasses.fields(upstream)}
    changes: dict[str, Any] = {"model_type": expected.name + "_pd", "stages": tuple(stages)}
    if "default_deploy_config_name" in fields:
        changes["default_deploy_config_name"] = None
    return dataclasses.replace(upstream, **changes)


def find_upstream_pipeline(name: str) -> Any | None:
    """vllm-omni's ``PipelineConfig`` registered as ``name`` (a resolver's module is
    searched for the config object whose ``model_type`` is ``name``)."""
    reg = importlib.import_module("vllm_omni.config.pipeline_registry")
    from vllm_omni.config.stage_config import PipelineConfig  # type: ignore

    entry = reg.OMNI_PIPELINES.get(name)
    if entry is None:
        return None
    if isinstance(entry, PipelineConfig):
        return entry
    mod = importlib.import_module(entry.__module__)
    for v in vars(mod).values():
        if isinstance(v, PipelineConfig) and v.model_type == name:
            return v
    return None


def register() -> None:
    """Register ``<name>_pd`` for every catalogued vllm-omni pipeline with a Thinker.

    Safe to call many times (vllm-omni loads plugins once per process). A pipeline
    whose upstream shape differs from the catalogue is refused with a logged error.
    """
    try:
        reg = importlib.import_module("vllm_omni.config.pipeline_registry")
    except ImportError:  # vllm-omni not installed: nothing to do
        return
    install_runtime_compat()
    from omni_pd.compile.pipelines import load_catalogue

    for p in load_catalogue().pipelines.values():
        if p.runtime != "vllm-omni" or p.is_pd or p.split_stage is None:
            continue
        if p.name + "_pd" in reg.OMNI_PIPELINES:
            continue
        up = find_upstream_pipeline(p.name)
        if up is None:
            continue
        try:
            reg.register_pipeline(derive_pd_pipeline(up, p), p.name + "_pd")
        except PipelineShapeError as e:
            logger.error("omni-pd: not registering %s_pd: %s", p.name, e)


def install_runtime_compat() -> None:
    """Install omni-pd's vllm-omni PD compatibility layer
    (:mod:`omni_pd.upstream.vllm_omni_compat`: gated by release, idempotent, one log
    line). Runs from both entry points, so it is in place in the API process before
    the first PD detection: the serve parser loads ``vllm.general_plugins`` before
    ``AsyncOmni`` exists, and on every path (serve, offline ``Omni``, extra API
    servers, read from the code) ``StageRuntime._prepare_stage_plans`` (engine/stage_runtime.py) calls
    ``prepare_engine_environment`` -> ``load_omni_general_plugins`` before
    ``OmniEngineBase._detect_pd_config`` and ``OmniBase._init_pd_state`` run. And
    :func:`register` calls it before registering the ``*_pd`` pipelines, which a process
    must have done before it can resolve a ``*_pd`` deploy file, so detection (which
    follows resolution) finds the layer in place in any process. A failure
    here is logged, never raised: plugin loading must not break vllm-omni.

    Where each patch acts (vllm-omni 0.30): the PD detection patches and the Talker
    handoff's ``pd_prefill_rows`` / ``talker_prefill_rows`` run in the API process (the
    orchestrator is a thread of it, engine/omni_engine_base.py), where both groups are
    loaded as above; ``talker_prefill_merge`` runs in the Talker stage's worker, where
    ``OmniWorkerMixin.__init__`` (worker/mixins.py; omni-pd's CPU workers inherit it) calls
    ``load_omni_general_plugins`` -> this group -> :func:`register` -> here
    (tests/test_oracle_talker_pd.py checks it in a fresh process). Engine-core processes
    load the groups too; nothing there is patched that they call."""
    try:
        from omni_pd.upstream.vllm_omni_compat import install

        install()
    except Exception:  # noqa: BLE001 - logged with traceback; PD then stays as upstream has it
        logger.exception("omni-pd: vllm-omni PD compatibility layer failed to install")


def register_if_omni() -> None:
    """vLLM ``general_plugins`` hook: :func:`register` only inside a vllm-omni process.

    On vllm-omni 0.30.0's serve path the API process resolves the deploy file's
    ``pipeline:`` (``StageConfigFactory.get_pipeline_config`` ->
    ``_get_deploy_override_pipe_config``, config/config_factory.py:352, called from
    ``_should_serve_duplex`` in entrypoints/openai/api_server.py) *before* it builds
    ``OmniEngineArgs``, whose ``__post_init__`` (engine/arg_utils.py:263) loads the
    ``vllm_omni.general_plugins`` group. vLLM's own group is loaded earlier, while the
    serve parser is built (``AsyncEngineArgs.add_cli_args``), and by then
    ``vllm_omni.entrypoints.cli.serve`` has imported the pipeline registry. A plain
    ``vllm serve`` never imports the registry, so this hook costs it one dict lookup.
    """
    import sys

    if "vllm_omni.config.pipeline_registry" in sys.modules:
        register()
