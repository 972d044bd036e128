"""Port rules (OPD5xx), per host: unique bound ranges, env/extra-config agreement,
routable addresses across hosts, valid port numbers.

What each connector binds comes from its contract (``omni_pd/compile/connectors``: NIXL side
channel ``[base, base + span)`` with the span per vLLM version, Mooncake bootstrap) plus
the connectors listed here. Sources: vLLM ``vllm/envs.py`` (``VLLM_NIXL_SIDE_CHANNEL_PORT``,
``VLLM_MOONCAKE_BOOTSTRAP_PORT``), ``kv_connector/v1/nixl/`` and ``v1/mooncake/``; vllm-omni
``vllm_omni/engine/stage_runtime.py`` ``_prepare_replica_vllm_config`` (per-replica
ports); the case reports named per rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable

from omni_pd.diagnostics import Diagnostic, Location, Severity
from omni_pd.check.rules import Context, Example, Rule, rule
from omni_pd.compile.connectors.lmcache import lmcache_rank_ports
from omni_pd.compile.versions import runtime_release

if TYPE_CHECKING:
    from omni_pd.compile.topology import StageNode

#: P2pNcclConnector's kv_port default (vLLM KVTransferConfig).
DEFAULT_KV_PORT = 14579
#: HCCL host-socket base port when HCCL_IF_BASE_PORT is unset (Ascend CANN default).
HCCL_DEFAULT_BASE = 60000
LOCAL = ("localhost", "127.0.0.1", "::1", "0.0.0.0", "")


@dataclass(frozen=True)
class Bound:
    """``[port, port + span)`` bound on its host by replica ``replica`` of stage ``node``
    (``replicas``: how many engines the stage starts)."""

    node: "StageNode"
    port: int
    span: int
    purpose: str
    loc: Location
    replica: int = 0
    replicas: int = 1

    @property
    def who(self) -> str:
        return f"stage {self.node.stage_id}" + (f" replica {self.replica}" if self.replicas > 1 else "")


def runtime_of(ctx: Context) -> str:
    """``vllm-omni`` or ``vllm``: which runtime reads the config, the topology's
    ``Pipeline.runtime`` (one of the two for every catalogued pipeline and for validate's
    stand-in chains). Callers check ``ctx.topology`` first."""
    return ctx.topology.pipeline.runtime  # type: ignore[union-attr]


def _as_port(v: Any) -> int | None:
    try:
        return int(str(v).strip())
    except (TypeError, ValueError):
        return None


def _side(n: "StageNode") -> str:
    if n.pd_role:
        return n.pd_role
    return "decode" if (n.kv or {}).get("kv_role") == "kv_consumer" else "prefill"


def bound_ports(ctx: Context, n: "StageNode") -> list[Bound]:
    """Every port range stage ``n`` binds on its host (per engine; ranks included). The
    connector's ports are the loaded class's (``capability.connector_contract`` /
    ``connector_row``): ``kv_connector: MooncakeConnector`` from vllm-ascend's module path binds
    vllm-ascend's ``kv_port`` range, not vLLM's bootstrap port; an out-of-tree class binds no
    port omni-pd knows."""
    from omni_pd.check.rules.capability import connector_contract, connector_label, connector_row
    from omni_pd.compile.connectors.base import launched_replicas

    out: list[Bound] = []
    kv = n.kv or {}
    row, name = connector_row(ctx, n), connector_label(ctx, n)
    tp, pp, dp = ctx.stage_tp(n), ctx.stage_pp(n), ctx.stage_dp(n)
    c = connector_contract(ctx, n)
    if c is not None and ctx.target.version >= (0, 11):
        runtime = runtime_of(ctx)
        reps = launched_replicas(n.num_replicas)
        for pu in c.ports(_side(n), kv, n.env, tp, dp, ctx.target, runtime=runtime, replicas=reps):
            if pu.span <= 0:
                continue
            if pu.key and ("." in pu.key or pu.key == "kv_port"):  # a kv_transfer_config path
                loc = ctx.sloc(n, "kv_transfer_config", *pu.key.split("."), value=True)
            elif pu.key:
                loc = ctx.sloc(n, "env", pu.key, value=True)
            else:
                loc = ctx.sloc(n, "kv_transfer_config", "kv_connector", value=True)
            purpose = pu.purpose if pu.key or "default" in pu.purpose else f"{pu.purpose} ({pu.env} default)"
            out.append(Bound(n, pu.port, pu.span, purpose, loc, pu.replica, reps))
    elif row in ("P2pNcclConnector", "MooncakeConnectorV1", "MooncakeLayerwiseConnector"):
        port = _as_port(kv.get("kv_port", DEFAULT_KV_PORT))
        if port is not None:
            span = tp * pp * (1 if row == "P2pNcclConnector" else dp)
            out.append(Bound(n, port, max(span, 1), f"kv_port + rank ({name})",
                             ctx.sloc(n, "kv_transfer_config", "kv_port", value=True)))
    p = _as_port(n.settings.get("port"))  # None when unset
    if p is not None:
        out.append(Bound(n, p, 1, "API server --port", ctx.sloc(n, "port", value=True)))
    if row == "P2pNcclConnector":  # vLLM's p2p_nccl_connector.py serves its own http_port
        p = _as_port((kv.get("kv_connector_extra_config") or {}).get("http_port"))
        if p is not None and not any(b.purpose.startswith("API") and b.port == p for b in out):
            out.append(Bound(n, p, 1, "API server (http_port)",
                             ctx.sloc(n, "kv_transfer_config", "kv_connector_extra_config", "http_port", value=True)))
    if _on_npu(ctx, n) and isinstance(n.devices, tuple) and tp * pp * dp > 1:
        raw = n.env.get("HCCL_IF_BASE_PORT")
        p = _as_port(raw) if raw is not None else HCCL_DEFAULT_BASE
        if p is not None:
            loc = ctx.sloc(n, "env", "HCCL_IF_BASE_PORT", value=True) if raw is not None else ctx.sloc(n, "devices")
            out.append(Bound(n, p, 1, "HCCL listener (HCCL_IF_BASE_PORT" + (")" if raw is not None else " default)"), loc))
    return out


def port_range(port: int, span: int) -> str:
    """``[port, port + span)`` as the port rules print it: ``30000`` for one port,
    ``30000-30003`` for four."""
    return f"{port}" if span <= 1 else f"{port}-{port + span - 1}"


def _on_npu(ctx: Context, n: "StageNode") -> bool:
    if ctx.platform:
        return ctx.platform == "npu"
    if ctx.inventory is not None:
        h = ctx.inventory.host(ctx.host_of(n))
        return bool(h and h.accelerator == "npu")
    return False


_PD = "pipeline: qwen3_omni_moe_pd\nasync_chunk: false\nstages:\n"


@rule("OPD501", "port-conflict", Severity.ERROR,
      "two stages on one host bind overlapping port ranges",
      fail=(_PD + "  - {stage_id: 0, devices: \"0\", env: {VLLM_NIXL_SIDE_CHANNEL_PORT: \"5600\"}, kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer, engine_id: p}}\n"
            "  - {stage_id: 1, devices: \"1\", env: {VLLM_NIXL_SIDE_CHANNEL_PORT: \"5600\"}, kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_consumer, engine_id: d}}\n"),
      passing=(_PD + "  - {stage_id: 0, devices: \"0\", env: {VLLM_NIXL_SIDE_CHANNEL_PORT: \"5600\"}, kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer, engine_id: p}}\n"
               "  - {stage_id: 1, devices: \"1\", env: {VLLM_NIXL_SIDE_CHANNEL_PORT: \"5601\"}, kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_consumer, engine_id: d}}\n"),
      labels=("PORT-UNIQUE", "PORT-RANGE"))
def port_conflict(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """Per host, every port range an engine binds must be disjoint from every other
    range bound there, its own other ones included (an API port on its own side-channel
    port fails to bind like one of another stage): NIXL side channel ``[base, base + dp)`` (0.13+; ``dp x tp`` on 0.11),
    Mooncake bootstrap, P2pNccl ``kv_port + rank`` (each engine's ranks start at 0, so
    two engines with one ``kv_port`` collide), vllm-ascend ``kv_port`` ranges, HCCL
    listeners of multi-rank NPU engines (``HCCL_IF_BASE_PORT``), API ports. Without an
    inventory all stages are taken to share one host. Sources:
    https://github.com/vllm-project/vllm/issues/44061,
    https://github.com/vllm-project/vllm/pull/26628,
    https://github.com/vllm-project/vllm-ascend/issues/4725,
    https://github.com/vllm-project/vllm-ascend/issues/11968."""
    if ctx.topology is None:
        return
    by_host: dict[str, list[Bound]] = {}
    for n in ctx.topology.stages:
        for b in bound_ports(ctx, n):
            by_host.setdefault(ctx.host_of(n), []).append(b)
    for host, items in by_host.items():
        items.sort(key=lambda b: (b.port, b.node.stage_id))
        for i, a in enumerate(items):  # each pair once: every Bound is a distinct (stage, replica, purpose)
            for b in items[i + 1:]:
                if b.port >= a.port + a.span:
                    break
                lo = max(a.port, b.port)
                ra, rb = port_range(a.port, a.span), port_range(b.port, b.span)
                hostword = f"host {host}" if host != "localhost" else "the shared host"
                if "HCCL" in b.purpose:
                    fix = "assign distinct HCCL_IF_BASE_PORT per instance (env)"
                elif a.node.stage_id == b.node.stage_id and a.replica == b.replica:
                    fix = f"one engine binds both: move stage {b.node.stage_id}'s {b.purpose} off {ra}"
                elif a.node.stage_id == b.node.stage_id:
                    fix = (f"all {b.replicas} replicas of stage {b.node.stage_id} get the same {b.purpose} port on "
                           f"this runtime: set num_replicas: 1, or place the replicas on different hosts")
                else:
                    fix = f"move stage {b.node.stage_id}'s range to start at {a.port + a.span} or above"
                yield r.diag(f"port {lo} on {hostword} bound by {a.who} ({a.purpose}, {ra}) and {b.who} ({b.purpose}, {rb})",
                             b.loc, related=[Location(a.loc.file, a.loc.line, a.loc.column, a.loc.path,
                                                      label=f"{a.who} binds {ra}")],
                             help=fix)


