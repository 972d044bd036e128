"""The ``expand`` pipeline: load -> parse -> resolve -> pd_split -> emit -> re-parse.

No printing and no file writes here: the CLI does those. Each step is one module;
this file only wires them, so a library user gets the same result as the CLI.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from omni_pd.diagnostics import Diagnostic, OmniPdError, Severity
from omni_pd.io import Document, parse_text
from omni_pd.compile.model import DeployConfig
from omni_pd.compile.parse import parse_config
from omni_pd.compile.passes.pd_split import ExpandOptions, PDSplitPlan, plan_pd_split
from omni_pd.compile.pipelines import Catalogue, Pipeline, load_catalogue
from omni_pd.compile.targets import Target, target as make_target
from omni_pd.compile.topology import Topology, resolve, select_pipeline

if TYPE_CHECKING:
    from omni_pd.compile.placement import InventoryLike, Placement
    from omni_pd.compile.passes.pd_split import OverlayLayout
    from omni_pd.compile.passes.encoder_split import EncoderOptions, EncoderSplitPlan


@dataclass(frozen=True)
class ExpandResult:
    """``text``: the four-stage YAML; ``config``/``topology``: the output re-parsed;
    ``plan``: the decisions; ``diagnostics``: infos/warnings to show the user."""

    text: str
    config: DeployConfig
    topology: Topology
    plan: PDSplitPlan
    diagnostics: tuple[Diagnostic, ...]


def _front(doc: Document, vllm_version: str | None, pipeline: str | None,
           catalogue: Catalogue | None) -> tuple[Catalogue, Target, Topology]:
    """The front end both splits share: target release (OPD006 when unknown), typed
    config (OPD1xx), pipeline selection (OPD802) and the resolved base topology."""
    cat = catalogue or load_catalogue()
    try:
        tgt = make_target(vllm_version)
    except ValueError as e:
        raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR, message=str(e))) from None
    tree = doc.tree
    if isinstance(tree, dict) and tree.get("base_config") is not None:
        raise OmniPdError(Diagnostic(
            code="OPD808", severity=Severity.ERROR, location=doc.loc(("base_config",), value=True),
            message=f"expand takes a flat deploy config; this one takes its stages from base_config "
                    f"`{tree.get('base_config')}`",
            help="write the merged stages into this file (or expand the base file), then run expand again; "
                 "`omni-pd validate` follows base_config"))
    cfg = parse_config(doc)
    pipe = select_pipeline(cfg, cat, doc, pipeline)
    return cat, tgt, resolve(cfg, pipe, None, doc)


def _thinker_only(doc: Document, pipeline: str | None, catalogue: Catalogue | None
                  ) -> tuple[Document, tuple[Diagnostic, ...]]:
    """``doc`` with the Thinker alone when ``--pipeline`` (``pipeline``) asks for
    ``<F>_thinker_only`` and the file, which names no other pipeline, has the stages of
    ``F`` (:func:`omni_pd.compile.passes.narrow.thinker_only_narrowing`), with the
    OPD905 info saying which stages were left out; else ``doc`` unchanged and no
    diagnostic. The narrowed document keeps ``doc``'s name, text and line positions."""
    from omni_pd.compile.passes.narrow import narrow_tree, thinker_only_narrowing
    from omni_pd.io import build_source_map, copy_tree

    tree = doc.tree
    # a file naming F takes `--pipeline F_thinker_only` too: the Thinker of F is what it asks
    # for (OPD704's text route), not another pipeline (topology.pipeline_conflict)
    if not pipeline or not isinstance(tree, dict) or tree.get("pipeline") not in (
            None, pipeline, pipeline.removesuffix("_thinker_only")):
        return doc, ()
    cat = catalogue or load_catalogue()
    wanted = cat.get(pipeline)
    stages = tree.get("stages")
    if wanted is None or not isinstance(stages, list):
        return doc, ()
    ids = {e.get("stage_id") for e in stages if isinstance(e, dict)}
    if not all(isinstance(i, int) for i in ids):
        return doc, ()  # the schema rules report it (OPD101)
    nar = thinker_only_narrowing(ids, wanted, cat)
    if nar is None:
        return doc, ()
    narrowed = copy_tree(tree)
    narrow_tree(narrowed, {s.stage_id for s in wanted.stages})
    if "pipeline" in narrowed:
        narrowed["pipeline"] = wanted.name
    left = ", ".join(f"{sid} ({role})" for sid, role in nar.dropped)
    note = Diagnostic(
        code="OPD905", severity=Severity.INFO, location=doc.loc(("stages",)),
        message=f"--pipeline {wanted.name}: the Thinker (stage 0) alone is split; stages {left} of "
                f"{nar.full.name} are left out, with the connectors only they used",
        help=f"for the full pipeline, expand without --pipeline (or with --pipeline {nar.full.name})")
    return Document(name=doc.name, text=doc.text, tree=narrowed, source_map=build_source_map(narrowed)), (note,)


