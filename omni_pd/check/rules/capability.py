"""Connector capability rules (OPD6xx) per (connector, vLLM version, platform).

Facts come from ``presets/targets/vllm.yaml`` (registry, renames, kv fields per
version) and the connector contracts in ``omni_pd/compile/connectors``; the tables below
hold what those do not cover yet, each with its source. Sources: vLLM
``vllm/config/kv_transfer.py``, ``vllm/distributed/kv_transfer/kv_connector/factory.py``
and the connectors under ``kv_connector/v1/`` (wheels 0.11-0.33), vllm-ascend
``docs/source/developer_guide/feature_guide/disaggregated_prefill.md``, and the case
reports named per rule.
"""

from __future__ import annotations

from difflib import get_close_matches
from typing import TYPE_CHECKING, Any, Iterable

from omni_pd.diagnostics import Diagnostic, Severity
from omni_pd.check.rules import Context, Example, Rule, rule
from omni_pd.compile import ascend  # vllm-ascend's facts (presets/targets/vllm_ascend.yaml)
from omni_pd.compile.tp_pairs import ASCEND_CONNECTORS  # vllm-ascend's connector names (NPU only)

if TYPE_CHECKING:
    from omni_pd.compile.topology import StageNode

#: MultiConnector child names that resolve to a different class (alias) on a platform.
ALIASES = {("npu", "OffloadingConnector"): "AscendOffloadingConnector"}
#: MLA KV layout support. True: supported; False: not; absent: unknown (no finding).
#: NIXL: MLA needs no head split (vLLM v1/nixl/tp_mapping.py); PyNccl V0 pipe: no MLA
#: (vllm#14324); MooncakeConnector: added by vllm PR #46807.
MLA_SUPPORT = {"NixlConnector": True, "NixlPullConnector": True, "NixlPushConnector": True,
               "PyNcclConnector": False, "LMCacheConnector": False}
#: Required kv_connector_extra_config keys (vLLM v1/moriio/moriio_common.py ``MoRIIOConfig``).
REQUIRED_EXTRA = {"MoRIIOConnector": ("http_port", "handshake_port", "notify_port")}

_PD = "pipeline: qwen3_omni_moe_pd\nasync_chunk: false\nstages:\n"


def _pair_yaml(conn: str, p_extra: str = "", d_extra: str = "", p_kv: str = "", d_kv: str = "") -> str:  # pragma: no mutate block (runs at import only)
    return (_PD + f"  - {{stage_id: 0, devices: \"0\"{p_extra}, kv_transfer_config: {{kv_connector: {conn}, kv_role: kv_producer, engine_id: p{p_kv}}}}}\n"
            f"  - {{stage_id: 1, devices: \"1\"{d_extra}, kv_transfer_config: {{kv_connector: {conn}, kv_role: kv_consumer, engine_id: d{d_kv}}}}}\n")


def _kv_nodes(ctx: Context) -> list["StageNode"]:
    return [n for n in ctx.topology.stages if n.kv] if ctx.topology is not None else []


def _platform(ctx: Context, node: "StageNode") -> str:
    """The platform ``node`` runs on: ``--platform``, else the accelerator of the inventory
    host it is placed on (with one host, that host), else cuda."""
    if ctx.platform:
        return ctx.platform
    h = ctx.inventory.host(ctx.host_of(node)) if ctx.inventory is not None else None
    return h.accelerator if h is not None and h.accelerator else "cuda"


@rule("OPD601", "connector-unknown", Severity.ERROR,
      "kv_connector is not registered for this vLLM version / platform",
      fail=_pair_yaml("PyNcclConnector"), passing=_pair_yaml("NixlConnector"), labels=("CAP-REGISTRY",))
def connector_unknown(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """``kv_connector`` must be a name in the target vLLM's ``KVConnectorFactory`` (or
    vllm-ascend's, on NPU), unless ``kv_connector_module_path`` loads it. The V0 names
    ``PyNcclConnector``/``LMCacheConnector`` never were V1 connectors, and
    ``SharedStorageConnector`` became ``ExampleConnector`` in 0.13; the replacement is
    suggested. On npu every name the vllm-ascend release built for the target vLLM
    registers is accepted (presets/targets/vllm_ascend.yaml ``extracted.<release>.connectors``,
    e.g. ``MooncakeHybridConnector`` from 0.23.0.post1); a vllm-ascend name that release
    does not register is refused with the release that does; with no vllm-ascend release
    for the target vLLM in the table, vllm-ascend names are not checked. Sources: vLLM
    kv_connector/factory.py (0.11-0.33); vllm-ascend
    vllm_ascend/distributed/kv_transfer/__init__.py (0.13.0-0.23.0.post1);
    https://github.com/vllm-project/vllm/issues/24152,
    https://github.com/vllm-project/vllm/issues/22093."""
    tgt = ctx.target
    if tgt.version < (0, 11):
        return  # no registry facts before 0.11
    registered = tgt.connectors()
    renames = tgt.connector_renames()
    for n in _kv_nodes(ctx):
        kv = n.kv or {}
        name = kv.get("kv_connector")
        if not name or kv.get("kv_connector_module_path") or name in registered:
            continue
        plat = _platform(ctx, n)
        if name in ASCEND_CONNECTORS or name in ascend.registered():
            if plat == "npu":
                yield from _ascend_release_lacks(ctx, r, n, name)
                continue
            yield r.diag(f"stage {n.stage_id}: {name} is a vllm-ascend connector; it exists only on the npu platform",
                         ctx.sloc(n, "kv_transfer_config", "kv_connector", value=True),
                         help=_off_npu_help(plat, registered, tgt.label))
            continue
        hist = tgt.connector_history(name)
        if name in renames:
            alts = " or ".join(renames[name])
            why = "is not a V1 connector" if hist is None else f"is not registered in vLLM {tgt.label}"
            yield r.diag(f"stage {n.stage_id}: {name} {why}; did you mean {alts}?",
                         ctx.sloc(n, "kv_transfer_config", "kv_connector", value=True),
                         help=f"write `kv_connector: {renames[name][0]}`")
        elif hist is not None:
            when = (f"added in vLLM {hist['since']}" if hist.get("since") and tgt.version < _v(hist["since"])
                    else f"removed in vLLM {hist.get('removed')}")
            yield r.diag(f"stage {n.stage_id}: {name} is not available in vLLM {tgt.label} ({when})",
                         ctx.sloc(n, "kv_transfer_config", "kv_connector", value=True),
                         help="pick a connector your vLLM has: " + ", ".join(sorted(c for c in registered if "Connector" in c)[:6]))
        else:
            # only names that load on the stage's platform: a vllm-ascend name off npu is refused above
            pool = registered | ASCEND_CONNECTORS | ascend.registered() if plat == "npu" else registered
            close = get_close_matches(name, sorted(pool), n=1, cutoff=0.6)
            low = {c.lower(): c for c in registered}
            sugg = low.get(name.lower()) or (close[0] if close else None)
            yield r.diag(f"stage {n.stage_id}: unknown kv_connector `{name}`" + (f"; did you mean {sugg}?" if sugg else ""),
                         ctx.sloc(n, "kv_transfer_config", "kv_connector", value=True),
                         help=f"write `kv_connector: {sugg}`" if sugg else "set kv_connector_module_path for an out-of-tree connector")


def _ascend_release_lacks(ctx: Context, r: Rule, n: "StageNode", name: str) -> Iterable[Diagnostic]:
    """OPD601 on npu for vllm-ascend connector ``name``: an error when the vllm-ascend
    release built for the target vLLM (presets/targets/vllm_ascend.yaml ``targets``) does
    not register it (``extracted.<release>.connectors``); nothing when it does, or when no
    release in the table runs on the target vLLM (no registry facts to check against)."""
    release = ascend.release_for_vllm(ctx.target.label)
    have = ascend.registered(release) if release is not None else frozenset()
    if not have or name in have:
        return
    others = [rel for rel in ascend.releases() if name in ascend.registered(rel)]
    where = f" (registered in vllm-ascend {', '.join(others)})" if others else ""
    yield r.diag(f"stage {n.stage_id}: {name} is not registered in vllm-ascend {release} "
                 f"(the release for vLLM {ctx.target.label}){where}",
                 ctx.sloc(n, "kv_transfer_config", "kv_connector", value=True),
                 help=(f"run vllm-ascend {others[0]} (`--vllm-version {ascend.releases()[others[0]]}`) or use "
                       if others else "use ") + "one of " + ", ".join(sorted(c for c in have if ascend.is_ascend(c))))


#: vLLM connectors to suggest in place of a vllm-ascend one, per platform, when the target
#: registers them. NixlConnector runs on cuda, rocm and xpu (vLLM v1/nixl/utils.py
#: ``_NIXL_SUPPORTED_DEVICE``, BUFFER_DEVICES below); MooncakeConnector is suggested on cuda only.
OFF_NPU_CONNECTORS = {"cuda": ("MooncakeConnector", "NixlConnector"), "rocm": ("NixlConnector",),
                      "xpu": ("NixlConnector",)}


def _off_npu_help(plat: str, registered: frozenset[str], label: str) -> str:
    """OPD601's help for a vllm-ascend connector on ``plat`` (not npu): the connectors of
    :data:`OFF_NPU_CONNECTORS` the target registers, named for ``plat``, else a pointer
    to the target's registry."""
    names = [c for c in OFF_NPU_CONNECTORS.get(plat, ()) if c in registered]
    if names:
        return f"on {plat} use " + " or ".join(names)
    return f"on {plat} use a connector vLLM {label} registers, or kv_connector_module_path for an out-of-tree one"


def _v(s: str) -> tuple[int, int]:
    from omni_pd.compile.targets import parse_version

    return parse_version(s)


def _multi(children: list[str], side: str = "d") -> str:  # pragma: no mutate block (runs at import only)
    """A PD pair whose ``side`` (p or d) stage runs MultiConnector over ``children``."""
    kids = ", ".join(f"{{kv_connector: {c}, kv_role: {'kv_consumer' if side == 'd' else 'kv_producer'}}}" for c in children)
    multi = (f"{{kv_connector: MultiConnector, kv_role: {'kv_consumer' if side == 'd' else 'kv_producer'}, engine_id: {side}, "
             f"kv_connector_extra_config: {{connectors: [{kids}]}}}}")
    first = next((c for c in children if c.startswith(("Nixl", "Mooncake"))), "NixlConnector")  # the other side's
    plain_p = f"{{kv_connector: {first}, kv_role: kv_producer, engine_id: p}}"
    plain_d = f"{{kv_connector: {first}, kv_role: kv_consumer, engine_id: d}}"
    p, d = (plain_p, multi) if side == "d" else (multi, plain_d)
    return ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
            f"  - {{stage_id: 0, devices: \"0\", kv_transfer_config: {p}}}\n"
            f"  - {{stage_id: 1, devices: \"1\", kv_transfer_config: {d}}}\n")