_MC = "{kv_connector: MooncakeConnector, kv_role: kv_producer, engine_id: p, kv_connector_extra_config: {bootstrap_port: 25201}}"
_MC_D = "  - {stage_id: 1, devices: \"1\", kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_consumer, engine_id: d}}\n"


def _bootstrap_facts(ctx: Context, n: "StageNode"):
    """(facts, deciding setting, port replica 0 binds, replicas) for a Mooncake stage that
    runs a bootstrap server, else None: vLLM's MooncakeConnector only (``connector_row``; another
    package's class of that name runs no bootstrap server omni-pd knows). One source with expand
    and launch: omni_pd.compile.connectors.mooncake.bootstrap_ports."""
    from omni_pd.check.rules.capability import connector_row
    from omni_pd.compile.connectors.base import launched_replicas
    from omni_pd.compile.connectors.mooncake import bootstrap_ports, deciding_setting

    kv = n.kv or {}
    if connector_row(ctx, n) != "MooncakeConnector" or kv.get("kv_role") not in ("kv_producer", "kv_both"):
        return None
    runtime = runtime_of(ctx)
    reps = launched_replicas(n.num_replicas)
    bound = bootstrap_ports(kv, n.env, ctx.stage_tp(n), ctx.stage_dp(n), ctx.target, runtime, reps)
    if not bound:
        return None
    return ctx.target.mooncake_bootstrap(runtime), deciding_setting(kv, ctx.target, runtime), bound