def check_device_options(topo: Topology, opts: ExpandOptions) -> None:
    """Refuse ``--prefill-devices``/``--decode-devices`` lists whose length is not the
    side's devices: ``num_replicas`` (the Thinker's, copied to both sides) x the devices per
    engine (TP x PP x DP; TP from ``--tp``/``--prefill-tp``/``--decode-tp``, DP from
    ``--dp``/``--prefill-dp``/``--decode-dp``, each else the Thinker's), before the split:
    the written stage would fail validate's OPD401 (vllm-omni engine/stage_init_utils.py
    gives each engine TP x PP x local DP devices).

    The option is the side's ``devices`` as expand writes them, verbatim: with
    ``num_replicas`` > 1 that is the pool of every replica's devices (vllm-omni 0.30
    ``split_devices_for_replicas`` pool mode: replica r takes the r-th consecutive chunk),
    as ``--prefill-replicas``/``--decode-replicas`` lists are (checked per instance by
    :func:`~omni_pd.compile.passes.pd_split.plan_pd_split`). A list of one engine's devices
    is refused there: in the file it would be vllm-omni's per-replica template, which puts
    replica r on ``r x engine + entry`` (devices the option did not name, and a template on
    each side always overlaps) and raises ValueError for an entry at or above ``engine``.
    Raises :class:`OmniPdError` OPD805 (exit 2) naming the options. Pure."""
    from omni_pd.compile.connectors.base import launched_replicas
    from omni_pd.compile.passes.pd_split import side_dps, side_tps

    split = topo.pipeline.split_stage
    thinker = topo.node(split.stage_id) if split is not None else None
    if thinker is None or opts.prefill_replicas is not None or opts.decode_replicas is not None:
        return
    given, given_dp = side_tps(opts), side_dps(opts)
    tps = (given[0] or thinker.tp, given[1] or thinker.tp)
    dps = (given_dp[0] or thinker.dp, given_dp[1] or thinker.dp)
    reps = launched_replicas(thinker.num_replicas)
    flags = ("--prefill-tp" if opts.prefill_tp else "--tp",
             "--npu-decode-tp" if opts.platform == "npu" and opts.npu_decode_tp else
             "--decode-tp" if opts.decode_tp else "--tp")
    dp_flags = ("--prefill-dp" if opts.prefill_dp else "--dp", "--decode-dp" if opts.decode_dp else "--dp")
    engines = [tps[k] * thinker.pp * dps[k] for k in (0, 1)]
    for k, (side, devs) in enumerate((("prefill", opts.prefill_devices), ("decode", opts.decode_devices))):
        engine = engines[k]
        if devs is None or len(devs) == engine * reps:
            continue
        origin = f"from {flags[k]}" if given[k] else "from the Thinker"
        dp_origin = f" from {dp_flags[k]}" if given_dp[k] else ""
        sizes = f"TP {tps[k]} {origin} x PP {thinker.pp} x DP {dps[k]}{dp_origin}"
        if reps == 1:
            raise OmniPdError(Diagnostic(
                code="OPD805", severity=Severity.ERROR,
                message=f"--{side}-devices lists {len(devs)} device(s); {side} needs {engine} ({sizes})",
                help=f"give --{side}-devices {engine} device(s), e.g. \"{','.join(map(str, range(engine)))}\", "
                     f"or a tensor{' or data' if given_dp[k] else ''} parallel size that fits the list"))
        start = 0 if k == 0 else engines[0] * reps  # an example that leaves the other side's example free
        pool = ",".join(map(str, range(start, start + engine * reps)))
        template = (f"; one engine's list would be vllm-omni's per-replica template in the file (replica r on "
                    f"r x {engine} + each entry: vllm-omni 0.30 split_devices_for_replicas)"
                    if len(devs) == engine else "")
        raise OmniPdError(Diagnostic(
            code="OPD805", severity=Severity.ERROR,
            message=f"--{side}-devices lists {len(devs)} device(s); {side} needs {engine * reps} "
                    f"({reps} replicas, the Thinker's num_replicas, x {engine} device(s) each: {sizes})",
            help=f"give --{side}-devices every replica's devices, {engine * reps} (written as the {side} "
                 f"stage's devices, replica r on the r-th {engine} of them), e.g. \"{pool}\"" + template))


