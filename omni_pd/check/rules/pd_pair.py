"""PD pair rules (OPD3xx): the invariants vllm-omni checks at engine init, and more.

Upstream source: vllm-omni ``vllm_omni/entrypoints/pd_utils.py``
``_validate_pd_separation_config`` (its checks in order: kv_transfer_config present, roles,
decode lists prefill in ``engine_input_source``, one connector, matching connector
settings, equal TP), vllm-omni ``docs/features/pd_disaggregation.md``, vLLM
``vllm/config/kv_transfer.py`` (role sets), and the case reports named in each rule.
"""

from __future__ import annotations

from difflib import get_close_matches
from typing import Any, Iterable

from omni_pd.diagnostics import Diagnostic, Severity
from omni_pd.check.rules import Context, Example, Rule, rule
from omni_pd.check.rules.capability import connector_ident, connector_label, connector_row, same_connector

PRODUCERS = ("kv_producer", "kv_both")
CONSUMERS = ("kv_consumer", "kv_both")
ROLES = ("kv_producer", "kv_consumer", "kv_both")

_PD = "pipeline: qwen3_omni_moe_pd\nasync_chunk: false\nstages:\n"


def _pd_yaml(p_kv: str, d_kv: str, p_extra: str = "", d_extra: str = "") -> str:  # pragma: no mutate block (runs at import only)
    return (_PD + f"  - {{stage_id: 0, devices: \"0\"{p_extra}, kv_transfer_config: {p_kv}}}\n"
            f"  - {{stage_id: 1, devices: \"1\"{d_extra}, kv_transfer_config: {d_kv}}}\n")


OK_P = "{kv_connector: NixlConnector, kv_role: kv_producer, engine_id: p}"
OK_D = "{kv_connector: NixlConnector, kv_role: kv_consumer, engine_id: d}"


def _kv_reported_elsewhere(ctx: Context, n: Any) -> bool:
    """True when a stage without a usable ``kv_transfer_config`` is another finding's: the
    key is there but not a mapping (a JSON string: OPD101), or the stage has no entry
    because its entry carries another stage's id (a duplicate ``stage_id``: OPD202). One
    cause, one error."""
    if n.index is not None:
        entry = ctx.raw_at(("stages", n.index))
        return isinstance(entry, dict) and entry.get("kv_transfer_config") is not None \
            and not isinstance(entry.get("kv_transfer_config"), dict)
    stages = ctx.raw_at(("stages",))
    ids = [st.get("stage_id") for st in stages if isinstance(st, dict)] if isinstance(stages, list) else []
    return len(ids) != len(set(map(repr, ids)))


@rule("OPD301", "pd-kv-missing", Severity.ERROR,
      "a stage of the PD pair has no kv_transfer_config",
      fail=_PD + "  - {stage_id: 0, devices: \"0\"}\n  - {stage_id: 1, devices: \"1\"}\n",
      passing=_pd_yaml(OK_P, OK_D), labels=("SCH-REQ-KVCFG",))
