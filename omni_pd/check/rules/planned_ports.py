"""OPD510 planned-port-conflict: two listeners of the launch plan on one host get one port.

``launch`` and ``render`` give every process its ports from one port plan
(:func:`omni_pd.compile.port_plan.plan_ports`): HTTP ports from ``--port`` and
``--engine-port-base``, the ports derived from them (an engine's data-parallel RPC port,
the torch.distributed store of an instance spanning hosts, a vllm-omni head's master
port) and the connector ports the file sets. Their preflight refuses a port planned twice
on one host (OPD960, "give each process its own port"); this rule judges the same plan
before anything is planned, naming both processes and the key to change.
"""

from __future__ import annotations

from typing import Any, Iterable

from omni_pd.check.rules import Context, Example, Rule, rule
from omni_pd.compile.port_plan import DP_RPC, PORT_MAX, PlannedPort, plan_ports
from omni_pd.diagnostics import Diagnostic, Location, Severity

_NIXL_P = ("{kv_connector: NixlConnector, kv_role: kv_producer, engine_id: p}")
_NIXL_D = ("{kv_connector: NixlConnector, kv_role: kv_consumer, engine_id: d}")
#: prefill TP 4 spanning hosts A + B (its --master-port: HTTP 8100 + 600 = 8700), decode DP 2
#: on A (its --data-parallel-rpc-port: HTTP 8200 + 300 = 8500, or the stage's
#: data_parallel_rpc_port)
_SPAN = ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
         "  - {stage_id: 0, tensor_parallel_size: 4, nnodes: 2, devices: \"0,1\", env: {VLLM_NIXL_SIDE_CHANNEL_HOST: "
         "10.201.0.1, VLLM_NIXL_SIDE_CHANNEL_PORT: \"5600\"}, kv_transfer_config: " + _NIXL_P + "}\n"
         "  - {stage_id: 1, data_parallel_size: 2, DP_RPCdevices: \"2,3\", env: {VLLM_NIXL_SIDE_CHANNEL_HOST: "
         "10.201.0.1, VLLM_NIXL_SIDE_CHANNEL_PORT: \"5601\"}, kv_transfer_config: " + _NIXL_D + "}\n")
_SPAN_HOSTS = {"inventory": {"hosts": {"A": {"address": "10.201.0.1", "count": 4},
                                       "B": {"address": "10.201.0.2", "count": 2}},
                             "placement": {0: ["A", "B"], 1: "A"}}}
#: the llm pipeline over MooncakeConnector (plain vllm serve per engine): prefill listens on
#: --engine-port-base 8100, the router on --port 8000
_MC_LLM = ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
           "  - {stage_id: 0, devices: \"0\", env: {VLLM_MOONCAKE_BOOTSTRAP_PORT: \"PORT_N\"}, kv_transfer_config: "
           "{kv_connector: MooncakeConnector, kv_role: kv_producer, engine_id: p}}\n"
           "  - {stage_id: 1, devices: \"1\", kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_consumer, "
           "engine_id: d}}\n")
#: Qwen3-Omni PD on vllm-omni: one server on --port 8000 binds every stage's connector ports
_MC_OMNI = ("pipeline: qwen3_omni_moe_pd\nasync_chunk: false\nstages:\n"
            "  - {stage_id: 0, devices: \"0\", kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_producer, "
            "engine_id: p, kv_connector_extra_config: {bootstrap_port: PORT_N}}}\n"
            "  - {stage_id: 1, devices: \"1\", kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_consumer, "
            "engine_id: d}}\n")


def _listener(purpose: str) -> str:
    """The socket a port use binds (as preflight reads it): the API server serves ``/metrics`` on its HTTP port."""
    return "http" if purpose in ("http", "metrics") else purpose