def _reparse(text: str, doc: Document, pipeline: Pipeline) -> tuple[DeployConfig, Topology]:
    """The emitted ``text`` read back as a user's file would be (config and topology
    under the split's target ``pipeline``), so callers check what was written."""
    out_doc = parse_text(text, doc.name + " (expanded)", own_output=True, comments=False)  # read, never written back
    out_cfg = parse_config(out_doc)
    return out_cfg, resolve(out_cfg, pipeline, None, out_doc)


def _roles(pipeline: Pipeline) -> str:
    """``"0 thinker prefill, 1 thinker decode, 2 talker"``: the header's stage list."""
    return ", ".join(f"{s.stage_id} {s.role}{' ' + s.pd_role if s.pd_role else ''}" for s in pipeline.stages)


def header_lines(doc: Document, plan: PDSplitPlan, target: Target, *, npu_connector: str | None = None,
                 dropped: tuple[str, ...] = ()) -> list[str]:
    """The comment block expand writes above the output. ``npu_connector``: the base stages
    run on npu with this vllm-ascend connector (``--platform npu``); ``dropped``: the input's
    platform overlays left out because the base cannot run on their platform."""
    roles = _roles(plan.target_pipeline)
    conn = f"{npu_connector} (vllm-ascend; the base stages run on npu)" if npu_connector else plan.connector
    out = [
        f"Generated by `omni-pd expand` from {os.path.basename(doc.name)} "
        f"({plan.source.name} -> {plan.target_pipeline.name}); do not edit by hand, re-run omni-pd.",
        f"Stages: {roles}. KV connector: {conn}, vLLM {target.label}.",
    ]
    if dropped:
        names = ", ".join(f"platforms.{p}" for p in dropped)
        out += [f"Not kept from the input: {names} ({npu_connector} exists only on npu,",
                f"so this file runs on npu only; expand without --platform npu for a file that runs on "
                f"{', '.join(dropped)})."]
    return out


def expand_document(doc: Document, opts: ExpandOptions = ExpandOptions(), *, vllm_version: str | None = None,
                    pipeline: str | None = None, schema_ref: str | None = None,
                    catalogue: Catalogue | None = None, inventory: "InventoryLike | None" = None) -> ExpandResult:
    """Split the Thinker of ``doc`` into a prefill/decode pair.

    ``inventory``: hosts and placement (``--inventory``): devices, ports and advertised
    addresses per host (:mod:`omni_pd.compile.placement`).

    Raises :class:`OmniPdError` (exit 2) for bad input: types (OPD101), legacy schema
    (OPD102), no Thinker (OPD801), unknown pipeline (OPD802), already PD (OPD803),
    unknown connector (OPD804), impossible allocation or a placement the inventory
    cannot hold (OPD805).
    """
    from omni_pd.compile.emit import apply_pd_split, render

    doc, migrated = migrate_first(doc, vllm_version, pipeline, catalogue)
    doc, narrowed = _thinker_only(doc, pipeline, catalogue)
    cat, tgt, topo = _front(doc, vllm_version, pipeline, catalogue)
    check_device_options(topo, opts)
    placed: tuple[Diagnostic, ...] = ()
    if inventory is not None:
        opts, where, placed = _placement_options(topo, cat, opts, inventory)
    plan = plan_pd_split(topo, cat, tgt, opts, doc)
    if inventory is not None:
        plan = _place(plan, where, inventory)
        plan = replace(plan, diagnostics=tuple(plan.diagnostics) + placed)
    tree = apply_pd_split(doc.tree, plan)
    edge_notes: tuple[Diagnostic, ...] = ()
    if inventory is not None:
        edge_notes = _cross_host_edges(tree, plan, opts, tgt, where)
    npu_notes = _npu_pass(tree, plan, opts, tgt, doc)
    dropped = drop_foreign_overlays(tree) if opts.platform == "npu" else ()
    header = header_lines(doc, plan, tgt, npu_connector=opts.npu_connector if opts.platform == "npu" else None,
                          dropped=dropped)
    if inventory is not None:
        header.append(f"Placement (--inventory): {where.describe()}; device ids and ports are per host.")
    if narrowed:  # the input's own comments still describe its three stages
        header.append(f"Thinker only (--pipeline {plan.source.name}): the input's other stages are left out.")
    text = render(tree, schema_ref=schema_ref, header=header)
    if dropped:  # the blank line that separated the npu overlay from the next one must not end the file
        text = text.rstrip("\n") + "\n"
    out_cfg, out_topo = _reparse(text, doc, plan.target_pipeline)
    return ExpandResult(text=text, config=out_cfg, topology=out_topo, plan=plan,
                        diagnostics=migrated + narrowed + tuple(plan.diagnostics) + edge_notes + npu_notes)


