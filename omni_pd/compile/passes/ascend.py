"""Expand's npu pass: give the prefill/decode pair a correct vllm-ascend configuration.

After the PD split, the pair carries the CUDA connector of the base file. On the npu
platform (the ``platforms.npu`` overlay of a multi-platform file, or the base stages
with ``--platform npu``) this pass writes, for each side:

* ``kv_transfer_config``: vllm-ascend's connector (``MooncakeConnectorV1`` pull by
  default, ``MooncakeLayerwiseConnector`` push), ``kv_role``, a unique ``engine_id``, a
  ``kv_port`` range of its own, and the ``prefill``/``decode`` peer blocks generated
  from the real parallel sizes of both stages *as resolved on npu* (BR-16);
* ``env.HCCL_IF_BASE_PORT``: a distinct HCCL listener base per engine instance (BR-29).

``kv_port`` ranges start at 36000, above AscendDirectTransport's random range of a
16-NPU node; HCCL bases start at 61000, above CANN's 60000 default, each instance
reserving 16 ports per rank. The overlay replaces ``kv_transfer_config`` as a whole
(vllm-omni ``_apply_platform_overrides``; :func:`omni_pd.compile.topology.apply_overlay`)
and merges ``env``. Facts: ``presets/targets/vllm_ascend.yaml``.

Pure planning (:func:`plan_ascend`) and one tree edit (:func:`apply_ascend`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.scalarstring import DoubleQuotedScalarString

from omni_pd.compile import ascend, connectors
from omni_pd.compile.connectors.base import SideConfig, launched_replicas
from omni_pd.compile.passes.pd_split import check_replicas_apart
from omni_pd.compile.targets import Target
from omni_pd.compile.targets import target as make_target
from omni_pd.compile.topology import Topology
from omni_pd.compile.tp_pairs import connector_tp_problem
from omni_pd.diagnostics import Diagnostic, OmniPdError, Severity

NPU = "npu"


@dataclass(frozen=True)
class AscendSide:
    """What the pass writes for one stage: its id, ``kv_transfer_config`` and env."""

    stage_id: int
    kv: dict[str, Any]
    env: dict[str, str]
    #: other keys to set on the stage entry (asymmetric TP: decode's tensor_parallel_size, devices;
    #: ``num_replicas: 1`` when the overlay cannot keep the base's replicas apart)
    settings: dict[str, Any] = field(default_factory=dict)
    #: warnings for the user (what the pass changed and why)
    notes: tuple[Diagnostic, ...] = ()


def plan_ascend(topo: Topology, connector: str, *, release: str | None = None, decode_tp: int | None = None,
                kv_port_base: int | None = None, hccl_base: int | None = None,
                target: Target | None = None, overlay: bool = False,
                replica_options: tuple[str, ...] = ()) -> list[AscendSide]:
    """The Ascend configuration of the PD pair of ``topo`` (resolved on npu).

    ``connector``: ``MooncakeConnectorV1`` or ``MooncakeLayerwiseConnector``. Prefill takes
    ``[kv_port_base, +span*replicas)``, decode the next range; HCCL bases likewise from
    ``hccl_base``. ``decode_tp``: a decode TP below prefill's (vllm-ascend's asymmetric TP, within its
    ``disaggregated_prefill.md`` limits; e.g. 4 -> 2); decode then runs on the first
    ``decode_tp * dp * pp`` of its devices.
    ``target``: the vLLM release (default: omni-pd's default), for the replica check.
    ``replica_options``: the sides (``"prefill"``, ``"decode"``) whose replicas came from
    ``--prefill-replicas`` / ``--decode-replicas``: a refusal's help names that option
    instead of the file's ``num_replicas``.
    ``overlay``: the sides go into ``platforms.npu`` of a file whose base runs elsewhere;
    a side whose replicas cannot be kept apart on npu (below) then runs one replica
    there (``num_replicas: 1`` in the overlay, which vllm-omni 0.30's
    ``_apply_platform_overrides`` applies) with an OPD904 warning, instead of refusing
    the whole file. Raises :class:`OmniPdError` OPD804 for another connector name and OPD805 when the
    pair's TP sizes break vllm-ascend's rule (P_tp >= D_tp, divisible), ``decode_tp``
    differs on a vllm-omni pipeline (its PD validator requires equal TP), or a side has
    several replicas whose kv_port ranges the runtime cannot keep apart: vllm-omni 0.30
    gives every replica the stage's ``kv_transfer_config`` unchanged (it offsets only
    MooncakeConnector's bootstrap port: engine/stage_runtime.py
    ``_prepare_replica_vllm_config``); the connector contract's ``ports`` (what validate
    checks, OPD501) says which ports each replica binds on the pipeline's runtime.
    """
    if not ascend.emits(connector):
        raise OmniPdError(Diagnostic(code="OPD804", severity=Severity.ERROR,
                                     message=f"{connector} is not a vllm-ascend PD connector",
                                     help=f"on npu use {ascend.PULL} (pull) or {ascend.PUSH} (layerwise push)"))
    pair = topo.pd_pair
    if pair is None:
        return []
    p, d = pair
    ps, ds = (ascend.Sizes(tp=n.tp, dp=n.dp, pp=n.pp) for n in (p, d))
    d_settings: dict[str, Any] = {}
    tgt = target if target is not None else make_target(None)
    # the TP table expand --prefill-tp/--decode-tp and validate's OPD603 use (vllm-ascend's row)
    err = connector_tp_problem(connector, ps.tp, decode_tp or ds.tp, tgt)
    if err:
        raise OmniPdError(Diagnostic(code="OPD805", severity=Severity.ERROR, message=f"npu overlay: {err}",
                                     help="give prefill the larger TP, a multiple of decode's (vllm-ascend's PD limits)"))
    if decode_tp is not None and decode_tp != ps.tp and topo.pipeline.launcher == "vllm-omni":
        raise OmniPdError(Diagnostic(
            code="OPD805", severity=Severity.ERROR,
            message=f"npu overlay: decode TP {decode_tp} != prefill TP {ps.tp}, but {topo.pipeline.name} runs on "
                    "vllm-omni, whose PD validator requires equal TP (pd_utils.py)",
            help="asymmetric TP needs a pipeline launched as plain vllm serve engines (e.g. *_thinker_only)"))
    if decode_tp is not None and decode_tp != ds.tp:
        ds = ascend.Sizes(tp=decode_tp, dp=ds.dp, pp=ds.pp)
        d_settings["tensor_parallel_size"] = decode_tp
        if isinstance(d.devices, tuple):
            d_settings["devices"] = ",".join(str(x) for x in d.devices[:ds.ranks])
    port = int(kv_port_base if kv_port_base is not None else ascend.rules()["kv_port_base"])
    hccl = int(hccl_base if hccl_base is not None else ascend.hccl()["base"])
    runtime = topo.pipeline.runtime  # what validate's port rules and the PD split model (rules/ports.py)
    contract = connectors.get(connector)
    out = []
    for n, s, side in ((p, ps, "prefill"), (d, ds, "decode")):
        reps = launched_replicas(n.num_replicas)
        engine_id = str((n.kv or {}).get("engine_id") or f"omni-{side}")
        kv, env = ascend.side_config(connector, side, engine_id=engine_id, kv_port=port, prefill=ps, decode=ds,
                                     hccl_base=hccl, release=release)
        settings = dict(d_settings) if side == "decode" else {}
        notes: tuple[Diagnostic, ...] = ()
        try:
            check_replicas_apart(contract, side, SideConfig(kv_transfer_config=kv, env=env), s.tp, s.dp, tgt,
                                 runtime, reps, None, f"--{side}-replicas" if side in replica_options else None)
        except OmniPdError as e:
            if not overlay:
                raise OmniPdError(replace(e.diagnostic, message=f"npu: {e.diagnostic.message}")) from None
            settings["num_replicas"] = 1
            if isinstance(n.devices, tuple) and len(n.devices) > s.ranks:
                # the pool of every replica (expand's overlay plan): one engine's devices for the one
                # replica left, else vllm-omni reads it as a pool of one engine (OPD401)
                settings["devices"] = ",".join(str(x) for x in n.devices[:s.ranks])
            notes = (Diagnostic(
                code="OPD904", severity=Severity.WARNING,
                message=f"npu overlay: the {side} stage {n.stage_id} runs 1 replica on npu (the base keeps {reps}): "
                        + e.diagnostic.message.removeprefix(f"cannot place {reps} replicas of the {side} stage on "
                                                            "one host: ").replace("gives", "would give"),
                help="to serve xPyD on npu, place the replicas on different hosts"),)
            reps = 1
        out.append(AscendSide(n.stage_id, kv, env, settings, notes))
        # the contract's span covers every instance; an engine binds dp*tp(*pp) ports
        port += max(contract.port_span(side, s.tp, s.dp, tgt, runtime=runtime, replicas=reps),
                    ascend.kv_port_span(connector, s) * reps)
        hccl += ascend.hccl_span(s) * reps
    return out


def _kv_map(kv: dict[str, Any]) -> CommentedMap:
    cm = CommentedMap()
    for k, v in kv.items():
        if isinstance(v, dict):
            inner = CommentedMap()
            for bk, bv in v.items():
                blk = CommentedMap(bv)
                blk.fa.set_flow_style()
                inner[bk] = blk
            cm[k] = inner
        else:
            cm[k] = v
    return cm


def _entry(stages: CommentedSeq, stage_id: int) -> CommentedMap:
    for s in stages:
        if isinstance(s, CommentedMap) and str(s.get("stage_id")) == str(stage_id):
            return s
    new = CommentedMap(stage_id=stage_id)
    ids = [int(s.get("stage_id")) for s in stages if isinstance(s, CommentedMap) and str(s.get("stage_id")).isdigit()]
    stages.insert(sum(1 for i in ids if i < stage_id), new)
    return new


def apply_ascend(tree: CommentedMap, sides: list[AscendSide], *, base: bool) -> None:
    """Write ``sides`` into ``tree`` in place: into ``platforms.npu.stages`` (created
    when missing), or into the base ``stages`` when ``base`` (a file for npu only; then
    the CUDA connector's env port variables are removed)."""
    if base:
        stages = tree["stages"]
    else:
        plats = tree.setdefault("platforms", CommentedMap())
        npu = plats.setdefault(NPU, CommentedMap())
        stages = npu.setdefault("stages", CommentedSeq())
    for s in sides:
        st = _entry(stages, s.stage_id)
        for k, v in s.settings.items():
            st[k] = DoubleQuotedScalarString(v) if k == "devices" else v
        kv = _kv_map(s.kv)
        if "kv_transfer_config" in st:
            st["kv_transfer_config"] = kv
        else:
            st.insert(len(st), "kv_transfer_config", kv)
        env = st.get("env")
        if not isinstance(env, CommentedMap):
            env = CommentedMap()
            keys = list(st.keys())
            st.insert(keys.index("kv_transfer_config"), "env", env)
        if base:
            for k in ("VLLM_MOONCAKE_BOOTSTRAP_PORT", "VLLM_NIXL_SIDE_CHANNEL_PORT", "VLLM_NIXL_SIDE_CHANNEL_HOST"):
                env.pop(k, None)
        for k, v in s.env.items():
            env[k] = DoubleQuotedScalarString(v)
