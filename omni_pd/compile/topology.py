"""Resolve a deploy config against its pipeline (and one platform overlay) into a Topology.

The deploy YAML only overrides per-stage engine settings; the stage graph (roles,
input sources, final outputs, prefill/decode flags) comes from the frozen pipeline.
A :class:`Topology` joins the two, one :class:`StageNode` per pipeline stage, with the
*effective* values vllm-omni 0.30.0 would use:

* nested layouts flattened as ``_parse_stage_deploy`` does (stage_config.py):
  ``runtime.{devices,env,num_replicas}`` win over flat keys, ``engine_args`` keys win
  over flat keys (dicts deep-merged), explicit ``engine_extras`` lose to both;
* a platform overlay applied as ``_apply_platform_overrides`` does: ``devices``
  replaces, ``env`` merges, other keys are set (sampling dicts shallow-merged);
* pipeline-wide ``data_parallel_size`` / ``pipeline_parallel_size`` inherited.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from omni_pd.diagnostics import Diagnostic, OmniPdError, Severity
from omni_pd.io import Document
from omni_pd.compile.devices import PLATFORMS, Devices, format_devices, parse_devices  # noqa: F401  (re-exported)
from omni_pd.compile.pipelines import Catalogue, Pipeline

if TYPE_CHECKING:  # annotations only: validate hands in model_lite objects (issue 38)
    from omni_pd.compile.model import DeployConfig

_RESERVED = frozenset({"async_chunk", "stage_id", "devices", "num_replicas", "env", "output_connectors",
                       "input_connectors", "default_sampling_params", "default_pooling_params",
                       "engine_extras", "engine_args", "runtime"})
_SHALLOW_MERGE = frozenset({"default_sampling_params", "default_pooling_params",
                            "subtalker_sampling_params", "engine_extras"})


#: Pipeline-wide top-level deploy keys that are vLLM engine args: vllm-omni applies them to
#: every stage's engine args and a stage's own value overrides them (vllm-omni 0.30.0
#: config/stage_config.py ``_PIPELINE_WIDE_ENGINE_FIELDS`` / ``_build_engine_args``).
#: ``active_stream_window`` and ``custom_voice_dir`` are in upstream's list too but are
#: vllm-omni-only, not ``vllm serve`` flags.
PIPELINE_WIDE_ENGINE_KEYS = ("trust_remote_code", "distributed_executor_backend", "dtype", "quantization",
                             "enable_prefix_caching", "enable_chunked_prefill", "data_parallel_size",
                             "pipeline_parallel_size")


def pipeline_wide_settings(cfg: DeployConfig) -> dict[str, Any]:
    """The top-level :data:`PIPELINE_WIDE_ENGINE_KEYS` ``cfg`` sets (None: unset, left out),
    in upstream's order: ``{"dtype": "bfloat16", "data_parallel_size": 2}``."""
    return {k: getattr(cfg, k) for k in PIPELINE_WIDE_ENGINE_KEYS if getattr(cfg, k, None) is not None}


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def effective_stage(raw: dict[str, Any]) -> dict[str, Any]:
    """Flatten one stage mapping the way vllm-omni's ``_parse_stage_deploy`` does.

    Returns a flat dict: reserved keys (devices, env, num_replicas, connectors,
    sampling) plus every engine key, with ``kv_transfer_config`` where the engine sees it.
    """
    flat = {k: v for k, v in raw.items() if k not in _RESERVED}
    for k, v in (raw.get("engine_args") or {}).items():
        if isinstance(v, dict) and isinstance(flat.get(k), dict):
            flat[k] = _merge(flat[k], v)
        else:
            flat[k] = v
    flat = _merge(dict(raw.get("engine_extras") or {}), flat)
    rt = raw.get("runtime") or {}
    out = dict(flat)
    out["stage_id"] = raw.get("stage_id")
    out["devices"] = rt.get("devices", raw.get("devices"))
    out["num_replicas"] = rt.get("num_replicas", raw.get("num_replicas", 1))
    out["env"] = rt.get("env", raw.get("env"))
    for k in ("async_chunk", "output_connectors", "input_connectors", "default_sampling_params",
              "default_pooling_params"):
        if k in raw:
            out[k] = raw[k]
    return out