def _cross_host_edges(tree, plan: PDSplitPlan, opts: ExpandOptions, tgt: Target,
                      where: "Placement") -> tuple[Diagnostic, ...]:
    """Give the stage edges of ``tree`` a cross-host omni connector when one of them
    crosses hosts under ``where`` (:func:`omni_pd.compile.stage_edges.cross_host_plan`:
    NixlConnector on every edge, each edge's ``host`` its sender's address, ``zmq_port``
    the connector port base + 64), and the OPD907 info that says so; () when every payload
    edge stays on one host. Raises :class:`OmniPdError` OPD805 when a sending host has no
    address."""
    from omni_pd.compile import connectors
    from omni_pd.compile.emit_edges import apply_edges
    from omni_pd.compile.stage_edges import PAYLOAD_PORT_OFFSET, cross_host_plan, crossing, payload_edges

    roles = {s.pd_role: s.stage_id for s in plan.target_pipeline.stages if s.pd_role}
    pair = (roles["prefill"], roles["decode"]) if "prefill" in roles and "decode" in roles else None
    edges = payload_edges(tree)
    contract = connectors.get(plan.connector)
    base = opts.port_base or (contract.default_port_base(tgt) if contract is not None else 20000)
    try:
        rewrites = cross_host_plan(edges, where.stage_host, where.addresses, pair, base)
    except ValueError as e:
        raise OmniPdError(Diagnostic(code="OPD805", severity=Severity.ERROR, message=f"cannot place the stages: {e}",
                                     help="set the address of every host that runs a stage")) from None
    if not rewrites:
        return ()
    apply_edges(tree, rewrites)
    cross = ", ".join(f"{e.src} -> {e.dst} ({where.host_of(e.src)} -> {where.host_of(e.dst)})"
                      for e in crossing(edges, where.stage_host, pair))
    return (Diagnostic(
        code="OPD907", severity=Severity.INFO,
        message=f"stage edge {cross} crosses hosts: every stage edge now uses NixlConnector "
                f"(zmq_port {base + PAYLOAD_PORT_OFFSET}, each edge's host its sender's address), as "
                "SharedMemoryConnector reaches one host only",
        help="vllm-omni 0.30 gives a middle stage its incoming edge's connector, and only NixlConnector sends "
             "through it (omni_pd/compile/stage_edges.py)"),)


def _placement_options(topo: Topology, cat: Catalogue, opts: ExpandOptions, inventory: "InventoryLike"
                       ) -> tuple[ExpandOptions, "Placement", tuple[Diagnostic, ...]]:
    """Resolve the placement of the split's output stages and put each side's host address
    into ``opts.side_hosts``; the OPD906 info naming the stages omni-pd placed itself.
    Raises :class:`OmniPdError` OPD805 for a placement the inventory cannot hold."""
    from omni_pd.compile.pipelines import derive_pd
    from omni_pd.compile.placement import PlacementError, resolve_placement, side_addresses

    target_pipe = cat.get(topo.pipeline.name + "_pd") or derive_pd(topo.pipeline)
    roles = {s.pd_role: s.stage_id for s in target_pipe.stages if s.pd_role}
    try:
        where = resolve_placement(target_pipe.stages, inventory)
        hosts = side_addresses(where, roles["prefill"], roles["decode"], opts.kv_host)
    except PlacementError as e:
        raise OmniPdError(Diagnostic(code="OPD805", severity=Severity.ERROR, message=f"cannot place the stages: {e}",
                                     help=e.help)) from None
    notes: tuple[Diagnostic, ...] = ()
    if where.proposed:
        notes = (Diagnostic(
            code="OPD906", severity=Severity.INFO,
            message=f"the inventory places no stage {', '.join(map(str, where.proposed))}: placed as {where.describe()}",
            help="write it under placement: in the inventory, so validate and launch read the same placement"),)
    return replace(opts, side_hosts=hosts), where, notes


