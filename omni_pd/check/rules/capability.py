"""Connector capability rules (OPD6xx) per (connector, vLLM version, platform): the
connector registry (OPD601) and the KV fields a connector reads (OPD604-OPD611), with the
helpers the family's other modules share. One module per capability family (issue 38),
beside this one in omni_pd/check/rules/: multi_connector (OPD602), hetero_tp (OPD603),
pipeline_parallel (OPD612), lmcache_pd (OPD613), ec_connector (OPD614-OPD615), encoder
(OPD616-OPD619) and the one-rule modules (hybrid_state, known_broken, nixl_lease,
draft_kv, context_parallel).

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
#: Required kv_connector_extra_config keys (vLLM v1/moriio/moriio_common.py ``MoRIIOConfig``:
#: ``int(extra_config["http_port"])``). ``handshake_port`` and ``notify_port`` are not required:
#: ``MoRIIOConnector.__init__`` fills them first (``_set_port_defaults``: 6301 and 61005) in every
#: release with MoRIIO (0.18.0, 0.24.0, 0.29.0, 0.30.0, 0.33.0, 0.34.0 wheels; issue 35 audit).
REQUIRED_EXTRA = {"MoRIIOConnector": ("http_port",)}

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


def connector_row(ctx: Context, node: "StageNode", kv: dict | None = None) -> str:
    """The name the per-connector tables key on for the connector ``node`` loads (``kv``: its
    ``kv_transfer_config``, or a MultiConnector child): vLLM's registry name for vLLM's own class,
    vllm-ascend's registered name for a class loaded from ``vllm_ascend.*``
    (``MooncakeConnectorV1``), else ``"<module path>:<class>"``, which no vLLM row matches; ``""``
    without a connector. So ``kv_connector: MooncakeConnector`` with another package's
    ``kv_connector_module_path`` is not judged by vLLM's MooncakeConnector row
    (:func:`omni_pd.compile.connectors.identity.identify`; vLLM ``KVConnectorFactory``)."""
    ident = connector_ident(ctx, node, kv)
    return ident.name if ident is not None else ""


def connector_ident(ctx: Context, node: "StageNode", kv: dict | None = None) -> Any:
    """The :class:`~omni_pd.compile.connectors.identity.ConnectorIdentity` ``node`` (or ``kv``)
    loads on the platform it runs on; None without a connector."""
    from omni_pd.compile.connectors.identity import identify

    return identify(node.kv if kv is None else kv, _platform(ctx, node))


def connector_label(ctx: Context, node: "StageNode", kv: dict | None = None) -> str:
    """How a message names the connector ``node`` loads (``kv``: as for :func:`connector_row`):
    ``kv_connector`` as the user wrote it, or ``ConnectorIdentity.describe()`` when a
    ``kv_connector_module_path`` loads another package's class of that name (``"vllm-ascend's
    MooncakeConnectorV1 (MooncakeConnector from vllm_ascend....)"``); ``""`` without one."""
    ident = connector_ident(ctx, node, kv)
    if ident is None:
        return ""
    return ident.class_name if ident.module_path is None or ident.is_vllm else ident.describe()


def connector_contract(ctx: Context, node: "StageNode", kv: dict | None = None) -> Any:
    """The ``omni_pd.compile.connectors`` contract (router protocol, routing fields, ports) of
    the connector ``node`` loads, by its :func:`connector_row`: vLLM's MooncakeConnector for
    the registry name, vllm-ascend's pull connector (``MooncakeConnectorV1``) for
    ``MooncakeConnector`` from ``vllm_ascend.distributed.kv_transfer.kv_p2p.mooncake_connector``;
    None for a class omni-pd has no contract for (an out-of-tree module path)."""
    from omni_pd.compile import connectors

    row = connector_row(ctx, node, kv)
    return connectors.get(row) if row else None