@rule("OPD602", "multi-connector", Severity.WARNING,
      ("MultiConnector children are malformed, compete for the P->D handoff, are ordered so decode skips it, clash, "
       "or form a combination known broken on the target release"),
      fail=("stages:\n  - {stage_id: 0, devices: \"0\", kv_transfer_config: {kv_connector: MultiConnector, kv_role: kv_producer,"
            " kv_connector_extra_config: {connectors: [{kv_connector: NixlConnector}]}}}\n"),
      passing=("stages:\n  - {stage_id: 0, devices: \"0\", kv_transfer_config: {kv_connector: MultiConnector, kv_role: kv_producer,"
               " kv_connector_extra_config: {connectors: [{kv_connector: NixlConnector, kv_role: kv_producer}]}}}\n"),
      labels=("CAP-MULTI",),
      examples=(
          Example("no connectors list", _multi([]).replace("connectors: []", "other: 1"), True, severity=Severity.ERROR,
                  contains="non-empty"),
          Example("two handoff children", _multi(["NixlConnector", "MooncakeConnector"]), True, severity=Severity.ERROR,
                  contains="Key clash"),
          Example("cache child before the handoff child on decode", _multi(["OffloadingConnector", "NixlConnector"]), True,
                  severity=Severity.WARNING, contains="skips the transfer from prefill"),
          Example("handoff child first", _multi(["NixlConnector", "OffloadingConnector"]), False, {"vllm_version": "0.30"}),
          Example("order does not matter on prefill", _multi(["OffloadingConnector", "NixlConnector"], side="p"), False),
          Example("children with different KV layouts", _multi(["NixlConnector", "ExampleHiddenStatesConnector"]), True,
                  {"vllm_version": "0.30"}, severity=Severity.ERROR, contains="layout"),
          Example("layouts not pinned before 0.30", _multi(["NixlConnector", "ExampleHiddenStatesConnector"]), False,
                  {"vllm_version": "0.24"}),
          Example("a child whose kv_connector is a mapping (fuzz-found TypeError)",
                  _multi(["NixlConnector"]).replace("[{kv_connector: NixlConnector", "[{kv_connector: {name: NixlConnector}"),
                  True, severity=Severity.ERROR, contains="must be a connector name"),
          Example("vllm-ascend OffloadingConnector alias", _multi(["MooncakeConnectorV1", "OffloadingConnector"]), True,
                  {"platform": "npu"}, contains="AscendOffloadingConnector"),
          Example("two handoff children before the params merge (0.24 raises on any second producer)",
                  _multi(["NixlConnector", "MooncakeConnector"]), True, {"vllm_version": "0.24"},
                  severity=Severity.ERROR, contains="Only one connector can produce KV transfer params"),
          Example("LMCacheMPConnector beside the handoff child on prefill, last release read raising",
                  _multi(["NixlConnector", "LMCacheMPConnector"], side="p"), True, {"vllm_version": "0.24"},
                  severity=Severity.ERROR, contains="NixlConnector + LMCacheMPConnector on prefill on vLLM 0.24"),
          Example("ExampleHiddenStatesConnector beside the handoff child on prefill (always returns params)",
                  _multi(["MooncakeConnector", "ExampleHiddenStatesConnector"], side="p"), True, {"vllm_version": "0.22"},
                  severity=Severity.ERROR, contains="Only one connector can produce KV transfer params"),
          Example("LMCacheMPConnector on prefill, first release read merging the params",
                  _multi(["NixlConnector", "LMCacheMPConnector"], side="p"), False, {"vllm_version": "0.30"}),
          Example("LMCacheMPConnector on prefill, a release between those read",
                  _multi(["NixlConnector", "LMCacheMPConnector"], side="p"), True, {"vllm_version": "0.27"},
                  severity=Severity.INFO, contains="not pinned"),
          Example("LMCacheMPConnector on prefill, last release read returning None",
                  _multi(["NixlConnector", "LMCacheMPConnector"], side="p"), False, {"vllm_version": "0.18"}),
          Example("LMCacheMPConnector on prefill, a release before the first read returning {}",
                  _multi(["NixlConnector", "LMCacheMPConnector"], side="p"), True, {"vllm_version": "0.22"},
                  severity=Severity.INFO, contains="not pinned"),
          Example("NixlConnector + OffloadingConnector on a replicated-PCP prefill, release not read",
                  _multi(["NixlConnector", "OffloadingConnector"], side="p").replace(
                      'devices: "0", kv_transfer_config', 'devices: "0,1", prefill_context_parallel_size: 2, kv_transfer_config'),
                  True, {"vllm_version": "0.28"}, severity=Severity.INFO, contains="prefill stalls"),
          Example("NixlConnector + OffloadingConnector on a replicated-PCP prefill, fixed release read",
                  _multi(["NixlConnector", "OffloadingConnector"], side="p").replace(
                      'devices: "0", kv_transfer_config', 'devices: "0,1", prefill_context_parallel_size: 2, kv_transfer_config'),
                  False, {"vllm_version": "0.30"}),
          Example("LMCacheMPConnector on decode (the handoff child returns no params there)",
                  _multi(["NixlConnector", "LMCacheMPConnector"]), False, {"vllm_version": "0.24"}),
          Example("LMCache's own LMCacheMPConnector copy on prefill",
                  _multi(["NixlConnector", "LMCacheMPConnector"], side="p").replace(
                      "{kv_connector: LMCacheMPConnector,",
                      "{kv_connector: LMCacheMPConnector, kv_connector_module_path: lmcache.integration.vllm.lmcache_mp_connector,"),
                  True, {"vllm_version": "0.24"}, severity=Severity.WARNING, contains="LMCache/LMCache/pull/3866"),
      ))