def _place(plan: PDSplitPlan, where: "Placement", inventory: "InventoryLike") -> PDSplitPlan:
    """``plan`` with device ids restarting per host (:func:`~omni_pd.compile.placement.
    place_devices`), after checking each host holds its stages (OPD805), on the base and on
    every platform overlay that places stages.

    The base map and every platform overlay's whole layout (``plan.overlay_layouts``: each
    stage's devices on that platform, also the ones its entry inherits or carries as copied)
    are renumbered per host the same way; the overlay entries to write are then derived
    again (:func:`~omni_pd.compile.passes.pd_split.overlay_entries`), so an entry that keeps
    the input's ``devices`` is rewritten when its host's numbering moves it."""
    from omni_pd.compile.placement import PlacementError, check_capacity, place_devices

    try:
        plan = _span(plan, where)
        base, layouts = place_devices(plan.base_devices,
                                      {p: lay.devices for p, lay in plan.overlay_layouts.items()}, where)
        check_capacity(base, where, inventory)
        for pname, layout in sorted(layouts.items()):
            check_capacity(layout, where, inventory, pname)
    except PlacementError as e:
        raise OmniPdError(Diagnostic(code="OPD805", severity=Severity.ERROR, message=f"cannot place the stages: {e}",
                                     help=e.help)) from None
    return _with_overlays(replace(plan, base_devices=base),
                          {p: replace(lay, devices=layouts[p]) for p, lay in plan.overlay_layouts.items()})


def _with_overlays(plan: PDSplitPlan, layouts: "dict[str, OverlayLayout]") -> PDSplitPlan:
    """``plan`` with the overlay ``layouts`` and the entries each must spell out over
    ``plan.base_devices`` (:func:`~omni_pd.compile.passes.pd_split.overlay_entries`)."""
    from omni_pd.compile.passes.pd_split import overlay_entries

    return replace(plan, overlay_layouts=layouts,
                   overlay_devices={p: overlay_entries(lay, plan.base_devices) for p, lay in layouts.items()})


def _span(plan: PDSplitPlan, where: "Placement") -> PDSplitPlan:
    """``plan`` with each stage whose one instance spans hosts (``where.spans``) given the
    devices of one host (:func:`~omni_pd.compile.placement.span_devices`) and ``nnodes``.
    Raises :class:`~omni_pd.compile.placement.PlacementError` for a span omni-pd does not
    compile: a stage that is not prefill or decode of a pipeline ``omni-pd launch`` serves
    with ``vllm serve`` per engine (a vllm-omni stage's engine is started by vllm-omni, which
    has no multi-node launch of one stage: vllm_omni/entrypoints/cli/serve.py), an xPyD side
    (``num_replicas`` > 1), or a world size the host count does not divide."""
    from omni_pd.compile.placement import PlacementError, span_devices

    if not where.spans:
        return plan
    roles = {s.stage_id: s.pd_role for s in plan.target_pipeline.stages}
    out = plan
    for sid, hosts in sorted(where.spans.items()):
        role = roles.get(sid)
        if role not in ("prefill", "decode") or plan.target_pipeline.launcher != "vllm":
            raise PlacementError(
                f"stage {sid} is placed on {len(hosts)} hosts ({', '.join(hosts)}): omni-pd spans only the prefill "
                "or decode instance of a pair it launches with `vllm serve` (the llm and thinker-only pipelines)",
                help=f"place stage {sid} on one host")
        reps = plan.prefill_replicas if role == "prefill" else plan.decode_replicas
        if (reps or 1) > 1:
            raise PlacementError(f"stage {sid} spans {len(hosts)} hosts and has {reps} replicas: omni-pd places one "
                                 "instance across hosts", help=f"drop --{role}-replicas, or place stage {sid} on one host")
        base = dict(out.base_devices)
        base[sid] = span_devices(base.get(sid), len(hosts), sid)
        layouts = {p: (replace(lay, devices={**lay.devices, sid: span_devices(lay.devices[sid], len(hosts), sid)})
                       if sid in lay.devices else lay)
                   for p, lay in out.overlay_layouts.items()}
        out = _with_overlays(replace(out, base_devices=base, **{f"{role}_nnodes": len(hosts)}), layouts)
    return out