def key_path(key: str | None) -> tuple[str, ...]:
    """The stage-entry path of a port's deciding setting (:attr:`PlannedPort.key`, the
    connector contract's ``key``): a ``kv_transfer_config`` path (``kv_port``,
    ``kv_connector_extra_config.bootstrap_port``), a stage key (``data_parallel_rpc_port``),
    else an env variable; None: the connector's default, located at ``kv_connector``."""
    if key is None:
        return ("kv_transfer_config", "kv_connector")
    if key == "data_parallel_rpc_port":
        return (key,)
    if "." in key or key == "kv_port":
        return ("kv_transfer_config", *key.split("."))
    return ("env", key)


def _shown(path: tuple[str, ...]) -> str:
    return f"env {path[1]}" if path[0] == "env" else ".".join(path)


def _what(x: PlannedPort) -> str:
    return f"{x.process} ({x.purpose}" + (f", {x.how}" if x.how else "") + ")"


@rule("OPD510", "planned-port-conflict", Severity.ERROR,
      "two processes launch or render would start on one host are planned on the same port",
      fail=_SPAN.replace("DP_RPC", "data_parallel_rpc_port: 8700, "),
      passing=_SPAN.replace("DP_RPC", "data_parallel_rpc_port: 8701, "),
      example_context=_SPAN_HOSTS,
      examples=(
          Example("prefill spanning A + B, decode DP 2 on A, derived ports only: 8700 and 8500 apart",
                  _SPAN.replace("DP_RPC", ""), False, _SPAN_HOSTS),
          Example("a Mooncake bootstrap port on prefill's HTTP port (--engine-port-base 8100)",
                  _MC_LLM.replace("PORT_N", "8100"), True, contains="prefill-0 (http, --engine-port-base 8100)"),
          Example("a Mooncake bootstrap port on the router's --port 8000", _MC_LLM.replace("PORT_N", "8000"), True,
                  contains="router (http, --port 8000)"),
          Example("Mooncake's default bootstrap port: no conflict", _MC_LLM.replace("PORT_N", "25201"), False),
          Example("vllm-omni: a bootstrap_port on the server's --port 8000", _MC_OMNI.replace("PORT_N", "8000"), True,
                  contains="omni (http, --port 8000)"),
      ))
