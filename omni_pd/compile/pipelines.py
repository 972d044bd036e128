"""The catalogue of frozen pipelines, read from ``presets/pipelines/*.yaml``.

vllm-omni keeps each model's stage topology in code (``PipelineConfig`` /
``StagePipelineConfig`` registered in ``OMNI_PIPELINES``, vllm_omni/config/
pipeline_registry.py); the deploy YAML only overrides per-stage engine settings. The
compiler needs the same facts: which stage is the Thinker (the one split into
prefill/decode), each stage's role, inputs and final outputs.

:func:`derive_pd` builds the PD variant (``<name>_pd``) of a pipeline the same way
the vllm-omni plugin does at import time: the Thinker becomes a prefill stage
(``is_prefill_only``, no final output) and a decode stage (``is_decode_only``, input
= prefill, keeps the final output); downstream ids and input sources shift by one.
Shape of the fork that first registered ``qwen3_omni_moe_pd``: Timez-zx/vllm-omni
@53889919 ``qwen3_omni/pipeline.py`` (reference: vllm_omni_deploy_schema.md §d2).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Literal

PD_SUFFIX = "_pd"

#: Roles whose stage is split into a prefill/decode pair.
SPLITTABLE_ROLES = frozenset({"thinker", "llm"})

PDRole = Literal["prefill", "decode"]


@dataclass(frozen=True)
class PipelineStage:
    """One frozen stage. ``input_sources`` are stage ids; ``role`` is omni-pd's name."""

    stage_id: int
    role: str
    model_stage: str
    execution_type: str = "LLM_AR"
    input_sources: tuple[int, ...] = ()
    final_output: bool = False
    final_output_type: str | None = None
    pd_role: PDRole | None = None


#: how ``omni-pd launch`` serves a PD pipeline, by :attr:`Pipeline.launcher` (the two
#: branches of omni_pd/launch/plan.py ``build_plan``): what ``omni-pd pipelines`` lists in
#: its ``launch`` column and ``launch --dry-run``'s header says, one text for both
LAUNCH_FORMS: dict[str, str] = {
    "vllm": "vllm serve per engine + router",  # one plain vllm serve per instance, omni-pd's PD router in front
    "vllm-omni": "vllm serve --omni",  # one vllm-omni server; it starts the stage engines and routes P -> D
}


@dataclass(frozen=True)
class Pipeline:
    """A frozen pipeline: ``name`` is the vllm-omni registry key (``model_type``).

    ``runtime``: whose pipeline it is (``vllm-omni``: registered in vllm-omni's
    ``OMNI_PIPELINES``, so the plugin registers its ``_pd`` variant and deploy files
    name it; ``vllm``: a plain vLLM model). ``launch_runtime``: how ``omni-pd launch``
    serves its PD pair when that differs from ``runtime`` (catalogue key
    ``launch_runtime``): ``vllm`` = one plain ``vllm serve`` per prefill and decode
    engine behind omni-pd's router, for thinker-only pipelines whose architecture vLLM
    itself maps to the Thinker class (vllm/model_executor/models/registry.py:
    ``Qwen3OmniMoeForConditionalGeneration`` -> ``Qwen3OmniMoeThinkerForConditionalGeneration``).
    ``linear_chain``: not a real pipeline but validate's stand-in for one it cannot name
    or does not catalogue (``omni_pd/check/validate.py choose_pipeline``): its stages are
    a chain whose roles are unknown.
    """

    name: str
    stages: tuple[PipelineStage, ...]
    model_arch: str | None = None
    runtime: Literal["vllm-omni", "vllm"] = "vllm-omni"
    deploy_configs: tuple[str, ...] = ()
    base: str | None = None  # for a PD variant: the pipeline it was derived from
    launch_runtime: Literal["vllm-omni", "vllm"] | None = None
    linear_chain: bool = False

    @property
    def launcher(self) -> Literal["vllm-omni", "vllm"]:
        """The runtime ``omni-pd launch`` starts: ``launch_runtime``, else ``runtime``."""
        return self.launch_runtime or self.runtime

    @property
    def launch_form(self) -> str | None:
        """How ``omni-pd launch`` serves this pipeline (:data:`LAUNCH_FORMS` of
        :attr:`launcher`: ``"vllm serve per engine + router"`` for
        ``qwen3_omni_moe_thinker_only_pd`` although its :attr:`runtime` is vllm-omni)
        when launch starts it: a prefill/decode split or an encoder split (E -> PD,
        E -> P -> D). None for a pipeline launch refuses (it is expanded first)."""
        return LAUNCH_FORMS[self.launcher] if self.is_pd or self.encoder is not None else None

    @property
    def is_pd(self) -> bool:
        return any(s.pd_role for s in self.stages)

    def stage(self, stage_id: int) -> PipelineStage | None:
        for s in self.stages:
            if s.stage_id == stage_id:
                return s
        return None

    @property
    def encoder(self) -> PipelineStage | None:
        """The encoder-only stage E of an encoder-split pipeline (:func:`derive_encoder`), or None."""
        return next((s for s in self.stages if s.role == "encoder"), None)

    @property
    def ec_consumer(self) -> PipelineStage | None:
        """The stage that runs prefill after E (the ``ec_consumer``), or None without E."""
        if self.encoder is None:
            return None
        return next((s for s in self.stages if s.role in SPLITTABLE_ROLES and s.pd_role != "decode"), None)

    @property
    def split_stage(self) -> PipelineStage | None:
        """The stage a PD split applies to (the Thinker, or the only stage of an LLM)."""
        if self.encoder is not None:
            return None
        for s in self.stages:
            if s.role in SPLITTABLE_ROLES and s.pd_role is None:
                return s
        return None

    @property
    def pd_pair(self) -> tuple[int, int] | None:
        p = next((s.stage_id for s in self.stages if s.pd_role == "prefill"), None)
        d = next((s.stage_id for s in self.stages if s.pd_role == "decode"), None)
        return (p, d) if p is not None and d is not None else None


