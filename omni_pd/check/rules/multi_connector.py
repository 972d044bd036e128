"""MultiConnector rules (OPD602, capability family): the children a stage's
MultiConnector loads, which of them carries the P->D handoff, and the combinations known
broken per vLLM release (presets/targets/multi_connector.yaml, read by
:func:`_multi_facts`). Sources: vLLM
``vllm/distributed/kv_transfer/kv_connector/v1/multi_connector.py`` and the case reports
named in the rule (issue 38 split it out of omni_pd/check/rules/capability.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from omni_pd.diagnostics import Diagnostic, Severity
from omni_pd.check.rules import Context, Example, Rule, rule
from omni_pd.check.rules.capability import ALIASES, _kv_nodes, _platform, _v, connector_label, connector_row

if TYPE_CHECKING:
    from omni_pd.compile.topology import StageNode


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
    finding. Facts: ``presets/targets/multi_connector.yaml``, keyed on vLLM's classes: the
    wrapper and each child are judged as the class they load (``capability.connector_row``), so
    an out-of-tree ``MultiConnector`` is not checked and a child another package's
    ``kv_connector_module_path`` loads is no handoff, cache or layout row of vLLM's (the
    ``broken`` rows match LMCache's own copies by name, as above).
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
        if connector_row(ctx, n) != "MultiConnector":
            continue  # vLLM's MultiConnector (vllm-ascend's on npu), not a same-named out-of-tree class
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
            # a module path bypasses the registry, so the platform's alias does not apply
            alias = None if c.get("kv_connector_module_path") else ALIASES.get((plat, name))
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
    # the facts key on vLLM's classes: each child's loaded class (its own module path), named
    # in messages as written (or which package's class a module path loads)
    rows = [connector_row(ctx, n, c) for c in kids]
    names = [connector_label(ctx, n, c) for c in kids]
    handoff = [i for i, x in enumerate(rows) if x in facts["handoff"]]
    cache = [i for i, x in enumerate(rows) if x in facts["cache"]]
    base = ("kv_transfer_config", "kv_connector_extra_config", "connectors")
    if len(handoff) > 1:
        a, b = handoff[0], handoff[1]
        yield r.diag(f"stage {n.stage_id}: MultiConnector has two P->D handoff children ({names[a]}, {names[b]}): both return "
                     f"kv_transfer_params, which {ctx.release_words()} {_params_refusal(ctx, facts)}; decode loads "
                     "from one of them only",
                     ctx.sloc(n, *base, b, "kv_connector", value=True), severity=Severity.ERROR,
                     related=[ctx.sloc(n, *base, a, "kv_connector", value=True, label="first handoff child")],
                     help=f"keep one handoff connector ({names[a]}); use the others as cache/offload children only")
    role = (n.kv or {}).get("kv_role")
    pair = ctx.pd_pair
    is_decode = (pair is not None and n is pair[1]) or role == "kv_consumer"
    if handoff:
        yield from _broken_combinations(ctx, r, n, kids, rows[handoff[0]], facts, prefill=not is_decode)
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
    for x, shown_as in zip(rows, names):
        f = layouts.get(x)
        if f is None or (mla and f.get("mla") == "none"):
            continue
        need.setdefault(f["layout"], shown_as)
    if len(need) > 1:
        shown = ", ".join(f"{x} {lay}" for lay, x in need.items())
        yield r.diag(f"stage {n.stage_id}: MultiConnector children require different KV cache layouts ({shown}): "
                     f"{ctx.release_words()} stops with \"KV cache layout mismatch\"",
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
                             f"{ctx.release_words()} lies between the releases read, so this is not pinned",
                             loc, severity=Severity.INFO, help=f"check that your vLLM has {row['sources'][-1]}")
            elif c.get("kv_connector_module_path") and row.get("fixed_out_of_tree"):
                yield r.diag(f"{what} (loaded from {c['kv_connector_module_path']}) on {ctx.release_words()}: "
                             f"{row['symptom']}, unless that copy has {row['fixed_out_of_tree']}", loc,
                             severity=Severity.WARNING,
                             help=f"use a release of it with {row['fixed_out_of_tree']}, or vLLM {row['first_fixed_read']}+")
            else:
                yield r.diag(f"{what} on {ctx.release_words()}: {row['symptom']} ({', '.join(row['sources'])})", loc,
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
