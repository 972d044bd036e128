"""Typed model of the vllm-omni deploy schema (the ``stages:`` YAML).

Mirrors ``DeployConfig`` / ``StageDeployConfig`` in vllm-omni 0.30.0
``vllm_omni/config/stage_config.py``. Known fields are typed; any other stage key is
an engine argument that vllm-omni forwards verbatim (its ``engine_extras``), so the
stage model keeps unknown keys (``extra="allow"``) instead of rejecting them.
``kv_transfer_config`` is typed here (vLLM ``vllm/config/kv_transfer.py``) although
vllm-omni treats it as an engine extra, because the PD compiler reasons about it.

The JSON Schema in ``schemas/`` is generated from these classes
(``omni-pd schema``); a test fails when the two drift.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator

from omni_pd.resources import SCHEMA_FILENAME  # noqa: F401  (re-exported)


def _check(name: str) -> Any:
    """A pydantic ``mode="before"`` field validator running the shared check ``name`` of
    :data:`omni_pd.compile.model_checks.CHECKS`; its refusal becomes a
    ``PydanticCustomError`` of the check's type. The spec generator
    (:mod:`omni_pd.compile.model_spec`) reads the name back from ``check_name``."""
    from omni_pd.compile.model_checks import CHECKS, FieldCheckError

    fn = CHECKS[name]

    def run(cls: Any, v: Any) -> Any:
        try:
            return fn(v)
        except FieldCheckError as e:
            from pydantic_core import PydanticCustomError

            raise PydanticCustomError(e.type, "{why}", {"why": e.message}) from None

    run.check_name = name  # type: ignore[attr-defined]
    return classmethod(run)


class _Open(BaseModel):
    """Base for models that keep unknown keys verbatim (engine args pass through)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


class KVTransferConfig(_Open):
    """vLLM ``KVTransferConfig`` (union of fields over vLLM 0.11–0.33).

    Which fields a given vLLM accepts is target data (``omni_pd.compile.targets``): 0.32
    removed ``kv_ip``, ``kv_rank``, ``kv_parallel_size`` and ``kv_buffer_size``, and
    from 0.18 unknown keys are a hard error. Source: vllm/config/kv_transfer.py.
    """

    kv_connector: str | None = Field(None, description="KV connector registry name, e.g. MooncakeConnector")
    engine_id: str | None = Field(None, description="engine identity in transfers (uuid4 when unset)")
    kv_buffer_device: str | None = Field(None, description="cuda | cpu | xpu (connector-specific)")
    kv_buffer_size: float | None = Field(None, description="bytes; removed in vLLM 0.32")
    kv_role: str | None = Field(None, description="kv_producer | kv_consumer | kv_both")
    kv_rank: int | None = Field(None, description="V0 legacy; removed in vLLM 0.32")
    kv_parallel_size: int | None = Field(None, description="V0 legacy; removed in vLLM 0.32")
    kv_ip: str | None = Field(None, description="V0 legacy; vllm-omni reads it for the Mooncake bootstrap address; removed in vLLM 0.32")
    kv_port: int | None = Field(None, description="base port (P2pNcclConnector: kv_port + rank)")
    kv_connector_extra_config: dict[str, Any] | None = Field(None, description="per-connector options")
    kv_connector_module_path: str | None = Field(None, description="import path of an out-of-tree connector")
    enable_permute_local_kv: bool | None = None
    kv_load_failure_policy: str | None = Field(None, description="recompute | fail (vLLM >= 0.13)")


class ECTransferConfig(_Open):
    """vLLM ``ECTransferConfig``: encoder-cache transfer for encoder disaggregation (E -> PD).

    Union of fields over vLLM 0.13-0.33; which ones a release accepts, its EC
    connectors and their extra keys are target data (``presets/targets/ec_connectors.yaml``,
    rules OPD614/OPD615). Source: vllm/config/ec_transfer.py.
    """

    ec_connector: str | None = Field(None, description="EC connector registry name, e.g. ECCPUConnector")
    engine_id: str | None = None
    ec_buffer_device: str | None = None
    ec_buffer_size: float | None = Field(None, description="bytes")
    ec_role: str | None = Field(None, description="ec_producer | ec_consumer | ec_both")
    ec_rank: int | None = Field(None, description="removed in vLLM 0.32")
    ec_parallel_size: int | None = Field(None, description="removed in vLLM 0.32")
    ec_ip: str | None = None
    ec_port: int | None = None
    ec_connector_extra_config: dict[str, Any] | None = None
    ec_connector_module_path: str | None = None


