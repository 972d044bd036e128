"""OPD507 cross-host-advertised-address: a listener a peer on another host dials is advertised as localhost.

OPD503 checks the KV side channels of the PD pair (NIXL, Mooncake bootstrap). Every other
transport that announces an address works the same way and fails the same way (a
connection refused or a silent fallback when the peer is on another host): the encoder
cache side channels (``ec_transfer_config``: ECCPUConnector's ``VLLM_EC_SIDE_CHANNEL_HOST``,
ECMooncakeConnector's ``ec_ip``), LMCache's PD receiver (``lmcache.pd_peer_host``) and
its proxy (``lmcache.pd_proxy_host``). Who advertises what is one table,
``presets/targets/advertised_addresses.yaml`` (loader: ``omni_pd/compile/advertised.py``),
read by this one rule; rows owned by OPD503 are skipped here.

PASS::

    stages:
      - {stage_id: 0, env: {VLLM_EC_SIDE_CHANNEL_HOST: 10.0.0.1},
         ec_transfer_config: {ec_connector: ECCPUConnector, ec_role: ec_producer}}
      - {stage_id: 1, ec_transfer_config: {ec_connector: ECCPUConnector, ec_role: ec_consumer}}

FAIL (stage 0 on host-a, stage 1 on host-b)::

    stages:
      - {stage_id: 0, ec_transfer_config: {ec_connector: ECCPUConnector, ec_role: ec_producer}}
      - {stage_id: 1, ec_transfer_config: {ec_connector: ECCPUConnector, ec_role: ec_consumer}}
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from omni_pd.check.rules import Context, Example, Rule, rule
from omni_pd.compile.advertised import LOCAL, Listener, listeners
from omni_pd.diagnostics import Diagnostic, Severity

if TYPE_CHECKING:
    from omni_pd.compile.topology import StageNode


def _block(n: "StageNode", row: Listener) -> dict[str, Any] | None:
    b = n.kv if row.config == "kv_transfer_config" else n.settings.get(row.config)
    return b if isinstance(b, dict) and b.get(row.connector_key) in row.connectors else None


def _value(ctx: Context, n: "StageNode", row: Listener, b: dict[str, Any]) -> tuple[Any, bool, tuple]:
    """(value, written?, path under the stage) of the row's setting on stage ``n``."""
    where, name = row.setting  # type: ignore[misc]
    if where == "env":
        return n.env.get(name, row.default), name in n.env, ("env", name)
    if where == "key":
        return b.get(name, row.default), name in b, (row.config, name)
    extra = b.get(row.config.replace("_transfer_config", "_connector_extra_config"))
    extra = extra if isinstance(extra, dict) else {}
    return (extra.get(name, row.default), name in extra,
            (row.config, row.config.replace("_transfer_config", "_connector_extra_config"), name))


def _where(row: Listener) -> str:
    where, name = row.setting  # type: ignore[misc]
    return {"env": f"env {name}", "key": f"{row.config}.{name}", "extra": name}[where]


def _addr(ctx: Context, host: str) -> str:
    h = ctx.inventory.host(host) if ctx.inventory is not None else None
    return (h.address if h is not None and h.address else None) or f"<routable IP of {host}>"


_INV = {"inventory": {"hosts": {"host-a": {"address": "10.0.0.1"}, "host-b": {"address": "10.0.0.2"}},
                      "placement": {0: "host-a", 1: "host-b", 2: "host-b"}}}
_E = ("pipeline: llm_1e1p1d\nstages:\n"
      "  - {{stage_id: 0, devices: \"2\"{e}, ec_transfer_config: {{ec_connector: {c}, ec_role: ec_producer{x}}}}}\n"
      "  - {{stage_id: 1, devices: \"0\"{p}, kv_transfer_config: {{kv_connector: NixlConnector, kv_role: kv_producer, "
      "engine_id: p}}, ec_transfer_config: {{ec_connector: {c}, ec_role: ec_consumer{y}}}}}\n"
      "  - {{stage_id: 2, devices: \"1\", kv_transfer_config: {{kv_connector: NixlConnector, kv_role: kv_consumer, "
      "engine_id: d}}}}\n")