def planned_port_conflict(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """``launch`` and ``render`` derive ports the file does not hold: each engine's HTTP port
    (``--engine-port-base`` + 0 for prefill, + 100 for decode, + 200 for the encoder, + the
    instance), the PD router's (or vllm-omni server's) ``--port``, a ``data_parallel_size`` > 1
    engine's ``--data-parallel-rpc-port`` (its HTTP port + 300, or the stage's
    ``data_parallel_rpc_port``), the torch.distributed store of an instance spanning hosts
    (``--master-port``, its HTTP port + 600, on its first host) and a vllm-omni head's
    ``--omni-master-port`` (``--engine-port-base`` + 300). Each derivation has its own band
    of 100 ports, so they never meet one another (they did before: with + 400 a prefill
    spanning hosts A + B and a decode of DP 2 on A both planned 8500); a port the file sets
    can meet one: a Mooncake bootstrap port of 8100 is prefill's HTTP port, a decode
    ``data_parallel_rpc_port: 8700`` is the spanning prefill's ``--master-port``. The second listener to start fails with ``Address already in use``,
    and launch's preflight refuses the plan (OPD960). Judged over the one port plan launch
    and render use (omni_pd/compile/port_plan.py ``plan_ports``), with launch's defaults
    ``--port 8000 --engine-port-base 8100`` (``launch``/``render`` judge their own values);
    two ports the file sets are OPD501's. The finding points at the key to change: the
    setting of a port the file sets, else the stage's ``data_parallel_rpc_port`` for a
    data-parallel RPC port, else the stage (then ``--port``/``--engine-port-base`` move it).
    Sources: vLLM 0.30 vllm/config/parallel.py (``master_port``, ``data_parallel_rpc_port``:
    one default each for every engine, so omni-pd sets them per engine),
    vllm/entrypoints/cli/serve.py (``--master-port`` of a multi-node instance); the plan's
    formulas: omni_pd/compile/port_plan.py."""
    topo = ctx.topology
    if topo is None:
        return
    port, base = ctx.launch_ports
    where = ctx.placement
    nodes_of = (lambda sid: where.nodes_of(sid)) if where is not None else (lambda sid: (None,))
    try:
        planned = plan_ports(topo, ctx.target, port=port, engine_port_base=base, nodes_of=nodes_of,
                             platform=ctx.launch_platform or ctx.platform)
    except (KeyError, ValueError, TypeError):  # a placement without the stage, a port that is no number
        return
    seen: dict[tuple[Any, int], PlannedPort] = {}
    used: dict[Any, set[int]] = {}
    for x in planned:
        used.setdefault(x.host, set()).add(x.port)
    for x in planned:
        first = seen.get((x.host, x.port))
        if first is None:
            seen[(x.host, x.port)] = x
            continue
        if first.process == x.process and _listener(first.purpose) == _listener(x.purpose):
            continue
        if first.source == "config" and x.source == "config":
            continue  # two ports the file sets: OPD501 judges them
        yield _finding(ctx, r, first, x, used.get(x.host, set()))


def _free(near: int, used: set[int]) -> int:
    """The first port above ``near`` no listener of the host uses."""
    p = near + 1
    while p in used and p < PORT_MAX:
        p += 1
    return p


def _finding(ctx: Context, r: Rule, a: PlannedPort, b: PlannedPort, used: set[int]) -> Diagnostic:
    """OPD510 for ``a`` and ``b``, located at the key that moves one of them."""
    hostword = f"host {b.host}" if b.host is not None else "the shared host"
    msg = f"port {b.port} on {hostword} is planned for both {_what(a)} and {_what(b)}"
    free = _free(b.port, used)
    cfg = next((x for x in (b, a) if x.source == "config" and x.stage_id is not None), None)
    rpc = next((x for x in (b, a) if x.purpose == DP_RPC and x.stage_id is not None), None)
    other = a if cfg is b or (cfg is None and rpc is b) else b
    related: list[Location] = []
    if other.stage_id is not None and topo_node(ctx, other.stage_id) is not None:
        related = [ctx.sloc(topo_node(ctx, other.stage_id), label=f"{other.process}: stage {other.stage_id}")]
    if cfg is not None:
        node = topo_node(ctx, cfg.stage_id)
        path = key_path(cfg.key)
        loc = ctx.sloc(node, *path, value=True)
        if cfg.key is None:
            fix = (f"set the port of stage {cfg.stage_id}'s {cfg.purpose} (unset: the connector's default "
                   f"{cfg.port}) to one no other process on {hostword} uses, e.g. {free}")
        else:
            fix = f"set {_shown(path)} of stage {cfg.stage_id} to a port no other process on {hostword} uses, e.g. {free}"
        return r.diag(msg, loc, related=related, help=fix)
    if rpc is not None:
        node = topo_node(ctx, rpc.stage_id)
        at = ctx.stage_path(node, "data_parallel_size")
        loc = ctx.sloc(node, "data_parallel_size") if ctx.exists(at) else ctx.sloc(node)
        return r.diag(msg, loc, related=related,
                      help=f"set data_parallel_rpc_port: {free} on stage {rpc.stage_id} ({rpc.process}'s "
                           "--data-parallel-rpc-port; instance r of num_replicas takes it + r)")
    node = topo_node(ctx, b.stage_id if b.stage_id is not None else a.stage_id)  # type: ignore[arg-type]
    loc = ctx.sloc(node) if node is not None else Location(file=ctx.doc.name, line=1, column=1)
    return r.diag(msg, loc, related=related,
                  help="pass launch/render a --port and --engine-port-base whose ports stay apart (prefill "
                       "listens on the base, decode on +100, the encoder on +200; their DP RPC ports +300, a "
                       "spanning instance's --master-port +600)")


def topo_node(ctx: Context, stage_id: int | None) -> Any:
    """The :class:`~omni_pd.compile.topology.StageNode` of ``stage_id`` in ``ctx``'s topology (None: none)."""
    if stage_id is None or ctx.topology is None:
        return None
    return ctx.topology.node(stage_id)