def migrate_first(doc: Document, vllm_version: str | None, pipeline: str | None,
                  catalogue: Catalogue | None) -> tuple[Document, tuple[Diagnostic, ...]]:
    """A legacy ``stage_args`` ``doc`` migrated to the target's ``stages:`` form
    (omni_pd/compile/migrate.py), named ``<name> (migrated)`` so positions in later
    diagnostics are read as the migrated text's, and the OPD970 info that says so;
    any other ``doc`` unchanged with no note. Raises :class:`OmniPdError`: OPD006 (bad
    ``vllm_version``), OPD971 (a key migrate cannot map)."""
    from omni_pd.compile.migrate import NOTE, is_legacy, migrate_text

    if not is_legacy(doc.tree):
        return doc, ()
    try:
        tgt = make_target(vllm_version)
    except ValueError as e:
        raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR, message=str(e))) from None
    from omni_pd.compile.migrate import MigrateError

    try:
        text, m = migrate_text(doc, tgt, catalogue or load_catalogue(), pipeline)
    except MigrateError as e:
        raise OmniPdError(Diagnostic(
            code="OPD102", severity=Severity.ERROR, location=doc.loc(("stage_args",)),
            message="legacy `stage_args` file: vllm-omni 0.30 only reads the `stages:` deploy schema, "
                    "and omni-pd cannot migrate this one",
            notes=[f"{d.location}: {d.message}" for d in e.diagnostics],
            help="fix the keys named (`omni-pd migrate` lists them), then expand again")) from None
    assert m is not None
    if m.pipeline.is_pd:  # a legacy PD recipe: nothing to split, the rewrite is what it needs
        raise OmniPdError(Diagnostic(
            code="OPD803", severity=Severity.ERROR, location=doc.loc(("stage_args",)),
            message=f"this legacy `stage_args` file is already prefill/decode split ({m.pipeline.name}); "
                    "refusing to split it twice",
            help=f"rewrite it with `omni-pd migrate {doc.name} -o new.yaml`, then validate or launch new.yaml"))
    note = Diagnostic(code=NOTE, severity=Severity.INFO, location=doc.loc(("stage_args",)),
                      message=f"legacy `stage_args` file migrated to the `stages:` schema first ({m.pipeline.name}, "
                              f"{len(m.notes)} changes)",
                      help=f"`omni-pd migrate {os.path.basename(doc.name)}` shows each change and writes the migrated file")
    return parse_text(text, doc.name + " (migrated)", own_output=True), (note,)


def _npu_pass(tree, plan: PDSplitPlan, opts: ExpandOptions, tgt: Target, doc: Document) -> tuple[Diagnostic, ...]:
    """Run the npu pass (:mod:`omni_pd.compile.passes.ascend`) on the split ``tree`` (in
    place) when the file has a ``platforms.npu`` overlay or ``opts.platform == "npu"``.
    The sizes come from a rendering of a copy (render edits the tree it is given).
    Returns the pass's warnings (OPD904: a side runs fewer replicas on npu)."""
    from omni_pd.compile import ascend
    from omni_pd.compile.emit import render
    from omni_pd.compile.passes.ascend import apply_ascend, plan_ascend
    from omni_pd.io import copy_tree

    base = opts.platform == "npu"
    plats = tree.get("platforms")
    if not base and not (isinstance(plats, dict) and "npu" in plats):
        return ()
    probe = render(copy_tree(tree), schema_ref=None, header=[])
    cfg = parse_config(parse_text(probe, doc.name + " (split)", own_output=True, comments=False))
    overlay = bool(cfg.platforms and cfg.platforms.get("npu"))
    if not base and not overlay:
        return ()
    topo = resolve(cfg, plan.target_pipeline, "npu", None)  # the sizes the pair runs with on npu
    sides = plan_ascend(topo, opts.npu_connector, release=ascend.release_for_vllm(tgt.label),
                        decode_tp=opts.npu_decode_tp, target=tgt, overlay=not base,
                        replica_options=tuple(side for side, n in (("prefill", opts.prefill_replicas),
                                                                   ("decode", opts.decode_replicas)) if n))
    if base and sides:
        apply_ascend(tree, sides, base=True)
    if overlay and sides:
        apply_ascend(tree, sides, base=False)
    return tuple(d for s in sides for d in s.notes)