_CPU = ", ec_connector_extra_config: {{ec_cpu_bytes: 1073741824}}"
_NX = ", env: {{VLLM_NIXL_SIDE_CHANNEL_HOST: 10.0.0.2}}"


def _epd(e: str = "", c: str = "ECCPUConnector", x: str = _CPU, y: str = _CPU) -> str:  # pragma: no mutate block
    return _E.format(e=e, c=c, x=x.replace("{{", "{").replace("}}", "}"), y=y.replace("{{", "{").replace("}}", "}"),
                     p=_NX.replace("{{", "{").replace("}}", "}"))


_L = ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
      "  - {{stage_id: 0, devices: \"0\", kv_transfer_config: {{kv_connector: LMCacheConnectorV1, kv_role: kv_producer, "
      "engine_id: p, kv_connector_extra_config: {{lmcache.pd_proxy_host: {pp}}}}}}}\n"
      "  - {{stage_id: 1, devices: \"0\", kv_transfer_config: {{kv_connector: LMCacheConnectorV1, kv_role: kv_consumer, "
      "engine_id: d, kv_connector_extra_config: {{lmcache.pd_proxy_host: {dp}, lmcache.pd_peer_host: {peer}}}}}}}\n")
_INV2 = {"inventory": {"hosts": {"host-a": {"address": "10.0.0.1"}, "host-b": {"address": "10.0.0.2"}},
                       "placement": {0: "host-a", 1: "host-b"}}}


@rule("OPD507", "cross-host-advertised-address", Severity.ERROR,
      "a stage advertises localhost for a listener a peer on another host must reach (encoder cache, LMCache PD)",
      fail=_epd(), passing=_epd(e=", env: {VLLM_EC_SIDE_CHANNEL_HOST: 10.0.0.1}"),
      example_context=_INV,
      examples=(
          Example("every stage on one host: localhost is reachable", _epd(), False,
                  {"inventory": {"hosts": {"host-a": {}}, "placement": {"all": "host-a"}}}),
          Example("ECMooncakeConnector: the consumer advertises ec_ip (default 127.0.0.1)",
                  _epd(c="ECMooncakeConnector", x="", y=""), True, _INV, contains="127.0.0.1 (default)"),
          Example("ECMooncakeConnector consumer with a routable ec_ip",
                  _epd(c="ECMooncakeConnector", x="", y=", ec_ip: 10.0.0.2"), False, _INV),
          Example("LMCache receiver advertises pd_peer_host localhost to a sender on another host",
                  _L.format(pp="10.0.0.9", dp="10.0.0.9", peer="localhost"), True, _INV2, contains="pd_peer_host"),
          Example("LMCache proxy named localhost on two hosts: two different proxies",
                  _L.format(pp="localhost", dp="localhost", peer="10.0.0.2"), True, _INV2, contains="pd_proxy_host"),
          Example("LMCache with routable receiver and proxy addresses",
                  _L.format(pp="10.0.0.9", dp="10.0.0.9", peer="10.0.0.2"), False, _INV2),
          Example("ECCPUConnector producer without a host on vLLM 0.34 (an empty host is get_ip())",
                  _epd(), False, {**_INV, "vllm_version": "0.34"}),
          Example("ECCPUConnector producer naming localhost on vLLM 0.34",
                  _epd(e=", env: {VLLM_EC_SIDE_CHANNEL_HOST: localhost}"), True, {**_INV, "vllm_version": "0.34"},
                  contains="'localhost'"),
      ))
