"""OPD508 same-host-connector-across-hosts, OPD509 stage-edge-localhost: vllm-omni's
stage-to-stage omni connectors under a placement across hosts (``--inventory``).

Each stage edge is carried by the omni connector its receiving stage names (or
``SharedMemoryConnector`` when none: vllm-omni 0.30 auto-configures it); the sending
stage's worker puts the payload, the receiving stage's worker gets it, so the edge crosses
hosts exactly when its two stages do (facts and sources: omni_pd/compile/stage_edges.py).
The prefill -> decode edge is not judged: it carries no payload (the KV connector moves
prefill's KV; OPD503 checks its addresses).
"""

from __future__ import annotations

from typing import Iterable

from omni_pd.check.rules import Context, Example, Rule, rule
from omni_pd.compile.stage_edges import SAME_HOST_ONLY, crossing, payload_edges
from omni_pd.diagnostics import Diagnostic, Severity

#: omni connectors whose sender advertises ``extra.host`` (``sender_host`` on a receiver)
#: to a receiver that dials it (vllm-omni 0.30 vllm_omni/distributed/omni_connectors/connectors/
#: nixl_connector.py, mooncake_transfer_engine_connector.py)
#: the addresses OPD509 flags: loopback. Not the wildcards: a NIXL sender binds a route-probed
#: address for ``""``/``0.0.0.0``/``auto`` (vllm-omni's nixl_connector.py ``_get_local_ip``) and the orchestrator
#: then advertises the replica's registered host (vllm-omni's stage_engine_core_client.py
#: ``_resolve_sender_host_from_config``), while a loopback value is advertised as written
LOOPBACK = ("localhost", "127.0.0.1", "::1")
_ADVERTISING = frozenset({"NixlConnector", "MooncakeTransferEngineConnector", "MoriTransferEngineConnector",
                          "YuanrongTransferEngineConnector"})

_HEAD = ("pipeline: qwen3_omni_moe_pd\nasync_chunk: false\n{conn}stages:\n"
         "  - {{stage_id: 0, kv_transfer_config: {{kv_connector: NixlConnector, kv_role: kv_producer}}}}\n"
         "  - {{stage_id: 1, kv_transfer_config: {{kv_connector: NixlConnector, kv_role: kv_consumer}}{d_in}}}\n"
         "  - {{stage_id: 2{t_in}}}\n"
         "  - {{stage_id: 3{c_in}}}\n"
         "edges: [{{from: 0, to: 1}}, {{from: 1, to: 2}}, {{from: 2, to: 3}}]\n")
_SHM = "connectors:\n  shm: {name: SharedMemoryConnector}\n"


def _nixl(host_1: str = "10.0.0.2", host_2: str = "10.0.0.1") -> str:
    conns = ("connectors:\n"
             "  n01: {name: NixlConnector, extra: {host: 10.0.0.1, zmq_port: 19064}}\n"
             f"  n12: {{name: NixlConnector, extra: {{host: {host_1}, zmq_port: 19064}}}}\n"
             f"  n23: {{name: NixlConnector, extra: {{host: {host_2}, zmq_port: 19064}}}}\n")
    return _HEAD.format(conn=conns, d_in=", input_connectors: {from_stage_0: n01}",
                        t_in=", input_connectors: {from_stage_1: n12}", c_in=", input_connectors: {from_stage_2: n23}")


def _shm() -> str:
    return _HEAD.format(conn=_SHM, d_in="", t_in=", input_connectors: {from_stage_1: shm}",
                        c_in=", input_connectors: {from_stage_2: shm}")


#: prefill and the Talker + Code2Wav on host-a, decode on host-b: edge 1 -> 2 crosses
_INV = {"inventory": {"hosts": {"host-a": {"address": "10.0.0.1"}, "host-b": {"address": "10.0.0.2"}},
                      "placement": {0: "host-a", 1: "host-b", 2: "host-a", 3: "host-a"}}}
#: the proposal's placement: prefill alone on host-a, every edge after decode on host-b
_INV_B = {"inventory": {"hosts": {"host-a": {"address": "10.0.0.1"}, "host-b": {"address": "10.0.0.2"}},
                        "placement": {0: "host-a", 1: "host-b", 2: "host-b", 3: "host-b"}}}


def _edge_loc(ctx: Context, dst_node, src: int, ref: str | None, explicit: bool):
    """Where the edge's connector is named: the receiving stage's ``input_connectors``
    entry, else the ``edges:`` entry, else the stage."""
    if explicit and dst_node is not None:
        return ctx.sloc(dst_node, "input_connectors", f"from_stage_{src}", value=True)
    for i, e in enumerate(ctx.raw_at(("edges",)) or ()):
        if isinstance(e, dict) and e.get("from") == src and e.get("to") == (dst_node.stage_id if dst_node else None):
            return ctx.loc(("edges", i))
    return ctx.sloc(dst_node) if dst_node is not None else None


def _edges(ctx: Context):
    topo = ctx.topology
    if topo is None or ctx.inventory is None or not isinstance(ctx.raw, dict):
        return None, None, []
    hosts = {n.stage_id: ctx.host_of(n) for n in topo.stages}
    pair = (topo.pd_pair[0].stage_id, topo.pd_pair[1].stage_id) if topo.pd_pair is not None else None
    return hosts, pair, payload_edges(ctx.raw)