def _ports_text(bound) -> str:
    """What a stage's bootstrap servers bind (one PortUse per replica): ``port 25201``,
    ``ports 25301-25302`` (one engine, TP 2 on vLLM 0.13), ``ports 25301-25304 (replicas
    0-1, 2 ports each)`` for back-to-back ranges, else each replica's range."""
    first = bound[0]
    if len(bound) == 1:
        return ("port " if first.span <= 1 else "ports ") + port_range(first.port, first.span)
    if all(b.span == first.span and b.port == a.port + a.span for a, b in zip(bound, bound[1:])):
        each = "" if first.span <= 1 else f", {first.span} ports each"
        last = bound[-1]
        return f"ports {first.port}-{last.port + last.span - 1} (replicas 0-{len(bound) - 1}{each})"
    return "ports " + ", ".join(f"{port_range(b.port, b.span)} (replica {b.replica})" for b in bound)


@rule("OPD502", "bootstrap-port-disagree", Severity.ERROR,
      "the env bootstrap port disagrees with the one the runtime binds (it overwrites the env)",
      fail=(_PD + "  - {stage_id: 0, devices: \"0\", env: {VLLM_MOONCAKE_BOOTSTRAP_PORT: \"25301\"}, kv_transfer_config: " + _MC + "}\n" + _MC_D),
      passing=(_PD + "  - {stage_id: 0, devices: \"0\", env: {VLLM_MOONCAKE_BOOTSTRAP_PORT: \"25201\"}, kv_transfer_config: " + _MC + "}\n" + _MC_D),
      labels=("PORT-BOOTSTRAP-AGREE",))