def cross_host_advertised(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """For each row of ``presets/targets/advertised_addresses.yaml`` not owned by another
    rule: a stage whose connector and role advertise the row's address (its ``setting``,
    else the row's ``default``) and a peer that dials it on another host (inventory
    placement) is an error when the address is a loopback or wildcard address
    (localhost, 127.0.0.1, ::1, 0.0.0.0, empty). ``kind: shared`` rows (a proxy every
    stage names) are an error when stages on two hosts both name it localhost. Without
    an inventory every stage is on one host and nothing is reported. Sources: the rows'
    ``sources`` (vLLM 0.30.0 envs.py:230 ``VLLM_EC_SIDE_CHANNEL_HOST``,
    ec_connector/cpu/scheduler/__init__.py:165, ec_connector/mooncake/config.py:109,
    config/ec_transfer.py:52; LMCache pd_backend.py ``PDConfig``). A row's ``own_ip_since`` release
    on: an unset or empty setting is the host's own routable address (ECCPUConnector from vLLM 0.34,
    envs.py ``VLLM_EC_SIDE_CHANNEL_HOST`` default ``""`` resolved by ``get_ip()``), not localhost."""
    topo = ctx.topology
    if topo is None or ctx.inventory is None:
        return
    for row in listeners():
        if row.checked_by or not row.in_config or row.setting is None:
            continue
        stages = [(n, b) for n in topo.stages if (b := _block(n, row)) is not None]
        if row.kind == "shared":
            local = [(n, b) for n, b in stages if (v := _value(ctx, n, row, b))[1] and str(v[0]).strip() in LOCAL]
            hosts = sorted({ctx.host_of(n) for n, _ in local})
            if len(hosts) < 2:
                continue
            for n, b in local[1:]:
                first = local[0][0]
                if ctx.host_of(n) == ctx.host_of(first):
                    continue
                v, _, path = _value(ctx, n, row, b)
                yield r.diag(f"stage {n.stage_id} on {ctx.host_of(n)} and stage {first.stage_id} on "
                             f"{ctx.host_of(first)} both name {str(v)!r} as {_where(row)}: they reach two "
                             "different endpoints, not one", ctx.sloc(n, *path, value=True),
                             related=[ctx.sloc(first, *_value(ctx, first, row, local[0][1])[2], value=True,
                                               label=f"stage {first.stage_id} on {ctx.host_of(first)}")],
                             notes=[f"source: {s}" for s in row.sources],
                             help=f"set {_where(row)} to the routable address of the host that runs it, on every stage")
            continue
        for n, b in stages:
            if b.get(row.role_key) not in row.advertiser:
                continue
            v, written, path = _value(ctx, n, row, b)
            if v is None or str(v).strip() not in LOCAL or row.own_ip(ctx.target.version, v, written):
                continue
            here = ctx.host_of(n)
            peers = [m for m, mb in stages if m is not n and mb.get(row.role_key) in row.dialed_by
                     and ctx.host_of(m) != here]
            if not peers:
                continue
            shown = repr(str(v)) if written else f"{v} (default)"
            m = peers[0]
            yield r.diag(f"stage {n.stage_id} ({b.get(row.role_key)}) on {here} advertises {shown} as its "
                         f"{row.connectors[0] if len(row.connectors) == 1 else b.get(row.connector_key)} address "
                         f"({_where(row)}); stage {m.stage_id} on {ctx.host_of(m)} cannot reach it",
                         ctx.sloc(n, *path, value=True),
                         related=[ctx.sloc(m, label=f"stage {m.stage_id} ({mb}) on {ctx.host_of(m)}")
                                  for m, mb in ((p, _block(p, row).get(row.role_key)) for p in peers[:2])],  # type: ignore[union-attr]
                         notes=[f"source: {s}" for s in row.sources],
                         help=f"set {_where(row)}: {_addr(ctx, here)} on stage {n.stage_id}")


_N = ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
      "  - {{stage_id: 0, devices: \"0\", env: {{VLLM_NIXL_SIDE_CHANNEL_HOST: {p}}}, kv_transfer_config: "
      "{{kv_connector: NixlConnector, kv_role: kv_producer, engine_id: p}}}}\n"
      "  - {{stage_id: 1, devices: \"0\", kv_transfer_config: {{kv_connector: NixlConnector, kv_role: kv_consumer, "
      "engine_id: d}}}}\n")
