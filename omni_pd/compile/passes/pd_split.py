"""The prefill/decode split, decided as data (a :class:`PDSplitPlan`). Pure.

Input: a three-stage (or any catalogued) topology whose pipeline has a Thinker/LLM
stage ``t``. Output: what the four-stage deploy must say, without touching YAML:

* ids: ``t`` -> prefill ``t`` and decode ``t+1``; later stages shift by one
  (:class:`~omni_pd.compile.pipelines.IdMap`); upstream fact: the orchestrator forwards
  ``src -> src+1``, so ids must stay a chain (vllm-omni engine/orchestrator.py);
* ``pipeline: <name>_pd``, top-level ``async_chunk: false`` (PD routing runs only
  without async chunking: orchestrator.py), prefill ``async_scheduling: false``;
* ``kv_transfer_config`` + env for both sides from the connector contract, with
  unique ``engine_id`` s and per-host ports that collide with nothing in the input;
* devices for the base layout and for every platform overlay that places stages.

:func:`apply_pd_split` in ``omni_pd.compile.emit`` writes the plan into the round-trip tree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omni_pd.compile import connectors, stream_pd
from omni_pd.compile.alloc import AllocationError, split_devices, allocate_ports
from omni_pd.compile.connectors.base import Endpoint, SideConfig, launched_replicas
from omni_pd.diagnostics import Diagnostic, Location, OmniPdError, Severity
from omni_pd.io import Document
from omni_pd.compile.pipelines import Catalogue, IdMap, Pipeline
from omni_pd.compile.targets import Target
from omni_pd.compile.topology import Devices, Topology, effective_stage, parse_devices, resolve

DEFAULT_CONNECTOR = "MooncakeConnector"


@dataclass(frozen=True)
class ExpandOptions:
    """User choices for ``omni-pd expand`` (CLI flags). Devices are logical indices."""

    connector: str | None = None          # None: the Thinker's own kv_connector, else Mooncake
    tp: int | None = None                 # tensor parallel size for both halves
    prefill_tp: int | None = None         # prefill's TP (xPyD per-side TP; None: tp, else the Thinker's)
    decode_tp: int | None = None          # decode's TP (None: tp, else the Thinker's); unequal where tp_pairs allows
    dp: int | None = None                 # data parallel size (data_parallel_size) of both halves
    prefill_dp: int | None = None         # prefill's DP per instance (None: dp, else the Thinker's)
    decode_dp: int | None = None          # decode's DP per instance (None: dp, else the Thinker's)
    prefill_devices: tuple[int, ...] | None = None
    decode_devices: tuple[int, ...] | None = None
    downstream_devices: tuple[int, ...] | None = None
    kv_host: str = "127.0.0.1"            # address each side advertises (single host)
    kv_buffer_device: str | None = None   # e.g. "cpu" for NIXL host staging
    mooncake_protocol: str | None = None  # MooncakeConnector: "rdma" | "tcp" (kv_connector_extra_config)
    port_base: int | None = None          # first connector port to try
    engine_id_prefix: str | None = None   # default "omni-<role>" ("omni-thinker", "llm")
    prefill_replicas: int | None = None   # xPyD: prefill instances (num_replicas); None: the Thinker's
    decode_replicas: int | None = None    # xPyD: decode instances (num_replicas); None: the Thinker's
    platform: str | None = None           # "npu": the base stages run on npu (vllm-ascend connector there)
    npu_connector: str = "MooncakeConnectorV1"  # vllm-ascend connector of the npu pair (or MooncakeLayerwiseConnector)
    npu_decode_tp: int | None = None      # npu: decode TP below prefill's (P_tp % D_tp == 0); None: equal
    #: (prefill, decode) advertised addresses from a placement across hosts
    #: (omni_pd/compile/placement.py); None: kv_host for both. Two different addresses
    #: mean two hosts: each side's connector range is then allocated on its own host.
    side_hosts: tuple[str, str] | None = None
    #: ``--stream`` / ``--no-stream``: True turns vllm-omni's streaming on (``async_chunk: true``)
    #: where the input turns it off, False writes ``async_chunk: false`` (the one-piece answer);
    #: None keeps the input's (omni_pd/compile/stream_pd.py)
    stream: bool | None = None

    @property
    def no_stream(self) -> bool:
        """``--no-stream`` was given."""
        return self.stream is False


@dataclass(frozen=True)
class OverlayLayout:
    """One ``platforms.<P>`` overlay after the split, both maps ``{new stage id: Devices}``.

    ``devices``: every stage of the PD pipeline as it runs on P (prefill, decode and the
    shifted downstream stages; :func:`_plan_overlays`). ``own``: the devices the rewritten
    overlay entry of a stage carries by itself, copied from the input's entry (prefill and
    decode both carry the Thinker's: omni_pd/compile/emit.py ``_split_list``); a stage absent
    from ``own`` inherits its base stage's ``devices`` on P (vllm-omni
    ``_apply_platform_overrides`` merges an overlay entry over the base stage by ``stage_id``;
    :func:`~omni_pd.compile.topology.apply_overlay`)."""

    devices: dict[int, Devices]
    own: dict[int, Devices]


def overlay_entries(layout: OverlayLayout, base: dict[int, Devices]) -> dict[int, Devices]:
    """The entries overlay ``layout`` must spell out over the base device map ``base``
    (``{new stage id: Devices}``): each stage whose devices on the platform differ from what
    its rewritten entry already implies (its ``own`` devices, else ``base``'s). Pure."""
    return {sid: dev for sid, dev in sorted(layout.devices.items())
            if dev != (layout.own[sid] if sid in layout.own else base.get(sid))}


@dataclass(frozen=True)
class PDSplitPlan:
    """Everything the rewrite needs. Device maps are keyed by *new* stage id;
    ``overlay_devices[p]`` lists only the entries that platform ``p`` must spell out
    (:func:`overlay_entries` of ``overlay_layouts[p]`` against ``base_devices``)."""

    source: Pipeline
    target_pipeline: Pipeline
    ids: IdMap
    connector: str
    base_devices: dict[int, Devices]
    overlay_devices: dict[str, dict[int, Devices]]
    tp: int | None
    prefill: SideConfig
    decode: SideConfig
    prefill_engine_id: str
    decode_engine_id: str
    diagnostics: tuple[Diagnostic, ...] = field(default_factory=tuple)
    #: xPyD: ``num_replicas`` to write on the prefill / decode stage (None: leave as copied)
    prefill_replicas: int | None = None
    decode_replicas: int | None = None
    #: ``tensor_parallel_size`` to write on the prefill / decode stage (None: leave as copied)
    prefill_tp: int | None = None
    decode_tp: int | None = None
    #: ``data_parallel_size`` to write on the prefill / decode stage (None: leave as copied)
    prefill_dp: int | None = None
    decode_dp: int | None = None
    #: ``nnodes`` to write on the prefill / decode stage: the hosts one instance spans
    #: (a placement ``{sid: [A, B]}``, omni_pd/compile/placement.py); None: one host
    prefill_nnodes: int | None = None
    decode_nnodes: int | None = None
    #: keep ``async_chunk: true`` (streaming PD, omni_pd/compile/stream_pd.py): the output
    #: then has no prefill -> decode entry in ``edges:``
    stream: bool = False
    #: per platform overlay that places stages: every stage's devices there and the devices
    #: its rewritten entry carries by itself (:class:`OverlayLayout`); a placement across
    #: hosts renumbers these, then ``overlay_devices`` is derived again (omni_pd/compile/expand.py)
    overlay_layouts: dict[str, "OverlayLayout"] = field(default_factory=dict)


#: Most devices one engine (TP x PP x DP) may take: far above any host's accelerator
#: count, and a bound on the device lists :func:`~omni_pd.compile.alloc.split_devices` builds.
MAX_ENGINE_DEVICES = 4096


def _stage_loc(doc: Document | None, index: int | None, *keys: str, top: tuple[str, ...] = ()) -> Location | None:
    """Where the Thinker's entry (list position ``index``) sets one of ``keys``, looked
    up in the order vllm-omni lets them win (``engine_args``, flat, ``engine_extras``);
    else a top-level key of ``top``; else the stage entry; else the ``stages:`` key.
    ``keys`` are paths joined by dots (``kv_transfer_config.kv_connector``)."""
    if doc is None:
        return None
    if index is not None:
        for key in keys:
            for sub in (("engine_args",), (), ("engine_extras",)):
                path = ("stages", index) + sub + tuple(key.split("."))
                if doc.exists(path):
                    return doc.loc(path, value=True)
    for key in top:
        if doc.exists((key,)):
            return doc.loc((key,), value=True)
    if index is not None:
        return doc.loc(("stages", index))
    return doc.loc(("stages",)) if doc.exists(("stages",)) else doc.loc(())


_PARALLEL = ("tensor_parallel_size", "data_parallel_size", "pipeline_parallel_size")


def _used_ports(node: Any, out: list[tuple[int, int]]) -> None:
    """Collect every int-valued key ending in ``port`` (ports the input already claims)."""
    if isinstance(node, dict):
        for k, v in node.items():
            if isinstance(k, str) and k.lower().endswith("port") and not isinstance(v, (dict, list, bool)):
                try:
                    p = int(str(v))
                except ValueError:
                    p = -1
                if 0 < p <= 65535:
                    out.append((p, 1))
            _used_ports(v, out)
    elif isinstance(node, list):
        for v in node:
            _used_ports(v, out)


def _stage_ranges(topo: Topology, split_id: int, target: Target, runtime: str) -> list[tuple[int, int]]:
    """``(port, span)`` of every connector range the stages other than the split one bind
    (their own contracts, all replicas), so a new range never overlaps one that is wider
    than the single port :func:`_used_ports` sees."""
    out: list[tuple[int, int]] = []
    for n in topo.stages:
        kv = n.kv or {}
        c = connectors.get(str(kv.get("kv_connector") or "")) if n.stage_id != split_id else None
        if c is None:
            continue
        side = "decode" if kv.get("kv_role") == "kv_consumer" else "prefill"
        for pu in c.ports(side, kv, n.env, n.tp, n.dp, target, runtime=runtime,
                          replicas=launched_replicas(n.num_replicas)):
            if 0 < pu.port <= 65535 and pu.span > 0:
                out.append((pu.port, pu.span))
    return out


def check_replicas_apart(contract: Any, side: str, cfg: SideConfig, tp: int, dp: int, target: Target,
                          runtime: str, replicas: int, loc: Location | None, option: str | None = None) -> None:
    """Refuse (OPD805) when the ``replicas`` engines of one side would bind the same port on
    one host: the runtime gives every replica the stage's env unchanged (NIXL side channel,
    Mooncake on vllm-omni <= 0.28), so no port choice in the file can make them disjoint.
    Mooncake prefill on vllm-omni 0.30 binds ``bootstrap_port + replica id`` and passes.
    ``option``: the command-line flag that asked for the replicas (``--decode-replicas``),
    named in the help; None: they come from the file (``num_replicas``, at ``loc``)."""
    uses = contract.ports(side, cfg.kv_transfer_config, cfg.env, tp, dp, target, runtime=runtime, replicas=replicas)
    seen: dict[int, int] = {}
    for u in uses:
        for port in range(u.port, u.port + max(u.span, 1)):
            if port in seen and seen[port] != u.replica:
                from omni_pd.compile.versions import runtime_release

                raise _err("OPD805", f"cannot place {replicas} replicas of the {side} stage on one host: "
                           f"{runtime_release(runtime, target)} gives every replica the same {u.purpose} port ({port})",
                           loc, help=(f"give {option} 1" if option else "set num_replicas: 1 on the Thinker")
                           + " (one engine per side), or serve the replicas from different hosts")
            seen.setdefault(port, u.replica)


def _err(code: str, msg: str, loc: Location | None, help: str | None = None) -> OmniPdError:
    return OmniPdError(Diagnostic(code=code, severity=Severity.ERROR, message=msg, location=loc, help=help))


def side_tps(opts: ExpandOptions) -> tuple[int | None, int | None]:
    """``(prefill TP, decode TP)`` the options ask for (None: the side keeps the Thinker's).

    ``--tp`` sets both sides; ``--prefill-tp``/``--decode-tp`` set one each and may repeat
    ``--tp``'s value but not contradict it. With ``--platform npu`` the base decode stage
    runs on npu, so ``--npu-decode-tp`` is decode's TP (over ``--tp``, as before) and must
    agree with a ``--decode-tp`` (without ``--platform npu``, ``--npu-decode-tp`` is the
    ``platforms.npu`` overlay's decode TP and ``--decode-tp`` the base's: different engines). Raises :class:`OmniPdError` OPD006
    (exit 2) naming both options for a contradiction. Pure."""
    def one(flag: str, own: int | None) -> int | None:
        if own is not None and opts.tp is not None and own != opts.tp:
            raise _err("OPD006", f"{flag} {own} contradicts --tp {opts.tp} (--tp sets both prefill and decode)",
                       None, help=f"drop --tp and give --prefill-tp and --decode-tp, or give {flag} {opts.tp}")
        return own if own is not None else opts.tp

    p_tp, d_tp = one("--prefill-tp", opts.prefill_tp), one("--decode-tp", opts.decode_tp)
    if opts.platform == "npu" and opts.npu_decode_tp is not None:
        if opts.decode_tp is not None and opts.npu_decode_tp != opts.decode_tp:
            raise _err("OPD006", f"--npu-decode-tp {opts.npu_decode_tp} contradicts --decode-tp {opts.decode_tp}: "
                       "with --platform npu both set the decode stage's tensor_parallel_size", None,
                       help="give one of them")
        d_tp = opts.npu_decode_tp  # the base decode runs on npu: one setting, one code path
    return p_tp, d_tp


def side_dps(opts: ExpandOptions) -> tuple[int | None, int | None]:
    """``(prefill DP, decode DP)`` the options ask for (None: the side keeps the Thinker's
    ``data_parallel_size``), as :func:`side_tps` reads the TPs: ``--dp`` sets both sides,
    ``--prefill-dp``/``--decode-dp`` one each and may repeat ``--dp``'s value but not
    contradict it. Each instance of a side is one engine of DP ranks that takes TP x PP x DP
    devices (vLLM 0.30 ``Worker.init_device``: a rank uses device
    ``dp_local_rank*TP*PP + pp_rank*TP + tp_rank`` of its visible devices; vllm-omni 0.30
    engine/stage_init_utils.py ``get_stage_devices_per_replica``). Raises
    :class:`OmniPdError` OPD006 (exit 2) naming both options for a contradiction. Pure."""
    def one(flag: str, own: int | None) -> int | None:
        if own is not None and opts.dp is not None and own != opts.dp:
            raise _err("OPD006", f"{flag} {own} contradicts --dp {opts.dp} (--dp sets both prefill and decode)",
                       None, help=f"drop --dp and give --prefill-dp and --decode-dp, or give {flag} {opts.dp}")
        return own if own is not None else opts.dp

    return one("--prefill-dp", opts.prefill_dp), one("--decode-dp", opts.decode_dp)


def check_tp_pair(connector: str, p_tp: int, d_tp: int, target: Target, launcher: str,
                  given: tuple[int | None, int | None], loc: Location | None) -> None:
    """Refuse a prefill/decode TP pair the runtime or the connector cannot serve, with the
    code validate would report on the written file: OPD306 (vllm-omni's PD validator wants
    equal TP) or OPD603 (the connector's table, :mod:`omni_pd.compile.tp_pairs`).
    ``given``: the (prefill, decode) TPs the command line set, named in the message (the
    others come from the Thinker). ``loc``: where the connector is named in the input (None:
    ``--connector`` or the default). Raises :class:`OmniPdError` (exit 2)."""
    from omni_pd.compile.tp_pairs import connector_tp_problem, runtime_tp_problem

    if p_tp == d_tp:
        return
    asked = " ".join(f"--{side}-tp {v}" for side, v in zip(("prefill", "decode"), given) if v is not None)
    what = f"{asked}: " if asked else ""
    msg = runtime_tp_problem(launcher, p_tp, d_tp)
    if msg:
        raise _err("OPD306", what + msg + " (vllm_omni/entrypoints/pd_utils.py)", loc,
                   help="serve per-side TP from a pipeline launched as plain vllm serve engines "
                        "(llm, *_thinker_only), or give both sides the same TP")
    msg = connector_tp_problem(connector, p_tp, d_tp, target)
    if msg:
        raise _err("OPD603", what + msg, loc,
                   help="pick TPs the connector pairs (`omni-pd explain OPD603`), another --connector "
                        "or another --vllm-version")


def check_not_pd(topo: Topology, doc: Document | None) -> None:
    """Refuse a config that is already split (OPD803): a PD pipeline, or two stages that
    already form a KV pair (one that can send, ``kv_producer``/``kv_both``, and another
    that can receive, ``kv_consumer``/``kv_both``; vLLM config/kv_transfer.py role sets).
    A kv_both Thinker with a kv_consumer Talker is such a pair: splitting it again would
    emit two ``kv_consumer`` stages."""
    roles: list[tuple[int, Any]] = []
    for i, st in enumerate(topo.config.stages):  # every deploy entry, also ids the pipeline lacks
        kv = effective_stage(st.model_dump(by_alias=True, exclude_unset=True)).get("kv_transfer_config")
        if isinstance(kv, dict):
            roles.append((i, kv.get("kv_role")))
    pair = any(i != j for i, a in roles if a in ("kv_producer", "kv_both")
               for j, b in roles if b in ("kv_consumer", "kv_both"))
    if topo.pipeline.is_pd or (topo.config.pipeline or "").endswith("_pd") or pair:
        loc = doc.loc(("pipeline",), value=True) if (doc is not None and "pipeline" in doc.tree) else (
            doc.loc(()) if doc else None)
        raise _err("OPD803", "this deploy config is already prefill/decode split; refusing to split it twice",
                   loc, help="run `omni-pd validate` on it instead, or expand the original three-stage config")


def plan_pd_split(topo: Topology, catalogue: Catalogue, target: Target, opts: ExpandOptions,
                  doc: Document | None = None) -> PDSplitPlan:
    """Decide the PD split of ``topo`` (resolved without a platform overlay).

    Raises :class:`OmniPdError` (exit 2): OPD803 already PD, OPD801 no Thinker/LLM
    stage, OPD804 unknown connector, OPD805 device/port allocation impossible, OPD006
    contradicting TP options, OPD603/OPD306 a prefill/decode TP pair the connector or the
    runtime refuses (:func:`check_tp_pair`).

    Per-side TP and DP (``opts.prefill_tp``/``decode_tp``, ``opts.prefill_dp``/``decode_dp``,
    :func:`side_tps`, :func:`side_dps`): each instance of a side gets that side's TP x PP x DP
    devices, its side-channel/bootstrap range is sized from its own TP and DP (the
    contract's ``port_span``), and its ``Endpoint`` carries them.
    """
    check_not_pd(topo, doc)
    src = topo.pipeline
    t = src.split_stage
    if t is None:
        raise _err("OPD801", f"pipeline `{src.name}` has no Thinker (or single LLM) stage to split",
                   doc.loc(()) if doc else None,
                   help="PD disaggregation splits the Thinker; choose a pipeline that has one with --pipeline")
    target_pipe = catalogue.get(src.name + "_pd")
    if target_pipe is None:  # catalogue always derives it; defensive for custom catalogues
        from omni_pd.compile.pipelines import derive_pd

        target_pipe = derive_pd(src)
    ids = IdMap(t.stage_id)
    thinker = topo.node(t.stage_id)
    assert thinker is not None
    notes: list[Diagnostic] = []

    # connector ---------------------------------------------------------------------
    own = (thinker.kv or {}).get("kv_connector")
    cname = opts.connector or own or DEFAULT_CONNECTOR
    # a connector named in the file is located there; --connector is the command line
    conn_loc = None if (opts.connector or not own) else _stage_loc(
        doc, thinker.index, "kv_transfer_config.kv_connector")
    contract = connectors.get(cname)
    if contract is None:
        from difflib import get_close_matches

        # a connector vLLM registers is not a typo of one omni-pd emits (LMCacheConnectorV1 is
        # not "MooncakeConnectorV1"); a real typo is one or two edits away (cutoff 0.8)
        close = [] if cname in target.connectors() else get_close_matches(cname, connectors.names(), n=1, cutoff=0.8)
        known = (f"{cname} is a vLLM connector omni-pd does not emit (validate checks a file that names it); "
                 if cname in target.connectors() else "")
        raise _err("OPD804", f"no connector contract for `{cname}`", conn_loc,
                   help=(f"did you mean {close[0]}? " if close else "") + known
                   + "omni-pd can emit: " + ", ".join(connectors.names()))
    if contract.name not in target.connectors():
        raise _err("OPD804", f"{contract.name} is not registered in vLLM {target.label}", conn_loc,
                   help="pick another --connector or --vllm-version")

    # devices -----------------------------------------------------------------------
    tp = opts.tp
    given = side_tps(opts)
    p_tp, d_tp = given[0] or thinker.tp, given[1] or thinker.tp
    launcher = target_pipe.launcher
    tp_conn = opts.npu_connector if opts.platform == "npu" else contract.name
    check_tp_pair(tp_conn, p_tp, d_tp, target, launcher, given, conn_loc)
    given_dp = side_dps(opts)
    p_dp, d_dp = given_dp[0] or thinker.dp, given_dp[1] or thinker.dp
    p_engine, d_engine = (x * thinker.pp * y for x, y in ((p_tp, p_dp), (d_tp, d_dp)))
    world = p_engine if (given[0] or given_dp[0]) else (
        len(thinker.devices) if isinstance(thinker.devices, tuple) else thinker.world_size)
    for w in (world, d_engine):
        if not 1 <= w <= MAX_ENGINE_DEVICES:
            # a parallel size from engine_args, the top level or --tp (the model bounds only
            # stage keys below by 1): refuse before split_devices builds a list that long
            where = None if any(given + given_dp) else _stage_loc(doc, thinker.index, *_PARALLEL,
                                                                   top=_PARALLEL[1:])
            raise _err("OPD805", f"cannot place prefill and decode: TP x PP x DP = {w} devices per engine"
                       + (f", more than the {MAX_ENGINE_DEVICES} omni-pd places" if w > 0 else ""),
                       where, help="parallel sizes must be at least 1 and fit the host's devices")
    layout = {s.stage_id: s.devices for s in topo.stages}
    xpyd = opts.prefill_replicas is not None or opts.decode_replicas is not None
    d_count = d_engine if (p_tp, p_dp) != (d_tp, d_dp) else None
    reps = launched_replicas(thinker.num_replicas)
    if xpyd or reps > 1:
        # every instance gets its own devices (TP x PP x DP of its side), one contiguous chunk
        # per replica, as vllm-omni's split_devices_for_replicas reads a stage's pool
        # (vllm_omni/engine/stage_init_utils.py compute_replica_layout). xPyD: the sides'
        # --prefill-replicas/--decode-replicas; else the Thinker's num_replicas, copied to both
        # sides. Each side is written as the pool of all its replicas, and a device option
        # lists that pool: two one-engine (template-mode) lists always overlap (every
        # template's replica r starts at r x its size)
        p_n, d_n = (opts.prefill_replicas or 1, opts.decode_replicas or 1) if xpyd else (reps, reps)
        world, d_count = p_engine * p_n, d_engine * d_n
        for flag, given_devs, n, engine in (("--prefill-devices", opts.prefill_devices, p_n, p_engine),
                                            ("--decode-devices", opts.decode_devices, d_n, d_engine)):
            if given_devs is not None and len(given_devs) != n * engine:
                raise _err("OPD805", f"{flag} lists {len(given_devs)} device(s); {n * engine} are needed "
                           f"({n} instance(s) x {engine} device(s) each)", None,
                           help=f"give {flag} every instance's devices, instance r on the r-th {engine} of them")
    elif d_count is not None and opts.decode_devices is not None and len(opts.decode_devices) != d_count:
        raise _err("OPD805", f"--decode-devices lists {len(opts.decode_devices)} device(s); decode at TP {d_tp}"
                   + (f" x DP {d_dp}" if d_dp != 1 else "") + f" needs {d_count}", None)
    try:
        base = split_devices(layout, t.stage_id, world, opts.prefill_devices, opts.decode_devices,
                             opts.downstream_devices, decode_count=d_count)
    except (ValueError, AllocationError) as e:
        raise _err("OPD805", f"cannot place prefill and decode: {e}", None) from None
    base_devices: dict[int, Devices] = {ids.prefill: base.prefill, ids.decode: base.decode}
    for old, dev in base.others.items():
        base_devices[ids.shift(old)] = dev
    if thinker.devices is None and base.prefill is not None:
        notes.append(Diagnostic(
            code="OPD902", severity=Severity.INFO,
            message=f"the Thinker had no `devices`; prefill gets \"{_fmt(base.prefill)}\" and decode \"{_fmt(base.decode)}\"",
            location=doc.loc(("stages", thinker.index)) if (doc and thinker.index is not None) else None,
            help="pass --prefill-devices/--decode-devices to choose them"))

    side_n = (p_n, d_n) if xpyd else (launched_replicas(thinker.num_replicas),) * 2
    overlay_layouts = _plan_overlays(topo, t.stage_id, ids, given, given_dp, side_n)
    overlay_devices = {p: overlay_entries(lay, base_devices) for p, lay in overlay_layouts.items()}

    # ports and connector config ----------------------------------------------------
    runtime = src.runtime
    used: list[tuple[int, int]] = []
    _used_ports(topo.config.model_dump(by_alias=True, exclude_unset=True), used)
    used += _stage_ranges(topo, t.stage_id, target, runtime)
    prefix = opts.engine_id_prefix or ("omni-" + t.role if t.role != "llm" else "llm")
    p_id, d_id = f"{prefix}-prefill", f"{prefix}-decode"
    start = opts.port_base or contract.default_port_base(target)
    # a platform overlay may raise the Thinker's TP/DP/replicas: reserve the widest range
    # any platform binds, so prefill and decode ranges stay disjoint on every platform
    span_tps, span_dps, span_rep = [p_tp, d_tp], [p_dp, d_dp], thinker.num_replicas
    for pname in topo.config.platforms or {}:
        node = resolve(topo.config, src, pname).node(t.stage_id)
        if node is not None:
            span_tps = [max(x, node.tp) for x in span_tps]
            span_dps = [max(x, node.dp) for x in span_dps]
            span_rep = max(span_rep, node.num_replicas)
    side_reps = (launched_replicas(opts.prefill_replicas or span_rep),
                 launched_replicas(opts.decode_replicas or span_rep))
    # each side's range from its own TP and DP: a NIXL engine binds one port per DP rank
    # (per TP x DP rank on vLLM 0.11), a Mooncake prefill one per rank on 0.13 (the
    # contracts' port_span)
    spans = [contract.port_span(side, side_tp, side_dp, target, runtime=runtime, replicas=reps)
             for side, side_tp, side_dp, reps in zip(("prefill", "decode"), span_tps, span_dps, side_reps)]
    bases: list[int | None] = [None, None]
    wanted = [i for i, sp in enumerate(spans) if sp > 0]
    hosts = opts.side_hosts or (opts.kv_host, opts.kv_host)
    # on two hosts each side's range is its own host's: both may start at the base
    groups = [[i] for i in wanted] if hosts[0] != hosts[1] else [wanted]
    if start is not None and wanted:
        for group in groups:
            try:
                got = allocate_ports([spans[i] for i in group], used, start)
            except AllocationError as e:
                raise _err("OPD805", f"cannot allocate {contract.name} ports: {e}", None,
                           help="pass --port-base with a lower free port") from None
            for i, port in zip(group, got):
                bases[i] = port
    p_port, d_port = bases
    kvbd = opts.kv_buffer_device or (thinker.kv or {}).get("kv_buffer_device")
    p_ep = Endpoint("prefill", p_id, hosts[0], p_tp, p_dp, p_port, kvbd, runtime, opts.mooncake_protocol)
    d_ep = Endpoint("decode", d_id, hosts[1], d_tp, d_dp, d_port, kvbd, runtime, opts.mooncake_protocol)
    # each side drops what its role does not read (decode: a Mooncake prefill's bootstrap port)
    p_cfg = _merge_user_kv(contract.configure(p_ep, target), thinker.kv, target,
                           contract.unread_keys(target, runtime, side="prefill"))
    d_cfg = _merge_user_kv(contract.configure(d_ep, target), thinker.kv, target,
                           contract.unread_keys(target, runtime, side="decode"))
    for side, cfg, reps, side_tp, side_dp, asked in (
            ("prefill", p_cfg, side_reps[0], span_tps[0], span_dps[0], opts.prefill_replicas),
            ("decode", d_cfg, side_reps[1], span_tps[1], span_dps[1], opts.decode_replicas)):
        if reps > 1:  # replicas from the command line are refused naming the option, without a location
            check_replicas_apart(contract, side, cfg, side_tp, side_dp, target, runtime, reps,
                                  None if asked else _stage_loc(doc, thinker.index, "num_replicas"),
                                  f"--{side}-replicas" if asked else None)

    # async chunking ----------------------------------------------------------------
    # said when the file asked for async_chunk, or when vllm-omni (whose orchestrator
    # reads the key) serves the pair; a pipeline launched as plain `vllm serve` engines
    # (llm, *_thinker_only) never reads it, so writing false there changes nothing
    # (a one-stage pipeline has topo.async_chunk off: vllm-omni forces it off there, and
    # turns it back on, unless the file says false, once the pair has two stages)
    # vllm-omni streams this pipeline without PD: keep it where omni-pd's layer makes the pair
    # stream (silent); where it cannot, write false and warn (the file then works, in one piece)
    asked = topo.async_chunk or (opts.stream is True and len(src.stages) > 1)  # --stream: vllm-omni's default
    g = stream_pd.gap(target_pipe, target) if asked and stream_pd.streams(target_pipe) else None
    if opts.stream is True and (g is not None or not stream_pd.streams(target_pipe)):
        raise OmniPdError(Diagnostic(
            code="OPD006", severity=Severity.ERROR,
            message=(f"--stream: {g.why}" if g is not None else
                     f"--stream: {target_pipe.name} has no stage after decode that streams (plain vllm serve engines "
                     "never read async_chunk)"),
            help=g.help if g is not None else "drop --stream"))
    stream = asked and stream_pd.streams(target_pipe) and not opts.no_stream and g is None
    if not stream and (topo.async_chunk or (topo.config.async_chunk is not False and len(src.stages) == 1
                                            and target_pipe.launcher == "vllm-omni")):
        had_stream = topo.async_chunk  # on only for a pipeline of several stages (resolve)
        cannot = g is not None and not opts.no_stream
        notes.append(Diagnostic(
            code="OPD901", severity=Severity.WARNING if cannot else Severity.INFO,
            help=(g.help if cannot else None),
            message=(f"async_chunk set to false: {g.why}; the answer's audio comes in one piece after the text"
                     if cannot else
                     "async_chunk set to false (--no-stream): the answer's audio comes in one piece after the text"
                     if had_stream and opts.no_stream else
                     "async_chunk set to false: streaming of audio chunks between stages is given up"
                     if had_stream else "async_chunk set to false (prefill/decode routing needs it off)"),
            location=doc.loc(("async_chunk",), value=True) if (doc and "async_chunk" in doc.tree) else None,
            notes=["without omni-pd's streaming patches vllm-omni refuses async_chunk with a kv_transfer_config "
                   "(config/omni_config.py) and would prewarm decode with a placeholder prompt (engine/orchestrator.py)"],
        ))
    _talker_refusal(target_pipe, topo, doc, target)
    return PDSplitPlan(source=src, target_pipeline=target_pipe, ids=ids, connector=contract.name,
                       base_devices=base_devices, overlay_devices=overlay_devices,
                       overlay_layouts=overlay_layouts, tp=tp,
                       prefill=p_cfg, decode=d_cfg, prefill_engine_id=p_id, decode_engine_id=d_id,
                       diagnostics=tuple(notes), prefill_replicas=opts.prefill_replicas,
                       decode_replicas=opts.decode_replicas, prefill_tp=given[0], decode_tp=given[1],
                       prefill_dp=given_dp[0], decode_dp=given_dp[1], stream=stream)


def _talker_refusal(target_pipe: Pipeline, topo: Topology, doc: Document | None, target: Target) -> None:
    """OPD704 (error, exit 2, nothing written) when the PD pipeline's Talker reads the
    decode stage and omni-pd's vllm-omni compatibility layer cannot hand it prefill's rows
    at ``target`` (release or pipeline not covered, or switched off in the input's Talker
    stage ``env``): its audio would be wrong (facts and sources: omni_pd/compile/talker_pd.py).
    Located at the input's ``pipeline:`` key (the Talker's ``env`` entry for a switch),
    else the Talker's entry of the input. Silent where the layer covers it."""
    from omni_pd.compile import talker_pd

    found = talker_pd.talker_after_decode(target_pipe)
    if found is None:
        return
    decode, talker = found
    node = topo.node(next((s.stage_id for s in topo.pipeline.stages if s.role == "talker"), -1))
    g = talker_pd.gap(target_pipe, target, None, node.env if node is not None else None)
    if g is None:
        return
    where = None
    if g.var and doc is not None and node is not None and node.index is not None:
        for path in (("stages", node.index, "runtime", "env", g.var), ("stages", node.index, "env", g.var)):
            if doc.exists(path):
                where = doc.loc(path, value=True)
                break
    if where is None and doc is not None and doc.exists(("pipeline",)):
        where = doc.loc(("pipeline",), value=True)
    elif where is None:
        where = _stage_loc(doc, node.index) if node is not None else None
    raise OmniPdError(Diagnostic(code=talker_pd.CODE, severity=Severity.ERROR,
                                 message=talker_pd.message(decode.stage_id, talker.stage_id, g.why), location=where,
                                 notes=list(talker_pd.NOTES), help=g.help))


def _fmt(d: Devices) -> str:
    from omni_pd.compile.topology import format_devices

    return format_devices(d) or ""


def _merge_user_kv(cfg: SideConfig, user: dict[str, Any] | None, target: Target,
                   unread: tuple[str, ...] = ()) -> SideConfig:
    """Keep what the user already wrote in the Thinker's kv_transfer_config (extra
    config keys, buffer device, ...) under the contract's fields; role, engine id and
    connector always come from the contract. Legacy fields the target lacks are dropped,
    and so are ``unread`` paths (``kv_connector_extra_config.mooncake_bootstrap_port``:
    keys no code reads on this runtime, presets/targets/mooncake_bootstrap.yaml)."""
    if not user:
        return cfg
    allowed = target.kv_fields()
    drop = {tuple(u.split(".")) for u in unread}
    merged: dict[str, Any] = {}
    for k, v in user.items():
        if k in ("kv_role", "engine_id", "kv_rank", "kv_parallel_size") or (target.kv_field_known(k) and k not in allowed):
            continue
        if (k,) in drop:
            continue
        if isinstance(v, dict) and any(len(p) == 2 and p[0] == k for p in drop):
            v = {ek: ev for ek, ev in v.items() if (k, ek) not in drop}
            if not v:
                continue
        merged[k] = v
    for k, v in cfg.kv_transfer_config.items():
        if isinstance(v, dict) and isinstance(merged.get(k), dict):
            merged[k] = {**merged[k], **v}
        else:
            merged[k] = v
    ordered = {k: merged[k] for k in cfg.kv_transfer_config}
    ordered.update({k: v for k, v in merged.items() if k not in ordered})
    return SideConfig(kv_transfer_config=ordered, env=cfg.env, env_remove=cfg.env_remove)


def _plan_overlays(topo: Topology, t: int, ids: IdMap,
                   side_tps: tuple[int | None, int | None] = (None, None),
                   side_dps: tuple[int | None, int | None] = (None, None),
                   side_reps: tuple[int, int] = (1, 1)) -> dict[str, OverlayLayout]:
    """Per platform overlay that places stages (an entry sets ``devices``): the devices every
    new stage has there so that prefill and decode stay disjoint and downstream stages
    follow, with the devices each rewritten entry carries by itself (:class:`OverlayLayout`).
    An overlay whose entries set no ``devices`` inherits the base layout, already split: absent.

    ``side_tps``/``side_dps``: the (prefill, decode) TPs and DPs written on the base stages
    (None: unchanged). A side runs its TP (DP) on the platform too unless the overlay's
    Thinker entry sets its own ``tensor_parallel_size`` (``data_parallel_size``), copied to
    both halves, so it wins there: each side then gets one engine's TP x PP x DP devices (as before, an overlay places one engine per side;
    xPyD instances share them there, and the npu pass runs one replica on npu, OPD904).
    ``side_reps``: the (prefill, decode) replicas written on the base stages; a side of
    more than one gets the pool of all its replicas' devices there too (vllm-omni 0.30
    ``split_devices_for_replicas`` reads one engine's list as a template that shifts
    replica r by r x its size, which lands on the other side), unless the overlay's
    Thinker entry sets its own ``num_replicas``, copied to both halves.
    Every stage is in the layout, also one that inherits its devices: a placement across
    hosts renumbers the whole layout per host (:func:`~omni_pd.compile.placement.place_devices`),
    and :func:`overlay_entries` then lists the entries the overlay must spell out.
    """
    cfg = topo.config
    out: dict[str, OverlayLayout] = {}
    for pname, pov in (cfg.platforms or {}).items():
        if pov is None or not pov.stages or all(
                effective_stage(o.model_dump(by_alias=True, exclude_unset=True)).get("devices") is None
                for o in pov.stages):
            continue  # inherits the base layout, which is already split
        ptopo = resolve(cfg, topo.pipeline, pname)
        layout = {s.stage_id: s.devices for s in ptopo.stages}
        t_dev = layout.get(t)
        raw = {o.stage_id: o.model_dump(by_alias=True, exclude_unset=True) for o in pov.stages}
        entries = {sid: effective_stage(r) for sid, r in raw.items()}

        def overlay_sets(key: str) -> bool:  # written in the overlay's Thinker entry (no defaults)
            r = raw.get(t, {})
            return any(isinstance(h, dict) and key in h for h in (r, r.get("engine_args"), r.get("engine_extras")))

        node = ptopo.node(t)
        assert node is not None  # resolve builds a node for every stage of the pipeline
        # a Thinker without devices on this platform runs one engine there (TP x PP x DP),
        # as in the base split (plan_pd_split's world)
        as_is = len(t_dev) if isinstance(t_dev, tuple) else node.world_size
        t_reps = launched_replicas(node.num_replicas)
        if isinstance(t_dev, tuple) and t_reps > 1 and len(t_dev) == node.world_size * t_reps:
            as_is = node.world_size  # the Thinker's pool: one engine's devices, times the replicas below
        reps = (t_reps, t_reps) if overlay_sets("num_replicas") else side_reps

        def world(tp: int | None, dp: int | None) -> int:
            tp = None if overlay_sets("tensor_parallel_size") else tp
            dp = None if overlay_sets("data_parallel_size") else dp
            if tp is None and dp is None:
                return as_is
            return (tp or node.tp) * node.pp * (dp or node.dp)

        p_world, d_world = world(side_tps[0], side_dps[0]), world(side_tps[1], side_dps[1])
        p_world, d_world = p_world * max(1, reps[0]), d_world * max(1, reps[1])
        res = split_devices(layout, t, p_world, decode_count=d_world if d_world != p_world else None)
        own = {sid: e.get("devices") for sid, e in entries.items()}
        placed = [(ids.prefill, t, res.prefill), (ids.decode, t, res.decode)]
        placed += [(ids.shift(old), old, dev) for old, dev in res.others.items()]
        out[pname] = OverlayLayout(
            devices={new_id: dev for new_id, _, dev in placed},
            own={new_id: parse_devices(own[old]) for new_id, old, _ in placed if own.get(old) is not None})
    return out
