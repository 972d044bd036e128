"""The encoder split (encoder disaggregation), decided as data (an :class:`EncoderSplitPlan`). Pure.

vLLM's disaggregated encoder (``docs/features/disagg_encoder.md``, examples
``disagg_1e1pd_example.sh`` / ``disagg_1e1p1d_example.sh``) runs the multimodal encoder in
its own instance E (``ec_producer``; encoder-only) and ships its outputs through an EC
connector to the instance that runs prefill (``ec_consumer``). Two layouts:

* ``1e1pd``: stage 0 E, stage 1 the LLM/Thinker as one combined instance (ec_consumer);
* ``1e1p1d``: stage 0 E, stages 1/2 the prefill/decode pair of
  :func:`~omni_pd.compile.passes.pd_split.plan_pd_split` shifted by one; prefill is the
  ec_consumer (it runs the prompt, so it needs the embeddings) and the KV producer;
  decode gets KV only.

Applies to single-LLM pipelines served by plain ``vllm serve`` (``llm``, the
``*_thinker_only`` pipelines). The full omni pipelines (Thinker -> Talker -> Code2Wav) are
refused (OPD806): vllm-omni 0.30's runtime has no encoder stage (see :data:`OMNI_REFUSAL`).

:func:`omni_pd.compile.emit_encoder.apply_encoder_split` writes the plan into the tree.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from omni_pd.compile import ec_connectors
from omni_pd.compile.devices import Devices
from omni_pd.compile.ec_connectors.base import ECSideConfig, encoder_only_flag
from omni_pd.compile.passes.pd_split import ExpandOptions, PDSplitPlan, _err, check_not_pd, plan_pd_split
from omni_pd.compile.pipelines import ENCODER_SPLITS, Catalogue, Pipeline, derive_encoder
from omni_pd.compile.targets import Target
from omni_pd.compile.topology import Topology
from omni_pd.diagnostics import Diagnostic, OmniPdError, Severity
from omni_pd.io import Document

DEFAULT_EC_CONNECTOR = "ECExampleConnector"
#: ECExampleConnector's directory when --ec-storage-path is not given: a directory of its
#: own, not vLLM's default /tmp (one folder per mm_hash would land directly in /tmp)
DEFAULT_EC_STORAGE = "/tmp/omni-pd-ec"

#: Why the full omni pipelines get no encoder split (OPD806), read from vllm-omni 0.30.0:
#: its stage workers do run vLLM's EC hooks (worker/gpu_ar_model_runner.py calls
#: ``maybe_get_ec_connector_output``), but nothing above them knows an encoder stage.
OMNI_REFUSAL = (
    "vllm-omni 0.30's runtime cannot run an encoder stage: its pipeline registry has no "
    "encoder-only stage type (vllm_omni/config/pipeline_registry.py), its orchestrator forwards a "
    "stage's outputs to the next stage as its prompt (vllm_omni/engine/orchestrator.py) and never sends "
    "the per-item encoder request or passes `ec_transfer_params`, and nothing in vllm_omni/engine, "
    "entrypoints or config reads `ec_transfer_config`")


@dataclass(frozen=True)
class EncoderOptions:
    """``omni-pd expand --encoder-split`` choices. ``layout``: ``1e1pd`` | ``1e1p1d``.
    ``ec_connector``: EC connector name. ``storage``: shared directory (ECExampleConnector).
    ``encoder_devices``: logical device indices of E (default: the next free one)."""

    layout: str
    ec_connector: str = DEFAULT_EC_CONNECTOR
    storage: str | None = None
    encoder_devices: tuple[int, ...] | None = None


@dataclass(frozen=True)
class EncoderSplitPlan:
    """What the rewrite needs. Stage ids are the output's: E is 0, the consumer 1 (and
    decode 2 for ``1e1p1d``). ``pd``: the PD plan of the LLM (ids before the shift by
    one), None for ``1e1pd``. ``encoder_settings``: engine keys E gets beyond the LLM's
    (``mm_encoder_only`` where the release needs it). ``encoder_drop``: keys of the LLM's
    entry E must not copy."""

    layout: str
    source: Pipeline
    target_pipeline: Pipeline
    pd: PDSplitPlan | None
    ec_connector: str
    storage: str | None
    encoder_devices: Devices
    producer: ECSideConfig
    consumer: ECSideConfig
    encoder_engine_id: str
    encoder_settings: dict[str, Any]
    consumer_id: int
    diagnostics: tuple[Diagnostic, ...] = field(default_factory=tuple)


#: keys of the LLM's deploy entry the encoder-only instance does not take: KV transfer
#: (E runs no language model: OPD618), parallel layout (E is one rank), PD/stage wiring
ENCODER_DROP = ("kv_transfer_config", "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
                "num_replicas", "async_scheduling", "input_connectors", "output_connectors",
                "default_sampling_params", "env", "devices", "ec_transfer_config")


def _used_devices(topo: Topology, pd: PDSplitPlan | None) -> set[int]:
    out: set[int] = set()
    devs = list(pd.base_devices.values()) if pd else [n.devices for n in topo.stages]
    for d in devs:
        if isinstance(d, tuple):
            out.update(d)
    return out


def _overlays_of(topo: Topology, stage_id: int) -> tuple[str, ...]:
    """The ``platforms.<p>`` overlays of ``topo``'s config with an entry for ``stage_id``, sorted."""
    out = []
    for name, ov in (topo.config.platforms or {}).items():
        if ov is not None and any(getattr(st, "stage_id", None) == stage_id for st in (ov.stages or [])):
            out.append(str(name))
    return tuple(sorted(out))