_M = ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
      "  - {{stage_id: 0, devices: \"0\", kv_transfer_config: {{kv_connector: MooncakeConnector, kv_role: kv_producer, "
      "kv_ip: {p}, kv_port: 25201}}}}\n"
      "  - {{stage_id: 1, devices: \"0\", kv_transfer_config: {{kv_connector: MooncakeConnector, kv_role: kv_consumer, "
      "kv_port: 25201}}}}\n")


@rule("OPD511", "advertised-address-of-another-host", Severity.ERROR,
      "a stage advertises the inventory address of another host for a listener its peers dial",
      fail=_N.format(p="10.0.0.2"), passing=_N.format(p="10.0.0.1"), example_context=_INV2,
      examples=(
          Example("Mooncake bootstrap kv_ip of decode's host on prefill (a file compiled for another placement)",
                  _M.format(p="10.0.0.2"), True, _INV2, contains="the address of host-b"),
          Example("Mooncake bootstrap kv_ip of prefill's own host", _M.format(p="10.0.0.1"), False, _INV2),
          Example("an address the inventory does not list (another interface of the host, e.g. an RDMA NIC)",
                  _N.format(p="192.168.7.1"), False, _INV2),
          Example("one host: both stages share it", _N.format(p="10.0.0.1"), False,
                  {"inventory": {"hosts": {"host-a": {"address": "10.0.0.1"}}, "placement": {"all": "host-a"}}}),
      ))
def advertised_address_of_another_host(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """Every row of ``presets/targets/advertised_addresses.yaml`` (the KV side channels OPD503
    owns included) whose address a stage writes explicitly: when the address is the inventory
    ``address`` of a host other than the one the stage is placed on, its peers dial that other
    host (the NIXL handshake or the Mooncake bootstrap reaches the wrong machine: connection
    refused, or a hang until the request times out). Typical cause: a file compiled with
    ``expand --inventory`` for one placement, then validated or launched with another. An
    address the inventory does not list is not judged (a host can have several interfaces; the
    inventory names one). Sources: the rows' ``sources`` (vLLM 0.30.0 envs.py
    ``VLLM_NIXL_SIDE_CHANNEL_HOST``, ``VLLM_HOST_IP``; config/kv_transfer.py ``kv_ip``)."""
    topo, inv = ctx.topology, ctx.inventory
    if topo is None or inv is None:
        return
    owner = {str(h.address): name for name, h in inv.hosts.items() if h.address}
    for row in listeners():
        if not row.in_config or row.setting is None or row.kind != "listener":
            continue
        for n in topo.stages:
            b = _block(n, row)
            if b is None or b.get(row.role_key) not in row.advertiser:
                continue
            v, written, path = _value(ctx, n, row, b)
            here = ctx.host_of(n)
            other = owner.get(str(v).strip()) if written and v is not None else None
            if other is None or other == here:
                continue
            yield r.diag(f"stage {n.stage_id} ({b.get(row.role_key)}) on {here} advertises {str(v)!r} as its "
                         f"{b.get(row.connector_key)} address ({_where(row)}), the address of {other} in the "
                         "inventory: its peers would dial the wrong host",
                         ctx.sloc(n, *path, value=True),
                         notes=[f"source: {s}" for s in row.sources],
                         help=f"set {_where(row)}: {_addr(ctx, here)} on stage {n.stage_id}, or re-run "
                              "`omni-pd expand --inventory` for this placement",
                         replace=(str(v), str(_addr(ctx, here))) if inv.host(here) and inv.host(here).address else None)