@dataclass(frozen=True)
class IdMap:
    """Stage-id renumbering of a PD split around the split stage ``t``.

    ``as_source(k)``: where data *from* old stage k now comes from (``t`` -> decode).
    ``as_dest(k)``: where data *to* old stage k now goes (``t`` -> prefill).
    Ids below ``t`` keep their number; ids above shift by one.
    """

    t: int

    @property
    def prefill(self) -> int:
        return self.t

    @property
    def decode(self) -> int:
        return self.t + 1

    def shift(self, k: int) -> int:
        return k if k < self.t else k + 1

    def as_source(self, k: int) -> int:
        return self.decode if k == self.t else self.shift(k)

    def as_dest(self, k: int) -> int:
        return self.prefill if k == self.t else self.shift(k)


def derive_pd(p: Pipeline) -> Pipeline:
    """The PD variant of ``p``: split its Thinker/LLM stage in two.

    Raises ValueError if ``p`` has no splittable stage or is already PD.
    """
    t = p.split_stage
    if t is None or p.is_pd:
        raise ValueError(f"pipeline {p.name!r} has no Thinker/LLM stage to split")
    m = IdMap(t.stage_id)
    out: list[PipelineStage] = []
    for s in p.stages:
        if s.stage_id == t.stage_id:
            out.append(replace(s, final_output=False, final_output_type=None, pd_role="prefill"))
            out.append(replace(s, stage_id=m.decode, input_sources=(m.prefill,), pd_role="decode"))
        else:
            out.append(replace(s, stage_id=m.shift(s.stage_id),
                               input_sources=tuple(m.as_source(k) for k in s.input_sources)))
    return Pipeline(name=p.name + PD_SUFFIX, stages=tuple(sorted(out, key=lambda s: s.stage_id)),
                    model_arch=p.model_arch, runtime=p.runtime, deploy_configs=(), base=p.name,
                    launch_runtime=p.launch_runtime)


#: Encoder-split layouts (``omni-pd expand --encoder-split``), named as upstream's example
#: scripts (vLLM examples/disaggregated/disaggregated_encoder/disagg_1e1pd_example.sh,
#: disagg_1e1p1d_example.sh): ``1e1pd`` = an encoder instance E and one combined
#: prefill+decode instance; ``1e1p1d`` = E and a prefill/decode pair.
ENCODER_SPLITS = ("1e1pd", "1e1p1d")

ENCODER_ROLE = "encoder"


