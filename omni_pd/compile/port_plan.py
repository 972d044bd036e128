"""The port plan: every TCP port the processes ``omni-pd launch`` starts bind, per host (pure).

One function, :func:`plan_ports`, derives them from a resolved
:class:`~omni_pd.compile.topology.Topology`, the launch options that move ports (``--port``,
``--engine-port-base``) and the placement; ``validate`` (OPD510,
omni_pd/check/rules/planned_ports.py) judges its collisions and ``launch``/``render``
(:func:`omni_pd.launch.plan.build_plan`) give each process the ports it lists. The formulas
live here once:

* ``vllm`` runtime: prefill instance r listens on ``--engine-port-base`` + r, decode on
  + 100 + r (:data:`DECODE_PORT_OFFSET`), the encoder on + 200 (:data:`ENCODER_PORT_OFFSET`),
  the PD router on ``--port`` on decode's host; an engine with ``data_parallel_size`` > 1
  binds its HTTP port + 300 for vLLM's data-parallel RPC (:func:`dp_rpc_port`), an instance
  spanning hosts its HTTP port + 600 for the torch.distributed store on its first host
  (:func:`span_master_port`); connector ports are the connector contract's
  (omni_pd/compile/connectors ``ports``, ``base + r*span`` per instance: :func:`instances`).
* ``vllm-omni`` runtime: one server on ``--port`` binding every stage's connector ports;
  across hosts, the head's ``--omni-master-port`` = ``--engine-port-base`` + 300
  (:data:`OMNI_MASTER_PORT_OFFSET`) and each stage's ports on its own host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from omni_pd.compile.devices import format_devices
from omni_pd.compile.topology import StageNode, Topology

#: the highest TCP port a planned listener may use
PORT_MAX = 65535
#: decode instance r's HTTP port: ``--engine-port-base`` + this + r (prefill: + r)
DECODE_PORT_OFFSET = 100
#: HTTP port of the encoder instance E: ``--engine-port-base`` + this (prefill +0, decode +100)
ENCODER_PORT_OFFSET = 200
#: a ``data_parallel_size`` > 1 engine's ``--data-parallel-rpc-port``: its HTTP port + this
#: (prefill instances ``--engine-port-base`` + 300.., decode + 400.., the encoder + 500)
DP_RPC_PORT_OFFSET = 300
#: the :class:`PortUse` purpose of that port
DP_RPC = "data-parallel RPC (--data-parallel-rpc-port)"
#: ``--master-port`` of an instance spanning hosts: its HTTP port + this (prefill 8100 -> 8700,
#: decode 8200 -> 8800), so two spanning instances with a leader on one host do not collide
#: (vLLM's own default is 29501 for every instance: vllm/config/parallel.py ``master_port``).
#: Every port derived from ``--engine-port-base`` has its own band of 100 (xPyD instances
#: r < 100): HTTP prefill +0, decode +100, encoder +200; DP RPC prefill +300, decode +400,
#: encoder +500; master prefill +600, decode +700. With + 400 (before issue 35 item 7) a
#: prefill spanning hosts A + B and a decode of DP 2 on A both planned 8500 (8100 + 400,
#: 8200 + 300), and launch refused what expand wrote
SPAN_MASTER_PORT_OFFSET = 600
#: the :class:`PortUse` purpose of a spanning instance's ``--master-port`` on node rank 0
MASTER_PURPOSE = "torch.distributed store (--master-port)"
#: a vllm-omni head's ``--omni-master-port`` across hosts: ``--engine-port-base`` + this
OMNI_MASTER_PORT_OFFSET = 300
#: the :class:`PortUse` purpose of that port
OMNI_MASTER_PURPOSE = "omni master (registration)"
#: the :class:`PortUse` purpose of an HCCL listener on npu
HCCL_PURPOSE = "HCCL listener (HCCL_IF_BASE_PORT)"


@dataclass(frozen=True)
class PortUse:
    """One TCP port a process binds: ``port`` (1..65535) on ``host``; ``purpose`` e.g.
    ``http``, ``nixl-side-channel``, ``mooncake-bootstrap``."""

    port: int
    purpose: str
    host: str = "127.0.0.1"


@dataclass(frozen=True)
class PlannedPort:
    """One port of :func:`plan_ports`. ``process``: the launch plan's process name
    (``prefill-0``, ``decode-1``, ``encoder-0``, ``router``, ``omni``, ``stage-2``);
    ``stage_id``: the stage it serves (None: the router); ``host``: the inventory host it
    binds on (None: the one host); ``port``/``purpose`` as the plan's
    :class:`PortUse`; ``source``: where the number comes from, a launch option
    (``--port``, ``--engine-port-base``) or ``config`` (a setting of the stage);
    ``key``: for ``config``, the setting that decides it as the connector contract names
    it (``kv_connector_extra_config.bootstrap_port``, an env variable, ``data_parallel_rpc_port``;
    None: a default); ``how``: how a derived port is computed, in words
    (``--engine-port-base 8100 + 100``, ``its HTTP port 8200 + 300``; "" for ``config``)."""

    process: str
    stage_id: int | None
    host: str | None
    port: int
    purpose: str
    source: str
    key: str | None = None
    how: str = ""


def engine_http_port(role: str, replica: int, engine_port_base: int) -> int:
    """HTTP port of instance ``replica`` of a ``vllm``-runtime engine of ``role``
    (``prefill``/``pd`` + r, ``decode`` + 100 + r, ``encoder`` + 200)."""
    if role == "encoder":
        return engine_port_base + ENCODER_PORT_OFFSET
    return engine_port_base + (DECODE_PORT_OFFSET if role == "decode" else 0) + replica


def dp_rpc_port(settings: dict[str, Any], dp: int, http_port: int, replica: int) -> int | None:
    """The ``--data-parallel-rpc-port`` of one engine, None for ``dp`` 1.

    vLLM 0.30 gives every engine the same default, 29550 (vllm/config/parallel.py:143
    ``data_parallel_rpc_port``), and its DP head binds it (ZMQ ROUTER on
    ``data_parallel_address``) whenever a DP rank is not local: ``data_parallel_size_local``
    below ``data_parallel_size``, hybrid or external load balancing
    (vllm/v1/engine/utils.py:1196-1217 ``launch_core_engines``; with every rank local the
    handshake is IPC, vllm/engine/arg_utils.py:2330). omni-pd sets it per engine anyway,
    so no two engines on a host can share it in any mode and preflight holds it free:
    the stage's own ``data_parallel_rpc_port`` + ``replica`` when it sets one (instance
    ``replica`` of ``num_replicas``), else ``http_port`` + :data:`DP_RPC_PORT_OFFSET`.
    ``settings``: the engine keys (pipeline-wide and the stage's). Pure."""
    if dp <= 1:
        return None
    own = settings.get("data_parallel_rpc_port")
    return int(own) + replica if own is not None else http_port + DP_RPC_PORT_OFFSET


def span_master_port(http_port: int) -> int:
    """``--master-port`` of an instance spanning hosts whose API server listens on
    ``http_port`` (:data:`SPAN_MASTER_PORT_OFFSET`)."""
    return http_port + SPAN_MASTER_PORT_OFFSET


def hccl_port(raw: Any, node: StageNode, replica: int) -> int | None:
    """On npu: the ``HCCL_IF_BASE_PORT`` of instance ``replica`` of ``node`` whose stage
    sets ``raw``: that base + ``replica * span`` (expand reserves ``span`` = 16 ports per
    rank per instance; presets/targets/vllm_ascend.yaml ``rules.hccl``), so co-located
    instances listen apart (vllm-ascend#4725). None when ``raw`` is no integer."""
    from omni_pd.compile import ascend

    try:
        base = int(str(raw))
    except (TypeError, ValueError):
        return None
    return base + replica * ascend.hccl_span(ascend.Sizes(tp=node.tp, dp=node.dp, pp=node.pp))


def connector_ports(node: StageNode, target: Any, host: str, runtime: str = "vllm",
                    platform: str | None = None) -> tuple[PortUse, ...]:
    """Every connector port the engines of ``node`` bind on ``host``, one entry per port.

    The same function as ``expand``'s allocation and ``validate``'s OPD501/OPD502
    (the connector contract's ``ports``, facts from presets/targets), never the env value
    in the file alone: on vllm-omni 0.30 a Mooncake prefill stage with ``num_replicas`` N
    binds ``bootstrap_port + r`` for r < N (vllm_omni/engine/stage_runtime.py
    ``_prepare_replica_vllm_config``). ``runtime``: ``vllm-omni`` starts ``num_replicas``
    engines per stage, ``vllm`` one per process omni-pd starts.
    """
    return tuple(PortUse(port, purpose, host)
                 for port, purpose, _ in _connector_port_keys(node, target, runtime, platform))


def _connector_port_keys(node: StageNode, target: Any, runtime: str,
                         platform: str | None = None) -> list[tuple[int, str, str | None]]:
    """:func:`connector_ports` as (port, purpose, deciding key)."""
    from omni_pd.compile import connectors
    from omni_pd.compile.connectors.base import launched_replicas

    kv = node.kv or {}
    conn = connectors.contract_of(kv, platform)
    if conn is None or target is None:
        return []
    side = "prefill" if node.pd_role == "prefill" else "decode"
    reps = launched_replicas(node.num_replicas)
    out = []
    for p in conn.ports(side, kv, node.env or {}, node.tp, node.dp, target, runtime=runtime, replicas=reps):
        label = p.purpose + (f" replica {p.replica}" if reps > 1 else "")
        for i in range(p.span):
            out.append((p.port + i, label + (f"[{i}]" if p.span > 1 else ""), p.key))
    return out


def payload_ports(topo: Topology) -> dict[int, list[tuple[int, str]]]:
    """Stage id -> the (port, purpose) of the omni connector listener its worker binds
    for a stage edge it sends on: NixlConnector and the transfer-engine connectors with a
    ``zmq_port`` (:func:`omni_pd.compile.stage_edges.sender_port`); SharedMemoryConnector
    binds none."""
    from omni_pd.compile.stage_edges import payload_edges, sender_port

    tree = topo.config.model_dump(by_alias=True, exclude_unset=True) if topo.config is not None else {}
    out: dict[int, list[tuple[int, str]]] = {}
    for e in payload_edges(tree):
        port = (e.extra or {}).get("zmq_port")
        if e.connector in ("NixlConnector", "MooncakeTransferEngineConnector") and isinstance(port, int):
            out.setdefault(e.src, []).append((sender_port(port, e.src), f"omni connector {e.src}->{e.dst}"))
    return out


@dataclass(frozen=True)
class Instance:
    """One ``vllm serve`` of a prefill or decode stage with ``num_replicas`` N (xPyD).

    ``replica``: 0..N-1. ``devices``: its chunk of the stage's devices (``"0,1"``; None:
    no device list). ``kv``: the stage's ``kv_transfer_config`` with this instance's
    ``engine_id``. ``env``: the connector port variable set to this instance's port.
    ``ports``: connector ports it binds (one entry per port). ``bootstrap_port``: the
    port the router must know (a prefill of a connector whose contract sets
    ``router_bootstrap``: Mooncake's bootstrap server), else None. ``keys``: the setting
    that decides each of ``ports`` (same order; None: a default).
    """

    replica: int
    devices: str | None
    kv: dict[str, Any]
    env: dict[str, str]
    ports: tuple[PortUse, ...]
    bootstrap_port: int | None = None
    keys: tuple[str | None, ...] = ()


def instance_devices(devices: Any, replicas: int, replica: int, per_replica: int | None = None) -> Any:
    """The devices of instance ``replica`` of a stage with ``replicas`` instances, placed as
    vllm-omni 0.30 places a stage's replicas (vllm_omni/engine/stage_init_utils.py
    ``split_devices_for_replicas``, :func:`omni_pd.compile.devices.replica_devices`), so a
    file means the same on both runtimes and validate (OPD401/402/403/404) judges what runs:
    ``per_replica`` the devices one engine takes (TP x PP x DP): a pool of ``replicas x
    per_replica`` entries splits into consecutive chunks, a template of ``per_replica``
    entries shifts by ``replica x per_replica`` (``(0,)``, 2 replicas: ``(0,)``, ``(1,)``).
    ``per_replica`` None: the length over ``replicas`` (a pool when it divides). A split
    vllm-omni refuses (validate's OPD401, and launch refuses the file), "cpu" or None: the
    devices as written, shared by every instance."""
    from omni_pd.compile.devices import replica_devices

    if not isinstance(devices, tuple) or replicas <= 1:
        return devices
    if per_replica is None:
        if len(devices) % replicas:
            return devices
        per_replica = len(devices) // replicas
    split = replica_devices(devices, replicas, per_replica)
    return devices if split is None else split[replica]


def instances(node: StageNode, target: Any, platform: str | None = None) -> list[Instance]:
    """The ``vllm serve`` instances omni-pd's launcher starts for a prefill or decode
    stage: ``num_replicas`` of them, instance r with its own devices
    (:func:`instance_devices`), ``engine_id`` (:func:`~omni_pd.compile.connectors.base.
    instance_engine_id`) and connector ports (the contract's ``ports`` on the ``vllm``
    runtime: ``base + r*span``, the same function validate and expand use) of the connector
    the stage loads on ``platform`` (:func:`omni_pd.compile.connectors.contract_of`: a
    ``kv_connector_module_path`` decides it)."""
    from omni_pd.compile import connectors
    from omni_pd.compile.connectors.base import instance_engine_id, launched_replicas

    kv = dict(node.kv or {})
    reps = launched_replicas(node.num_replicas)
    conn = connectors.contract_of(kv, platform)
    side = "prefill" if node.pd_role == "prefill" else "decode"
    uses = (conn.ports(side, kv, node.env or {}, node.tp, node.dp, target, runtime="vllm", replicas=reps)
            if conn is not None and target is not None else [])
    out = []
    for r in range(reps):
        mine = [u for u in uses if u.replica == r]
        env: dict[str, str] = {}
        if conn is not None and conn.port_env and mine and reps > 1:
            env[conn.port_env] = str(mine[0].port)
        ports = tuple(PortUse(u.port + i, u.purpose + (f" instance {r}" if reps > 1 else "")
                              + (f"[{i}]" if u.span > 1 else ""))
                      for u in mine for i in range(u.span))
        keys = tuple(u.key for u in mine for _ in range(u.span))
        ikv = dict(kv)
        if isinstance(kv.get("engine_id"), str):
            ikv["engine_id"] = instance_engine_id(kv["engine_id"], r, reps)
        bp = mine[0].port if (mine and conn is not None and conn.router_bootstrap) else None
        out.append(Instance(r, format_devices(instance_devices(node.devices, reps, r, node.world_size)),
                            ikv, env, ports, bp, keys))
    return out


#: the role (and process name prefix) of an E -> PD instance: it runs prefill and decode
PD_ROLE = "pd"


def e_pd_instance(topo: Topology) -> StageNode | None:
    """The LLM stage of an E -> PD layout (``*_1e1pd``: an encoder stage E and one stage
    that runs prefill and decode, E's ec_consumer), served by plain ``vllm serve``; None
    for every other topology (a PD pair, no encoder, the vllm-omni runtime)."""
    pipe = topo.pipeline
    c = pipe.ec_consumer
    if pipe.encoder is None or c is None or c.pd_role is not None or pipe.launcher != "vllm":
        return None
    return topo.node(c.stage_id)


def plan_ports(topo: Topology, target: Any, *, port: int = 8000, engine_port_base: int = 8100,
               nodes_of: Callable[[int], Sequence[str | None]] = lambda sid: (None,),
               platform: str | None = None, wide: dict[str, Any] | None = None,
               env: Mapping[str, Any] | None = None) -> tuple[PlannedPort, ...]:
    """Every port the launch plan of ``topo`` binds, per process, in the order each
    process lists them (HTTP first).

    ``target``: the vLLM :class:`~omni_pd.compile.targets.Target` (connector port facts).
    ``port``/``engine_port_base``: ``launch --port``/``--engine-port-base``. ``nodes_of(sid)``:
    the hosts one instance of stage ``sid`` runs on, node rank order (``(None,)``: the one
    host; a placement's ``nodes_of``). ``platform``: the launch platform (``npu`` adds HCCL
    listeners). ``wide``: the pipeline-wide engine keys
    (:func:`~omni_pd.compile.topology.pipeline_wide_settings`; a stage's own keys win).
    ``env``: what ``launch --env`` gives every process (a stage's own env wins).
    Raises nothing for a topology without a PD pair or E -> PD instance: () then. Pure."""
    from omni_pd.compile.topology import pipeline_wide_settings

    if wide is None:
        wide = pipeline_wide_settings(topo.config) if topo.config is not None else {}
    host = lambda sid: nodes_of(sid)[0]  # noqa: E731  (node rank 0: an instance's leader)
    out: list[PlannedPort] = []
    pair = topo.pd_pair
    if topo.pipeline.launcher == "vllm-omni":
        hosts = {host(s.stage_id) for s in topo.stages}
        if len(hosts) <= 1:
            h = next(iter(hosts), None)
            out.append(PlannedPort("omni", None, h, port, "http", "--port", how=f"--port {port}"))
            for s in topo.stages:
                if s.pd_role:
                    out += [PlannedPort("omni", s.stage_id, h, p, what, "config", key)
                            for p, what, key in _connector_port_keys(s, target, "vllm-omni", platform)]
            return tuple(out)
        payload = payload_ports(topo)
        head = min(s.stage_id for s in topo.stages)
        for s in sorted(topo.stages, key=lambda n: n.stage_id):
            name, h = ("omni" if s.stage_id == head else f"stage-{s.stage_id}"), host(s.stage_id)
            if s.stage_id == head:
                out.append(PlannedPort(name, s.stage_id, h, port, "http", "--port", how=f"--port {port}"))
                out.append(PlannedPort(name, s.stage_id, h, engine_port_base + OMNI_MASTER_PORT_OFFSET,
                                       OMNI_MASTER_PURPOSE, "--engine-port-base",
                                       how=f"--engine-port-base {engine_port_base} + {OMNI_MASTER_PORT_OFFSET}"))
            if s.pd_role:
                out += [PlannedPort(name, s.stage_id, h, p, what, "config", key)
                        for p, what, key in _connector_port_keys(s, target, "vllm-omni", platform)]
            out += [PlannedPort(name, s.stage_id, h, p, what, "config", "zmq_port")
                    for p, what in payload.get(s.stage_id, ())]
        return tuple(out)
    whole = e_pd_instance(topo) if pair is None else None
    if pair is None and whole is None:
        return ()
    sides = (("prefill", pair[0]), ("decode", pair[1])) if pair is not None else ((PD_ROLE, whole),)
    for role, node in sides:
        h = host(node.stage_id)
        settings = {**wide, **node.settings}
        for inst in instances(node, target, platform):
            name = f"{role}-{inst.replica}"
            http = engine_http_port(role, inst.replica, engine_port_base)
            plus = http - engine_port_base
            out.append(PlannedPort(name, node.stage_id, h, http, "http", "--engine-port-base",
                                   how=f"--engine-port-base {engine_port_base}" + (f" + {plus}" if plus else "")))
            out += [PlannedPort(name, node.stage_id, h, u.port, u.purpose, "config", k)
                    for u, k in zip(inst.ports, inst.keys or (None,) * len(inst.ports))]
            if platform == "npu":
                from omni_pd.compile import ascend

                raw = {**(env or {}), **node.env}.get(ascend.hccl()["env"])
                hp = hccl_port(raw, node, inst.replica) if raw is not None else None
                if hp is not None:
                    out.append(PlannedPort(name, node.stage_id, h, hp, HCCL_PURPOSE, "config", ascend.hccl()["env"]))
            rpc = dp_rpc_port(settings, node.dp, http, inst.replica)
            if rpc is not None:
                own = settings.get("data_parallel_rpc_port") is not None
                out.append(PlannedPort(name, node.stage_id, h, rpc, DP_RPC, "config" if own else "--engine-port-base",
                                       "data_parallel_rpc_port" if own else None,
                                       "" if own else f"its HTTP port {http} + {DP_RPC_PORT_OFFSET}"))
            if len(nodes_of(node.stage_id)) > 1:
                out.append(PlannedPort(name, node.stage_id, h, span_master_port(http), MASTER_PURPOSE,
                                       "--engine-port-base", how=f"its HTTP port {http} + {SPAN_MASTER_PORT_OFFSET}"))
    enc = topo.node(topo.pipeline.encoder.stage_id) if topo.pipeline.encoder is not None else None
    if enc is not None:
        h = host(enc.stage_id)
        http = engine_http_port("encoder", 0, engine_port_base)
        out.append(PlannedPort("encoder-0", enc.stage_id, h, http, "http", "--engine-port-base",
                               how=f"--engine-port-base {engine_port_base} + {ENCODER_PORT_OFFSET}"))
        settings = {**wide, **enc.settings}
        rpc = dp_rpc_port(settings, enc.dp, http, 0)
        if rpc is not None:
            own = settings.get("data_parallel_rpc_port") is not None
            out.append(PlannedPort("encoder-0", enc.stage_id, h, rpc, DP_RPC, "config" if own else "--engine-port-base",
                                   "data_parallel_rpc_port" if own else None,
                                   "" if own else f"its HTTP port {http} + {DP_RPC_PORT_OFFSET}"))
    d = pair[1] if pair is not None else whole
    out.append(PlannedPort("router", None, host(d.stage_id), port, "http", "--port",  # type: ignore[union-attr]
                           how=f"--port {port}"))
    return tuple(out)