def multi_connector(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """``MultiConnector`` needs ``kv_connector_extra_config.connectors``: a non-empty list
    whose children each set ``kv_connector`` and ``kv_role`` (error otherwise). A child
    name that resolves to another class on the platform (``OffloadingConnector`` is
    ``AscendOffloadingConnector`` on vllm-ascend) is flagged: its stats reconstruction
    crashed EngineCore on unpatched vLLM. One handoff owner: two children that hand KV
    from prefill to decode (NIXL, Mooncake, MoRIIO, P2pNccl, vllm-ascend's) both return
    ``kv_transfer_params``, which MultiConnector merges and refuses on a key clash. Child
    order: MultiConnector loads from the first child reporting hits, so on decode a
    cache/offload child listed before the handoff child takes the request on a local
    hit and the transfer is skipped (warning). Children that require different KV cache
    layouts stop the engine (pinned for 0.30). Lost or refused kv_transfer_params, per
    release: up to vLLM 0.24 (read) MultiConnector raised "Only one connector can produce
    KV transfer params" on any second child returning params (PR #46777 merges them; 0.30
    read merging, 0.25-0.29 not read: info there). On prefill, vLLM's
    ``LMCacheMPConnector`` returns ``{}`` for every routed PD request (0.24 read; 0.18 read
    returned None, 0.19-0.23 not read: info) and
    ``ExampleHiddenStatesConnector`` always returns its path, so beside a handoff child
    every request fails on those releases (error); LMCache's own copy loaded by
    ``kv_connector_module_path`` returns None from LMCache PR #3866 (warning). NIXL +
    OffloadingConnector on a replicated-KV PCP prefill stalled (vLLM PR #53903; fixed in
    0.30 read, no release read with it: info on 0.25-0.29). The
    NIXL-under-HMA loss of vLLM issue #36547 reached no release (0.17.0, 0.18.0 read): no
    finding. Facts: ``presets/targets/multi_connector.yaml``.
    Sources: vLLM 0.24.0 and 0.30.0 kv_connector/v1/multi_connector.py
    (``get_num_new_matched_tokens``, ``request_finished``, ``_aggregate_request_finished``,
    ``get_required_kvcache_layout``), ``lmcache_mp_connector.py``,
    ``example_hidden_states_connector.py``; https://github.com/vllm-project/vllm/pull/50546,
    https://github.com/vllm-project/vllm/pull/35092,
    https://github.com/vllm-project/vllm/pull/46777,
    https://github.com/LMCache/LMCache/pull/3866,
    https://github.com/vllm-project/vllm/pull/53903,
    https://github.com/vllm-project/vllm/issues/36547,
    https://github.com/vllm-project/vllm-ascend/issues/16932."""
    for n in _kv_nodes(ctx):
        kv = n.kv or {}
        if kv.get("kv_connector") != "MultiConnector":
            continue
        kids = (kv.get("kv_connector_extra_config") or {}).get("connectors")
        if not isinstance(kids, list) or not kids:
            yield r.diag(f"stage {n.stage_id}: MultiConnector needs a non-empty kv_connector_extra_config.connectors list",
                         ctx.sloc(n, "kv_transfer_config", "kv_connector_extra_config"), severity=Severity.ERROR,
                         help="list the child connectors: `connectors: [{kv_connector: NixlConnector, kv_role: kv_producer}]`")
            continue
        plat = _platform(ctx, n)
        for j, c in enumerate(kids):
            if not isinstance(c, dict):
                continue
            path = ("kv_transfer_config", "kv_connector_extra_config", "connectors", j)
            for key in ("kv_connector", "kv_role"):
                if not c.get(key):
                    yield r.diag(f"stage {n.stage_id}: MultiConnector child {j} has no {key}", ctx.sloc(n, *path),
                                 severity=Severity.ERROR, help=f"add `{key}:` to the child")
            name = c.get("kv_connector")
            if name is not None and not isinstance(name, str):
                yield r.diag(f"stage {n.stage_id}: MultiConnector child {j} kv_connector must be a connector name, "
                             f"found a {type(name).__name__}", ctx.sloc(n, *path, "kv_connector", value=True),
                             severity=Severity.ERROR, help="write the child's connector class name, e.g. `NixlConnector`")
                continue
            alias = ALIASES.get((plat, name))
            if alias:
                yield r.diag(f"MultiConnector child '{c.get('kv_connector')}' is an alias of {alias} on {plat}; "
                             "stats reconstruction can crash EngineCore on unpatched vLLM",
                             ctx.sloc(n, *path, "kv_connector", value=True),
                             help=f"use a vLLM with the fix, or name `{alias}` and check its stats support")
        # children whose kv_connector is not a name were reported above (the facts key by name)
        yield from _multi_children(ctx, r, n, [c for c in kids if isinstance(c, dict)
                                               and isinstance(c.get("kv_connector"), (str, type(None)))])


def _multi_facts() -> dict[str, Any]:
    from omni_pd.resources import data_dir, load_data

    return load_data(data_dir("presets") / "targets" / "multi_connector.yaml")


def _multi_children(ctx: Context, r: Rule, n: "StageNode", kids: list[dict]) -> Iterable[Diagnostic]:
    """One handoff owner, the handoff child first on decode, one KV layout."""
    facts = _multi_facts()
    names = [str(c.get("kv_connector") or "") for c in kids]
    handoff = [i for i, x in enumerate(names) if x in facts["handoff"]]
    cache = [i for i, x in enumerate(names) if x in facts["cache"]]
    base = ("kv_transfer_config", "kv_connector_extra_config", "connectors")
    if len(handoff) > 1:
        a, b = handoff[0], handoff[1]
        yield r.diag(f"stage {n.stage_id}: MultiConnector has two P->D handoff children ({names[a]}, {names[b]}): both return "
                     f"kv_transfer_params, which vLLM {ctx.target.label} {_params_refusal(ctx, facts)}; decode loads "
                     "from one of them only",
                     ctx.sloc(n, *base, b, "kv_connector", value=True), severity=Severity.ERROR,
                     related=[ctx.sloc(n, *base, a, "kv_connector", value=True, label="first handoff child")],
                     help=f"keep one handoff connector ({names[a]}); use the others as cache/offload children only")
    role = (n.kv or {}).get("kv_role")
    pair = ctx.pd_pair
    is_decode = (pair is not None and n is pair[1]) or role == "kv_consumer"
    if handoff:
        yield from _broken_combinations(ctx, r, n, kids, names[handoff[0]], facts, prefill=not is_decode)
    if is_decode and handoff and cache and cache[0] < handoff[0]:
        c, h = cache[0], handoff[0]
        yield r.diag(f"stage {n.stage_id}: MultiConnector lists {names[c]} before the handoff child {names[h]}; decode loads "
                     f"from the first child that reports hits, so a local {names[c]} hit skips the transfer from prefill "
                     "(the rest of the prompt is recomputed; prefill keeps its blocks until their lease ends)",
                     ctx.sloc(n, *base, c, "kv_connector", value=True), severity=Severity.WARNING,
                     related=[ctx.sloc(n, *base, h, "kv_connector", value=True, label="handoff child")],
                     help=f"list {names[h]} first in `connectors:`")
    layouts = None
    for row in facts.get("layouts") or []:
        if ctx.target.version >= _v(row["since"]):
            layouts = row["required"]
    if layouts is None:
        return
    mla = ctx.model is not None and ctx.model.is_mla
    need: dict[str, str] = {}
    for x in names:
        f = layouts.get(x)
        if f is None or (mla and f.get("mla") == "none"):
            continue
        need.setdefault(f["layout"], x)
    if len(need) > 1:
        shown = ", ".join(f"{x} {lay}" for lay, x in need.items())
        yield r.diag(f"stage {n.stage_id}: MultiConnector children require different KV cache layouts ({shown}): vLLM "
                     f"{ctx.target.label} stops with \"KV cache layout mismatch\"",
                     ctx.sloc(n, "kv_transfer_config", "kv_connector_extra_config", "connectors"), severity=Severity.ERROR,
                     help="combine children that use the same KV cache layout")


def _params_refusal(ctx: Context, facts: dict[str, Any]) -> str:
    """How MultiConnector refuses kv_transfer_params from two children on the target release.

    Before vLLM PR #46777 a second non-None dict raised "Only one connector can produce KV
    transfer params"; from it on the dicts are merged and a shared key raises "Key clash"
    (``presets/targets/multi_connector.yaml`` ``params_merge``: 0.24.0 read raising, 0.30.0
    merging, the releases between not pinned)."""
    pm = facts.get("params_merge") or {}
    v = ctx.target.version
    only_one = "refuses (RuntimeError \"Only one connector can produce KV transfer params\")"
    clash = "merges and refuses on a key clash (RuntimeError \"Key clash in kv_transfer_params from multiple connectors\")"
    if pm and v <= _v(pm["last_raising_read"]):
        return only_one
    if pm and v < _v(pm["first_merging_read"]):
        return f"either {only_one.replace('refuses ', 'refuses outright ')} or {clash} (PR #46777; release not pinned)"
    return clash


def _broken_combinations(ctx: Context, r: Rule, n: "StageNode", kids: list[dict], handoff: str,
                         facts: dict[str, Any], prefill: bool) -> Iterable[Diagnostic]:
    """Rows of ``broken`` in ``presets/targets/multi_connector.yaml`` that match this stage.

    A row matches a MultiConnector holding a handoff child and the row's ``child`` on the
    row's ``side``. Target vLLM in ``[since, last_broken_read]``: error; strictly between
    a release read clean (``last_clean_read``, ``first_fixed_read``) and one read broken:
    info (not pinned). A child loaded from ``kv_connector_module_path`` (an out-of-tree
    copy) is a warning naming the row's out-of-tree fix, whose release is not pinned.
    Sources per row."""
    v = ctx.target.version
    base = ("kv_transfer_config", "kv_connector_extra_config", "connectors")
    for row in facts.get("broken") or []:
        if row.get("side") == "prefill" and not prefill:
            continue
        if row.get("handoff") and handoff not in row["handoff"]:
            continue
        if row.get("requires") == "replicated_pcp" and not _replicated_pcp(ctx, n):
            continue
        fixed = _v(row["first_fixed_read"])
        since = _v(row["since"]) if row.get("since") else fixed  # no release read with it: info only
        last = _v(row["last_broken_read"]) if row.get("last_broken_read") else since
        clean = _v(row["last_clean_read"]) if row.get("last_clean_read") else None
        if v >= fixed or (clean is not None and v <= clean) or (clean is None and v < since):
            continue
        for j, c in enumerate(kids):
            if c.get("kv_connector") != row["child"]:
                continue
            loc = ctx.sloc(n, *base, j, "kv_connector", value=True)
            what = f"stage {n.stage_id}: MultiConnector {handoff} + {row['child']} on prefill"
            if v < since or v > last:
                since, last_broken = row.get("since"), row.get("last_broken_read")
                span = str(since) if str(since) == str(last_broken) else f"{since}-{last_broken}"
                seen = (f"on vLLM {span} (releases read)" if row.get("since")
                        else f"reported before vLLM {row['first_fixed_read']} (no release read with it)")
                yield r.diag(f"{what}: {seen} {row['symptom']}; "
                             f"vLLM {ctx.target.label} lies between the releases read, so this is not pinned",
                             loc, severity=Severity.INFO, help=f"check that your vLLM has {row['sources'][-1]}")
            elif c.get("kv_connector_module_path") and row.get("fixed_out_of_tree"):
                yield r.diag(f"{what} (loaded from {c['kv_connector_module_path']}) on vLLM {ctx.target.label}: "
                             f"{row['symptom']}, unless that copy has {row['fixed_out_of_tree']}", loc,
                             severity=Severity.WARNING,
                             help=f"use a release of it with {row['fixed_out_of_tree']}, or vLLM {row['first_fixed_read']}+")
            else:
                yield r.diag(f"{what} on vLLM {ctx.target.label}: {row['symptom']} ({', '.join(row['sources'])})", loc,
                             severity=Severity.ERROR, help=f"drop {row['child']} from prefill's connectors, or target vLLM "
                                                           f"{row['first_fixed_read']}+ (which merges the params)")


def _replicated_pcp(ctx: Context, n: "StageNode") -> bool:
    """Prefill context parallelism with replicated KV: ``prefill_context_parallel_size`` > 1
    and ``decode_context_parallel_size`` 1 (NIXL serves KV from PCP rank 0 only; vLLM
    nixl/base_worker.py ``pcp_dcp_sharded``). Unreadable sizes count as 1."""
    def size(key: str) -> int:
        try:
            return int(ctx.setting(n, key, 1) or 1)
        except (TypeError, ValueError):
            return 1

    return size("prefill_context_parallel_size") > 1 and size("decode_context_parallel_size") <= 1


def hetero_tp_problem(ctx: Context, p: "StageNode", d: "StageNode") -> str | None:
    """Why the connector cannot pair prefill TP with decode TP, or None: the table of
    :func:`omni_pd.compile.tp_pairs.connector_tp_problem` (the one ``expand
    --prefill-tp/--decode-tp`` refuses with), fed the stages' TPs as validate reads them
    and the model's facts when ``--model-info`` gives them."""
    from omni_pd.compile.tp_pairs import connector_tp_problem

    name = (p.kv or {}).get("kv_connector") or (d.kv or {}).get("kv_connector")
    m = ctx.model
    return connector_tp_problem(name, ctx.stage_tp(p), ctx.stage_tp(d), ctx.target,
                                num_kv_heads=m.num_kv_heads if m is not None else None,
                                mla=bool(m is not None and m.is_mla), hybrid=bool(m is not None and m.is_hybrid),
                                sparse_attention=m.sparse_attention if m is not None else None)


_TP18 = _pair_yaml("NixlConnector", ", tensor_parallel_size: 1", ", tensor_parallel_size: 8").replace(
    'devices: "1"', 'devices: "1,2,3,4,5,6,7,8"')
_TP21 = _pair_yaml("NixlConnector", ", tensor_parallel_size: 2", ", tensor_parallel_size: 1").replace(
    'devices: "0"', 'devices: "0,1"').replace('devices: "1"', 'devices: "2"')
_TP88 = _pair_yaml("NixlConnector", ", tensor_parallel_size: 8", ", tensor_parallel_size: 8").replace(
    'devices: "0"', 'devices: "0,1,2,3,4,5,6,7"').replace('devices: "1"', 'devices: "8,9,10,11,12,13,14,15"')


@rule("OPD603", "hetero-tp", Severity.ERROR,
      "the connector cannot pair these prefill and decode tensor parallel sizes",
      fail=_pair_yaml("NixlConnector", ", tensor_parallel_size: 4", ", tensor_parallel_size: 2").replace(
          'devices: "0"', 'devices: "0,1,2,3"').replace('devices: "1"', 'devices: "4,5"'),
      passing=_pair_yaml("NixlConnector", ", tensor_parallel_size: 2", ", tensor_parallel_size: 2").replace(
          'devices: "0"', 'devices: "0,1"').replace('devices: "1"', 'devices: "2,3"'),
      example_context={"vllm_version": "0.13"}, labels=("CAP-HETERO-TP",),
      examples=(
          Example("decode TP 8 > 4 KV heads over NIXL on vLLM 0.23 (before vllm#45879)", _TP18, True,
                  {"vllm_version": "0.23", "model": {"num_kv_heads": 4, "attention": "GQA"}}, contains="vllm#45879"),
          Example("vLLM 0.24 not pinned for vllm#45879: warning", _TP18, True,
                  {"vllm_version": "0.24", "model": {"num_kv_heads": 4, "attention": "GQA"}},
                  severity=Severity.WARNING, contains="not pinned"),
          Example("vLLM 0.25 carries vllm#45879: decode TP 8 > 4 KV heads pairs", _TP18, False,
                  {"vllm_version": "0.25", "model": {"num_kv_heads": 4, "attention": "GQA"}}),
          Example("prefill TP 2 > 1 KV head with decode TP 1 still fails on vLLM 0.30", _TP21, True,
                  {"vllm_version": "0.30", "model": {"num_kv_heads": 1, "attention": "GQA"}},
                  contains="prefill TP 2 > num_key_value_heads 1"),
          Example("MiniMax-M3 MSA (NHD-native) over NIXL with unequal TP", _TP18, True,
                  {"vllm_version": "0.30", "model": {"num_kv_heads": 4, "attention": "GQA", "sparse_attention": "msa",
                                                     "model_type": "minimax_m3"}}, contains="NHD"),
          Example("MiniMax-M3 MSA with equal TP", _TP88, False,
                  {"vllm_version": "0.30", "model": {"num_kv_heads": 4, "attention": "GQA", "sparse_attention": "msa",
                                                     "model_type": "minimax_m3"}}),
      ))
def hetero_tp(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """Heterogeneous TP per connector and version: NIXL 0.11-0.13 decode TP a multiple
    of prefill TP, 0.18+ either way if divisible; Mooncake equal TP before 0.22, then
    divisible; P2pNccl equal; vllm-ascend MooncakeConnectorV1 P_tp >= D_tp and
    P_tp % D_tp == 0; differing TPs above ``num_key_value_heads`` fail (needs
    ``--model-info``). Sources: vLLM ``vllm/distributed/kv_transfer/kv_connector/utils.py``
    ``TransferTopology.tp_ratio`` (0.30; ``v1/nixl_connector.py`` in 0.11-0.13),
    ``v1/mooncake/mooncake_connector.py`` ``_get_tp_ratio``; vllm-ascend
    ``docs/source/developer_guide/feature_guide/disaggregated_prefill.md`` (limits);
    https://github.com/ai-dynamo/dynamo/issues/2295,
    https://github.com/vllm-project/vllm/issues/14952,
    https://github.com/vllm-project/vllm/issues/45330. Model facts per release
    (``presets/targets/hetero_tp.yaml``): prefill TP above decode TP and above
    ``num_key_value_heads`` fails on every release; decode TP above prefill TP and above
    ``num_key_value_heads`` fails over NIXL until vllm#45879 (0.23 and before: error; 0.24:
    warning, not pinned; 0.25+: pairs); MiniMax-M3's MSA attention keeps KV NHD, so
    unequal TP over NIXL reads permuted heads (https://github.com/vllm-project/vllm/issues/46204,
    fix https://github.com/vllm-project/vllm/pull/46223 unmerged): error on every release."""
    from omni_pd.compile.tp_pairs import kv_head_split_problem

    pair = ctx.pd_pair
    if pair is None or not (pair[0].kv and pair[1].kv):
        return
    p, d = pair
    msg = hetero_tp_problem(ctx, p, d)
    ptp, dtp = ctx.stage_tp(p), ctx.stage_tp(d)
    rel = [ctx.sloc(p, "tensor_parallel_size", value=True, label=f"prefill (stage {p.stage_id}) TP {ptp}")]
    if msg:
        yield r.diag(msg, ctx.sloc(d, "tensor_parallel_size", value=True), related=rel,
                     help=f"give decode (stage {d.stage_id}) `tensor_parallel_size: {ptp}` or prefill (stage {p.stage_id}) "
                          f"`tensor_parallel_size: {dtp}` (equal TP), or pick TPs the connector pairs")
        return
    m = ctx.model
    name = str((p.kv or {}).get("kv_connector") or (d.kv or {}).get("kv_connector") or "")
    split = kv_head_split_problem(name, ptp, dtp, ctx.target, m.num_kv_heads if m is not None else None,
                                  bool(m is not None and m.is_mla))
    if split is not None and split[0] == "unpinned":
        yield r.diag(split[1], ctx.sloc(d, "tensor_parallel_size", value=True), related=rel, severity=Severity.WARNING,
                     notes=["source: https://github.com/vllm-project/vllm/pull/45879"],
                     help=f"give decode (stage {d.stage_id}) `tensor_parallel_size: {ptp}`, or target vLLM 0.25+ "
                          "(`--vllm-version 0.25`), which carries the fix")


@rule("OPD604", "mla-unsupported", Severity.ERROR,
      "the model uses MLA and the connector has no MLA KV layout support",
      fail=_pair_yaml("PyNcclConnector"), passing=_pair_yaml("NixlConnector"),
      example_context={"model": {"attention": "MLA"}, "vllm_version": "0.30"}, labels=("CAP-MLA",))
def mla_unsupported(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """MLA keeps one latent KV per token (one fewer dimension); a connector without MLA
    support fails its shape check ("'DeepseekV2Model' object has no attribute
    'config'"). Needs ``--model-info``. Sources:
    https://github.com/vllm-project/vllm/issues/14324; vLLM PR #14824, #46807."""
    if ctx.model is None or not ctx.model.is_mla:
        return
    for n in _kv_nodes(ctx):
        name = (n.kv or {}).get("kv_connector")
        if MLA_SUPPORT.get(name) is False:
            yield r.diag(f"stage {n.stage_id}: {name} has no MLA KV layout support and the model uses MLA",
                         ctx.sloc(n, "kv_transfer_config", "kv_connector", value=True),
                         help="use NixlConnector (MLA needs no head split)")


@rule("OPD605", "kv-dtype-mismatch", Severity.ERROR,
      "kv_cache_dtype differs between prefill and decode",
      fail=_pair_yaml("NixlConnector", ", kv_cache_dtype: fp8", ", kv_cache_dtype: auto"),
      passing=_pair_yaml("NixlConnector", ", kv_cache_dtype: auto", ", kv_cache_dtype: auto"), labels=("XS-DTYPE",))
def kv_dtype_mismatch(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """Prefill and decode must store KV in the same ``kv_cache_dtype``: NIXL hashes it
    into the handshake compatibility check (0.13+), Mooncake copies raw bytes. Sources:
    vLLM ``vllm/distributed/kv_transfer/kv_connector/v1/nixl/metadata.py``
    ``compute_nixl_compatibility_hash``; https://github.com/vllm-project/vllm/issues/42179."""
    pair = ctx.pd_pair
    if pair is None:
        return
    p, d = pair
    pv, dv = ctx.setting(p, "kv_cache_dtype", "auto"), ctx.setting(d, "kv_cache_dtype", "auto")
    if str(pv) != str(dv):
        yield r.diag(f"kv_cache_dtype {pv} (prefill) != {dv} (decode)", ctx.sloc(d, "kv_cache_dtype", value=True),
                     related=[ctx.sloc(p, "kv_cache_dtype", value=True, label=f"prefill uses {pv}")],
                     help=f"write `kv_cache_dtype: {pv}` on both stages")


@rule("OPD606", "fp8-kv-over-nixl", Severity.WARNING,
      "fp8 KV cache over a NIXL PD pair has been reported to corrupt output",
      fail=_pair_yaml("NixlConnector", ", kv_cache_dtype: fp8", ", kv_cache_dtype: fp8"),
      passing=_pair_yaml("NixlConnector"), labels=("CAP-DTYPE",))
def fp8_kv(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """fp8 KV transferred over NIXL between P and D produced garbage output for the
    Qwen3 MoE family in vllm#42179 (same dtype on both sides). Validate the output of a
    few prompts against a single-instance run before serving. Source:
    https://github.com/vllm-project/vllm/issues/42179."""
    pair = ctx.pd_pair
    if pair is None:
        return
    p, _d = pair
    name = str((p.kv or {}).get("kv_connector") or "")
    if name.startswith("Nixl") and str(ctx.setting(p, "kv_cache_dtype", "")).startswith("fp8"):
        yield r.diag("fp8 KV cache over NIXL P/D has been reported to corrupt output for this model family",
                     ctx.sloc(p, "kv_cache_dtype", value=True),
                     help="use `kv_cache_dtype: auto` on both stages, or compare outputs against a non-PD run first")


@rule("OPD607", "block-size", Severity.ERROR,
      "block sizes of prefill and decode are not compatible for the connector",
      fail=_pair_yaml("MooncakeConnector", ", block_size: 16", ", block_size: 32"),
      passing=_pair_yaml("MooncakeConnector", ", block_size: 16", ", block_size: 16"), labels=("XS-BLOCK",))
def block_size(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """``block_size`` must be equal on both sides, except NIXL 0.13+ where decode's may
    be a multiple of prefill's (not with ``kv_buffer_device: cpu``). For a hybrid model
    (``--model-info``) with different P/D layouts and no pinned ``block_size`` the
    physical block size may differ (observed 16 vs 32): warning. Sources: vLLM
    ``vllm/distributed/kv_transfer/kv_connector/utils.py`` ``TransferTopology.block_size_ratio``,
    ``v1/nixl/base_worker.py`` ("Heterogeneous block sizes are not supported with host
    buffer");
    https://github.com/vllm-project/vllm/issues/42895."""
    pair = ctx.pd_pair
    if pair is None or not (pair[0].kv and pair[1].kv):
        return
    p, d = pair
    pb, db = ctx.setting(p, "block_size"), ctx.setting(d, "block_size")
    # the pair's connector: prefill's, else decode's (as hetero_tp_problem reads it)
    name = str(p.kv.get("kv_connector") or d.kv.get("kv_connector") or "")  # type: ignore[union-attr]
    if pb is not None and db is not None and str(pb) != str(db):
        try:
            nixl_multiple = name.startswith("Nixl") and ctx.target.version >= (0, 13) and int(db) % int(pb) == 0
            ok = nixl_multiple and str((p.kv or {}).get("kv_buffer_device")) != "cpu"
        except (TypeError, ValueError, ZeroDivisionError):
            ok = False
        if not ok:
            yield r.diag(f"block_size {pb} (prefill) and {db} (decode) are not compatible for {name}",
                         ctx.sloc(d, "block_size", value=True),
                         related=[ctx.sloc(p, "block_size", value=True, label=f"prefill block_size {pb}")],
                         help=f"write `block_size: {pb}` on both stages")
        return
    if ctx.model is not None and ctx.model.is_hybrid and (pb is None or db is None):
        layouts = (ctx.stage_tp(p), ctx.stage_dp(p), p.settings.get("enable_expert_parallel")) != \
                  (ctx.stage_tp(d), ctx.stage_dp(d), d.settings.get("enable_expert_parallel"))
        if layouts:
            yield r.diag("hybrid model with different P/D layouts: the physical block size may differ (observed 16 vs 32)",
                         ctx.sloc(d, "block_size") if db is None else ctx.sloc(p, "block_size"),
                         severity=Severity.WARNING, related=[ctx.sloc(p, label="prefill")],
                         help="pin the same `block_size:` on both stages")


def _lmc_rx(init: str, alloc: str) -> str:  # pragma: no mutate block (runs at import only)
    """An LMCache PD pair at TP 2 whose decode (receiver) lists ``init``/``alloc`` peer ports."""
    return ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
            "  - {stage_id: 0, devices: \"0,1\", tensor_parallel_size: 2, kv_transfer_config: {kv_connector: LMCacheConnectorV1, "
            "kv_role: kv_producer, engine_id: p, kv_connector_extra_config: {lmcache.enable_pd: true, lmcache.pd_role: sender, "
            "lmcache.pd_proxy_host: localhost, lmcache.pd_proxy_port: 7500, lmcache.pd_buffer_size: 1073741824, "
            "lmcache.pd_buffer_device: cuda}}}\n"
            "  - {stage_id: 1, devices: \"2,3\", tensor_parallel_size: 2, kv_transfer_config: {kv_connector: LMCacheConnectorV1, "
            "kv_role: kv_consumer, engine_id: d, kv_connector_extra_config: {lmcache.enable_pd: true, lmcache.pd_role: receiver, "
            f"lmcache.pd_peer_host: localhost, lmcache.pd_peer_init_port: {init}, lmcache.pd_peer_alloc_port: {alloc}, "
            "lmcache.pd_buffer_size: 1073741824, lmcache.pd_buffer_device: cuda}}}\n")


@rule("OPD608", "extra-config-required", Severity.ERROR,
      "kv_connector_extra_config lacks a key the connector requires",
      fail=_pair_yaml("MoRIIOConnector", p_kv=", kv_connector_extra_config: {http_port: 8100}",
                      d_kv=", kv_connector_extra_config: {http_port: 8200, handshake_port: 6301, notify_port: 6401}"),
      passing=_pair_yaml("MoRIIOConnector", p_kv=", kv_connector_extra_config: {http_port: 8100, handshake_port: 6300, notify_port: 6400}",
                         d_kv=", kv_connector_extra_config: {http_port: 8200, handshake_port: 6301, notify_port: 6401}"),
      example_context={"vllm_version": "0.18"}, labels=("SCH-EXTRA-REQUIRED",),
      examples=(
          Example("LMCache PD receiver at TP 2 with one peer port per list", _lmc_rx("[7300]", "[7400]"), True,
                  contains="lists 1 port"),
          Example("LMCache PD receiver at TP 2 with one port per rank", _lmc_rx("[7300, 7301]", "[7400, 7401]"), False),
          Example("LMCache peer port as a scalar in kv_connector_extra_config", _lmc_rx("7300", "[7400, 7401]"), True,
                  contains="is not a list"),
      ))
def extra_required(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """Per connector required ``kv_connector_extra_config`` keys: P2pNcclConnector with a
    proxy (``proxy_ip``/``proxy_port``) needs ``http_port`` (= the instance's API port);
    MoRIIOConnector needs ``http_port``, ``handshake_port`` and ``notify_port`` (KeyError
    at start otherwise). LMCacheConnectorV1: LMCache's PD peer ports
    (``lmcache.pd_peer_init_port``, ``lmcache.pd_peer_alloc_port``, ``pd_peer_query_port``,
    the older ``nixl_peer_*`` names, or their ``LMCACHE_*`` variables) are lists with one
    port per worker rank of the stage that reads them (TP x PP): a shorter list is an
    IndexError at start on the first rank past its end, and in ``kv_connector_extra_config``
    a scalar is set as written and cannot be indexed. Sources: vLLM ``v1/moriio/moriio_common.py``
    ``MoRIIOConfig`` (0.18+), ``v1/p2p/p2p_nccl_engine.py`` (0.11-0.22),
    ``lmcache_integration/vllm_v1_adapter.py`` (``lmcache.`` keys); LMCache
    ``lmcache/v1/storage_backend/pd_backend.py`` ``PDConfig.from_cache_engine_config``,
    ``lmcache/v1/config.py`` ``_to_int_list``;
    https://github.com/vllm-project/vllm/pull/26628, LMCache/LMCache#1381, #1966."""
    yield from _lmcache_rank_ports(ctx, r)
    for n in _kv_nodes(ctx):
        kv = n.kv or {}
        name = kv.get("kv_connector")
        extra = kv.get("kv_connector_extra_config") or {}
        need: tuple[str, ...] = REQUIRED_EXTRA.get(name, ())
        if name == "P2pNcclConnector" and (extra.get("proxy_ip") or extra.get("proxy_port")):
            need = ("http_port",)
        for key in need:
            if extra.get(key) in (None, ""):
                yield r.diag(f"stage {n.stage_id}: {name} requires kv_connector_extra_config.{key}",
                             ctx.sloc(n, "kv_transfer_config", "kv_connector_extra_config"),
                             help=f"add `{key}: <port>`" + (" (the instance's API --port)" if key == "http_port" else ""))


def _lmcache_rank_ports(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """OPD608 for LMCache's per-rank port lists (ports.py :data:`LMCACHE_RANK_PORTS`):
    each needs one entry per worker of the stage that reads it (TP x PP ranks; LMCache
    indexes it with the worker's rank), and in ``kv_connector_extra_config`` it must be a
    YAML list (the adapter sets ``lmcache.*`` values as written; a scalar is indexed and
    fails at start). A longer list is fine (the extra entries are unread)."""
    from omni_pd.check.rules.ports import lmcache_rank_ports

    for n in _kv_nodes(ctx):
        tp, pp = ctx.stage_tp(n), ctx.stage_pp(n)
        ranks = tp * pp
        what = f"TP {tp}" + (f" x PP {pp}" if pp > 1 else "")
        for rp in lmcache_rank_ports(n):
            loc = ctx.sloc(n, *rp.keys, value=True)
            path = rp.keys[-1]
            if rp.ports is None:
                yield r.diag(f"stage {n.stage_id}: {path} = {rp.raw!r} is not a list; vLLM's LMCache adapter sets "
                             f"lmcache.* values as written and LMCache indexes this one by worker rank (TypeError at start)",
                             loc, help=f"write `{path}: {_port_list(rp.raw, ranks)}` (one port per rank, {what})")
            elif len(rp.ports) < ranks:
                yield r.diag(f"stage {n.stage_id} ({what}): {path} lists {len(rp.ports)} port"
                             f"{'' if len(rp.ports) == 1 else 's'}; LMCache's PD backend takes one per worker rank "
                             f"(rank {len(rp.ports)} fails with IndexError at start)",
                             loc, help=f"list {ranks}, e.g. `{path}: {_port_list(rp.ports[0] if rp.ports else None, ranks)}`")


def _port_list(first: Any, n: int) -> str:
    """``[first, first+1, ...]`` with ``n`` entries (``[<port>, ...]`` when ``first`` is no port)."""
    try:
        base = int(str(first).split(",")[0].strip())
    except ValueError:
        return "[" + ", ".join(["<port>"] * n) + "]"
    return "[" + ", ".join(str(base + i) for i in range(n)) + "]"


@rule("OPD609", "kv-field-unsupported", Severity.ERROR,
      "a kv_transfer_config key is not accepted by the target vLLM",
      fail=_pair_yaml("NixlConnector", p_kv=", kv_buffer_size: 1.0e9", d_kv=", kv_buffer_size: 1.0e9"),
      passing=_pair_yaml("NixlConnector"), example_context={"vllm_version": "0.32"})
def kv_field(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """From vLLM 0.18 KVTransferConfig forbids unknown keys (hard error at start); 0.32
    removed ``kv_ip``, ``kv_rank``, ``kv_parallel_size`` and ``kv_buffer_size``. On older
    versions unknown keys are silently ignored (warning). Sources: vLLM
    ``vllm/config/kv_transfer.py`` ``KVTransferConfig`` (fields per version),
    ``vllm/config/utils.py`` ``config`` (``extra="forbid"``)."""
    tgt = ctx.target
    if tgt.version < (0, 11):
        return
    allowed = tgt.kv_fields()
    sev = Severity.ERROR if tgt.rejects_unknown_kv_keys else Severity.WARNING
    for n in _kv_nodes(ctx):
        for key in (n.kv or {}):
            if key in allowed:
                continue
            if tgt.kv_field_known(key):
                msg = f"stage {n.stage_id}: `{key}` was removed from KVTransferConfig in vLLM 0.32 (target {tgt.label})"
                help_ = f"remove `{key}`" + (" (vllm-omni reads the Mooncake address from kv_connector_extra_config / env)" if key == "kv_ip" else "")
            else:
                close = get_close_matches(str(key), sorted(allowed), n=1)
                msg = f"stage {n.stage_id}: `{key}` is not a KVTransferConfig field"
                help_ = f"did you mean `{close[0]}`?" if close else "move connector options under kv_connector_extra_config"
            yield r.diag(msg, ctx.sloc(n, "kv_transfer_config", key), severity=sev, help=help_)


@rule("OPD610", "vllm-kv-config", Severity.ERROR,
      "vLLM's own KVTransferConfig rejects this kv_transfer_config (only when vLLM is installed)",
      fail=_pair_yaml("NixlConnector", p_kv=", kv_load_failure_policy: sometimes"),
      passing=_pair_yaml("NixlConnector"))
def vllm_kv_config(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """When ``vllm`` is importable, each ``kv_transfer_config`` is also built with
    ``vllm.config.KVTransferConfig(**kv)``; its validation error is shown at the stage's
    ``kv_transfer_config``. Without vLLM this rule checks nothing (its example tests
    are skipped, or run against a stand-in class); with a vLLM that is installed but
    fails to import it says so once, as an info at the first ``kv_transfer_config``,
    instead of passing silently. Source: vLLM config/kv_transfer.py."""
    nodes = _kv_nodes(ctx)
    if not nodes:
        return
    kv_cls, broken = _vllm_kv_class()
    if broken is not None:
        yield r.diag(f"vLLM is installed but `from vllm.config import KVTransferConfig` failed ({broken}): "
                     "kv_transfer_config was not checked by vLLM", ctx.sloc(nodes[0], "kv_transfer_config"),
                     severity=Severity.INFO,
                     help="repair the vLLM install (`python -c 'import vllm.config'` shows the error), "
                          "or uninstall it to check without vLLM")
        return
    if kv_cls is None:
        return
    for n in nodes:
        try:
            kv_cls(**dict(n.kv or {}))
        except Exception as e:  # pydantic ValidationError, ValueError, TypeError
            first = str(e).strip().splitlines()
            yield r.diag(f"stage {n.stage_id}: vLLM rejects kv_transfer_config: {first[0] if first else type(e).__name__}",
                         ctx.sloc(n, "kv_transfer_config"), notes=first[1:4],
                         help="fix the field vLLM names (see `omni-pd explain OPD609` for removed fields)")


def _vllm_kv_class() -> tuple[Any, str | None]:
    """``(vllm.config.KVTransferConfig, None)``; ``(None, None)`` when vLLM is not
    installed; ``(None, "<error type>: <message>")`` when it is installed but the import
    fails (a broken install: missing torch, ABI mismatch)."""
    import importlib.util

    try:
        if importlib.util.find_spec("vllm") is None:
            return None, None
        from vllm.config import KVTransferConfig  # type: ignore[import-not-found]
    except Exception as e:  # ImportError, or anything vLLM's import raises
        return None, f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}".rstrip(": ")
    return KVTransferConfig, None


#: kv_buffer_device values a connector accepts, per platform and from which vLLM version
#: (vLLM v1/nixl/utils.py ``_NIXL_SUPPORTED_DEVICE``). Connectors not listed are not checked.
BUFFER_DEVICES = {
    "NixlConnector": [
        ("cuda", (0, 11), ("cuda",)), ("cuda", (0, 13), ("cuda", "cpu")),
        ("rocm", (0, 11), ("cuda",)), ("rocm", (0, 13), ("cuda", "cpu")),
        ("xpu", (0, 11), ("cpu",)), ("xpu", (0, 18), ("cpu", "xpu")),
    ],
}


@rule("OPD611", "kv-buffer-device", Severity.ERROR,
      "kv_buffer_device is not one the connector supports on this platform and vLLM version",
      fail=_pair_yaml("NixlConnector", p_kv=", kv_buffer_device: cpu", d_kv=", kv_buffer_device: cpu"),
      passing=_pair_yaml("NixlConnector", p_kv=", kv_buffer_device: cuda", d_kv=", kv_buffer_device: cuda"),
      example_context={"vllm_version": "0.11"})
def kv_buffer_device(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """NixlConnector's ``kv_buffer_device``: on CUDA/ROCm ``cuda`` only in vLLM 0.11,
    ``cuda`` or ``cpu`` (host staging) from 0.13; on XPU ``cpu``, and ``xpu`` too from
    0.18. Source: vLLM ``vllm/distributed/kv_transfer/kv_connector/v1/nixl/utils.py``
    ``_NIXL_SUPPORTED_DEVICE``, checked in ``v1/nixl/base_worker.py`` (0.24+; in
    ``v1/nixl_connector.py`` for 0.11-0.13)."""
    for n in _kv_nodes(ctx):
        kv = n.kv or {}
        dev = kv.get("kv_buffer_device")
        table = BUFFER_DEVICES.get(str(kv.get("kv_connector")))
        if dev is None or table is None:
            continue
        plat = _platform(ctx, n)
        allowed = None
        for p, since, vals in table:
            if p == plat and ctx.target.version >= since:
                allowed = vals
        if allowed is not None and str(dev) not in allowed:
            yield r.diag(f"stage {n.stage_id}: {kv.get('kv_connector')} on {plat} with vLLM {ctx.target.label} "
                         f"accepts kv_buffer_device {' or '.join(allowed)}, not {dev}",
                         ctx.sloc(n, "kv_transfer_config", "kv_buffer_device", value=True),
                         help=f"write `kv_buffer_device: {allowed[0]}`")


# --- pipeline parallelism per connector, side and version (CAP-PP) -------------------


def _pp_table() -> dict[str, Any]:
    """``presets/targets/kv_pp.yaml``: connector -> rows (see the file's header)."""
    from omni_pd.resources import data_dir, load_data

    return dict(load_data(data_dir("presets") / "targets" / "kv_pp.yaml")["connectors"])


def pp_fact(name: str, version: tuple[int, int]) -> dict[str, Any] | None:
    """The kv_pp.yaml row for connector ``name`` on vLLM ``version`` (None: no row).

    Shape: ``{prefill: bool | None, decode: bool | None, requires: [...], why, fix,
    sources}``; ``same_as`` names are followed."""
    table = _pp_table()
    rows = table.get(name)
    for _ in range(3):
        if isinstance(rows, dict) and rows.get("same_as"):
            rows = table.get(rows["same_as"])
    out = None
    for row in rows if isinstance(rows, list) else []:
        if version >= _v(row["since"]):
            out = row
    return out


def loaded_connectors(kv: dict[str, Any]) -> list[str]:
    """The connector names a stage's ``kv_transfer_config`` loads: the connector, or every
    MultiConnector child (vLLM ``MultiConnector`` builds each child; per-connector facts
    such as PP support and HMA, ``MultiConnector.all_children_support_hma``, apply to all
    of them). ``[]`` when no name is given."""
    name = kv.get("kv_connector")
    if name == "MultiConnector":
        kids = (kv.get("kv_connector_extra_config") or {}).get("connectors")
        return [str(c["kv_connector"]) for c in kids if isinstance(c, dict) and c.get("kv_connector")] \
            if isinstance(kids, list) else []
    return [str(name)] if name else []


def _pd_sides(ctx: Context) -> list[tuple["StageNode", str]]:
    """(stage, side) for every KV stage: the PD pair's roles, else the stage's kv_role
    (kv_both counts as both sides)."""
    pair = ctx.pd_pair
    out: list[tuple["StageNode", str]] = []
    for n in _kv_nodes(ctx):
        role = (n.kv or {}).get("kv_role")
        if pair is not None and n is pair[0]:
            out.append((n, "prefill"))
        elif pair is not None and n is pair[1]:
            out.append((n, "decode"))
        elif role == "kv_producer":
            out.append((n, "prefill"))
        elif role == "kv_consumer":
            out.append((n, "decode"))
        elif role == "kv_both":
            out += [(n, "prefill"), (n, "decode")]
    return out


_PP = ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
       "  - {{stage_id: 0, devices: \"{pd}\", pipeline_parallel_size: {pp}, kv_transfer_config: {{kv_connector: {c}, kv_role: kv_producer, engine_id: p{pe}}}}}\n"
       "  - {{stage_id: 1, devices: \"{dd}\", pipeline_parallel_size: {dp}, kv_transfer_config: {{kv_connector: {c}, kv_role: kv_consumer, engine_id: d{de}}}}}\n")


def _pp_yaml(c: str, pp: int, dp: int, pe: str = "", de: str = "") -> str:  # pragma: no mutate block (runs at import only)
    pd = ",".join(str(i) for i in range(pp))
    dd = ",".join(str(i) for i in range(pp, pp + dp))
    return _PP.format(c=c, pp=pp, dp=dp, pd=pd, dd=dd, pe=pe, de=de)


_ASCEND_PEER = ", kv_connector_extra_config: {{prefill: {{tp_size: 1, dp_size: 1{p}}}, decode: {{tp_size: 1, dp_size: 1}}}}"


@rule("OPD612", "pp-unsupported", Severity.ERROR,
      "the KV connector does not support pipeline parallelism on this side (prefill / decode) in this vLLM",
      fail=_pp_yaml("NixlConnector", 2, 2), passing=_pp_yaml("NixlPushConnector", 2, 1),
      example_context={"vllm_version": "0.30"}, labels=("CAP-PP",),
      examples=(
          Example("pull NIXL, PP on prefill only", _pp_yaml("NixlConnector", 2, 1), True, {"vllm_version": "0.30"},
                  contains="stage 0 PP 2"),
          Example("NixlPullConnector is the pull connector", _pp_yaml("NixlPullConnector", 1, 2), True,
                  {"vllm_version": "0.30"}, contains="stage 1 PP 2"),
          Example("push NIXL, PP on decode", _pp_yaml("NixlPushConnector", 1, 2), True, {"vllm_version": "0.30"},
                  contains="stage 1 PP 2"),
          Example("push NIXL PP prefill with a hybrid model", _pp_yaml("NixlPushConnector", 2, 1), True,
                  {"vllm_version": "0.30", "model": {"attention": "hybrid"}}, contains="hybrid"),
          Example("push NIXL PP prefill before the release with PR #45880: unknown", _pp_yaml("NixlPushConnector", 2, 1),
                  True, {"vllm_version": "0.26"}, severity=Severity.INFO, contains="45880"),
          Example("Mooncake on 0.30 takes PP on both sides", _pp_yaml("MooncakeConnector", 2, 2), False,
                  {"vllm_version": "0.30"}),
          Example("unknown connector PP: info only", _pp_yaml("LMCacheConnectorV1", 2, 1), True,
                  {"vllm_version": "0.30"}, severity=Severity.INFO),
          Example("PP 1 everywhere is never checked", _pp_yaml("NixlConnector", 1, 1), False, {"vllm_version": "0.30"}),
          Example("global --pipeline-parallel-size counts", _pp_yaml("NixlConnector", 1, 1), True,
                  {"vllm_version": "0.30", "cli": {"pipeline_parallel_size": 2}}),
          Example("MultiConnector child NixlConnector", _pp_yaml("MultiConnector", 2, 1,
                  pe=", kv_connector_extra_config: {connectors: [{kv_connector: NixlConnector, kv_role: kv_producer}]}",
                  de=", kv_connector_extra_config: {connectors: [{kv_connector: NixlConnector, kv_role: kv_consumer}]}"),
                  True, {"vllm_version": "0.30"}),
          Example("vllm-ascend Mooncake: decode PP", _pp_yaml("MooncakeConnectorV1", 1, 2), True,
                  {"vllm_version": "0.30", "platform": "npu"}),
          Example("vllm-ascend Mooncake: PP prefill without pp_size in the peer block",
                  _pp_yaml("MooncakeConnectorV1", 2, 1, pe=_ASCEND_PEER.format(p="")), True,
                  {"vllm_version": "0.30", "platform": "npu"}, contains="pp_size"),
          Example("vllm-ascend Mooncake: PP prefill with pp_size in the peer block",
                  _pp_yaml("MooncakeConnectorV1", 2, 1, pe=_ASCEND_PEER.format(p=", pp_size: 2"),
                           de=_ASCEND_PEER.format(p=", pp_size: 2")), False,
                  {"vllm_version": "0.30", "platform": "npu"}),
      ))
def pp_unsupported(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """Pipeline parallelism (``pipeline_parallel_size`` > 1, per stage or the global
    flag) per KV connector, PD side and vLLM release, from
    ``presets/targets/kv_pp.yaml``: the pull-mode ``NixlConnector`` (=
    ``NixlPullConnector``) takes PP 1 on both sides (it reads from pipeline rank 0
    only; decode PP raises NotImplementedError); ``NixlPushConnector`` takes PP > 1
    on prefill only, from the release with vLLM PR #45880 (0.30 has it; earlier: info),
    not with hybrid (HMA) models; vLLM's ``MooncakeConnector`` takes PP on both sides
    in 0.30; vllm-ascend's ``MooncakeConnectorV1``/``MooncakeLayerwiseConnector`` take
    PP on prefill only and need the real ``pp_size`` in the ``prefill``/``decode``
    peer blocks. A connector or release without a row gives an info, not an error.
    MultiConnector is checked through its children. Sources:
    https://github.com/vllm-project/vllm/issues/22430,
    https://github.com/vllm-project/vllm/issues/52913,
    https://github.com/vllm-project/vllm/pull/45880; vLLM 0.30.0
    kv_connector/v1/nixl/base_worker.py, nixl/pull_worker.py,
    mooncake/mooncake_connector.py; vllm-ascend Mooncake connector worker."""
    if ctx.target.version < (0, 11):
        return
    bad: dict[str, list[tuple["StageNode", str, int, dict]]] = {}
    for n, side in _pd_sides(ctx):
        pp = ctx.parallel(n)["pipeline_parallel_size"]
        if pp <= 1:
            continue
        for name in loaded_connectors(n.kv or {}):
            row = pp_fact(name, ctx.target.version)
            ok = row.get(side) if row is not None else None
            loc = _pp_loc(ctx, n)
            if ok is None:
                why = (f"; {row['why']}" if row and row.get("why") else "")
                srcs = ", ".join(s for s in (row or {}).get("sources", []) if s.startswith("http"))
                yield r.diag(f"stage {n.stage_id} ({side}) runs pipeline_parallel_size {pp} over {name}: omni-pd has no "
                             f"pipeline-parallel fact for {name} on the {side} side in vLLM {ctx.target.label}{why}",
                             loc, severity=Severity.INFO,
                             help="check the connector's PP support for your release before launch" +
                                  (f" ({srcs})" if srcs else ""))
            elif ok is False:
                bad.setdefault(name, []).append((n, side, pp, row))  # type: ignore[arg-type]
            else:
                yield from _pp_requires(ctx, r, n, side, pp, name, row)  # type: ignore[arg-type]
    for name, hits in bad.items():
        row = hits[0][3]
        sides = sorted({s for _, s, _, _ in hits})
        # a kv_both stage (both sides) or a child named twice is one stage: name and relate it once
        once: dict[int, tuple["StageNode", str, int]] = {}
        for n, s, pp, _ in hits:
            once.setdefault(n.stage_id, (n, s, pp))
        stages = list(once.values())
        where = ", ".join(f"stage {n.stage_id} PP {pp}" for n, _, pp in stages)
        on = "" if row.get("prefill") is False and row.get("decode") is False else " on " + " and ".join(sides)
        first = hits[0][0]
        yield r.diag(f"{name} does not support pipeline_parallel_size > 1{on} in vLLM {ctx.target.label} ({where})",
                     _pp_loc(ctx, first),
                     related=[_pp_loc(ctx, n, label=f"stage {n.stage_id} ({s}) PP {pp}") for n, s, pp in stages[1:]],
                     notes=[row["why"]] if row.get("why") else [],
                     help=row.get("fix") or "use pipeline_parallel_size 1 with this connector")


def _pp_loc(ctx: Context, n: "StageNode", label: str | None = None):
    from omni_pd.diagnostics import Location

    if "pipeline_parallel_size" in ctx.cli:
        return Location(file="<command line>", path=("pipeline_parallel_size",), label=label)
    return ctx.sloc(n, "pipeline_parallel_size", value=True, label=label)


def _pp_requires(ctx: Context, r: Rule, n: "StageNode", side: str, pp: int, name: str,
                 row: dict[str, Any]) -> Iterable[Diagnostic]:
    """The conditions of a supported PP row (``requires`` in kv_pp.yaml)."""
    req = row.get("requires") or []
    if "no_hybrid" in req and ctx.model is not None and ctx.model.is_hybrid:
        yield r.diag(f"stage {n.stage_id} ({side}): {name} with pipeline_parallel_size {pp} does not support hybrid "
                     "(HMA) KV cache layouts", _pp_loc(ctx, n),
                     help="use pipeline_parallel_size 1 for this hybrid model (scale with tensor_parallel_size)")
    if "peer_pp_size" in req and ctx.pd_pair is not None:
        for m in ctx.pd_pair:
            blk = ((m.kv or {}).get("kv_connector_extra_config") or {}).get(side)
            if not isinstance(blk, dict):
                continue  # no peer blocks at all: OPD311 and vllm-ascend's defaults apply
            have = blk.get("pp_size")
            if have is None or str(have) != str(pp):
                yield r.diag(f"stage {m.stage_id}: kv_connector_extra_config.{side}.pp_size is "
                             f"{'missing' if have is None else have} but the {side} stage {n.stage_id} runs "
                             f"pipeline_parallel_size {pp}; {name} maps ranks from it",
                             ctx.sloc(m, "kv_transfer_config", "kv_connector_extra_config", side, "pp_size"),
                             help=f"write `pp_size: {pp}` in the `{side}` block on both stages")


# --- LMCacheConnectorV1 as the PD transport (CAP-LMCACHE-PD) -------------------------

_LMC = ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
        "  - {{stage_id: 0, devices: \"0\"{pe}, kv_transfer_config: {{kv_connector: LMCacheConnectorV1, kv_role: kv_producer{px}}}}}\n"
        "  - {{stage_id: 1, devices: \"1\"{de}, kv_transfer_config: {{kv_connector: LMCacheConnectorV1, kv_role: kv_consumer{dx}}}}}\n")


def _lmc(pe: str = "", de: str = "", px: str = "", dx: str = "") -> str:  # pragma: no mutate block (runs at import only)
    return _LMC.format(pe=pe, de=de, px=px, dx=dx)


_REDIS = ", env: {{LMCACHE_REMOTE_URL: \"{u}\"}}"
_TWO_HOSTS = {"inventory": {"hosts": {"host-a": {"address": "10.0.0.1"}, "host-b": {"address": "10.0.0.2"}},
                            "placement": {"0": "host-a", "1": "host-b"}}}


def _lmcache_sides(ctx: Context) -> "tuple[StageNode, StageNode] | None":
    """The PD pair when LMCacheConnectorV1 is its transfer connector (MultiConnector:
    the only child that could move KV)."""
    from omni_pd.compile.connectors import lmcache

    pair = ctx.pd_pair
    if pair is None or not (pair[0].kv and pair[1].kv):
        return None
    names = set(loaded_connectors(pair[0].kv)) | set(loaded_connectors(pair[1].kv))
    movers = {n for n in names if n not in ("OffloadingConnector", "SimpleCPUOffloadConnector", "LMCacheMPConnector")}
    return pair if movers and movers <= lmcache.NAMES else None


def lmcache_verdict(ctx: Context) -> Any:
    """:class:`omni_pd.compile.connectors.lmcache.Verdict` for the pair, or None when
    LMCache is not the pair's transfer connector."""
    from omni_pd.compile.connectors import lmcache

    pair = _lmcache_sides(ctx)
    if pair is None:
        return None
    p, d = pair

    def side(n: "StageNode") -> Any:
        kv = n.kv or {}
        kids = (kv.get("kv_connector_extra_config") or {}).get("connectors")
        if kv.get("kv_connector") == "MultiConnector" and isinstance(kids, list):
            kv = next((c for c in kids if isinstance(c, dict) and c.get("kv_connector") in lmcache.NAMES), kv)
        return lmcache.side_config(kv, {**ctx.env, **n.env})

    return lmcache.transport(side(p), side(d), ctx.host_of(p) == ctx.host_of(d))


@rule("OPD613", "lmcache-pd-transport", Severity.ERROR,
      "an LMCacheConnectorV1 PD pair has no LMCache transport (PD mode or one shared remote backend)",
      fail=_lmc(), passing=_lmc(pe=_REDIS.format(u="redis://kv-store:6379"), de=_REDIS.format(u="redis://kv-store:6379")),
      example_context=_TWO_HOSTS, labels=("CAP-LMCACHE-PD",),
      examples=(
          Example("PD mode through lmcache.* extra config", _lmc(
              px=", kv_connector_extra_config: {lmcache.enable_pd: true, lmcache.pd_role: sender}",
              dx=", kv_connector_extra_config: {lmcache.enable_pd: true, lmcache.pd_role: receiver}"), False, _TWO_HOSTS),
          Example("PD mode through LMCACHE_* env", _lmc(
              pe=", env: {LMCACHE_ENABLE_PD: \"True\", LMCACHE_PD_ROLE: sender}",
              de=", env: {LMCACHE_ENABLE_PD: \"True\", LMCACHE_PD_ROLE: receiver}"), False, _TWO_HOSTS),
          Example("PD mode with reversed pd_role", _lmc(
              px=", kv_connector_extra_config: {lmcache.enable_pd: true, lmcache.pd_role: receiver}",
              dx=", kv_connector_extra_config: {lmcache.enable_pd: true, lmcache.pd_role: sender}"), True, _TWO_HOSTS,
              contains="pd_role sender on prefill"),
          Example("PD mode on one side only", _lmc(
              px=", kv_connector_extra_config: {lmcache.enable_pd: true, lmcache.pd_role: sender}"), True, _TWO_HOSTS,
              contains="one side only"),
          Example("different remote backends", _lmc(pe=_REDIS.format(u="redis://a:6379"), de=_REDIS.format(u="redis://b:6379")),
                  True, _TWO_HOSTS, contains="different LMCache remote backends"),
          Example("loopback remote backend across two hosts", _lmc(
              pe=_REDIS.format(u="redis://localhost:6379"), de=_REDIS.format(u="redis://localhost:6379")), True, _TWO_HOSTS,
              contains="loopback"),
          Example("loopback remote backend on one host", _lmc(
              pe=_REDIS.format(u="redis://localhost:6379"), de=_REDIS.format(u="redis://localhost:6379")), False),
          Example("launcher environment shared by both engines", _lmc(), False,
                  {"env": {"LMCACHE_REMOTE_URL": "redis://kv-store:6379"}}),
          Example("LMCACHE_CONFIG_FILE: not readable here, info", _lmc(
              pe=", env: {LMCACHE_CONFIG_FILE: /etc/lmc-p.yaml}", de=", env: {LMCACHE_CONFIG_FILE: /etc/lmc-d.yaml}"), True,
              _TWO_HOSTS, severity=Severity.INFO),
          Example("no transport on one host either", _lmc(), True, contains="no LMCache PD mode"),
          Example("the LMCache maintainers' shape: NIXL hands off, LMCacheMPConnector reuses", _PD.replace(
              "qwen3_omni_moe_pd", "llm_pd") +
              "  - {stage_id: 0, devices: \"0\", kv_transfer_config: {kv_connector: MultiConnector, kv_role: kv_producer, "
              "kv_connector_extra_config: {connectors: [{kv_connector: NixlConnector, kv_role: kv_producer}, "
              "{kv_connector: LMCacheMPConnector, kv_role: kv_producer}]}}}\n"
              "  - {stage_id: 1, devices: \"1\", kv_transfer_config: {kv_connector: MultiConnector, kv_role: kv_consumer, "
              "kv_connector_extra_config: {connectors: [{kv_connector: NixlConnector, kv_role: kv_consumer}, "
              "{kv_connector: LMCacheMPConnector, kv_role: kv_consumer}]}}}\n", False, _TWO_HOSTS),
      ))
def lmcache_pd_transport(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """``kv_role`` alone does not make LMCacheConnectorV1 move KV between engines: each
    engine's LMCache backends are its own. A PD pair over it needs LMCache's PD mode
    (``enable_pd: true`` on both, ``pd_role: sender`` on prefill and ``receiver`` on
    decode, and a proxy that gives prefill LMCache's ``disagg_spec``) or one remote
    backend both sides reach (the same ``remote_url`` / ``LMCACHE_REMOTE_URL``, not a
    loopback address across hosts). Without either, answers stay right and decode
    recomputes every prompt. Settings are read from the stage and launcher
    environment (``LMCACHE_*``) and ``kv_connector_extra_config`` ``lmcache.*`` keys;
    an ``LMCACHE_CONFIG_FILE`` omni-pd cannot read gives an info. The LMCache
    maintainers' supported shape is MultiConnector(NixlConnector, LMCacheMPConnector),
    which this rule leaves alone. Sources: https://github.com/volcano-sh/kthena/issues/1069,
    https://github.com/LMCache/LMCache/issues/4614; vLLM 0.30.0
    kv_connector/v1/lmcache_integration/vllm_v1_adapter.py (``lmcache.`` extra keys,
    ``disagg_spec``) and utils.py (``LMCACHE_CONFIG_FILE``, environment)."""
    v = lmcache_verdict(ctx)
    if v is None:
        return
    p, d = ctx.pd_pair  # type: ignore[misc]
    two = ctx.host_of(p) != ctx.host_of(d)
    where = ctx.sloc(p, "kv_transfer_config", "kv_connector", value=True)
    rel = [ctx.sloc(d, "kv_transfer_config", "kv_connector", value=True, label="decode")]
    if v.transport == "unknown":
        yield r.diag("LMCacheConnectorV1 PD pair: the LMCache transport is set in LMCACHE_CONFIG_FILE, which omni-pd "
                     "does not read", where, severity=Severity.INFO, related=rel,
                     help="make sure the files set enable_pd with pd_role sender/receiver, or the same remote_url on both sides")
    elif v.transport == "none":
        hosts = " on two hosts" if two else ""
        yield r.diag(f"LMCacheConnectorV1 P/D pair{hosts} with no LMCache PD mode (enable_pd/pd_role) and no shared remote "
                     "backend: decode recomputes every prompt", where, related=rel,
                     help="use MultiConnector with NixlConnector (P->D handoff) and LMCacheMPConnector (reuse), or set "
                          "LMCache PD mode (lmcache.enable_pd: true, lmcache.pd_role: sender / receiver) with LMCache's PD "
                          "proxy, or one shared backend (the same LMCACHE_REMOTE_URL on both sides)")
    elif v.problem:
        yield r.diag(f"LMCacheConnectorV1 P/D pair: {v.problem}", where, related=rel,
                     help="set enable_pd on both with pd_role sender (prefill) / receiver (decode)" if v.transport == "pd"
                     else "point both sides at one remote backend both hosts reach (same LMCACHE_REMOTE_URL)")


# --- encoder-cache transfer (CAP-EC-REGISTRY, EC keys) -------------------------------
# OPD614 and OPD615 run on every platform of ``--all-platforms``: an overlay may set a stage's
# ``ec_transfer_config`` (validate merges a finding the base platform already made).


def _ec_facts() -> dict[str, Any]:
    from omni_pd.compile.ec_connectors.base import ec_facts

    return ec_facts()


def ec_fact(name: str, version: tuple[int, int]) -> dict[str, Any] | None:
    """The ec_connectors.yaml row of EC connector ``name`` for vLLM ``version``, or None
    (not registered in that release, or unknown): :func:`omni_pd.compile.ec_connectors.base.ec_row`."""
    from omni_pd.compile.ec_connectors.base import ec_row

    return ec_row(name, version)


def _ec_nodes(ctx: Context) -> list[tuple["StageNode", dict[str, Any]]]:
    if ctx.topology is None:
        return []
    return [(n, n.settings["ec_transfer_config"]) for n in ctx.topology.stages
            if isinstance(n.settings.get("ec_transfer_config"), dict)]


_EC = ("stages:\n"
       "  - {{stage_id: 0, devices: \"0\", mm_encoder_only: true{pe}, ec_transfer_config: {{ec_connector: {c}, ec_role: {pr}{px}}}}}\n"
       "  - {{stage_id: 1, devices: \"1\"{de}, ec_transfer_config: {{ec_connector: {c}, ec_role: {dr}{dx}}}}}\n")


def _ec(c: str = "ECExampleConnector", pr: str = "ec_producer", dr: str = "ec_consumer", px: str = "", dx: str = "",
        pe: str = "", de: str = "") -> str:  # pragma: no mutate block (runs at import only)
    return _EC.format(c=c, pr=pr, dr=dr, px=px, dx=dx, pe=pe, de=de)


_CPU_OK = ", ec_connector_extra_config: {ec_cpu_bytes: 1073741824, ec_enable_nixl: true}"


@rule("OPD614", "ec-connector", Severity.ERROR,
      "ec_transfer_config names an EC connector, role or option the target vLLM does not have (or ignores)",
      fail=_ec(c="ECCPUConnector", px=", ec_connector_extra_config: {ec_enable_nixl: true}",
               dx=", ec_connector_extra_config: {ec_enable_nixl: true}"),
      passing=_ec(c="ECCPUConnector", px=_CPU_OK, dx=_CPU_OK), example_context={"vllm_version": "0.29"},
      pass_context={"vllm_version": "0.30"}, labels=("CAP-EC-REGISTRY",),
      examples=(
          Example("connector not in this release", _ec(c="ECMooncakeConnector"), True, {"vllm_version": "0.29"},
                  contains="not registered"),
          Example("misspelt connector", _ec(c="ECExampleConnectr"), True, {"vllm_version": "0.30"},
                  contains="did you mean ECExampleConnector"),
          Example("pre-release name", _ec(c="ECSharedStorageConnector"), True, {"vllm_version": "0.30"},
                  contains="it is ECExampleConnector"),
          Example("module path loads an out-of-tree connector", _ec(
              c="MyEC", px=", ec_connector_module_path: my.ec", dx=", ec_connector_module_path: my.ec"), False,
              {"vllm_version": "0.30"}),
          Example("ec_connector without ec_role", _ec().replace(", ec_role: ec_consumer", ""), True,
                  {"vllm_version": "0.30"}, contains="no ec_role"),
          Example("unknown ec_role", _ec(dr="ec_reader"), True, {"vllm_version": "0.30"}, contains="ec_reader"),
          Example("consumer fed by no producer", _ec(pr="ec_consumer"), True, {"vllm_version": "0.30"},
                  contains="no ec_producer"),
          Example("producer with no consumer downstream", _ec(dr="ec_producer"), True, {"vllm_version": "0.30"},
                  severity=Severity.WARNING, contains="no ec_consumer"),
          Example("ec_both feeds itself and the next stage", _ec(pr="ec_both"), False, {"vllm_version": "0.30"}),
          Example("ECCPUConnector 0.30 needs ec_cpu_bytes", _ec(c="ECCPUConnector"), True, {"vllm_version": "0.30"},
                  contains="ec_cpu_bytes"),
          Example("ECCPUConnector with the V1 model runner forced", _ec(
              c="ECCPUConnector", px=_CPU_OK, dx=_CPU_OK, de=", env: {VLLM_USE_V2_MODEL_RUNNER: \"0\"}"), True,
              {"vllm_version": "0.30"}, contains="V2 model runner"),
          Example("ECMooncakeConnector producer with TP 2", _ec(c="ECMooncakeConnector").replace(
              'devices: "0", mm_encoder_only', 'devices: "0,1", tensor_parallel_size: 2, mm_encoder_only'), True,
              {"vllm_version": "0.30"}, contains="tensor_parallel_size 1"),
          Example("EC before vLLM 0.13", _ec(), True, {"vllm_version": "0.11"}, contains="0.13"),
      ))
def ec_connector(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """Encoder disaggregation (E -> PD) through ``ec_transfer_config``, per vLLM release
    (``presets/targets/ec_connectors.yaml``): the ``ec_connector`` must be registered
    (ECExampleConnector 0.13+, ECCPUConnector 0.29+, ECMooncakeConnector in 0.30) unless
    ``ec_connector_module_path`` loads it; ``ec_role`` is required and one of
    ec_producer / ec_consumer / ec_both; every ec_consumer needs an ec_producer (or
    ec_both) among the stages feeding it, and a producer with no consumer downstream
    moves nothing (warning). Per connector: an option the release ignores is an error,
    because the transfer is then a silent no-op (``ec_enable_nixl`` on 0.29: every item
    is re-encoded; it arrives with vLLM PR #47941 in 0.30); keys it refuses to start
    without (ECCPUConnector 0.30: ``ec_cpu_bytes``); ECCPUConnector needs the V2 model
    runner (``VLLM_USE_V2_MODEL_RUNNER=0`` is refused); ECMooncakeConnector producers run
    TP = PP = DP = 1. Sources: vLLM 0.30.0 config/ec_transfer.py,
    distributed/ec_transfer/ec_connector/factory.py, cpu/connector.py, cpu/common.py,
    cpu/scheduler/__init__.py, mooncake/config.py; https://github.com/llm-d/llm-d/issues/2535,
    https://github.com/vllm-project/vllm/pull/47941."""
    nodes = _ec_nodes(ctx)
    if not nodes:
        return
    tgt = ctx.target
    facts = _ec_facts()
    roles = tuple(facts["ec_roles"])
    if tgt.version < (0, 13):
        n, _ = nodes[0]
        yield r.diag(f"ec_transfer_config (encoder disaggregation) arrived in vLLM 0.13; the target is {tgt.label}",
                     ctx.sloc(n, "ec_transfer_config"), help="target vLLM 0.13 or later, or remove ec_transfer_config")
        return
    known = sorted(facts["connectors"])
    for n, ec in nodes:
        name = ec.get("ec_connector")
        role = ec.get("ec_role")
        if name and role is None:
            yield r.diag(f"stage {n.stage_id}: ec_connector is set but there is no ec_role (vLLM refuses to start)",
                         ctx.sloc(n, "ec_transfer_config"), help="add `ec_role: ec_producer` (encoder) or `ec_role: ec_consumer`")
        elif role is not None and role not in roles:
            close = get_close_matches(str(role), roles, n=1, cutoff=0.5)
            yield r.diag(f"stage {n.stage_id}: unsupported ec_role `{role}`",
                         ctx.sloc(n, "ec_transfer_config", "ec_role", value=True),
                         help=(f"did you mean `{close[0]}`? " if close else "") + "ec_role is one of " + ", ".join(roles))
        if not name or ec.get("ec_connector_module_path"):
            continue
        row = ec_fact(str(name), tgt.version)
        where = ctx.sloc(n, "ec_transfer_config", "ec_connector", value=True)
        if row is None:
            rows = facts["connectors"].get(name)
            if rows:
                yield r.diag(f"stage {n.stage_id}: {name} is not registered in vLLM {tgt.label} (added in vLLM {rows[0]['since']})",
                             where, help="pick an EC connector your vLLM has: " + ", ".join(
                                 c for c in known if ec_fact(c, tgt.version)))
            elif (facts.get("renames") or {}).get(name):
                new = facts["renames"][name]
                yield r.diag(f"stage {n.stage_id}: {name} is not registered; it is {new}", where,
                             help=f"write `ec_connector: {new}`")
            else:
                close = get_close_matches(str(name), known, n=1, cutoff=0.6)
                yield r.diag(f"stage {n.stage_id}: unknown ec_connector `{name}`" + (f"; did you mean {close[0]}?" if close else ""),
                             where, help=f"write `ec_connector: {close[0]}`" if close else
                             "set ec_connector_module_path for an out-of-tree EC connector")
            continue
        extra = ec.get("ec_connector_extra_config") or {}
        for key, why in (row.get("not_read") or {}).items():
            if key in extra:
                yield r.diag(f"stage {n.stage_id}: ec_connector_extra_config.{key} is not read by {name} in vLLM {tgt.label}: "
                             f"{why}", ctx.sloc(n, "ec_transfer_config", "ec_connector_extra_config", key),
                             help=f"target the release that reads {key}, or use an EC connector that moves encoder "
                                  "outputs on this release (ECExampleConnector with a shared directory)")
        for key in row.get("required") or []:
            if extra.get(key) in (None, "", 0):
                yield r.diag(f"stage {n.stage_id}: {name} in vLLM {tgt.label} requires ec_connector_extra_config.{key}",
                             ctx.sloc(n, "ec_transfer_config", "ec_connector_extra_config"),
                             help=f"add `{key}: <bytes>` (the CPU region size for encoder outputs)" if key.endswith("bytes")
                             else f"add `{key}:`")
        if row.get("needs_v2_runner"):
            v2 = {**ctx.env, **n.env}.get("VLLM_USE_V2_MODEL_RUNNER")
            runner = ctx.raw_at(("model_runner",))
            if (v2 is not None and str(v2).strip().lower() in ("0", "false", "no")) or runner == "v1":
                yield r.diag(f"stage {n.stage_id}: {name} requires the V2 model runner, which is switched off here",
                             ctx.sloc(n, "env", "VLLM_USE_V2_MODEL_RUNNER") if v2 is not None else ctx.loc(("model_runner",)),
                             help="set VLLM_USE_V2_MODEL_RUNNER=1 (and no `model_runner: v1`)")
        if row.get("producer_single_rank") and role in ("ec_producer", "ec_both"):
            par = ctx.parallel(n)
            for key in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
                if par[key] > 1:
                    yield r.diag(f"stage {n.stage_id}: {name} producers need {key} 1 (got {par[key]})",
                                 ctx.sloc(n, key, value=True), help=f"run the encoder stage with `{key}: 1`")
    yield from _ec_roles_along_edges(ctx, r, nodes)


def _ec_roles_along_edges(ctx: Context, r: Rule, nodes: list) -> Iterable[Diagnostic]:
    """Every ec_consumer has a producer upstream; every producer a consumer downstream."""
    topo = ctx.topology
    role = {n.stage_id: ec.get("ec_role") for n, ec in nodes}
    ups: dict[int, set[int]] = {}
    for n in topo.stages:  # type: ignore[union-attr]
        seen: set[int] = set()
        todo = list(n.input_sources)
        while todo:
            s = todo.pop()
            if s in seen:
                continue
            seen.add(s)
            up = topo.node(s)  # type: ignore[union-attr]
            todo += list(up.input_sources) if up is not None else []
        ups[n.stage_id] = seen
    producers = {s for s, ro in role.items() if ro in ("ec_producer", "ec_both")}
    for n, ec in nodes:
        ro = ec.get("ec_role")
        if ro == "ec_consumer" and not (ups[n.stage_id] & producers):
            yield r.diag(f"stage {n.stage_id} is an ec_consumer but no ec_producer feeds it (upstream: "
                         f"{', '.join(map(str, sorted(ups[n.stage_id]))) or 'none'})",
                         ctx.sloc(n, "ec_transfer_config", "ec_role", value=True),
                         help="make the encoder-only stage upstream of it `ec_role: ec_producer`")
        if ro == "ec_producer":
            downstream = [s for s, u in ups.items() if n.stage_id in u and role.get(s) in ("ec_consumer", "ec_both")]
            if not downstream:
                yield r.diag(f"stage {n.stage_id} is an ec_producer but no ec_consumer is downstream of it: "
                             "its encoder outputs go nowhere", ctx.sloc(n, "ec_transfer_config", "ec_role", value=True),
                             severity=Severity.WARNING, help="give the stage that consumes its outputs `ec_role: ec_consumer`")


@rule("OPD615", "ec-key-unknown", Severity.WARNING,
      "an ec_transfer_config key or EC connector option is not known to the target vLLM",
      fail=_ec(c="ECCPUConnector", px=", ec_connector_extra_config: {ec_cpu_bytes: 1073741824, num_ec_blocks: 880}",
               dx=", ec_connector_extra_config: {ec_cpu_bytes: 1073741824}"),
      passing=_ec(c="ECCPUConnector", px=_CPU_OK, dx=_CPU_OK), example_context={"vllm_version": "0.30"},
      labels=("SCH-UNKNOWN-KEY",),
      examples=(
          Example("misspelt option", _ec(px=", ec_connector_extra_config: {shared_storage_pth: /tmp/ec}"), True,
                  {"vllm_version": "0.30"}, contains="`shared_storage_pth` is not an option"),
          Example("unknown ec_transfer_config field is an error from 0.18", _ec(px=", ec_bufer_size: 1.0e9"), True,
                  {"vllm_version": "0.30"}, severity=Severity.ERROR, contains="`ec_bufer_size` is not"),
          Example("unknown field only ignored before 0.18", _ec(px=", ec_bufer_size: 1.0e9"), True,
                  {"vllm_version": "0.13"}, contains="ec_bufer_size"),
          Example("ec_rank removed in 0.32", _ec(px=", ec_rank: 0"), True, {"vllm_version": "0.32"},
                  severity=Severity.ERROR, contains="removed"),
          Example("options not pinned for the release are not reported", _ec(
              c="ECCPUConnector", px=", ec_connector_extra_config: {ec_cpu_bytes: 1}"), False, {"vllm_version": "0.29"}),
      ))
def ec_key_unknown(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """``ec_transfer_config`` keys must be ECTransferConfig fields of the target release
    (from 0.18 an unknown key stops the server: error; before, it is ignored: warning;
    ``ec_rank``/``ec_parallel_size`` were removed in 0.32), and
    ``ec_connector_extra_config`` keys should be options the connector reads in that
    release: an unread key does nothing (``num_ec_blocks`` only ever existed in a fork,
    vLLM PR #42998). Releases whose option list omni-pd has not pinned are not
    checked. Sources: vLLM 0.30.0 config/ec_transfer.py, ec_connector/*
    (``get_from_extra_config`` calls); https://github.com/llm-d/llm-d/issues/2535."""
    nodes = _ec_nodes(ctx)
    if not nodes or ctx.target.version < (0, 13):
        return
    facts = _ec_facts()
    tgt = ctx.target
    fields = {k: f for k, f in facts["ec_transfer_config_fields"].items()}
    live = sorted(k for k, f in fields.items() if tgt.version >= _v(f["since"]) and
                  (not f.get("removed") or tgt.version < _v(f["removed"])))
    strict = tgt.rejects_unknown_kv_keys  # same @config(extra="forbid") switch as KVTransferConfig
    never = facts.get("never_upstream") or {}
    for n, ec in nodes:
        for key in ec:
            if key in live:
                continue
            if key in fields:
                msg = f"stage {n.stage_id}: ec_transfer_config.{key} was removed in vLLM {fields[key]['removed']} (target {tgt.label})"
                help_ = f"remove `{key}`"
            else:
                close = get_close_matches(str(key), live, n=1, cutoff=0.75)
                msg = f"stage {n.stage_id}: `{key}` is not an ECTransferConfig field"
                help_ = f"did you mean `{close[0]}`?" if close else "move connector options under ec_connector_extra_config"
            yield r.diag(msg, ctx.sloc(n, "ec_transfer_config", key), help=help_,
                         severity=Severity.ERROR if strict else Severity.WARNING)
        name = ec.get("ec_connector")
        row = ec_fact(str(name), tgt.version) if name else None
        extra = ec.get("ec_connector_extra_config") or {}
        if row is None or not isinstance(extra, dict):
            continue
        keys = row.get("extra_keys")
        ignored_later = set(row.get("not_read") or {})
        for key in extra:
            if key in ignored_later:
                continue  # OPD614's finding
            loc = ctx.sloc(n, "ec_transfer_config", "ec_connector_extra_config", key)
            if key in never:
                yield r.diag(f"stage {n.stage_id}: {key} is not an option of {name} ({never[key]})", loc,
                             help=f"remove `{key}`")
            elif keys is not None and key not in keys:
                close = get_close_matches(str(key), keys, n=1, cutoff=0.75)
                yield r.diag(f"stage {n.stage_id}: `{key}` is not an option {name} reads in vLLM {tgt.label}", loc,
                             help=f"did you mean `{close[0]}`?" if close else f"{name} reads: " + ", ".join(keys))