def apply_overlay(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """Apply one ``platforms.<p>.stages`` entry to an effective stage dict
    (vllm-omni ``_apply_platform_overrides``)."""
    ov = effective_stage(overlay)
    out = dict(base)
    for k, v in ov.items():
        if k == "stage_id" or (v is None and k in ("devices", "env")):
            continue
        if k == "num_replicas" and "num_replicas" not in overlay and "num_replicas" not in (overlay.get("runtime") or {}):
            continue
        if k == "env" and isinstance(v, dict) and isinstance(out.get("env"), dict):
            out["env"] = {**out["env"], **v}
        elif k in _SHALLOW_MERGE and isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = {**out[k], **v}
        else:
            out[k] = v
    return out


@dataclass(frozen=True)
class StageNode:
    """One pipeline stage with its effective deploy settings.

    ``index``: position in the YAML ``stages:`` list (None if the deploy has no entry).
    ``devices``: see :data:`Devices`. ``tp``/``pp``/``dp``: parallel sizes (default 1).
    ``kv``: effective ``kv_transfer_config`` (plain dict) or None. ``settings``: the
    whole effective flat stage dict.
    """

    stage_id: int
    role: str
    pd_role: str | None
    input_sources: tuple[int, ...]
    final_output: bool
    final_output_type: str | None
    index: int | None
    devices: Devices
    tp: int
    pp: int
    dp: int
    num_replicas: int
    kv: dict[str, Any] | None
    env: dict[str, Any]
    settings: dict[str, Any] = field(repr=False)

    @property
    def world_size(self) -> int:
        """Devices one replica needs: TP x PP x local DP (vllm-omni stage_init_utils)."""
        return self.tp * self.pp * self.dp

    @property
    def nnodes(self) -> int:
        """Hosts one instance spans (vLLM's ``nnodes``, vllm/config/parallel.py): the nested
        ``parallel_config`` value first, as vllm-omni merges it, then the stage key; 1 when
        unset or not a positive integer (OPD401 judges the value)."""
        nested = self.settings.get("parallel_config")
        for v in ((nested or {}).get("nnodes") if isinstance(nested, dict) else None, self.settings.get("nnodes")):
            if v is not None:
                try:
                    return max(1, int(v))
                except (TypeError, ValueError):
                    return 1
        return 1


@dataclass(frozen=True)
class Topology:
    """A deploy config resolved against its pipeline for one platform (None = CUDA base)."""

    pipeline: Pipeline
    stages: tuple[StageNode, ...]
    platform: str | None
    async_chunk: bool
    config: DeployConfig = field(repr=False)
    orphan_ids: tuple[int, ...] = ()  # deploy entries whose id the pipeline lacks

    def node(self, stage_id: int) -> StageNode | None:
        for s in self.stages:
            if s.stage_id == stage_id:
                return s
        return None

    @property
    def pd_pair(self) -> tuple[StageNode, StageNode] | None:
        pair = self.pipeline.pd_pair
        if pair is None:
            return None
        p, d = self.node(pair[0]), self.node(pair[1])
        return (p, d) if p and d else None


def as_int(v: Any, default: int = 1) -> int:
    """``v`` as an int (bools and unparsable values give ``default``)."""
    try:
        return int(v) if v is not None and not isinstance(v, bool) else default
    except (TypeError, ValueError):
        return default


def pipeline_conflict(override: str | None, named: str | None, location=None) -> OmniPdError | None:
    """The usage error (OPD006, exit 2) for ``--pipeline override`` on a file whose own
    ``pipeline:`` key says ``named``, another pipeline; ``location``: that key's value.
    None when either is unset or both agree. ``--pipeline`` names the pipeline only when
    the file does not say: vllm-omni reads the file's key (config/stage_config.py
    ``StageConfigFactory``), so a command that checked or split the file under another
    pipeline would describe a deploy that never runs. Shared by expand, validate, graph and diff."""
    if not override or not named or override == named:
        return None
    return OmniPdError(Diagnostic(
        code="OPD006", severity=Severity.ERROR, location=location,
        message=f"--pipeline {override}: the file names pipeline `{named}`",
        help=f"--pipeline only names the pipeline of a file without a `pipeline:` key; drop --pipeline to use "
             f"`{named}`, or change the file's `pipeline:` to `{override}`"))


def select_pipeline(cfg: DeployConfig, catalogue: Catalogue, doc: Document | None = None,
                    override: str | None = None) -> Pipeline:
    """Which frozen pipeline a deploy config runs.

    Order: ``override`` (``--pipeline``), the config's ``pipeline:`` key, the vllm-omni
    default deploy file name (``qwen3_omni_moe.yaml`` -> ``qwen3_omni_moe``), and a
    single-stage config defaults to ``llm``. Raises :class:`OmniPdError` (OPD802, exit 2)
    when none applies or the name is not in the catalogue, and OPD006 (exit 2) when
    ``override`` and the config's ``pipeline:`` name different pipelines (:func:`pipeline_conflict`).
    """
    clash = pipeline_conflict(override, cfg.pipeline, doc.loc(("pipeline",), value=True) if doc is not None else None)
    if clash is not None:
        raise clash
    name = override or cfg.pipeline
    loc = doc.loc(("pipeline",), value=True) if (doc is not None and not override and cfg.pipeline) else (
        doc.loc(()) if doc is not None else None)
    if name:
        p = catalogue.get(name)
        if p is None:
            from difflib import get_close_matches

            close = get_close_matches(name, catalogue.names(), n=1)
            raise OmniPdError(Diagnostic(
                code="OPD802", severity=Severity.ERROR,
                message=f"unknown pipeline `{name}`",
                location=loc,
                help=(f"did you mean `{close[0]}`? " if close else "")
                + "known pipelines: " + ", ".join(catalogue.names())))
        return p
    if doc is not None:
        import os

        p = catalogue.for_deploy_file(os.path.basename(doc.name))
        if p is not None:
            return p
    ids = {s.stage_id for s in cfg.stages}
    if len(ids) <= 1:
        return catalogue.get("llm")  # type: ignore[return-value]
    raise OmniPdError(Diagnostic(
        code="OPD802", severity=Severity.ERROR,
        message="cannot tell which pipeline this deploy config runs (no `pipeline:` key)",
        location=loc,
        help="add `pipeline: qwen3_omni_moe` (or another catalogued name) or pass --pipeline NAME; "
             "known: " + ", ".join(catalogue.names())))


def resolve(cfg: DeployConfig, pipeline: Pipeline, platform: str | None = None,
            doc: Document | None = None) -> Topology:
    """Join ``cfg`` with ``pipeline`` (and ``platforms.<platform>``) into a Topology.

    Raises :class:`OmniPdError` (OPD101, exit 2) for a malformed ``devices`` string.
    """
    raw_stages = [s.model_dump(by_alias=True, exclude_unset=True) for s in cfg.stages]
    by_id: dict[int, tuple[int, dict]] = {}
    for i, rs in enumerate(raw_stages):
        by_id.setdefault(int(rs["stage_id"]), (i, rs))
    # every entry of a stage in file order, as vllm-omni applies them (two entries of one stage both apply)
    overlay: dict[int, list[tuple[int, dict]]] = {}  # stage id -> (entry index, entry)
    if platform and cfg.platforms and cfg.platforms.get(platform) and cfg.platforms[platform].stages:
        for j, o in enumerate(cfg.platforms[platform].stages):  # type: ignore[union-attr]
            overlay.setdefault(o.stage_id, []).append((j, o.model_dump(by_alias=True, exclude_unset=True)))
    nodes: list[StageNode] = []
    for ps in pipeline.stages:
        idx, rs = by_id.get(ps.stage_id, (None, {"stage_id": ps.stage_id}))
        eff = effective_stage(rs)
        where: tuple = ("stages", idx, "devices")  # the entry whose devices win: the last that sets them
        for j, o in overlay.get(ps.stage_id, ()):
            eff = apply_overlay(eff, o)
            if "devices" in o:
                where = ("platforms", platform, "stages", j, "devices")
            elif "devices" in (o.get("runtime") or {}):
                where = ("platforms", platform, "stages", j, "runtime", "devices")
        try:
            devices = parse_devices(eff.get("devices"))
        except ValueError as e:
            loc = None
            if doc is not None and None not in where:
                loc = doc.loc(where, value=True)
            raise OmniPdError(Diagnostic(code="OPD101", severity=Severity.ERROR, message=str(e),
                                         location=loc, help='write devices as "0" or "0,1"')) from None
        kv = eff.get("kv_transfer_config")
        nodes.append(StageNode(
            stage_id=ps.stage_id, role=ps.role, pd_role=ps.pd_role, input_sources=ps.input_sources,
            final_output=ps.final_output, final_output_type=ps.final_output_type, index=idx,
            devices=devices,
            tp=as_int(eff.get("tensor_parallel_size")),
            pp=as_int(eff.get("pipeline_parallel_size", cfg.pipeline_parallel_size)),
            dp=as_int(eff.get("data_parallel_size", cfg.data_parallel_size)),
            num_replicas=as_int(eff.get("num_replicas")),
            kv=dict(kv) if isinstance(kv, dict) else None,
            env=dict(eff.get("env") or {}),
            settings=eff,
        ))
    known = {ps.stage_id for ps in pipeline.stages}
    async_chunk = cfg.async_chunk if cfg.async_chunk is not None else True
    if len(pipeline.stages) == 1:
        async_chunk = False  # vllm-omni forces it off for a one-stage pipeline
    return Topology(pipeline=pipeline, stages=tuple(nodes), platform=platform, async_chunk=async_chunk,
                    config=cfg, orphan_ids=tuple(sorted(set(by_id) - known)))