def derive_encoder(p: Pipeline, layout: str) -> Pipeline:
    """The encoder-split variant ``<p.name>_<layout>`` of a single-LLM pipeline ``p``.

    Stage 0 becomes the encoder-only instance E (role ``encoder``, no output); the LLM
    follows with input E: ``1e1pd`` keeps it whole (stage 1), ``1e1p1d`` splits it as
    :func:`derive_pd` does (prefill 1, decode 2). ``runtime`` is ``vllm``: the variants are
    served as plain ``vllm serve`` instances (E with an ``ec_producer``, the prefill side
    with an ``ec_consumer``) behind omni-pd's router; vllm-omni 0.30 has no encoder stage.
    Raises ValueError when ``p`` is not one stage with a Thinker/LLM role, or is already split.
    """
    t = p.split_stage
    if layout not in ENCODER_SPLITS:
        raise ValueError(f"unknown encoder split {layout!r} (one of {', '.join(ENCODER_SPLITS)})")
    if t is None or p.is_pd or len(p.stages) != 1 or any(s.role == ENCODER_ROLE for s in p.stages):
        raise ValueError(f"pipeline {p.name!r} is not a single Thinker/LLM stage")
    enc = PipelineStage(stage_id=0, role=ENCODER_ROLE, model_stage=ENCODER_ROLE, execution_type="ENCODER")
    llm = replace(t, stage_id=1, input_sources=(0,))
    stages: tuple[PipelineStage, ...]
    if layout == "1e1pd":
        stages = (enc, llm)
    else:
        stages = (enc, replace(llm, final_output=False, final_output_type=None, pd_role="prefill"),
                  replace(llm, stage_id=2, input_sources=(1,), pd_role="decode"))
    return Pipeline(name=f"{p.name}_{layout}", stages=stages, model_arch=p.model_arch, runtime="vllm",
                    deploy_configs=(), base=p.name, launch_runtime="vllm")


@dataclass(frozen=True)
class Catalogue:
    """All known pipelines by name, PD variants included."""

    pipelines: dict[str, Pipeline] = field(default_factory=dict)

    def get(self, name: str) -> Pipeline | None:
        return self.pipelines.get(name)

    def names(self) -> list[str]:
        return sorted(self.pipelines)

    def for_deploy_file(self, filename: str) -> Pipeline | None:
        """The pipeline whose vllm-omni default deploy file is ``filename`` (basename)."""
        for p in self.pipelines.values():
            if filename in p.deploy_configs:
                return p
        return None


def _stage_from_dict(d: dict) -> PipelineStage:
    return PipelineStage(
        stage_id=int(d["stage_id"]), role=str(d["role"]), model_stage=str(d.get("model_stage", d["role"])),
        execution_type=str(d.get("execution_type", "LLM_AR")),
        input_sources=tuple(int(x) for x in d.get("input_sources", ()) or ()),
        final_output=bool(d.get("final_output", False)),
        final_output_type=d.get("final_output_type"),
    )


def pipeline_from_dict(d: dict) -> Pipeline:
    """Build a :class:`Pipeline` from one catalogue YAML mapping."""
    return Pipeline(
        name=str(d["name"]),
        stages=tuple(_stage_from_dict(s) for s in d["stages"]),
        model_arch=d.get("model_arch"),
        runtime=d.get("runtime", "vllm-omni"),
        deploy_configs=tuple(d.get("deploy_configs", ()) or ()),
        launch_runtime=d.get("launch_runtime"),
    )


@lru_cache(maxsize=1)
def load_catalogue() -> Catalogue:
    """Read every ``presets/pipelines/*.yaml`` and add the derived ``*_pd`` variants."""
    from omni_pd.resources import data_dir, load_data

    pipes: dict[str, Pipeline] = {}
    for path in sorted((data_dir("presets") / "pipelines").glob("*.yaml")):
        p = pipeline_from_dict(load_data(path))
        pipes[p.name] = p
    for p in list(pipes.values()):
        if p.split_stage is not None:
            v = derive_pd(p)
            pipes[v.name] = v
        if p.launcher == "vllm" and len(p.stages) == 1 and p.split_stage is not None:
            for layout in ENCODER_SPLITS:  # served by plain vllm serve: the encoder split applies
                e = derive_encoder(p, layout)
                pipes[e.name] = e
    return Catalogue(pipes)