@rule("OPD508", "same-host-connector-across-hosts", Severity.ERROR,
      "a stage edge whose stages run on different hosts is carried by SharedMemoryConnector (same host only)",
      fail=_shm(), passing=_nixl(), example_context=_INV, runtime="vllm-omni",
      examples=(
          Example("no connector named: vllm-omni auto-configures SharedMemoryConnector for the edge",
                  _HEAD.format(conn="", d_in="", t_in="", c_in=""), True, _INV, contains="(auto-configured)"),
          Example("prefill on host-a, decode, Talker and Code2Wav on host-b: only the PD edge crosses",
                  _shm(), False, _INV_B),
      ))
def same_host_connector_across_hosts(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """A stage edge (not the prefill -> decode one) whose sending and receiving stages the
    inventory places on different hosts, carried by ``SharedMemoryConnector`` (named, or
    auto-configured for an ``edges:`` entry no stage names): its worker-to-worker put/get
    goes through POSIX shared memory of one host, so the receiving stage waits for a
    payload that never arrives. Sources: vllm-omni 0.30
    vllm_omni/distributed/omni_connectors/connectors/shm_connector.py; the
    auto-configuration: utils/initialization.py ``load_omni_transfer_config``.
    ``expand --inventory`` writes NixlConnector on every edge instead (OPD907; why NIXL:
    omni_pd/compile/stage_edges.py)."""
    hosts, pair, edges = _edges(ctx)
    if hosts is None:
        return
    for e in crossing(edges, hosts, pair):
        if e.connector not in SAME_HOST_ONLY:
            continue
        dst = ctx.topology.node(e.dst) if ctx.topology is not None else None
        how = "(auto-configured)" if not e.explicit else f"(connectors.{e.ref})" if e.ref else "(inline)"
        yield r.diag(f"stage edge {e.src} -> {e.dst} runs from {hosts[e.src]} to {hosts[e.dst]} over "
                     f"{e.connector} {how}, which reaches one host only",
                     _edge_loc(ctx, dst, e.src, e.ref, e.explicit),
                     notes=["source: vllm_omni/distributed/omni_connectors/connectors/shm_connector.py "
                            "(POSIX shared memory named by key)"],
                     help="re-run `omni-pd expand --inventory` (it writes NixlConnector on every stage edge), or place "
                          f"stages {e.src} and {e.dst} on one host")


@rule("OPD509", "stage-edge-localhost", Severity.ERROR,
      "a stage edge's sender advertises localhost to a receiving stage on another host",
      fail=_nixl(host_1="127.0.0.1"), passing=_nixl(), example_context=_INV, runtime="vllm-omni",
      examples=(
          Example("every stage on one host: localhost is reachable", _nixl(host_1="127.0.0.1"), False,
                  {"inventory": {"hosts": {"host-a": {}}, "placement": {"all": "host-a"}}}),
          Example("an edge within one host may name localhost", _nixl(host_2="localhost"), False, _INV),
          Example("a wildcard host: the orchestrator advertises the host the stage registered from",
                  _nixl(host_1="0.0.0.0"), False, _INV),
          Example("sender_host localhost on the receiving side", _nixl().replace(
              "host: 10.0.0.2, zmq_port", "host: 10.0.0.2, sender_host: localhost, zmq_port"), True, _INV,
                  contains="as its sender_host"),
      ))
def stage_edge_localhost(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """A cross-host omni connector (NixlConnector, Mooncake/Mori/Yuanrong transfer
    engine) on a stage edge whose receiving stage runs on another host than the sending
    one, with the edge's ``host`` (where the sender binds its handshake listener and what
    the orchestrator hands the receiver as ``payload_sender_info``) or ``sender_host`` a
    loopback address (localhost, 127.0.0.1, ::1): the orchestrator hands that value to the
    receiver as written, which dials its own host, and the payload never arrives. Sources: vllm-omni 0.30
    vllm_omni/distributed/omni_connectors/connectors/nixl_connector.py handshake bind;
    engine/stage_engine_core_client.py ``_resolve_sender_host_from_config``;
    utils/initialization.py ``resolve_connector_spec``: a receiver's ``sender_host``
    defaults to the edge's ``host``. ``auto``, ``0.0.0.0`` and ``""`` are not
    flagged: the sender binds a route-probed address and the orchestrator advertises the
    host the stage registered from instead."""
    hosts, pair, edges = _edges(ctx)
    if hosts is None:
        return
    for e in crossing(edges, hosts, pair):
        if e.connector not in _ADVERTISING:
            continue
        for key in ("host", "sender_host"):
            v = (e.extra or {}).get(key)
            if v is None or str(v).strip() not in LOOPBACK:
                continue
            dst = ctx.topology.node(e.dst) if ctx.topology is not None else None
            path = ("connectors", e.ref, "extra", key) if e.ref else None
            loc = ctx.loc(path, value=True) if path and ctx.exists(path) else _edge_loc(ctx, dst, e.src, e.ref, True)
            addr = ctx.inventory.host(hosts[e.src]) if ctx.inventory is not None else None
            own = (addr.address if addr is not None else None) or f"the routable address of {hosts[e.src]}"
            yield r.diag(f"stage edge {e.src} -> {e.dst} ({e.connector}): stage {e.src} on {hosts[e.src]} advertises "
                         f"{str(v)!r} as its {key}; stage {e.dst} on {hosts[e.dst]} cannot reach it", loc,
                         notes=["source: vllm_omni/engine/stage_engine_core_client.py _build_payload_sender_info"],
                         help=f"set {key}: {own}")
            break