def loaded_rows(ctx: Context, node: "StageNode") -> list[tuple[str, str]]:
    """``(row, label)`` per connector ``node``'s ``kv_transfer_config`` loads: the connector, or
    every MultiConnector child (each with its own ``kv_connector_module_path``), ``row`` as
    :func:`connector_row` names it and ``label`` as :func:`connector_label` does. ``[]`` when
    no name is given."""
    kv = node.kv or {}
    kids = (kv.get("kv_connector_extra_config") or {}).get("connectors")
    if kv.get("kv_connector") == "MultiConnector":
        kvs = [c for c in kids if isinstance(c, dict) and c.get("kv_connector")] if isinstance(kids, list) else []
    else:
        kvs = [kv] if kv.get("kv_connector") else []
    return [(connector_row(ctx, node, c), connector_label(ctx, node, c)) for c in kvs]


def same_connector(ctx: Context, a: "StageNode", b: "StageNode") -> bool:
    """Whether the two stages load the same connector class: the same :func:`connector_row`
    (``kv_connector`` and the package ``kv_connector_module_path`` loads it from). Two sides
    with one ``kv_connector`` but different packages' module paths are different connectors,
    which vLLM's handshake refuses (vLLM ``KVConnectorFactory``)."""
    return connector_row(ctx, a) == connector_row(ctx, b)


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
            why = "is not a V1 connector" if hist is None else f"is not registered in {ctx.release_words()}"
            yield r.diag(f"stage {n.stage_id}: {name} {why}; did you mean {alts}?",
                         ctx.sloc(n, "kv_transfer_config", "kv_connector", value=True),
                         help=f"write `kv_connector: {renames[name][0]}`")
        elif hist is not None:
            when = (f"added in vLLM {hist['since']}" if hist.get("since") and tgt.version < _v(hist["since"])
                    else f"removed in vLLM {hist.get('removed')}")
            yield r.diag(f"stage {n.stage_id}: {name} is not available in {ctx.release_words()} ({when})",
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
                 f"(the release for {ctx.release_words()}){where}",
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
        name = connector_row(ctx, n)
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
    name = connector_row(ctx, p)
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
    be a multiple of prefill's (not with ``kv_buffer_device: cpu``, and from 0.18, when prefill
    TP may exceed decode TP, not with prefill TP > decode TP for a non-MLA model: "Different
    local/remote block sizes are not supported when P TP > D TP", ``v1/nixl/base_worker.py``
    in the 0.18.0-0.34.0 wheels; error when ``--model-info`` says the model is not MLA, warning
    when the model is unknown). For a hybrid model
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
    name = connector_row(ctx, p) or connector_row(ctx, d)
    if pb is not None and db is not None and str(pb) != str(db):
        try:
            nixl_multiple = name.startswith("Nixl") and ctx.target.version >= (0, 13) and int(db) % int(pb) == 0
            ok = nixl_multiple and str((p.kv or {}).get("kv_buffer_device")) != "cpu"
        except (TypeError, ValueError, ZeroDivisionError):
            ok = False
        m = ctx.model
        if ok and ctx.target.version >= (0, 18) and ctx.stage_tp(p) > ctx.stage_tp(d) and \
                not (m is not None and (m.is_mla or m.is_hybrid)):
            # decode reads a split of each prefill block: NIXL asserts "Different local/remote block
            # sizes are not supported when P TP > D TP" for non-MLA attention (0.18.0-0.34.0 wheels)
            known = m is not None and m.attention is not None
            yield r.diag(f"block_size {pb} (prefill) and {db} (decode) with prefill TP {ctx.stage_tp(p)} > decode TP "
                         f"{ctx.stage_tp(d)}: {name} needs equal block sizes when prefill TP is larger"
                         + ("" if known else " (unless the model uses MLA; pass --model-info to tell)"),
                         ctx.sloc(d, "block_size", value=True),
                         severity=Severity.ERROR if known else Severity.WARNING,
                         related=[ctx.sloc(p, "block_size", value=True, label=f"prefill block_size {pb}")],
                         help=f"write `block_size: {pb}` on both stages")
            return
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
      fail=_pair_yaml("MoRIIOConnector", p_kv=", kv_connector_extra_config: {handshake_port: 6300}",
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
    MoRIIOConnector needs ``http_port`` (KeyError at start otherwise; ``handshake_port`` and
    ``notify_port`` default to 6301 and 61005). LMCacheConnectorV1: LMCache's PD peer ports
    (``lmcache.pd_peer_init_port``, ``lmcache.pd_peer_alloc_port``, ``pd_peer_query_port``,
    the older ``nixl_peer_*`` names, or their ``LMCACHE_*`` variables) are lists with one
    port per worker rank of the stage that reads them (TP x PP): a shorter list is an
    IndexError at start on the first rank past its end, and in ``kv_connector_extra_config``
    a scalar is set as written and cannot be indexed. Sources: vLLM ``v1/moriio/moriio_common.py``
    ``MoRIIOConfig`` and ``moriio_connector.py`` ``_set_port_defaults`` (0.18-0.34), ``v1/p2p/p2p_nccl_engine.py`` (0.11-0.22),
    ``lmcache_integration/vllm_v1_adapter.py`` (``lmcache.`` keys); LMCache
    ``lmcache/v1/storage_backend/pd_backend.py`` ``PDConfig.from_cache_engine_config``,
    ``lmcache/v1/config.py`` ``_to_int_list``;
    https://github.com/vllm-project/vllm/pull/26628, LMCache/LMCache#1381, #1966."""
    yield from _lmcache_rank_ports(ctx, r)
    for n in _kv_nodes(ctx):
        kv = n.kv or {}
        name = connector_row(ctx, n)
        extra = kv.get("kv_connector_extra_config") or {}
        need: tuple[str, ...] = REQUIRED_EXTRA.get(name, ())
        if name == "P2pNcclConnector" and (extra.get("proxy_ip") or extra.get("proxy_port")):
            need = ("http_port",)
        for key in need:
            if extra.get(key) in (None, ""):
                yield r.diag(f"stage {n.stage_id}: {name} requires kv_connector_extra_config.{key}",
                             ctx.sloc(n, "kv_transfer_config", "kv_connector_extra_config"),
                             help=f"add `{key}: <port>` (the instance's API --port)")


def _lmcache_rank_ports(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """OPD608 for LMCache's per-rank port lists (omni_pd/compile/connectors/lmcache.py :data:`LMCACHE_RANK_PORTS`):
    each needs one entry per worker of the stage that reads it (TP x PP ranks; LMCache
    indexes it with the worker's rank), and in ``kv_connector_extra_config`` it must be a
    YAML list (the adapter sets ``lmcache.*`` values as written; a scalar is indexed and
    fails at start). A longer list is fine (the extra entries are unread)."""
    from omni_pd.compile.connectors.lmcache import lmcache_rank_ports

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
            hist = tgt.kv_field_history(key)
            if hist.get("removed"):
                msg = (f"stage {n.stage_id}: `{key}` was removed from KVTransferConfig in vLLM {hist['removed']}; "
                       f"judged for {ctx.release_words()}")
                help_ = f"remove `{key}`" + (" (vllm-omni reads the Mooncake address from kv_connector_extra_config / env)" if key == "kv_ip" else "")
            elif hist:
                msg = (f"stage {n.stage_id}: `{key}` is a KVTransferConfig field from vLLM {hist['since']} on; "
                       f"judged for {ctx.release_words()}")
                help_ = f"remove `{key}`, or pass --vllm-version {hist['since']} or later if the engines run it"
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
        table = BUFFER_DEVICES.get(connector_row(ctx, n))
        if dev is None or table is None:
            continue
        plat = _platform(ctx, n)
        allowed = None
        for p, since, vals in table:
            if p == plat and ctx.target.version >= since:
                allowed = vals
        if allowed is not None and str(dev) not in allowed:
            yield r.diag(f"stage {n.stage_id}: {kv.get('kv_connector')} on {plat} with {ctx.release_words()} "
                         f"accepts kv_buffer_device {' or '.join(allowed)}, not {dev}",
                         ctx.sloc(n, "kv_transfer_config", "kv_buffer_device", value=True),
                         help=f"write `kv_buffer_device: {allowed[0]}`")