class ConnectorSpec(_Open):
    """A named inter-stage (Omni) connector: ``{name, extra}``. Not a vLLM KV connector."""

    name: str
    extra: dict[str, Any] | None = None


ConnectorRef = Union[str, ConnectorSpec]


class Runtime(_Open):
    """Nested ``runtime:`` layout of a stage (takes precedence over flat keys)."""

    devices: str | None = None
    num_replicas: int | None = Field(None, ge=1)
    env: dict[str, Any] | None = None

    _devices_str = field_validator("devices", mode="before")(_check("devices_as_str"))


class ParallelConfig(_Open):
    """A stage's nested ``parallel_config:`` block (vllm-omni 0.30 ``_build_parallel_config``).

    Merged *over* the flat parallel keys of the same stage (the nested value wins), for
    LLM and diffusion stages alike. Sizes are counts of ranks (>= 1). The diffusion
    fields (``cfg_parallel_size``, ``ulysses_degree``, ``ring_degree``,
    ``allgather_degree``, HSDP) come from ``OmniStageDiffusionParallelConfig``; the
    others are vLLM ``ParallelConfig`` fields. Other keys are kept (vllm-omni's
    ownership check decides them). Source: vllm-omni 0.30.0 config/omni_config.py.
    """

    tensor_parallel_size: int | None = Field(None, ge=1)
    pipeline_parallel_size: int | None = Field(None, ge=1)
    data_parallel_size: int | None = Field(None, ge=1)
    prefill_context_parallel_size: int | None = Field(None, ge=1)
    decode_context_parallel_size: int | None = Field(None, ge=1)
    enable_expert_parallel: bool | None = None
    cfg_parallel_size: int | None = Field(None, ge=1, description="classifier-free-guidance branches in parallel (diffusion)")
    ulysses_degree: int | None = Field(None, ge=1, description="Ulysses sequence parallel degree (diffusion)")
    ring_degree: int | None = Field(None, ge=1, description="ring attention sequence parallel degree (diffusion)")
    allgather_degree: int | None = Field(None, ge=1, description="all-gather sequence parallel degree; excludes ulysses/ring > 1")
    sequence_parallel_size: int | None = Field(None, ge=1, description="derived by vllm-omni (allgather or ulysses x ring); not an input")
    vae_patch_parallel_size: int | None = Field(None, ge=1)
    text_encoder_tp_size: int | None = Field(None, ge=1)
    use_hsdp: bool | None = None
    hsdp_shard_size: int | None = Field(None, description="-1: derived from the other sizes")
    hsdp_replicate_size: int | None = Field(None, ge=1)
    ulysses_mode: Literal["strict", "advanced_uaa"] | None = None
    vae_parallel_mode: Literal["tile", "spatial_shard_height", "spatial_shard_width"] | None = None


class StageDeploy(_Open):
    """One entry under ``stages:`` (vllm-omni ``StageDeployConfig``).

    ``devices`` is a comma-separated list of logical device indices ("0,1"), "cpu", or
    None (default visibility); an int is read as a one-device list here, and OPD114 reports
    it (vllm-omni 0.30's ``OmniStageRuntimeConfig.devices`` refuses it). ``stage_id`` is an
    integer, strictly: vllm-omni's ``StageDeployConfig`` keeps ``"1"`` a string, and its PD
    checks then find no stage 1 (``Stage-1 is marked for PD but has no kv_transfer_config``).
    """

    stage_id: Annotated[int, Strict()]
    devices: str | None = None
    num_replicas: int | None = Field(None, ge=1)
    env: dict[str, Any] | None = None
    # Strict as the pipeline-wide key: vllm-omni tests `stage.async_chunk is not False`.
    async_chunk: Annotated[bool, Strict()] | None = None
    output_connectors: dict[str, ConnectorRef] | None = None
    input_connectors: dict[str, ConnectorRef] | None = None
    default_sampling_params: dict[str, Any] | None = None
    default_pooling_params: dict[str, Any] | None = None
    subtalker_sampling_params: dict[str, Any] | None = None
    # parallel sizes and replica counts are at least 1 (vLLM ParallelConfig); 0 or a
    # negative size is a located OPD101 instead of a division by zero further on
    tensor_parallel_size: int | None = Field(None, ge=1)
    pipeline_parallel_size: int | None = Field(None, ge=1)
    data_parallel_size: int | None = Field(None, ge=1)
    enable_expert_parallel: bool | None = None
    prefill_context_parallel_size: int | None = Field(None, ge=1)
    # diffusion-stage parallel sizes, flat (vllm-omni 0.30 StageDeployConfig); a nested
    # parallel_config of the same stage wins over them
    cfg_parallel_size: int | None = Field(None, ge=1)
    ulysses_degree: int | None = Field(None, ge=1)
    ring_degree: int | None = Field(None, ge=1)
    allgather_degree: int | None = Field(None, ge=1)
    sequence_parallel_size: int | None = Field(None, ge=1)
    vae_patch_parallel_size: int | None = Field(None, ge=1)
    text_encoder_tp_size: int | None = Field(None, ge=1)
    use_hsdp: bool | None = None
    hsdp_shard_size: int | None = None
    hsdp_replicate_size: int | None = Field(None, ge=1)
    parallel_config: ParallelConfig | None = Field(None, description="nested parallel sizes; win over the flat keys")
    gpu_memory_utilization: float | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    enforce_eager: bool | None = None
    async_scheduling: bool | None = None
    disable_hybrid_kv_cache_manager: bool | None = None
    mm_processor_cache_gb: float | None = None
    compilation_config: dict[str, Any] | None = None
    kv_transfer_config: KVTransferConfig | None = None
    ec_transfer_config: ECTransferConfig | None = Field(None, description="encoder-cache transfer (encoder disaggregation)")
    mm_encoder_only: bool | None = Field(None, description="run only the multimodal encoder (EC producer)")
    engine_args: dict[str, Any] | None = Field(None, description="nested legacy-ish layout; flattened by vllm-omni")
    runtime: Runtime | None = None
    engine_extras: dict[str, Any] | None = None

    _devices_str = field_validator("devices", mode="before")(_check("devices_as_str"))