def drop_foreign_overlays(tree) -> tuple[str, ...]:
    """With ``--platform npu`` the base stages carry a vllm-ascend connector, which exists
    only on npu: every ``platforms.<P>`` overlay for another platform would run that base
    on P, where the connector is not registered (validate: OPD601) and the peer blocks
    describe npu's sizes (OPD311). Remove those overlays from ``tree`` (in place; the
    ``platforms`` key too when nothing is left) and return their names, sorted, for the
    header's comment."""
    plats = tree.get("platforms")
    if not isinstance(plats, dict):
        return ()
    dropped = tuple(sorted(str(p) for p in plats if p != "npu"))
    for p in dropped:
        del plats[p]
    if not plats:
        del tree["platforms"]
    return dropped


@dataclass(frozen=True)
class EncoderExpandResult:
    """:func:`expand_encoder_document`'s answer: the YAML ``text``, the output re-parsed
    (``config``/``topology``), the :class:`~omni_pd.compile.passes.encoder_split.EncoderSplitPlan`
    and the infos/warnings to show."""

    text: str
    config: DeployConfig
    topology: Topology
    plan: "EncoderSplitPlan"
    diagnostics: tuple[Diagnostic, ...]


def expand_encoder_document(doc: Document, eopts: "EncoderOptions", opts: ExpandOptions = ExpandOptions(), *,
                            vllm_version: str | None = None, pipeline: str | None = None,
                            schema_ref: str | None = None, catalogue: Catalogue | None = None) -> EncoderExpandResult:
    """Split the multimodal encoder of a single-LLM deploy config into its own stage
    (``eopts.layout``: ``1e1pd`` = E + one instance, ``1e1p1d`` = E + a prefill/decode pair).

    Raises :class:`OmniPdError` (exit 2): what :func:`expand_document` raises, plus OPD806
    (pipeline cannot take an encoder split, e.g. Thinker -> Talker -> Code2Wav) and OPD807
    (EC connector not emitted or not in the target release).
    """
    from omni_pd.compile.emit import render
    from omni_pd.compile.emit_encoder import apply_encoder_split
    from omni_pd.compile.passes.encoder_split import plan_encoder_split

    doc, migrated = migrate_first(doc, vllm_version, pipeline, catalogue)
    doc, narrowed = _thinker_only(doc, pipeline, catalogue)  # `--pipeline *_thinker_only` on a full file
    cat, tgt, topo = _front(doc, vllm_version, pipeline, catalogue)
    plan = plan_encoder_split(topo, cat, tgt, eopts, opts, doc)
    tree = apply_encoder_split(doc.tree, plan)
    roles = _roles(plan.target_pipeline)
    header = [
        f"Generated by `omni-pd expand --encoder-split {plan.layout}` from {os.path.basename(doc.name)} "
        f"({plan.source.name} -> {plan.target_pipeline.name}); do not edit by hand, re-run omni-pd.",
        f"Stages: {roles}. EC connector: {plan.ec_connector}"
        + (f" (shared directory {plan.storage})" if plan.storage else "")
        + (f", KV connector: {plan.pd.connector}" if plan.pd else "") + f", vLLM {tgt.label}.",
    ]
    if narrowed:  # the input's own comments still describe its three stages
        header.append(f"Thinker only (--pipeline {plan.source.name}): the input's other stages are left out.")
    text = render(tree, schema_ref=schema_ref, header=header)
    out_cfg, out_topo = _reparse(text, doc, plan.target_pipeline)
    return EncoderExpandResult(text=text, config=out_cfg, topology=out_topo, plan=plan,
                               diagnostics=migrated + narrowed + tuple(plan.diagnostics))