def plan_encoder_split(topo: Topology, catalogue: Catalogue, target: Target, eopts: EncoderOptions,
                       opts: ExpandOptions = ExpandOptions(), doc: Document | None = None) -> EncoderSplitPlan:
    """Decide the encoder split of ``topo`` (resolved without a platform overlay).

    Raises :class:`~omni_pd.diagnostics.OmniPdError` (exit 2): OPD803 already split (PD or
    E), OPD806 the pipeline cannot take an encoder split (more than one stage, e.g. the
    vllm-omni Thinker -> Talker -> Code2Wav pipelines), OPD807 EC connector unknown or not in
    the target release, and what :func:`plan_pd_split` raises for ``1e1p1d``.
    """
    src = topo.pipeline
    root = doc.loc(()) if doc else None
    if src.encoder is not None or any(isinstance(n.settings.get("ec_transfer_config"), dict) for n in topo.stages):
        raise _err("OPD803", "this deploy config already has an encoder stage (ec_transfer_config); "
                   "refusing to split it twice", root, help="run `omni-pd validate` on it instead")
    check_not_pd(topo, doc)
    if eopts.layout not in ENCODER_SPLITS:
        raise _err("OPD806", f"unknown encoder split `{eopts.layout}`", None,
                   help="--encoder-split is one of " + ", ".join(ENCODER_SPLITS))
    t = src.split_stage
    if len(src.stages) > 1 or t is None:
        roles = " -> ".join(s.role for s in src.stages)
        thinker_only = catalogue.get(f"{src.name}_thinker_only")
        raise OmniPdError(Diagnostic(
            code="OPD806", severity=Severity.ERROR, location=root,
            message=f"pipeline `{src.name}` ({roles}) cannot take an encoder split",
            notes=[OMNI_REFUSAL] if src.runtime == "vllm-omni" else [],
            help=(f"for text output, serve `{thinker_only.name}` (the Thinker alone) with --encoder-split; "
                         if thinker_only else "") + "the encoder split applies to single-LLM pipelines: "
            + ", ".join(n for n in catalogue.names() if f"{n}_{eopts.layout}" in catalogue.pipelines)))
    tgt_pipe = catalogue.get(f"{src.name}_{eopts.layout}") or derive_encoder(src, eopts.layout)
    contract = ec_connectors.get(eopts.ec_connector)
    if contract is None:
        from omni_pd.compile.ec_connectors.base import ec_row

        known = ec_row(eopts.ec_connector, target.version) is not None
        raise _err("OPD807", f"omni-pd has no EC connector contract for `{eopts.ec_connector}`"
                   + (" (validate checks it, expand does not emit it yet)" if known else ""), None,
                   help="omni-pd can emit: " + ", ".join(ec_connectors.names()))
    llm = topo.node(t.stage_id)
    assert llm is not None
    overlays = _overlays_of(topo, t.stage_id)
    if overlays:
        # E's devices and the split's ports are allocated on the base stages only; an overlay's
        # own devices/TP for this stage would land on E's device (OPD404) or share its ports
        names = ", ".join(f"platforms.{p}" for p in overlays)
        raise _err("OPD806", f"--encoder-split does not rewrite platform overlays yet: {names} "
                   f"override{'s' if len(overlays) == 1 else ''} stage {t.stage_id} ({t.role})",
                   doc.loc(("platforms",)) if doc and doc.exists(("platforms",)) else root,
                   help="remove the `platforms:` entries of this stage (the split then runs on the base platform, "
                        "CUDA), or expand without --encoder-split")
    notes: list[Diagnostic] = []
    # the split pipeline is served by plain `vllm serve` engines (runtime "vllm"): the PD pair's
    # connector settings must be the ones that runtime reads (e.g. Mooncake's bootstrap port
    # from the env only), whatever runtime the source pipeline names
    pd_topo = replace(topo, pipeline=replace(src, runtime=tgt_pipe.runtime))
    pd = plan_pd_split(pd_topo, catalogue, target, opts, doc) if eopts.layout == "1e1p1d" else None
    prefix = opts.engine_id_prefix or ("omni-" + t.role if t.role != "llm" else "llm")
    e_id = f"{prefix}-encoder"
    c_id = pd.prefill_engine_id if pd else prefix
    storage = eopts.storage or (DEFAULT_EC_STORAGE if contract.storage_key else None)
    try:
        prod = contract.configure("producer", e_id, target, storage=storage)
        cons = contract.configure("consumer", c_id, target, storage=storage)
    except ValueError as e:
        raise _err("OPD807", str(e), None, help="pick another --ec-connector or --vllm-version") from None
    if eopts.encoder_devices is not None:
        e_dev: Devices = tuple(eopts.encoder_devices)
        clash = set(e_dev) & _used_devices(topo, pd)
        if clash:
            notes.append(Diagnostic(
                code="OPD903", severity=Severity.INFO,
                message=f"the encoder shares device(s) {', '.join(map(str, sorted(clash)))} with the language model",
                help="fine for a small encoder; give --encoder-devices a free device to keep them apart"))
    elif llm.devices is None:
        e_dev = None
    else:
        used = _used_devices(topo, pd)
        e_dev = (max(used) + 1,) if used else (0,)
    settings: dict[str, Any] = {}
    if encoder_only_flag(target):
        settings["mm_encoder_only"] = True
    return EncoderSplitPlan(
        layout=eopts.layout, source=src, target_pipeline=tgt_pipe, pd=pd, ec_connector=contract.name,
        storage=storage, encoder_devices=e_dev, producer=prod, consumer=cons, encoder_engine_id=e_id,
        encoder_settings=settings, consumer_id=1, diagnostics=tuple(pd.diagnostics if pd else ()) + tuple(notes))