def kv_missing(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """Both stages of the prefill/decode pair need a ``kv_transfer_config``; without it
    vllm-omni fails at engine init, or (outside vllm-omni) decode silently recomputes
    every prompt. Source: vllm-omni pd_utils.py ``_validate_pd_separation_config``
    rule 1; https://github.com/ai-dynamo/aiconfigurator/pull/522,
    https://github.com/kserve/kserve/issues/5987."""
    pair = ctx.pd_pair
    if pair is None:
        return
    p, d = pair
    missing = [n for n in (p, d) if not n.kv and not _kv_reported_elsewhere(ctx, n)]
    if len(missing) == 2:
        yield r.diag(f"stages {p.stage_id} (prefill) and {d.stage_id} (decode) form a PD pair but neither has a kv_transfer_config",
                     ctx.sloc(p), related=[ctx.sloc(d, label=f"decode (stage {d.stage_id}) has none either")],
                     help="add `kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_producer}` to prefill "
                          "and the same with `kv_role: kv_consumer` to decode (or run `omni-pd expand` on the three-stage config)",
                     reads=ctx.reads(p, "kv_transfer_config") + ctx.reads(d, "kv_transfer_config"))
    elif missing:
        n = missing[0]
        other = d if n is p else p
        side = "prefill" if n is p else "decode"
        role = "kv_producer" if n is p else "kv_consumer"
        yield r.diag(f"{side} stage {n.stage_id} has no kv_transfer_config", ctx.sloc(n),
                     related=[ctx.sloc(other, "kv_transfer_config", label=f"the other side (stage {other.stage_id}) has one")],
                     help=f"add `kv_transfer_config: {{kv_connector: {_same_as(other)}, kv_role: {role}}}`",
                     reads=ctx.reads(n, "kv_transfer_config"))


@rule("OPD302", "pd-kv-role", Severity.ERROR,
      "kv_role is missing, invalid, or reversed on the PD pair",
      fail=_pd_yaml("{kv_connector: NixlConnector, kv_role: kv_consumer, engine_id: p}",
                    "{kv_connector: NixlConnector, kv_role: kv_producer, engine_id: d}"),
      passing=_pd_yaml(OK_P, OK_D), labels=("SCH-KVROLE",))
def kv_role(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """Prefill must be ``kv_producer`` (or ``kv_both``), decode ``kv_consumer`` (or
    ``kv_both``); a ``kv_connector`` without a ``kv_role``, or a role outside the three
    values, is rejected by vLLM's KVTransferConfig. Sources: vllm-omni pd_utils.py
    rule 2; vLLM config/kv_transfer.py ``__post_init__``."""
    if ctx.topology is None:
        return
    for n in ctx.topology.stages:
        kv = n.kv or {}
        role = kv.get("kv_role")
        if kv.get("kv_connector") and role is None:
            stray = ctx.raw_at(("stages", n.index, "kv_role")) if n.index is not None else None
            if isinstance(stray, str):  # written at the stage's level, outside kv_transfer_config
                at = ctx.loc(("stages", n.index, "kv_role")).line
                help_ = (f"move the stage's `kv_role: {stray}` (line {at}) under `kv_transfer_config` "
                         f"(line {ctx.sloc(n, 'kv_transfer_config').line})")
            else:
                help_ = "add `kv_role: kv_producer` (prefill) or `kv_role: kv_consumer` (decode)"
            yield r.diag(f"stage {n.stage_id}: kv_connector is set but kv_role is not", ctx.sloc(n, "kv_transfer_config"),
                         help=help_)
        elif role is not None and role not in ROLES:
            near = get_close_matches(role, ROLES, n=1, cutoff=0.6) if isinstance(role, str) else []
            yield r.diag(f"stage {n.stage_id}: unsupported kv_role `{role}`",
                         ctx.sloc(n, "kv_transfer_config", "kv_role", value=True),
                         help=(f"did you mean `{near[0]}`? " if near else "")
                         + "kv_role is one of kv_producer, kv_consumer, kv_both",
                         replace=(role, near[0]) if near else None)
    pair = ctx.pd_pair
    if pair is None:
        return
    p, d = pair
    pr, dr = (p.kv or {}).get("kv_role"), (d.kv or {}).get("kv_role")
    if not (p.kv and d.kv):
        return
    reversed_ = pr == "kv_consumer" and dr == "kv_producer"
    for n, role, want, side, other in ((p, pr, PRODUCERS, "prefill", d), (d, dr, CONSUMERS, "decode", p)):
        if role in ROLES and role not in want:
            yield r.diag(f"{side} stage {n.stage_id} has kv_role {role}" + (" (roles are reversed)" if reversed_ else ""),
                         ctx.sloc(n, "kv_transfer_config", "kv_role", value=True),
                         related=[ctx.sloc(other, "kv_transfer_config", "kv_role", value=True,
                                           label=f"{'decode' if side == 'prefill' else 'prefill'} (stage {other.stage_id}) is {(other.kv or {}).get('kv_role')}")],
                         help=f"write `kv_role: {want[0]}` on the {side} stage", replace=(role, want[0]))


@rule("OPD303", "kv-both", Severity.WARNING,
      "kv_both on a PD stage: deprecated (NIXL), and a stage that also serves the other direction",
      fail=_pd_yaml("{kv_connector: NixlConnector, kv_role: kv_both, engine_id: p}", OK_D),
      passing=_pd_yaml(OK_P, OK_D), example_context={"vllm_version": "0.30"})
def kv_both(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """``kv_both`` makes a stage both send and receive. vLLM 0.24+ NixlConnector warns
    that it is deprecated (use producer on prefill, consumer on decode).
    MooncakeConnector's per-request asserts (``assert not self.is_kv_producer`` /
    ``is_kv_consumer``) hold for kv_both, whose stage is neither: a request routed the
    wrong way is served (a decode that prefills, a prefill that pulls) instead of refused,
    which hides a routing mistake. A warning: the pair works. Sources: vLLM
    ``vllm/distributed/kv_transfer/kv_connector/v1/nixl/connector.py``
    ``NixlConnector.__init__`` (the deprecation warning, 0.24+);
    ``v1/mooncake/mooncake_connector.py`` ``MooncakeConnectorScheduler`` (0.30:
    ``is_kv_producer = kv_role == "kv_producer"``, the asserts per request)."""
    pair = ctx.pd_pair
    if pair is None:
        return
    for n, side, want in ((pair[0], "prefill", "kv_producer"), (pair[1], "decode", "kv_consumer")):
        kv = n.kv or {}
        if kv.get("kv_role") == "kv_both":
            ident = connector_ident(ctx, n)  # the deprecation is vLLM's NIXL's, not a same-named class's
            nixl = ident is not None and ident.is_vllm and "nixl" in ident.name.lower()
            why = (f"deprecated for {kv.get('kv_connector')} since vLLM 0.24" if ctx.target.kv_both_deprecated
                   and nixl else "the stage then also accepts the other direction")
            yield r.diag(f"{side} stage {n.stage_id} uses kv_role kv_both ({why})",
                         ctx.sloc(n, "kv_transfer_config", "kv_role", value=True), help=f"write `kv_role: {want}`")


@rule("OPD304", "pd-connector-mismatch", Severity.ERROR,
      "prefill and decode use different (or no) KV connectors",
      fail=_pd_yaml(OK_P, "{kv_connector: MooncakeConnector, kv_role: kv_consumer, engine_id: d}"),
      passing=_pd_yaml(OK_P, OK_D))
def connector_mismatch(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """``kv_connector`` must be set and equal on both sides: a NIXL producer and a
    Mooncake consumer never exchange a block. Equal is the loaded class
    (``capability.same_connector``): one ``kv_connector`` loaded from different packages'
    ``kv_connector_module_path`` (vLLM's MooncakeConnector and vllm-ascend's) is two
    connectors whose handshakes never meet. On plain ``vllm serve`` engines a
    MultiConnector side whose handoff child is the other side's connector pairs
    (:func:`_same_handoff`). Source: vllm-omni
    ``vllm_omni/entrypoints/pd_utils.py`` ``_validate_pd_separation_config`` ("PD
    connector mismatch"); vLLM ``vllm/distributed/kv_transfer/kv_connector/factory.py``
    (each side loads only its own connector class)."""
    pair = ctx.pd_pair
    if pair is None or not (pair[0].kv and pair[1].kv):
        return
    p, d = pair
    pc, dc = p.kv.get("kv_connector"), d.kv.get("kv_connector")  # type: ignore[union-attr]
    for n, c in ((p, pc), (d, dc)):
        if not c:
            other = d if n is p else p
            yield r.diag(f"stage {n.stage_id}: kv_transfer_config has no kv_connector", ctx.sloc(n, "kv_transfer_config"),
                         help=f"add `kv_connector: {_same_as(other)}`")
    if pc and dc and not same_connector(ctx, p, d) and not _same_handoff(ctx, p, d):
        same_name = pc == dc  # one name, two packages' classes: name which class each side loads
        shown = (lambda n, c: connector_label(ctx, n) if same_name else c)
        yield r.diag("prefill and decode use different KV connectors"
                     + (f" (both name {pc}, loaded from different module paths)" if same_name else ""),
                     ctx.sloc(d, "kv_transfer_config", "kv_connector", value=True), label=f"decode uses {shown(d, dc)}",
                     related=[ctx.sloc(p, "kv_transfer_config", "kv_connector", value=True,
                                       label=f"prefill (stage {p.stage_id}) uses {shown(p, pc)}")],
                     help="use the same kv_connector" + (" and kv_connector_module_path" if same_name else "")
                          + " on both stages of the PD pair")


def _same_as(other: Any) -> str:
    """What to write for the connector ``other`` names: its ``kv_connector`` and, when set, its
    ``kv_connector_module_path`` (the same name without it is vLLM's class, another connector);
    MooncakeConnector when it names none."""
    kv = other.kv or {}
    name = kv.get("kv_connector") or "MooncakeConnector"
    path = kv.get("kv_connector_module_path") if kv.get("kv_connector") else None
    return f"{name}, kv_connector_module_path: {path}" if isinstance(path, str) and path.strip() else str(name)


def _handoff_names(ctx: Context, n: Any) -> set[str]:
    """The connectors that move KV from P to D on stage ``n``, as loaded classes
    (``capability.connector_row``): vLLM MultiConnector's children that
    presets/targets/multi_connector.yaml lists as handoff connectors (vLLM's classes of those
    names), else the connector."""
    from omni_pd.check.rules.multi_connector import _multi_facts

    kv = n.kv or {}
    if connector_row(ctx, n) != "MultiConnector":
        return {connector_row(ctx, n)}
    kids = (kv.get("kv_connector_extra_config") or {}).get("connectors") if isinstance(
        kv.get("kv_connector_extra_config"), dict) else None
    handoff = set(_multi_facts()["handoff"])
    rows = [connector_row(ctx, n, c) for c in kids if isinstance(c, dict)] if isinstance(kids, list) else []
    return {row for row in rows if row in handoff}


def _same_handoff(ctx: Context, p: Any, d: Any) -> bool:
    """True when two plain ``vllm serve`` engines exchange KV through one connector although
    their ``kv_connector`` names differ: one side (or both) is a MultiConnector whose
    handoff child is the other side's connector (a NIXL prefill that also offloads to
    LMCache, a NIXL decode). vLLM pairs engines per request by the handoff connector's
    ``kv_transfer_params``, never by the wrapper's name. vllm-omni compares the names
    (``_validate_pd_separation_config``), so its runtime keeps the finding."""
    if ctx.topology is None or ctx.topology.pipeline.runtime == "vllm-omni":
        return False
    a, b = _handoff_names(ctx, p), _handoff_names(ctx, d)
    return bool(a & b)


@rule("OPD305", "pd-buffer-mismatch", Severity.ERROR,
      "kv_buffer_device or kv_buffer_size differ between prefill and decode",
      fail=_pd_yaml("{kv_connector: NixlConnector, kv_role: kv_producer, engine_id: p, kv_buffer_device: cpu}",
                    "{kv_connector: NixlConnector, kv_role: kv_consumer, engine_id: d, kv_buffer_device: cuda}"),
      passing=_pd_yaml("{kv_connector: NixlConnector, kv_role: kv_producer, engine_id: p, kv_buffer_device: cuda}",
                       "{kv_connector: NixlConnector, kv_role: kv_consumer, engine_id: d, kv_buffer_device: cuda}"))
def buffer_mismatch(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """When both sides set ``kv_buffer_device`` (or ``kv_buffer_size``, bytes), the
    values must be equal. Source: vllm-omni pd_utils.py rule 5."""
    pair = ctx.pd_pair
    if pair is None or not (pair[0].kv and pair[1].kv):
        return
    p, d = pair
    for key in ("kv_buffer_device", "kv_buffer_size"):
        pv, dv = p.kv.get(key), d.kv.get(key)  # type: ignore[union-attr]
        if pv is not None and dv is not None and _norm(pv) != _norm(dv):
            yield r.diag(f"{key} differs: prefill {pv!r}, decode {dv!r}",
                         ctx.sloc(d, "kv_transfer_config", key, value=True),
                         related=[ctx.sloc(p, "kv_transfer_config", key, value=True, label=f"prefill sets {pv!r}")],
                         help=f"write the same {key} on both stages (or drop it from both)")


def _norm(v: Any) -> Any:
    try:
        return float(v)
    except (TypeError, ValueError):
        return str(v)


@rule("OPD306", "pd-tp-unequal", Severity.ERROR,
      "prefill and decode TP differ; vllm-omni's PD validator requires equal TP",
      fail=_pd_yaml(OK_P, OK_D, ", tensor_parallel_size: 2", "").replace('devices: "0"', 'devices: "0,2"', 1),
      passing=_pd_yaml(OK_P, OK_D), runtime="vllm-omni",
      examples=(
          Example("llm_pd under plain vllm serve: OPD603's table decides, not vllm-omni's validator",
                  _pd_yaml(OK_P, OK_D, ", tensor_parallel_size: 2", "").replace('devices: "0"', 'devices: "0,2"', 1)
                  .replace("qwen3_omni_moe_pd", "llm_pd"), False, {"vllm_version": "0.30"}),
          Example("thinker-only pipelines launch plain vllm serve engines too",
                  _pd_yaml(OK_P, OK_D, ", tensor_parallel_size: 2", "").replace('devices: "0"', 'devices: "0,2"', 1)
                  .replace("qwen3_omni_moe_pd", "qwen3_omni_moe_thinker_only_pd"), False, {"vllm_version": "0.30"}),
          Example("Qwen2.5-Omni PD under vllm-omni", _pd_yaml(OK_P, OK_D, ", tensor_parallel_size: 2", "").replace(
              'devices: "0"', 'devices: "0,2"', 1).replace("qwen3_omni_moe_pd", "qwen2_5_omni_pd"), True),
      ))
def tp_unequal(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """vllm-omni 0.30 rejects a PD pair whose ``tensor_parallel_size`` differ, whatever
    the connector (rule 6, explained as MooncakeConnector lacking heterogeneous TP).
    Reported only when the connector itself would accept the pair; otherwise OPD603
    (connector heterogeneous-TP rule) reports it. A rule of the vllm-omni runtime: a
    pair served as plain ``vllm serve`` engines (``llm_pd``, thinker-only pipelines)
    never meets that validator, vLLM pairs unequal TP and OPD603's table decides. Source: vllm-omni pd_utils.py
    ``_validate_pd_separation_config`` rule 6."""
    from omni_pd.check.rules.hetero_tp import hetero_tp_problem

    pair = ctx.pd_pair
    if pair is None or not (pair[0].kv and pair[1].kv):
        return
    p, d = pair
    ptp, dtp = ctx.stage_tp(p), ctx.stage_tp(d)
    if ptp == dtp or hetero_tp_problem(ctx, p, d) is not None:
        return
    yield r.diag(f"tensor_parallel_size differs: prefill {ptp}, decode {dtp}; vllm-omni's PD validator requires them equal",
                 ctx.sloc(d, "tensor_parallel_size", value=True),
                 related=[ctx.sloc(p, "tensor_parallel_size", value=True, label=f"prefill TP {ptp}")],
                 help=f"set `tensor_parallel_size: {ptp}` on decode (and give it {ptp} device{'s' if ptp != 1 else ''})",
                 reads=ctx.reads(p, "tensor_parallel_size") + ctx.reads(d, "tensor_parallel_size"))


@rule("OPD307", "decode-input", Severity.ERROR,
      "decode does not take its input from the prefill stage",
      fail=_PD + ("  - {stage_id: 0, devices: \"0\", kv_transfer_config: " + OK_P + "}\n"
                  "  - {stage_id: 1, devices: \"1\", kv_transfer_config: " + OK_D + "}\n"
                  "edges:\n  - {from: 1, to: 2}\n  - {from: 2, to: 3}\n"),
      passing=_PD + ("  - {stage_id: 0, devices: \"0\", kv_transfer_config: " + OK_P + "}\n"
                     "  - {stage_id: 1, devices: \"1\", kv_transfer_config: " + OK_D + "}\n"
                     "edges:\n  - {from: 0, to: 1}\n  - {from: 1, to: 2}\n  - {from: 2, to: 3}\n"),
      runtime="vllm-omni")
def decode_input(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """Decode's inputs must contain prefill (the orchestrator pairs them by decode's
    ``engine_input_source``); with explicit ``edges:`` and ``async_chunk: false`` the edge
    prefill -> decode must be there (with ``async_chunk`` on it must not: OPD310). A vllm-omni orchestrator rule (plain ``vllm serve`` engines are paired by
    the router, not by edges). Source: vllm-omni pd_utils.py rule 3 and
    ``detect_pd_separation_from_stage_configs``."""
    pair = ctx.pd_pair
    if pair is None or ctx.config is None:
        return
    p, d = pair
    if p.stage_id not in d.input_sources:
        yield r.diag(f"decode stage {d.stage_id} does not list prefill stage {p.stage_id} as an input",
                     ctx.sloc(d), related=[ctx.sloc(p, label="prefill")], help=f"decode's input is [{p.stage_id}]")
    streaming = ctx.topology is not None and ctx.topology.async_chunk  # OPD310 wants the edge gone then
    if (ctx.config.edges and not streaming
            and not any(e.from_ == p.stage_id and e.to == d.stage_id for e in ctx.config.edges)):
        yield r.diag(f"`edges:` has no edge from prefill (stage {p.stage_id}) to decode (stage {d.stage_id})",
                     ctx.loc(("edges",)), related=[ctx.sloc(d, label="decode")],
                     help=f"add `- {{from: {p.stage_id}, to: {d.stage_id}}}` to `edges:`")


@rule("OPD308", "pd-pair-count", Severity.ERROR,
      "more than one prefill/decode pair, or kv roles on a pipeline that is not PD",
      fail=("pipeline: qwen3_omni_moe\nstages:\n  - {stage_id: 0, devices: \"0\", kv_transfer_config: " + OK_P + "}\n"
            "  - {stage_id: 1, devices: \"1\", kv_transfer_config: " + OK_D + "}\n"),
      passing=_pd_yaml(OK_P, OK_D))
def pair_count(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """vllm-omni supports exactly one PD pair (1P1D): a second producer or consumer
    raises "only a single PD pair per pipeline". KV roles under a pipeline without a
    prefill/decode split (``qwen3_omni_moe`` instead of ``qwen3_omni_moe_pd``) are never
    detected: PD is silently off. Source: vllm-omni pd_utils.py
    ``detect_pd_separation_from_stage_configs``."""
    topo = ctx.topology
    if topo is None:
        return
    prod = [n for n in topo.stages if (n.kv or {}).get("kv_role") == "kv_producer"]
    cons = [n for n in topo.stages if (n.kv or {}).get("kv_role") == "kv_consumer"]
    if not topo.pipeline.is_pd:
        if prod and cons and ctx.catalogued:
            name = topo.pipeline.name
            yield r.diag(f"stages {prod[0].stage_id} and {cons[0].stage_id} are a KV producer/consumer pair, "
                         f"but pipeline {name} has no prefill/decode split: PD stays off",
                         ctx.loc(("pipeline",), value=True) if ctx.exists(("pipeline",)) else ctx.sloc(prod[0], "kv_transfer_config"),
                         related=[ctx.sloc(cons[0], "kv_transfer_config", "kv_role", value=True, label="consumer")],
                         help=f"use `pipeline: {name}_pd`")  # catalogued: a real name, never a `<...>` chain
        return
    for group, kind in ((prod, "kv_producer"), (cons, "kv_consumer")):
        for extra in group[1:]:
            yield r.diag(f"stage {extra.stage_id} is a second {kind}; vllm-omni supports exactly one PD pair",
                         ctx.sloc(extra, "kv_transfer_config", "kv_role", value=True),
                         related=[ctx.sloc(group[0], "kv_transfer_config", "kv_role", value=True, label=f"first {kind}")],
                         help="remove the kv_transfer_config from stages outside the prefill/decode pair")


@rule("OPD309", "engine-id-unique", Severity.ERROR,
      "two stages share a KV engine_id",
      fail=_pd_yaml("{kv_connector: NixlConnector, kv_role: kv_producer, engine_id: thinker}",
                    "{kv_connector: NixlConnector, kv_role: kv_consumer, engine_id: thinker}"),
      passing=_pd_yaml(OK_P, OK_D), labels=("ID-ENGINE-UNIQUE",))
def engine_id_unique(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """``engine_id`` names an engine in transfers (NIXL handshakes, Mooncake bootstrap
    ``remote_engine_id``); two engines with one id confuse the peer lookup. vllm-omni's
    PD recipe sets ``omni-thinker-prefill`` / ``omni-thinker-decode``. Sources: vllm-omni
    ``docs/features/pd_disaggregation.md``; vllm-ascend
    ``docs/source/developer_guide/feature_guide/disaggregated_prefill.md``."""
    if ctx.topology is None:
        return
    seen: dict[str, Any] = {}
    for n in ctx.topology.stages:
        eid = (n.kv or {}).get("engine_id")
        if eid is None:
            continue
        if str(eid) in seen:
            first = seen[str(eid)]
            yield r.diag(f"stages {first.stage_id} and {n.stage_id} share engine_id `{eid}`",
                         ctx.sloc(n, "kv_transfer_config", "engine_id", value=True),
                         related=[ctx.sloc(first, "kv_transfer_config", "engine_id", value=True, label="first used here")],
                         help=f"give each engine its own id, e.g. `engine_id: {eid}-{n.pd_role or n.stage_id}`")
        else:
            seen[str(eid)] = n


_STREAM_EDGES = "edges:\n  - {from: 1, to: 2}\n"


@rule("OPD310", "async-chunk-kv", Severity.ERROR,
      "async_chunk is on with a PD pair where the pair cannot stream",
      fail=(_pd_yaml(OK_P, OK_D).replace("async_chunk: false", "async_chunk: true")
            + "  - {stage_id: 2, devices: \"2\"}\nedges:\n  - {from: 0, to: 1}\n  - {from: 1, to: 2}\n"),
      passing=_pd_yaml(OK_P, OK_D).replace("async_chunk: false", "async_chunk: true")
      + "  - {stage_id: 2, devices: \"2\"}\n" + _STREAM_EDGES, runtime="vllm-omni",
      examples=(
          Example("llm_pd under plain vllm serve: no orchestrator, async_chunk is not read",
                  _pd_yaml(OK_P, OK_D).replace("async_chunk: false\n", "").replace("qwen3_omni_moe_pd", "llm_pd"), False),
          Example("one-piece answer: async_chunk false", _pd_yaml(OK_P, OK_D), False),
          Example("a vllm-omni release omni-pd's layer does not make stream",
                  _pd_yaml(OK_P, OK_D).replace("async_chunk: false", "async_chunk: true")
                  + "  - {stage_id: 2, devices: \"2\"}\n" + _STREAM_EDGES,
                  True, {"vllm_version": "0.28"}, contains="refuses async_chunk"),
          Example("the layer's streaming patches switched off in the launcher environment",
                  _pd_yaml(OK_P, OK_D).replace("async_chunk: false", "async_chunk: true")
                  + "  - {stage_id: 2, devices: \"2\"}\n" + _STREAM_EDGES,
                  True, {"env": {"OMNI_PD_VLLM_OMNI_STREAM_PD": "0"}}, contains="OMNI_PD_VLLM_OMNI_STREAM_PD=0"),
      ))
def async_chunk_kv(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """With ``async_chunk`` on (vllm-omni's default), a PD pair streams only where omni-pd's
    vllm-omni compatibility layer makes it (omni_pd/compile/stream_pd.py): vllm-omni 0.30
    itself refuses any ``kv_transfer_config`` with it ("Native AR-to-DiT KV transfer requires
    async_chunk=False", ``config/omni_config.py`` ``_validate_async_chunk_support``), and a
    stage edge from prefill to decode makes decode a chunk receiver that the orchestrator
    pre-submits with a placeholder prompt at request start
    (``engine/orchestrator.py`` ``_prewarm_async_chunk_stages``; the edge gets an
    auto-configured SharedMemoryConnector, ``distributed/omni_connectors/utils/initialization.py``)
    and never routes prefill's output to. So the rule is silent where the layer covers the
    target release and pipeline, is on in the launcher environment, and ``edges:`` has no
    prefill -> decode entry (``omni-pd expand`` writes it so); an error otherwise, naming
    the cause. For a pipeline with no stage after decode that vllm-omni serves, the edge
    rule alone applies. A vllm-omni orchestrator rule (not checked for plain ``vllm serve``
    engines). Sources: vllm-omni 0.30.0 ``config/omni_config.py``, ``engine/orchestrator.py``,
    ``engine/stage_init_utils.py`` ``get_stage_connector_spec``,
    ``distributed/omni_connectors/utils/initialization.py`` ``load_omni_transfer_config``;
    run end to end by tests/test_e2e_omni_stream_pd.py."""
    from omni_pd.compile import stream_pd

    topo = ctx.topology
    if topo is None or not topo.async_chunk:
        return
    kv_nodes = [n for n in topo.stages if n.kv and n.kv.get("kv_connector")]
    pair = ctx.pd_pair
    if topo.pd_pair is None or not kv_nodes or pair is None:
        return
    p, d = pair
    where = ctx.loc(("async_chunk",), value=True) if ctx.exists(("async_chunk",)) else ctx.loc(())
    related = [ctx.sloc(kv_nodes[0], "kv_transfer_config", label="KV connector here")]
    g = stream_pd.gap(topo.pipeline, ctx.target, ctx.env) if stream_pd.streams(topo.pipeline) else None
    if g is not None:
        yield r.diag(f"async_chunk is on (vllm-omni's default) with a prefill/decode pair: {g.why}", where,
                     related=related, help=g.help, reads=(("async_chunk",),))
        return
    edges = [{"from": e.from_, "to": e.to} for e in (ctx.config.edges or ())] if ctx.config is not None else []
    if stream_pd.edge_into_decode(edges, p.stage_id, d.stage_id):
        yield r.diag(f"async_chunk is on and `edges:` has an edge from prefill (stage {p.stage_id}) to decode "
                     f"(stage {d.stage_id}): decode becomes a chunk receiver and gets a placeholder prompt",
                     ctx.loc(("edges",)), related=related,
                     help=f"remove `- {{from: {p.stage_id}, to: {d.stage_id}}}` from `edges:` (the KV connector "
                          f"carries that hop), or set `async_chunk: false` for the one-piece answer",
                     reads=(("async_chunk",), ("edges",)))


@rule("OPD311", "peer-topology", Severity.ERROR,
      "kv_connector_extra_config declares a peer TP/DP that is not the real one",
      fail=_PD + ("  - {stage_id: 0, devices: \"0\", kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer, engine_id: p,"
                  " kv_connector_extra_config: {prefill: {tp_size: 1, dp_size: 1}, decode: {tp_size: 2, dp_size: 1}}}}\n"
                  "  - {stage_id: 1, devices: \"1\", kv_transfer_config: " + OK_D + "}\n"),
      passing=_PD + ("  - {stage_id: 0, devices: \"0\", kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer, engine_id: p,"
                     " kv_connector_extra_config: {prefill: {tp_size: 1, dp_size: 1}, decode: {tp_size: 1, dp_size: 1}}}}\n"
                     "  - {stage_id: 1, devices: \"1\", kv_transfer_config: " + OK_D + "}\n"),
      labels=("XS-PEER-TOPO",),
      examples=(
          Example("peer block pp_size that is not the stage's PP", _PD + (
              "  - {stage_id: 0, devices: \"0\", kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer, "
              "engine_id: p, kv_connector_extra_config: {prefill: {tp_size: 1, dp_size: 1, pp_size: 2}}}}\n"
              "  - {stage_id: 1, devices: \"1\", kv_transfer_config: " + OK_D + "}\n"), True, contains="pp_size=2"),
      ))
def peer_topology(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """vllm-ascend's MooncakeConnector(V1) takes ``kv_connector_extra_config.prefill``
    and ``.decode`` blocks (``tp_size``, ``dp_size``, and ``pp_size`` since vllm-ascend PR
    #4054) describing both sides; they must
    equal the stages' real parallel sizes or the rank mapping reads the wrong blocks.
    Generate them from the stages. Sources:
    https://github.com/vllm-project/vllm-ascend/issues/8442,
    https://github.com/vllm-project/vllm-ascend/issues/8344; vllm-ascend
    ``docs/source/developer_guide/feature_guide/disaggregated_prefill.md`` (limits)."""
    pair = ctx.pd_pair
    if pair is None:
        return
    real = {"prefill": pair[0], "decode": pair[1]}
    for n in pair:
        extra = (n.kv or {}).get("kv_connector_extra_config") or {}  # a mapping: validate types it (OPD101)
        for side, peer in real.items():
            blk = extra.get(side)
            if not isinstance(blk, dict):
                continue
            sizes = (("tp_size", "tensor", ctx.stage_tp(peer)), ("dp_size", "data", ctx.stage_dp(peer)),
                     ("pp_size", "pipeline", ctx.parallel(peer)["pipeline_parallel_size"]))
            for key, word, actual in sizes:
                v = blk.get(key)
                if v is not None and str(v) != str(actual):
                    yield r.diag(f"stage {n.stage_id}: kv_connector_extra_config.{side}.{key}={v} but stage {peer.stage_id} "
                                 f"({side}) runs {word}_parallel_size={actual}",
                                 ctx.sloc(n, "kv_transfer_config", "kv_connector_extra_config", side, key, value=True),
                                 related=[ctx.sloc(peer, f"{word}_parallel_size", label=f"{side} stage {peer.stage_id}")],
                                 help=f"write `{key}: {actual}`")


_ASC_P = ('{kv_connector: MooncakeConnectorV1, kv_role: kv_producer, kv_port: 36000, engine_id: p, '
          'kv_connector_extra_config: {prefill: {dp_size: 1, tp_size: 1}, decode: {dp_size: 1, tp_size: 1}}}')
_ASC_D = _ASC_P.replace("kv_producer", "kv_consumer").replace("36000", "36001").replace("engine_id: p", "engine_id: d")


@rule("OPD312", "ascend-peer-blocks-missing", Severity.ERROR,
      "a vllm-ascend Mooncake stage lacks the prefill/decode peer blocks its worker asserts",
      fail=_PD + ("  - {stage_id: 0, devices: \"0\", kv_transfer_config: "
                  "{kv_connector: MooncakeConnectorV1, kv_role: kv_producer, kv_port: 36000, engine_id: p}}\n"
                  "  - {stage_id: 1, devices: \"1\", kv_transfer_config: " + _ASC_D + "}\n"),
      passing=_PD + ("  - {stage_id: 0, devices: \"0\", kv_transfer_config: " + _ASC_P + "}\n"
                     "  - {stage_id: 1, devices: \"1\", kv_transfer_config: " + _ASC_D + "}\n"),
      example_context={"platform": "npu"}, labels=("XS-PEER-TOPO",),
      examples=(
          Example("a block without dp_size", _PD + (
              "  - {stage_id: 0, devices: \"0\", kv_transfer_config: " + _ASC_P.replace("prefill: {dp_size: 1, ", "prefill: {")
              + "}\n  - {stage_id: 1, devices: \"1\", kv_transfer_config: " + _ASC_D + "}\n"), True,
              {"platform": "npu"}, contains="kv_connector_extra_config.prefill.dp_size"),
          Example("layerwise on vllm-ascend 0.18+ reads no peer blocks", _PD + (
              "  - {stage_id: 0, devices: \"0\", kv_transfer_config: {kv_connector: MooncakeLayerwiseConnector, "
              "kv_role: kv_producer, kv_port: 36000, engine_id: p}}\n"
              "  - {stage_id: 1, devices: \"1\", kv_transfer_config: {kv_connector: MooncakeLayerwiseConnector, "
              "kv_role: kv_consumer, kv_port: 36001, engine_id: d}}\n"), False, {"platform": "npu", "vllm_version": "0.18"}),
          Example("MooncakeHybridConnector (vllm-ascend 0.23.0.post1) asserts them too", _PD + (
              "  - {stage_id: 0, devices: \"0\", kv_transfer_config: {kv_connector: MooncakeHybridConnector, "
              "kv_role: kv_producer, kv_port: 36000, engine_id: p}}\n"
              "  - {stage_id: 1, devices: \"1\", kv_transfer_config: " + _ASC_D.replace("MooncakeConnectorV1", "MooncakeHybridConnector")
              + "}\n"), True, {"platform": "npu", "vllm_version": "0.23"}, contains="MooncakeHybridConnector"),
          Example("layerwise on vllm-ascend 0.13 asserts them", _PD + (
              "  - {stage_id: 0, devices: \"0\", kv_transfer_config: {kv_connector: MooncakeLayerwiseConnector, "
              "kv_role: kv_producer, kv_port: 36000, engine_id: p}}\n"
              "  - {stage_id: 1, devices: \"1\", kv_transfer_config: {kv_connector: MooncakeLayerwiseConnector, "
              "kv_role: kv_consumer, kv_port: 36001, engine_id: d}}\n"), True, {"platform": "npu", "vllm_version": "0.13"},
              contains="MooncakeLayerwiseConnector"),
      ))
def ascend_peer_blocks_missing(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """vllm-ascend's ``MooncakeConnectorV1`` worker asserts ``tp_size`` and ``dp_size`` in
    both ``kv_connector_extra_config.prefill`` and ``.decode`` at init (``pp_size``
    defaults to 1); so does ``MooncakeHybridConnector`` (vllm-ascend 0.23.0.post1, the
    hybrid-KV connector; without the blocks it assumes peer TP 1 and misroutes KV under
    heterogeneous TP); ``MooncakeLayerwiseConnector`` did so up to vllm-ascend 0.13 (0.18+
    takes the peer TP per request). A missing key is an ``AssertionError`` at engine start;
    the help gives the block from the stages' real sizes (what ``expand`` writes). The
    connectors that read the blocks: presets/targets/vllm_ascend.yaml ``rules.connectors``
    (``peer_blocks``), by the loaded class (``capability.connector_row``: ``MooncakeConnector``
    from vllm-ascend's module path is MooncakeConnectorV1, an out-of-tree class of a vllm-ascend
    name is not vllm-ascend's); a vllm-ascend connector not listed there (UCMConnector, the store
    connectors) is not checked. Sources: ``extracted.*.pull_peer_blocks`` /
    ``push_peer_blocks`` (vllm-ascend kv_p2p/mooncake_connector.py
    ``_get_prefill_decode_size``, 0.13-0.23.0.post1); vllm-ascend v0.23.0
    kv_p2p/mooncake_hybrid_connector.py ``MooncakeConnectorWorker._get_prefill_decode_size``;
    vllm-ascend issue #8442, PR #11725."""
    from omni_pd.compile import ascend

    pair = ctx.pd_pair
    if pair is None:
        return
    release = ascend.release_for_vllm(ctx.target.label)
    real = {"prefill": pair[0], "decode": pair[1]}
    for n in pair:
        row = connector_row(ctx, n)  # vllm-ascend's class, also under vLLM's name from its module path
        if not ascend.is_ascend(row) or not ascend.peer_blocks_read(row, release):
            continue
        name = connector_label(ctx, n)
        extra = (n.kv or {}).get("kv_connector_extra_config") or {}
        for side, peer in real.items():
            blk = extra.get(side)
            missing = [k for k in ("tp_size", "dp_size") if not (isinstance(blk, dict) and k in blk)]
            if not missing:
                continue
            want = f"{side}: {{dp_size: {ctx.stage_dp(peer)}, tp_size: {ctx.stage_tp(peer)}}}"
            where = (ctx.sloc(n, "kv_transfer_config", "kv_connector_extra_config", side)
                     if isinstance(blk, dict) else ctx.sloc(n, "kv_transfer_config", "kv_connector", value=True))
            yield r.diag(f"stage {n.stage_id}: {name} needs kv_connector_extra_config.{side}."
                         f"{' and '.join(missing)} (vllm-ascend asserts it at worker init)",
                         where, related=[ctx.sloc(peer, label=f"{side} stage {peer.stage_id}")],
                         help=f"write `{want}` under kv_connector_extra_config on both stages (omni-pd expand does)")