def bootstrap_disagree(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """vllm-omni 0.30 decides each Mooncake prefill (``kv_producer``) replica's bootstrap
    port itself: ``kv_connector_extra_config.bootstrap_port`` (default 8998) plus the
    replica id, and overwrites the replica's env ``VLLM_MOONCAKE_BOOTSTRAP_PORT`` with it.
    An env value in the file that differs from what replica 0 gets is ignored, and
    anything that trusts it (a proxy, a firewall rule, ``launch``'s preflight before this
    rule) looks at the wrong port. Runtimes where the env decides are not affected.
    Facts per runtime/version: presets/targets/mooncake_bootstrap.yaml. Source:
    vllm_omni/engine/stage_runtime.py ``StageRuntime._prepare_replica_vllm_config``."""
    if ctx.topology is None:
        return
    for n in ctx.topology.stages:
        got = _bootstrap_facts(ctx, n)
        if got is None:
            continue
        facts, setting, bound = got
        env_v = n.env.get(facts.env)
        if setting == "env" or env_v is None or _as_port(env_v) == bound[0].port:
            continue
        set_here = facts.extra_key in ((n.kv or {}).get("kv_connector_extra_config") or {})
        where = (ctx.sloc(n, "kv_transfer_config", *setting.split("."), value=True,
                          label=f"{facts.extra_key} {bound[0].port}") if set_here
                 else ctx.sloc(n, "kv_transfer_config", "kv_connector", value=True,
                               label=f"{facts.extra_key} unset: default {facts.default}"))
        yield r.diag(f"stage {n.stage_id}: env {facts.env} = {env_v} is ignored: "
                     f"{runtime_release(facts.runtime, ctx.target)} sets it from "
                     f"{setting}{'' if set_here else f' (unset, default {facts.default})'} plus the replica id, "
                     f"so this stage binds {_ports_text(bound)}",
                     ctx.sloc(n, "env", facts.env, value=True), related=[where],
                     help=(f"write {facts.env}: \"{bound[0].port}\" (what the runtime sets for replica 0), "
                           f"or set {facts.extra_key}: {_as_port(env_v)} if that is the port you want"))


@rule("OPD505", "bootstrap-key-unread", Severity.WARNING,
      "a bootstrap-port key that nothing reads on this runtime and version",
      fail=(_PD + "  - {stage_id: 0, devices: \"0\", env: {VLLM_MOONCAKE_BOOTSTRAP_PORT: \"25201\"}, kv_transfer_config: "
            "{kv_connector: MooncakeConnector, kv_role: kv_producer, engine_id: p, kv_connector_extra_config: {mooncake_bootstrap_port: 25201}}}\n" + _MC_D),
      passing=(_PD + "  - {stage_id: 0, devices: \"0\", env: {VLLM_MOONCAKE_BOOTSTRAP_PORT: \"25201\"}, kv_transfer_config: " + _MC + "}\n" + _MC_D))
def bootstrap_key_unread(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """``kv_connector_extra_config.mooncake_bootstrap_port`` (vllm-omni's PD recipe key) is
    read only by ``entrypoints/pd_utils.py _get_pd_connector_info``, whose result feeds
    ``_prepare_pd_decode_routing``, which no vllm-omni release (0.18-0.30 read) calls; plain
    vLLM reads no extra-config key for the port at all. Such a key looks like it sets the
    port and does not: the port is the one in the deciding setting (or its default 8998).
    On a ``kv_consumer`` the key a producer reads is unread too (vllm-omni 0.30 reads
    ``bootstrap_port`` for a ``kv_producer`` only: engine/stage_runtime.py
    ``_prepare_replica_vllm_config``): the paths are the contract's for the stage's side
    (``MooncakeConnector.unread_keys``), the ones expand drops. Only vLLM's MooncakeConnector
    (``capability.connector_row``): a class another package's ``kv_connector_module_path``
    loads under that name reads its own keys.
    Source: vllm_omni/entrypoints/pd_utils.py (0.18.0-0.30.0 wheels); facts per runtime and
    version, each with its source: presets/targets/mooncake_bootstrap.yaml."""
    from omni_pd.check.rules.capability import connector_row
    from omni_pd.compile import connectors

    if ctx.topology is None:
        return
    runtime = runtime_of(ctx)
    facts = ctx.target.mooncake_bootstrap(runtime)
    for n in ctx.topology.stages:
        kv = n.kv or {}
        if connector_row(ctx, n) != "MooncakeConnector":
            continue  # vLLM's class only: another package's reads its own keys
        extra = kv.get("kv_connector_extra_config") or {}  # a mapping: validate types it (OPD101)
        got = _bootstrap_facts(ctx, n)
        # the contract's list for this stage's side, the one expand drops by: on decode it
        # also names the key a kv_producer reads (vllm-omni 0.30 ``bootstrap_port``)
        for path in connectors.get("MooncakeConnector").unread_keys(ctx.target, runtime, side=_side(n)):
            top, _, key = path.partition(".")
            if top != "kv_connector_extra_config" or key not in extra:
                continue
            rt = runtime_release(runtime, ctx.target)
            if got is None:
                msg = (f"stage {n.stage_id}: {path} is read by nothing on {rt}, and a kv_consumer binds no "
                       f"bootstrap port")
                fix = f"remove {key}"
            else:
                _, setting, bound = got
                shown = f"env {facts.env}" if setting == "env" else setting
                msg = (f"stage {n.stage_id}: {path} is read by nothing on {rt}; the bootstrap port comes from "
                       f"{shown}, so this stage binds {_ports_text(bound)}")
                v = _as_port(extra[key])
                if setting == "env":
                    fix = f"remove {key} and set env {facts.env}: \"{v}\"" if v else f"remove {key}"
                else:
                    fix = f"rename it to {setting.split('.', 1)[1]}" + (f": {v}" if v else "")
            yield r.diag(msg, ctx.sloc(n, "kv_transfer_config", "kv_connector_extra_config", key), help=fix)


@rule("OPD503", "cross-host-localhost", Severity.ERROR,
      "prefill and decode are on different hosts but prefill advertises localhost",
      fail=(_PD + "  - {stage_id: 0, devices: \"0\", kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer, engine_id: p}}\n"
            "  - {stage_id: 1, devices: \"0\", kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_consumer, engine_id: d}}\n"),
      passing=(_PD + "  - {stage_id: 0, devices: \"0\", env: {VLLM_NIXL_SIDE_CHANNEL_HOST: 10.0.0.1}, kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer, engine_id: p}}\n"
               "  - {stage_id: 1, devices: \"0\", env: {VLLM_NIXL_SIDE_CHANNEL_HOST: 10.0.0.2}, kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_consumer, engine_id: d}}\n"),
      example_context={"inventory": {"hosts": {"host-a": {"address": "10.0.0.1"}, "host-b": {"address": "10.0.0.2"}},
                                     "placement": {0: "host-a", 1: "host-b"}}},
      labels=("PORT-HOST",))
def cross_host_localhost(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """When prefill and decode run on different hosts, the address prefill advertises
    must be routable: NIXL's ``VLLM_NIXL_SIDE_CHANNEL_HOST`` defaults to localhost (it is
    both the bind address and the ``remote_host`` decode dials), and vllm-omni builds the
    Mooncake bootstrap address from ``kv_ip`` (default 127.0.0.1; :func:`_reads_kv_ip`:
    vllm-ascend's connectors and plain ``vllm serve`` do not read it, so a missing
    ``kv_ip`` there is no finding). A Mooncake prefill whose ``VLLM_HOST_IP`` is a
    loopback address advertises it (vLLM ``vllm/utils/network_utils.py`` ``get_ip``).
    The failure is a handshake error and silent recompute. The connector is the loaded class
    (``capability.connector_row``): a class another package's ``kv_connector_module_path`` loads
    under these names advertises what that package decides, and is not judged. Sources:
    https://github.com/vllm-project/vllm/issues/27083; vLLM PR #53018; dynamo PR #1327."""
    pair = ctx.pd_pair
    if pair is None:
        return
    p, d = pair
    hp, hd = ctx.host_of(p), ctx.host_of(d)
    if hp == hd:
        return
    from omni_pd.check.rules.capability import connector_ident

    ident = connector_ident(ctx, p)  # the loaded class: vLLM's NIXL, vLLM's or vllm-ascend's Mooncake
    name = ident.name if ident is not None and ident.registered else ""
    addr = None
    if ctx.inventory is not None and ctx.inventory.host(hp) is not None:
        addr = ctx.inventory.host(hp).address  # type: ignore[union-attr]
    addr = addr or "<routable IP of " + hp + ">"
    if name.startswith("Nixl"):
        v = p.env.get("VLLM_NIXL_SIDE_CHANNEL_HOST")
        if v is None or str(v).strip() in LOCAL:
            # the value when set, else the nearest existing ancestor: the env block or the stage
            loc = ctx.sloc(p, "env", "VLLM_NIXL_SIDE_CHANNEL_HOST", value=True)
            shown = repr(str(v)) if v is not None else "localhost (default)"  # quoted: " " must show as ' '
            yield r.diag(f"stage {p.stage_id} (prefill) on {hp} advertises {shown} as its NIXL side channel; "
                         f"decode on {hd} cannot reach it", loc,
                         related=[ctx.sloc(d, label=f"decode (stage {d.stage_id}) on {hd}")],
                         help=f"set env VLLM_NIXL_SIDE_CHANNEL_HOST: {addr} on the prefill stage")
    elif "mooncake" in name.lower():
        host_ip = p.env.get("VLLM_HOST_IP")
        if host_ip is not None and str(host_ip).strip() in LOCAL:
            # every Mooncake worker (vLLM's, vllm-ascend's) advertises get_ip() = VLLM_HOST_IP when set
            yield r.diag(f"stage {p.stage_id} (prefill) on {hp} advertises VLLM_HOST_IP={str(host_ip)!r} as its Mooncake "
                         f"transfer address; decode on {hd} cannot reach it",
                         ctx.sloc(p, "env", "VLLM_HOST_IP", value=True),
                         related=[ctx.sloc(d, label=f"decode (stage {d.stage_id}) on {hd}")],
                         help=f"set env VLLM_HOST_IP: {addr} on the prefill stage, or remove it (vLLM then picks "
                              "the address of the interface that routes outward)")
            return
        if not _reads_kv_ip(ctx, name):
            return
        v = (p.kv or {}).get("kv_ip")
        if v is None or str(v).strip() in LOCAL:
            loc = ctx.sloc(p, "kv_transfer_config", "kv_ip", value=True)
            shown = repr(str(v)) if v is not None else "127.0.0.1 (default kv_ip)"
            yield r.diag(f"stage {p.stage_id} (prefill) on {hp} advertises {shown} as its Mooncake "
                         f"bootstrap address; decode on {hd} cannot reach it", loc,
                         related=[ctx.sloc(d, label=f"decode (stage {d.stage_id}) on {hd}")],
                         help=f"set kv_ip: {addr} (and env VLLM_HOST_IP) on the prefill stage")


def _reads_kv_ip(ctx: Context, name: str) -> bool:
    """Whether the address a decode dials for Mooncake connector ``name`` comes from the
    prefill's ``kv_ip``: only on the vllm-omni runtime with a vLLM Mooncake connector
    (vllm_omni/engine/stage_runtime.py ``_prepare_replica_vllm_config`` and
    entrypoints/pd_utils.py build ``bootstrap_addr`` from ``kv_ip``, default 127.0.0.1).
    vllm-ascend's Mooncake workers advertise vLLM's ``get_ip()`` (presets/targets/
    vllm_ascend.yaml ``rules.host_address``), and on plain ``vllm serve`` the router passes
    ``remote_bootstrap_addr`` (vLLM v1/mooncake/mooncake_connector.py reads no kv_ip)."""
    from omni_pd.compile import ascend

    if ascend.is_ascend(name) or name in ascend.registered():
        return bool(ascend.rules()["host_address"]["reads_kv_ip"])
    return runtime_of(ctx) == "vllm-omni"


_EC0 = ("stages:\n"
        "  - {stage_id: 0, devices: \"0\", mm_encoder_only: true, env: {VLLM_EC_SIDE_CHANNEL_PORT: \"0\"}, "
        "ec_transfer_config: {ec_connector: ECCPUConnector, ec_role: ec_producer, "
        "ec_connector_extra_config: {ec_cpu_bytes: 1073741824, ec_enable_nixl: true}}}\n"
        "  - {stage_id: 1, devices: \"1\", ec_transfer_config: {ec_connector: ECCPUConnector, ec_role: ec_consumer, "
        "ec_connector_extra_config: {ec_cpu_bytes: 1073741824, ec_enable_nixl: true}}}\n")


@rule("OPD504", "port-invalid", Severity.ERROR,
      "a port is not an integer in 1..65535",
      fail=(_PD + "  - {stage_id: 0, devices: \"0\", env: {VLLM_NIXL_SIDE_CHANNEL_PORT: \"70000\"}, kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer, engine_id: p}}\n"
            "  - {stage_id: 1, devices: \"1\", kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_consumer, engine_id: d}}\n"),
      passing=(_PD + "  - {stage_id: 0, devices: \"0\", env: {VLLM_NIXL_SIDE_CHANNEL_PORT: \"7000\"}, kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer, engine_id: p}}\n"
               "  - {stage_id: 1, devices: \"1\", kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_consumer, engine_id: d}}\n"),
      examples=(
          Example("ECCPUConnector side-channel port 0 on vLLM 0.34: the OS picks a free port (0.34's default)",
                  _EC0, False, {"vllm_version": "0.34"}),
          Example("ECCPUConnector side-channel port 0 on vLLM 0.33 (default 5601; 0 is no port)",
                  _EC0, True, {"vllm_version": "0.33"}, contains="VLLM_EC_SIDE_CHANNEL_PORT = '0'"),
      ))
def port_invalid(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """Ports (``kv_port``, ``*_port`` extra-config keys, ``*_PORT`` env vars) must be
    integers in 1..65535 (P2pNccl rejects ``kv_port`` 0); LMCache's per-rank port lists
    (:data:`omni_pd.compile.connectors.lmcache.LMCACHE_RANK_PORTS`, a list such as ``[7300, 7301]`` or ``"7300,7301"`` in the
    environment) are checked element by element, their length and shape by OPD608; a range ``[base, base + span)``
    must also end at or below 65535 (the operating system's port range; vLLM does not
    range-check ``kv_port``). 0 is accepted where the release reads it as "the OS picks a free port"
    (ECCPUConnector's ``VLLM_EC_SIDE_CHANNEL_PORT`` from vLLM 0.34, whose default it is:
    :func:`omni_pd.compile.ec_connectors.base.zero_port_settings`). Sources: vLLM ``vllm/config/kv_transfer.py``
    ``KVTransferConfig`` (``kv_port: int``), ``v1/p2p/p2p_nccl_engine.py`` (0.11-0.22)."""
    from omni_pd.compile.ec_connectors.base import zero_port_settings

    if ctx.topology is None:
        return
    for n in ctx.topology.stages:
        kv = n.kv or {}
        items: list[tuple[tuple, Any]] = []
        lists = {rp.keys: rp for rp in lmcache_rank_ports(n)}  # one port per rank: each element is a port
        zero_ok = zero_port_settings(n.settings.get("ec_transfer_config"), ctx.target.version)
        if "kv_port" in kv:
            items.append((("kv_transfer_config", "kv_port"), kv["kv_port"]))
        for k, v in (kv.get("kv_connector_extra_config") or {}).items():
            if isinstance(k, str) and k.endswith("_port"):
                items.append((("kv_transfer_config", "kv_connector_extra_config", k), v))
        for k, v in n.env.items():
            if isinstance(k, str) and k.endswith("_PORT"):
                items.append((("env", k), v))
        for keys, v in items:
            if keys in lists:
                rp = lists[keys]
                bad = [x for x in rp.ports or () if _as_port(x) is None or not 1 <= _as_port(x) <= 65535]
                if bad:  # a scalar where LMCache wants a list is OPD608's finding
                    yield r.diag(f"stage {n.stage_id}: {keys[-1]} = {v!r} holds {', '.join(repr(x) for x in bad)}, "
                                 "not a port (1..65535)", ctx.sloc(n, *keys, value=True),
                                 help="one port per rank, each a free port number between 1024 and 65535")
                continue
            p = _as_port(v)
            if p == 0 and keys[0] == "env" and keys[-1] in zero_ok:
                continue  # the OS picks a free port (ECCPUConnector 0.34's default)
            if p is None or not 1 <= p <= 65535:
                yield r.diag(f"stage {n.stage_id}: {keys[-1]} = {v!r} is not a port (1..65535)",
                             ctx.sloc(n, *keys, value=True), help="use a free port number between 1024 and 65535")
        for b in bound_ports(ctx, n):
            if b.replica > 0 and b.port > 65535:
                yield r.diag(f"{b.who} would bind {b.purpose} port {b.port} (base + replica id), past 65535",
                             b.loc, help=f"start the range at {65535 - b.replica} or lower")
            elif 1 <= b.port <= 65535 and b.port + b.span - 1 > 65535:
                yield r.diag(f"stage {n.stage_id}: {b.purpose} range {port_range(b.port, b.span)} runs past 65535",
                             b.loc, help="start the range lower")


_ASC = ("pipeline: qwen3_omni_moe_pd\nasync_chunk: false\nstages:\n"
        "  - {stage_id: 0, devices: \"0,1\", tensor_parallel_size: 2, env: {HCCL_IF_BASE_PORT: \"61000\"}, kv_transfer_config: "
        "{kv_connector: MooncakeConnectorV1, kv_role: kv_producer, kv_port: P0, engine_id: p, "
        "kv_connector_extra_config: {prefill: {dp_size: 1, tp_size: 2}, decode: {dp_size: 1, tp_size: 2}}}}\n"
        "  - {stage_id: 1, devices: \"2,3\", tensor_parallel_size: 2, env: {HCCL_IF_BASE_PORT: \"61032\"}, kv_transfer_config: "
        "{kv_connector: MooncakeConnectorV1, kv_role: kv_consumer, kv_port: P1, engine_id: d, "
        "kv_connector_extra_config: {prefill: {dp_size: 1, tp_size: 2}, decode: {dp_size: 1, tp_size: 2}}}}\n")


@rule("OPD506", "ascend-transport-range", Severity.ERROR,
      "a vllm-ascend kv_port range overlaps AscendDirectTransport's random port range",
      fail=_ASC.replace("P0", "30000").replace("P1", "30002"),
      passing=_ASC.replace("P0", "36000").replace("P1", "36002"),
      example_context={"platform": "npu"}, labels=("PORT-RANGE",),
      examples=(
          Example("8 NPUs in the inventory: 28000 is above the range", _ASC.replace("P0", "28000").replace("P1", "28002"),
                  False, {"platform": "npu",
                          "inventory": {"hosts": {"host-a": {"accelerator": "npu", "count": 8}}, "placement": {"all": "host-a"}}}),
          Example("16 NPUs in the inventory: 28000 is inside", _ASC.replace("P0", "28000").replace("P1", "28002"),
                  True, {"platform": "npu",
                         "inventory": {"hosts": {"host-a": {"accelerator": "npu", "count": 16}}, "placement": {"all": "host-a"}}},
                  contains="[20000, 36000)"),
      ))
def ascend_transport_range(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """On Ascend, Mooncake's AscendDirectTransport binds random ports in
    ``[20000, 20000 + 1000 * NPUs)`` of the node; a vllm-ascend ``kv_port`` range
    (``[kv_port, kv_port + dp*tp*pp)`` per engine) inside it fails now and then with
    ``zmq.error.ZMQError: Address already in use``. NPUs per node: the inventory's host
    ``count``, else 16 (the largest node of the guide's table, so no range is missed).
    Source: vllm-ascend 0.23.0.post1 docs/source/tutorials/features/
    pd_disaggregation_mooncake_multi_node.md:233 (presets/targets/vllm_ascend.yaml
    ``extracted."0.23.0.post1".transport_port_range``)."""
    from omni_pd.compile import ascend

    topo = ctx.topology
    if topo is None:
        return
    for n in topo.stages:
        from omni_pd.check.rules.capability import connector_label, connector_row

        if not ascend.is_ascend(connector_row(ctx, n)):
            continue  # vllm-ascend's classes, also under vLLM's name from vllm-ascend's module path
        name = connector_label(ctx, n)
        host = ctx.inventory.host(ctx.host_of(n)) if ctx.inventory is not None else None
        npus = int(host.count) if host is not None and host.count else 16
        lo, hi = ascend.transport_range(npus)
        for b in bound_ports(ctx, n):
            if b.purpose.startswith("kv_port") and b.port < hi and b.port + b.span > lo:
                what = f"kv_port {port_range(b.port, b.span)}" if b.span <= 1 else f"kv_port range {port_range(b.port, b.span)}"
                yield r.diag(f"stage {n.stage_id}: {name} {what} overlaps "
                             f"AscendDirectTransport's random ports [{lo}, {hi}) on a {npus}-NPU node",
                             b.loc, help=f"move kv_port to {hi} or above (omni-pd expand allocates from 36000)")