class StageOverlay(StageDeploy):
    """A ``platforms.<p>.stages`` entry: same keys as a stage, matched by ``stage_id``."""


class PlatformOverlay(_Open):
    """``platforms.<p>``: per-platform stage overrides (the base YAML is the CUDA default)."""

    stages: list[StageOverlay] | None = None
    model_runner: Literal["v1", "v2"] | None = None


class Edge(_Open):
    """An explicit stage-graph edge (``edges:`` item)."""

    from_: int = Field(alias="from")
    to: int
    window_size: int | None = None
    max_inflight: int | None = None


class DeployConfig(_Open):
    """A whole deploy YAML (vllm-omni ``DeployConfig``).

    ``stage_args`` (the legacy schema) is not a field: vllm-omni 0.30.0 rejects files
    that have it, and omni-pd reports it as a located diagnostic.
    """

    base_config: str | None = None
    pipeline: str | None = Field(None, description="pipeline registry key; selects structural variants such as qwen3_omni_moe_pd")
    # Strict: vllm-omni 0.30 stores the raw value (stage_config.py load_deploy_config) and tests its
    # truthiness, so `async_chunk: "false"` streams; only a YAML boolean means what it says.
    async_chunk: Annotated[bool, Strict()] | None = Field(
        None, description="pipeline-wide chunked streaming (vllm-omni default true)")
    session_mode: str | None = None
    model_runner: Literal["v1", "v2"] | None = None
    active_stream_window: int | None = None
    duplex_session: dict[str, Any] | None = None
    connectors: dict[str, ConnectorSpec] | None = None
    edges: list[Edge] | None = None
    stages: list[StageDeploy] = Field(default_factory=list)
    platforms: dict[str, PlatformOverlay | None] | None = None
    trust_remote_code: bool | None = None
    distributed_executor_backend: str | None = None
    dtype: str | None = None
    quantization: str | None = None
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = None
    data_parallel_size: int | None = Field(None, ge=1)
    pipeline_parallel_size: int | None = Field(None, ge=1)
    custom_voice_dir: str | None = None


#: Top-level keys vllm-omni 0.30.0 knows (DeployConfig fields + base_config).
TOP_LEVEL_KEYS = frozenset(DeployConfig.model_fields) | {"base_config"}


def json_schema(vllm_version: str | None = None) -> dict[str, Any]:
    """The published JSON Schema (draft 2020-12) of a deploy YAML for vLLM ``vllm_version``
    (``"0.30"``; None: omni-pd's default target): pydantic's schema of :class:`DeployConfig`
    tightened with the target's enums, ranges and closed levels
    (:func:`omni_pd.compile.editor_schema.tighten`). Raises ValueError for a malformed
    version string (``omni_pd.compile.targets.target``)."""
    from omni_pd.compile.editor_schema import tighten
    from omni_pd.compile.targets import target

    tgt = target(vllm_version)
    schema = tighten(DeployConfig.model_json_schema(by_alias=True), tgt)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = f"vllm-omni deploy config (omni-pd, vLLM {tgt.label})"
    return schema
