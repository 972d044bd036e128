"""Build a :class:`~omni_pd.launch.spec.LaunchPlan` from a compiled PD deploy config (pure).

Two runtimes, chosen from the pipeline (``presets/pipelines/*.yaml`` ``launch_runtime:``,
else ``runtime:``):

* ``vllm-omni`` (Qwen3-Omni and other multi-stage pipelines): one
  ``vllm serve MODEL --omni --deploy-config FILE --host H --port P`` process; vllm-omni
  starts the stage engines itself and its orchestrator routes prefill -> decode. With
  ``MooncakeConnector`` no extra service is needed: vLLM's connector uses Mooncake's
  ``P2PHANDSHAKE`` metadata mode and each prefill runs its own bootstrap server
  (vllm/distributed/kv_transfer/kv_connector/v1/mooncake; shared/reference
  vllm_kv_connectors.md §3.2).
* ``vllm`` (plain LLMs, and thinker-only pipelines: their catalogue entries set
  ``launch_runtime: vllm``): one ``vllm serve`` per prefill and per decode instance with
  ``--kv-transfer-config`` (JSON) and the connector's env, plus the PD router
  (:mod:`omni_pd.launch.router`) in front, started once both are healthy. An engine with
  ``data_parallel_size`` > 1 also gets its own ``--data-parallel-rpc-port``
  (:func:`dp_rpc_port`).

Argv is always a list; env values are strings passed as data; nothing here touches
processes, files or the network.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from omni_pd.check.serve_flags import DEPLOY_ONLY_KEYS
from omni_pd.compile import connectors
from omni_pd.compile.devices import DEVICE_VARS, visible_value
from omni_pd.compile.port_plan import (DP_RPC, DP_RPC_PORT_OFFSET, ENCODER_PORT_OFFSET,  # noqa: F401  (re-exported)
                                       MASTER_PURPOSE, PD_ROLE, PORT_MAX, SPAN_MASTER_PORT_OFFSET, Instance,
                                       PlannedPort, dp_rpc_port, e_pd_instance, engine_http_port,
                                       OMNI_MASTER_PORT_OFFSET, instance_devices, instances, plan_ports,
                                       span_master_port)
from omni_pd.compile.port_plan import connector_ports as _connector_ports  # noqa: F401  (re-exported)
from omni_pd.compile.port_plan import payload_ports as _payload_ports  # noqa: F401  (re-exported)
from omni_pd.compile.topology import StageNode, Topology, format_devices, pipeline_wide_settings
from omni_pd.launch.device_map import (DEVICE_ENV, DeviceMap, device_env_values,  # noqa: F401  (re-exported)
                                       device_fields, device_note, launcher_visibility, map_devices)
from omni_pd.launch.ports import _dp_flags, _hccl_port, check_ports  # noqa: F401  (re-exported)
from omni_pd.launch.spec import HealthCheck, LaunchPlan, PortUse, ProcessSpec

#: stage keys that are deploy-schema keys, not `vllm serve` flags (one set, shared with
#: validate's unknown-flag check)
NON_ENGINE_KEYS = DEPLOY_ONLY_KEYS

def connector_modules(connector: str) -> tuple[str, ...]:
    """The Python module the engines import for ``connector``'s transport (preflight
    checks it): the connector module's ``import_name`` (omni_pd/compile/connectors), ()
    for an unknown connector or one without a transport package."""
    c = connectors.get(connector)
    return (c.import_name,) if c is not None and c.import_name else ()


@dataclass(frozen=True)
class LaunchOptions:
    """What the user told ``omni-pd launch``.

    ``vllm``: the ``vllm`` executable (path or name on PATH). ``host``: address every
    server binds and advertises. ``port``: the client-facing port (router or omni
    server). ``engine_port_base``: first HTTP port of the ``vllm`` runtime's engines
    (prefill ``base+i``, decode ``base+100+i``). ``platform``: ``cuda`` | ``rocm`` |
    ``npu`` | ``xpu`` | ``musa`` | ``cpu`` (picks the device env var). ``ready_timeout_s``:
    seconds each engine may take to load the model. ``extra_args``: appended to every
    ``vllm serve``. ``env``: added to every process (e.g. HF_TOKEN; masked in output).
    """

    model: str
    vllm: str = "vllm"
    host: str = "127.0.0.1"
    port: int = 8000
    engine_port_base: int = 8100
    platform: str = "cuda"
    served_model_name: str | None = None
    ready_timeout_s: float = 1200.0
    extra_args: tuple[str, ...] = ()
    #: ``(role, argument)``: appended to the ``vllm serve`` of that role's engines only
    #: (``--prefill-engine-arg``/``--decode-engine-arg``; the ``vllm`` runtime: one engine per
    #: instance). The vllm-omni runtime serves every stage from one command line and refuses them
    role_args: tuple[tuple[str, str], ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    python: str | None = None  # interpreter of the vllm install (preflight); None: next to `vllm`
    #: PD router processes (``--workers``); None: the router's default for this host's CPUs
    #: (:func:`omni_pd.launch.router.sizing.default_workers`)
    router_workers: int | None = None
    #: the interpreter that runs the PD router where it runs: ``render --python`` (a script
    #: runs on another host: ``python3`` from its PATH); None: this one (``sys.executable``,
    #: ``launch``). When set and ``router_workers`` is None, ``--workers`` is left to the
    #: router, which sizes it for the CPUs of the host it runs on
    router_python: str | None = None
    #: placement across hosts (``--inventory``; :class:`omni_pd.compile.placement.Placement`):
    #: every process runs on its stage's host and binds and advertises that host's
    #: address; the router runs on decode's host (:func:`build_plan`). None: one host, ``host``.
    placement: Any = None
    #: the launcher's own visibility variables (:func:`launcher_visibility` of its
    #: environment, which every child inherits): each engine's ``devices`` index them
    #: (:func:`map_devices`). {}: none set, logical == physical. Passed in by the caller;
    #: the plan never reads ``os.environ``
    launcher_env: dict[str, str] = field(default_factory=dict)
    #: the inventory host this launch runs on (``launch --host NAME``); None: one host, or a
    #: dry-run of every host. With a placement, :attr:`launcher_env` applies to that host's
    #: processes only (:func:`launcher_env_on`)
    local_host: str | None = None


def replica_notes(topo: Topology) -> tuple[str, ...]:
    """On the vllm-omni runtime, where vllm-omni itself places the replicas of each stage
    with ``num_replicas`` > 1 (vllm-omni 0.30 engine/stage_init_utils.py
    ``compute_replica_layout`` -> ``split_devices_for_replicas``; one engine's devices,
    TP x PP x DP, per replica; :func:`omni_pd.compile.devices.replica_devices`), e.g.
    ``vllm-omni places stage 0's 2 replicas itself: replica 0 on device 0, replica 1 on
    device 1 (a per-replica template)``: the plan starts one process, validate judges
    these devices (OPD401-404). Logical entries of the launcher's visibility variable."""
    from omni_pd.compile.devices import replica_devices

    out = []
    for n in topo.stages:
        reps = int(n.num_replicas or 1)
        if reps <= 1 or not isinstance(n.devices, tuple):
            continue
        split = replica_devices(n.devices, reps, n.world_size)
        if split is None:
            continue  # validate refuses it (OPD401)
        mode = "a per-replica template" if len(n.devices) < sum(len(x) for x in split) else "the pool, split in order"
        runs = ", ".join(f"replica {r} on device{'s' if len(x) > 1 else ''} {format_devices(x)}"
                         for r, x in enumerate(split))
        out.append(f"vllm-omni places stage {n.stage_id}'s {reps} replicas itself: {runs} ({mode} "
                   f"\"{format_devices(n.devices)}\")")
    return tuple(out)


def launcher_env_on(opts: LaunchOptions, host: str | None) -> Mapping[str, str]:
    """The launcher's visibility variables as they apply to a process placed on ``host``:
    all of :attr:`LaunchOptions.launcher_env` without a placement or on the launcher's own
    host (:attr:`LaunchOptions.local_host`); ``{}`` for a process on another host, whose
    logical devices index that host's own variable (unknown here: vllm-omni 0.30
    ``stage_runtime_setup`` reads the variable of the process it starts in), and for every
    process of a dry-run of all hosts."""
    if opts.placement is None or host is None:
        return opts.launcher_env
    return opts.launcher_env if host == opts.local_host else {}


def _router_workers_args(conn: str, opts: LaunchOptions) -> list[str]:
    """``["--workers", N]`` for the PD router: ``opts.router_workers``, else the router's
    default for this host (:func:`omni_pd.launch.router.sizing.default_workers`). None for
    a decode-first connector (``router_protocol`` ``push_front``): its front keeps the
    metaserver state in one process."""
    from omni_pd.launch.router.sizing import default_workers

    contract = connectors.get(conn)
    if contract is not None and contract.router_protocol == "push_front":
        return []
    if opts.router_workers is None and opts.router_python is not None:
        return []  # rendered for another host: the router's own default there (its CPUs, not ours)
    n = opts.router_workers if opts.router_workers is not None else default_workers()
    return ["--workers", str(n)]


def engine_flags(settings: dict[str, Any]) -> list[str]:
    """``vllm serve`` flags for a stage's engine keys, in the file's order.

    ``max_num_seqs: 8`` -> ``--max-num-seqs 8``; ``true`` -> ``--flag``; ``false`` ->
    ``--no-flag`` (vLLM's boolean flags accept both forms); mappings and lists ->
    JSON; None is skipped.
    """
    out: list[str] = []
    for k, v in settings.items():
        if k in NON_ENGINE_KEYS or v is None or not isinstance(k, str):
            continue
        flag = "--" + k.replace("_", "-")
        if isinstance(v, bool):
            out.append(flag if v else "--no-" + k.replace("_", "-"))
        elif isinstance(v, (dict, list)):
            out += [flag, json.dumps(v, sort_keys=False, separators=(",", ":"))]
        else:
            out += [flag, str(v)]
    return out


def _python_of(vllm: str) -> str | None:
    d = os.path.dirname(vllm)
    return os.path.join(d, "python") if d else None


def _env_str(env: dict[str, Any] | None) -> dict[str, str]:
    return {str(k): str(v) for k, v in (env or {}).items()}


def _is_ascend(connector: Any) -> bool:
    from omni_pd.compile import ascend

    return isinstance(connector, str) and ascend.is_ascend(connector)


#: :attr:`~omni_pd.launch.spec.LaunchPlan.connector` of an E -> PD plan (no KV connector)
NO_CONNECTOR = "none"


def build_plan(topo: Topology, config_path: str, opts: LaunchOptions, target: Any = None) -> LaunchPlan:
    """The launch plan for a compiled PD topology.

    ``topo``: the compiled config resolved for ``opts.platform`` (its pipeline must be
    a PD pipeline, or an E -> PD encoder split: :func:`e_pd_instance`). ``config_path``:
    the compiled file (passed to ``--deploy-config``). ``target``: the vLLM
    :class:`~omni_pd.compile.targets.Target` (connector port rules).

    E -> PD (``*_1e1pd``) is planned as vLLM's own example runs it (examples/online_serving/
    disaggregated_encoder/disagg_1e1pd_example.sh): the encoder ``encoder-0``
    (ec_producer), one ``vllm serve`` per replica of the LLM stage (``pd-<r>``, role
    ``pd``: its ec_consumer ``--ec-transfer-config``, no ``--kv-transfer-config``, HTTP
    port ``--engine-port-base`` + r) and the router with ``--instance`` URLs and no
    ``--connector``, which sends each request's media to E first and then the whole
    request to one instance (:class:`~omni_pd.launch.router.core.PDRouter` without a
    connector). ``connector`` is ``none``.
    Raises ``ValueError`` when the topology has neither a prefill/decode pair nor that
    instance.
    """
    pair = topo.pd_pair
    whole = e_pd_instance(topo) if pair is None else None
    if pair is None and whole is None:
        raise ValueError("the config has no prefill/decode pair: run `omni-pd expand` first")
    p, d = pair if pair is not None else (whole, whole)
    where = _Where(opts)
    # the connector prefill loads (a kv_connector_module_path decides which: its contract's name, so
    # vllm-ascend's MooncakeConnector module path gets MooncakeConnectorV1's router protocol and ports)
    conn = connectors.row_name(p.kv, opts.platform) if pair is not None else NO_CONNECTOR
    served = opts.served_model_name or opts.model
    env_all = dict(opts.env)
    engine_py = opts.python or _python_of(opts.vllm)
    mods = ("vllm",) + (connector_modules(conn) if pair is not None else ())
    wide = pipeline_wide_settings(topo.config)  # top-level keys; a stage's own value wins
    # every port of every process: the one port plan validate judges (OPD510)
    planned = plan_ports(topo, target, port=opts.port, engine_port_base=opts.engine_port_base,
                         nodes_of=where.nodes_of, platform=opts.platform, wide=wide, env=env_all)

    def uses(name: str, bind: str) -> tuple[PortUse, ...]:
        return tuple(PortUse(x.port, x.purpose, bind) for x in planned if x.process == name)

    if topo.pipeline.launcher == "vllm-omni":
        if opts.role_args:
            from omni_pd.diagnostics import Diagnostic, OmniPdError, Severity

            raise OmniPdError(Diagnostic(
                code="OPD006", severity=Severity.ERROR,
                message="--prefill-engine-arg/--decode-engine-arg: vllm-omni serves every stage of this pipeline "
                        "from one `vllm serve --omni` command line, so a flag cannot reach one side only",
                help="write the setting into that stage of the deploy file: `omni-pd expand --prefill-set KEY=VALUE "
                     "--decode-set KEY=VALUE` (validated like the file)"))
        if where.across_hosts(topo):
            return _omni_across_hosts(topo, config_path, opts, target, where, served, env_all, engine_py, mods, p.kv,
                                      planned)
        omni_host = where.one_host(topo)
        opts = replace(opts, host=where.address(omni_host)) if omni_host is not None else opts
        ports = uses("omni", opts.host)
        proc = ProcessSpec(
            name="omni", role="omni",
            argv=(opts.vllm, "serve", opts.model, "--omni", "--deploy-config", config_path,
                  "--host", opts.host, "--port", str(opts.port), "--served-model-name", served,
                  *opts.extra_args),
            env=env_all, ports=tuple(ports),
            health=HealthCheck(f"http://{opts.host}:{opts.port}/health", timeout_s=opts.ready_timeout_s),
            modules=mods + ("vllm_omni", "omni_pd"), python=engine_py, host=omni_host)
        return LaunchPlan(runtime="vllm-omni", model=opts.model, connector=conn,
                          entrypoint=f"http://{opts.host}:{opts.port}", config=config_path, processes=(proc,),
                          notes=("vllm-omni starts every stage engine and routes prefill -> decode itself",)
                          + replica_notes(topo) + _lease_note(p.kv, opts.platform, target, False))
    from omni_pd.check.lease_facts import planned_lease

    procs: list[ProcessSpec] = []
    device_notes: list[str] = []
    lease_set = False
    sides = (("prefill", p), ("decode", d)) if pair is not None else ((PD_ROLE, p),)
    urls: dict[str, list[str]] = {role: [] for role, _ in sides}
    for role, node in sides:
        on = where.host(node.stage_id)
        bind = where.address(on)
        for inst in instances(node, target, opts.platform):
            leased = planned_lease(inst.kv, opts.platform, target)
            if leased is not None:
                inst, lease_set = replace(inst, kv=leased), True
            port = engine_http_port(role, inst.replica, opts.engine_port_base)
            env = {**env_all, **_env_str(node.env), **inst.env}
            dev, note = device_fields(f"{role}-{inst.replica}", inst.devices, DEVICE_VARS.get(opts.platform),
                                      node.env, env_all, launcher_env_on(opts, on))
            env.update(device_env_values(opts.platform, dev))
            if note:
                device_notes.append(note)
            if opts.platform == "npu":
                _hccl_port(env, node, inst.replica)  # the instance's HCCL_IF_BASE_PORT, as the port plan has it
            if _is_ascend(conn):  # an npu overlay keeps the base's CUDA-connector env: unread there
                for k in ("VLLM_MOONCAKE_BOOTSTRAP_PORT", "VLLM_NIXL_SIDE_CHANNEL_PORT", "VLLM_NIXL_SIDE_CHANNEL_HOST"):
                    env.pop(k, None)
            settings = {**wide, **node.settings}
            rpc = dp_rpc_port(settings, node.dp, port, inst.replica)
            settings, dp_flags = _dp_flags(settings, rpc)
            kv_flag = [] if role == PD_ROLE else ["--kv-transfer-config", json.dumps(inst.kv, separators=(",", ":"))]
            argv = [opts.vllm, "serve", opts.model, "--host", bind, "--port", str(port),
                    "--served-model-name", served, *kv_flag, *engine_flags(settings)]
            argv += dp_flags + list(opts.extra_args) + [a for r, a in opts.role_args if r == role]
            procs.append(ProcessSpec(
                name=f"{role}-{inst.replica}", role=role, argv=tuple(argv), env=env, **dev,
                ports=uses(f"{role}-{inst.replica}", bind),
                health=HealthCheck(f"http://{bind}:{port}/health", timeout_s=opts.ready_timeout_s),
                modules=mods, python=engine_py,
                memory_fraction=float(node.settings.get("gpu_memory_utilization") or 0.9), host=on))
            nodes = _span_nodes(node, where, role)
            if len(nodes) > 1:
                leader, workers = _span_processes(procs.pop(), nodes, where, opts, port, role, node.env)
                procs += [leader, *workers]
            url = f"http://{bind}:{port}"
            if role == "prefill" and inst.bootstrap_port is not None:
                url += f",{inst.bootstrap_port}"
            urls[role].append(url)
    ec_storage, ec_name = None, None
    enc = topo.node(topo.pipeline.encoder.stage_id) if topo.pipeline.encoder is not None else None
    if enc is not None:
        e_on = where.host(enc.stage_id)
        e_proc, ec_name, ec_storage, note = _encoder_process(enc, replace(opts, host=where.address(e_on)), served,
                                                             env_all, engine_py, wide,
                                                             uses("encoder-0", where.address(e_on)))
        if note:
            device_notes.append(note)
        e_proc = replace(e_proc, host=e_on)
        consumer = "prefill" if pair is not None else PD_ROLE  # the ec_consumer reads E's outputs
        procs = [replace(x, writable_dirs=(ec_storage,)) if (x.role == consumer and ec_storage) else x
                 for x in procs]
        procs.append(e_proc)
        urls["encoder"] = [e_proc.health.url.rsplit("/", 1)[0]]  # type: ignore[union-attr]
    # the router runs on decode's host, as llm-d runs its routing sidecar in the decode pod
    r_on = where.host(d.stage_id)
    r_bind = where.address(r_on)
    router_py = opts.router_python or sys.executable
    router_argv = [router_py, "-m", "omni_pd.launch.router"] + (
        ["--connector", conn] if pair is not None else []) + [
        "--host", r_bind, "--port", str(opts.port)] + _router_workers_args(conn, opts)
    for role, flag in (("prefill", "--prefill"), ("decode", "--decode"), (PD_ROLE, "--instance")):
        for u in urls.get(role, []):
            router_argv += [flag, u]
    for u in urls.get("encoder", []):
        router_argv += ["--encoder", u]
    procs.append(ProcessSpec(
        name="router", role="router", argv=tuple(router_argv), env=env_all,
        ports=uses("router", r_bind),
        health=HealthCheck(f"http://{r_bind}:{opts.port}/health", timeout_s=60.0),
        depends_on=tuple(x.name for x in procs if x.ready_with is None),  # a worker: its leader gates it
        # the router runs under omni-pd's own interpreter: preflight checks its HTTP stack there
        modules=("aiohttp", "omni_pd"), python=router_py, host=r_on))
    return LaunchPlan(runtime="vllm", model=opts.model, connector=conn, entrypoint=f"http://{r_bind}:{opts.port}",
                      config=config_path, processes=tuple(procs),
                      notes=(("router: omni_pd.launch.router (prefill leg max_tokens=1, min_tokens/stop cleared; "
                              f"{conn} routing fields relayed to decode)",) if pair is not None else (
                          "router: omni_pd.launch.router without a KV connector (E -> PD): each request goes "
                          "whole to one pd instance, which runs prefill and decode itself",))
                      + ((f"encoder leg: one request per media item to encoder-0 first; its {ec_name} output "
                          f"reaches {'prefill' if pair is not None else 'the pd instance'} (ec_consumer)",)
                         if enc is not None else ())
                      + _lease_note(p.kv, opts.platform, target, lease_set) + tuple(device_notes),
                      ec_connector=ec_name, ec_storage=ec_storage)


#: flags of the API server only: a headless worker takes none of them
SERVER_FLAGS = ("--host", "--port", "--api-key", "--served-model-name")
#: role suffix of a headless worker of an instance spanning hosts (``prefill-worker``)
WORKER_SUFFIX = "-worker"

def drop_flags(args: Sequence[str], flags: Sequence[str]) -> list[str]:
    """``args`` without each of ``flags`` and its value (``--flag V`` or ``--flag=V``). Pure."""
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a in flags:
            skip = True
        elif "=" not in a or a.split("=", 1)[0] not in flags:
            out.append(a)
    return out


def _span_nodes(node: StageNode, where: "_Where", role: str) -> tuple[str, ...]:
    """The hosts one instance of ``node`` spans, node rank order (one entry: it does not
    span). Raises OmniPdError OPD966 when the stage's ``nnodes`` and the placement disagree:
    ``nnodes`` N > 1 needs a placement listing N hosts for it (``placement: {sid: [A, B]}``),
    a spanning placement needs the compiled ``nnodes`` (``omni-pd expand --inventory``)."""
    from omni_pd.diagnostics import Diagnostic, OmniPdError, Severity

    want = node.nnodes
    nodes = where.placement.nodes_of(node.stage_id) if where.placement is not None else (None,)
    if want == len(nodes):
        return tuple(h for h in nodes if h is not None)
    have = (f"the inventory places it on {len(nodes)} host{'s' if len(nodes) > 1 else ''} ({', '.join(nodes)})"
            if where.placement is not None else "there is no --inventory to say which hosts")
    raise OmniPdError(Diagnostic(
        code="OPD966", severity=Severity.ERROR,
        message=f"stage {node.stage_id} ({role}) spans nnodes {want} hosts, but {have}",
        help=f"list {want} hosts for it in the inventory (placement: {{{node.stage_id}: [HOST_A, HOST_B]}}) and pass "
             "--inventory; or re-run `omni-pd expand --inventory` with that placement"))


def _span_processes(leader: ProcessSpec, nodes: tuple[str, ...], where: "_Where", opts: LaunchOptions,
                    http_port: int, role: str, stage_env: Mapping[str, Any] | None = None,
                    ) -> tuple[ProcessSpec, list[ProcessSpec]]:
    """One instance spanning ``nodes`` (vLLM 0.30's multi-node launch, no Ray): ``leader``
    (node rank 0, on ``nodes[0]``: the API server, the engine core, its local workers, the
    torch.distributed store on ``--master-port``) gains ``--node-rank 0 --master-addr
    <its address> --master-port P``; each other host runs ``vllm serve ... --node-rank i
    --master-addr <leader's address> --master-port P --headless`` (vllm/entrypoints/cli/serve.py
    ``run_headless``: the workers of that node only, no API server), without the API
    server's flags (:data:`SERVER_FLAGS`), its ``ready_with`` the leader. ``--nnodes`` comes
    from the stage's ``nnodes`` key (:func:`engine_flags`). Every process sets
    ``VLLM_HOST_IP`` (vLLM's ``get_ip``, the address of the instance's message queues) and
    a NIXL side-channel host to its own host's address; a worker's devices are the leader's
    logical ids mapped on its own host (``stage_env``: the stage's env, whose visibility
    value wins as on the leader). Pure."""
    master = span_master_port(http_port)
    addr0 = where.address(nodes[0])
    rank = ("--master-addr", addr0, "--master-port", str(master))

    def own(env: Mapping[str, str], addr: str) -> dict[str, str]:
        out = {**env, "VLLM_HOST_IP": addr}
        if "VLLM_NIXL_SIDE_CHANNEL_HOST" in out:
            out["VLLM_NIXL_SIDE_CHANNEL_HOST"] = addr
        return out

    lead = replace(leader, argv=leader.argv + ("--node-rank", "0") + rank, env=own(leader.env, addr0),
                   ports=leader.ports if any(u.purpose == MASTER_PURPOSE for u in leader.ports)
                   else leader.ports + (PortUse(master, MASTER_PURPOSE, addr0),))
    body = drop_flags(leader.argv[3:], SERVER_FLAGS)  # vllm serve MODEL ...
    workers = []
    for i, h in enumerate(nodes[1:], start=1):
        addr = where.address(h)
        dev, _ = device_fields(f"{leader.name}-node{i}", leader.logical_devices or leader.devices,
                               DEVICE_VARS.get(opts.platform), stage_env, opts.env, launcher_env_on(opts, h))
        env = {k: v for k, v in leader.env.items() if k not in DEVICE_VARS.get(opts.platform, ())}
        env = own({**env, **device_env_values(opts.platform, dev)}, addr)
        env.pop("VLLM_API_KEY", None)
        workers.append(replace(
            leader, name=f"{leader.name}-node{i}", role=role + WORKER_SUFFIX,
            argv=tuple(leader.argv[:3]) + tuple(body) + ("--node-rank", str(i)) + rank + ("--headless",),
            env=env, **dev, ports=(), health=None, depends_on=(), host=h, ready_with=leader.name))
    return lead, workers


def _lease_note(kv: dict[str, Any] | None, platform: str, target: Any, set_by_plan: bool) -> tuple[str, ...]:
    """The plan's note on the NIXL KV lease (OPD623) where ``platform`` needs more than
    vLLM's default: what the launch sets and why, or that the file's value is used."""
    from omni_pd.check.lease_facts import configured, facts

    f = facts()
    need = f.needed_s(platform)
    if need is None or target is None or not f.applies(target, (kv or {}).get("kv_connector")):
        return ()
    why = (f"vLLM {target.label}'s default lease, {f.default_s} s, ran out on a loaded CPU before decode read "
           "prefill's KV, and decode then used freed blocks (presets/targets/nixl_lease.yaml)")
    if set_by_plan:
        return (f"NIXL KV lease: {f.key} {need} s in every engine's --kv-transfer-config (--platform {platform}): "
                + why,)
    is_set, value = configured(kv)
    now = f"{value!r} s, from the file" if is_set else f"vLLM's default {f.default_s} s (the file sets none)"
    return (f"NIXL KV lease: {now}; --platform {platform} needs {need} s (OPD623): " + why,)


class _Where:
    """Host and bind address of a stage under ``opts.placement`` (None host and
    ``opts.host`` without one)."""

    def __init__(self, opts: LaunchOptions) -> None:
        self.placement, self.fallback = opts.placement, opts.host

    def host(self, stage_id: int) -> str | None:
        return self.placement.host_of(stage_id) if self.placement is not None else None

    def address(self, host: str | None) -> str:
        if host is None or self.placement is None:
            return self.fallback
        return self.placement.addresses.get(host, self.fallback)

    def nodes_of(self, stage_id: int) -> tuple[str | None, ...]:
        """The hosts one instance of ``stage_id`` spans, node rank order ((None,) without a placement)."""
        return self.placement.nodes_of(stage_id) if self.placement is not None else (None,)

    def hosts(self, topo: Topology) -> list[str]:
        """The hosts the stages of ``topo`` are on, sorted ([] without a placement)."""
        if self.placement is None:
            return []
        return sorted({self.placement.host_of(s.stage_id) for s in topo.stages})

    def across_hosts(self, topo: Topology) -> bool:
        """True when the stages of ``topo`` are on more than one host."""
        return len(self.hosts(topo)) > 1

    def one_host(self, topo: Topology) -> str | None:
        """The one host every stage of ``topo`` is on (vllm-omni runtime), None without a
        placement or with stages on several hosts (:func:`_omni_across_hosts` plans those)."""
        hosts = self.hosts(topo)
        return hosts[0] if len(hosts) == 1 else None


def _omni_across_hosts(topo: Topology, config_path: str, opts: LaunchOptions, target: Any, where: "_Where",
                       served: str, env_all: dict[str, str], engine_py: str | None, mods: tuple[str, ...],
                       prefill_kv: dict[str, Any] | None, planned: Sequence[PlannedPort] = ()) -> LaunchPlan:
    """The plan of a vllm-omni pipeline whose stages are on several hosts: vllm-omni's head
    (the first stage, the API server, the orchestrator) on that stage's host and one
    headless process per other stage on its own host (:mod:`omni_pd.launch.omni_hosts`).
    The head's ``--omni-master-port`` is ``opts.engine_port_base`` +
    :data:`~omni_pd.launch.omni_hosts.MASTER_PORT_OFFSET`. Raises OmniPdError OPD966 for
    what has not been run that way (:func:`~omni_pd.launch.omni_hosts.unsupported`)."""
    from omni_pd.launch import omni_hosts

    why = omni_hosts.unsupported(topo.stages)
    if why is not None:
        from omni_pd.diagnostics import Diagnostic, OmniPdError, Severity

        raise OmniPdError(Diagnostic(
            code="OPD966", severity=Severity.ERROR,
            message=f"the stages of this vllm-omni pipeline are placed on {', '.join(where.hosts(topo))}: {why}",
            help="place every stage on one host, or set num_replicas: 1 on every stage"))

    def ports_of(sid: int, bind: str) -> tuple[PortUse, ...]:  # its connector ports, from the port plan
        return tuple(PortUse(x.port, x.purpose, bind) for x in planned if x.stage_id == sid and x.source == "config")

    master = opts.engine_port_base + OMNI_MASTER_PORT_OFFSET
    stage_host = {s.stage_id: where.host(s.stage_id) for s in topo.stages}
    procs = omni_hosts.omni_processes(
        vllm=opts.vllm, model=opts.model, config_path=config_path, served=served,
        stage_host=stage_host, address=where.address, http_port=opts.port, master_port=master,  # type: ignore[arg-type]
        extra_args=opts.extra_args, env=env_all, ports_of=ports_of, modules=mods + ("vllm_omni", "omni_pd"),
        python=engine_py, ready_timeout_s=opts.ready_timeout_s)
    head = procs[0]
    notes = (f"vllm-omni head on {head.host}: the API server, the orchestrator and stage "
             f"{omni_hosts.head_stage(sorted(stage_host))}; registration on {where.address(head.host)}:{master} "
             "(the stage control sockets are the head's, at ephemeral ports)",
             "headless stages: " + ", ".join(f"{p.name} on {p.host}" for p in procs[1:])
             + "; each registers with the head, which answers /health once every stage is attached")
    return LaunchPlan(runtime="vllm-omni", model=opts.model, connector=connectors.row_name(prefill_kv, opts.platform),
                      entrypoint=head.health.url.rsplit("/", 1)[0], config=config_path,  # type: ignore[union-attr]
                      processes=procs, notes=notes + _lease_note(prefill_kv, opts.platform, target, False))


def hosts_of(plan: LaunchPlan) -> tuple[str, ...]:
    """The hosts ``plan``'s processes run on, in first-process order (() for a one-host plan)."""
    out: list[str] = []
    for p in plan.processes:
        if p.host is not None and p.host not in out:
            out.append(p.host)
    return tuple(out)


def for_host(plan: LaunchPlan, host: str) -> LaunchPlan:
    """The part of ``plan`` that ``launch --host HOST`` starts: the processes placed on
    ``host``, plus a ``peer`` entry (no argv, never started, same name and health check)
    for each process on another host that one of them depends on, so the supervisor
    health-gates on it over that host's address (the router on decode's host waits for
    prefill's ``/health`` on prefill's host). A vllm-omni pipeline across hosts: a host
    without the head gets the head as a peer (its headless stages start at once, nothing
    waits for it, and the launch is ready when the head's ``/health`` answers, which it
    does once every stage registered: :mod:`omni_pd.launch.omni_hosts`). Pure. Raises
    KeyError for a host no process runs on."""
    from omni_pd.launch.omni_hosts import HEAD_ROLE, STAGE_ROLE

    mine = [p for p in plan.processes if p.host == host]
    if not mine:
        raise KeyError(host)
    names = {p.name for p in mine}
    needed = {d for p in mine for d in p.depends_on if d not in names}
    # a headless worker of an instance spanning hosts is up when its leader's /health answers
    needed |= {p.ready_with for p in mine if p.ready_with is not None and p.ready_with not in names}
    if any(p.role == STAGE_ROLE for p in mine):
        needed |= {p.name for p in plan.processes if p.role == HEAD_ROLE and p.name not in names}
    peers = [replace(p, argv=(), role="peer", env={}, ports=(), depends_on=(), modules=(), python=None,
                     devices=None, device_env=None, logical_devices=None, visible_devices=None, writable_dirs=())
             for p in plan.processes if p.name in needed]
    return replace(plan, processes=tuple(peers + mine))


def without_peers(plan: LaunchPlan) -> LaunchPlan:
    """``plan`` without its ``peer`` entries: what preflight checks on this host."""
    return replace(plan, processes=tuple(p for p in plan.processes if p.role != "peer"))



def _encoder_process(node: StageNode, opts: LaunchOptions, served: str,
                     env_all: dict[str, str], engine_py: str | None,
                     wide: dict[str, Any] | None = None, ports: tuple[PortUse, ...] | None = None,
                     ) -> tuple[ProcessSpec, str | None, str | None, str | None]:
    """The ``vllm serve`` of the encoder-only instance E (``--ec-transfer-config`` with
    ``ec_producer`` from its stage keys, no KV connector), its EC connector name, the
    shared directory E writes and prefill reads (ECExampleConnector; None otherwise) and
    the plan's note on its devices (:func:`device_fields`).
    ``wide``: the pipeline-wide engine keys (:func:`~omni_pd.compile.topology.
    pipeline_wide_settings`); the stage's own keys override them. ``ports``: its entries of
    the port plan (:func:`~omni_pd.compile.port_plan.plan_ports`, as :func:`build_plan`
    passes them); None: derived here by the same formulas."""
    from omni_pd.compile import ec_connectors

    port = engine_http_port("encoder", 0, opts.engine_port_base)
    env = {**env_all, **_env_str(node.env)}
    dev, note = device_fields("encoder-0", format_devices(node.devices), DEVICE_VARS.get(opts.platform), node.env,
                              env_all, opts.launcher_env)
    env.update(device_env_values(opts.platform, dev))
    ec = node.settings.get("ec_transfer_config") or {}
    contract = ec_connectors.get(str(ec.get("ec_connector") or ""))
    storage = contract.storage_path(ec) if contract is not None else None
    settings = {**(wide or {}), **node.settings}
    rpc = dp_rpc_port(settings, node.dp, port, 0)
    settings, dp_flags = _dp_flags(settings, rpc)
    argv = [opts.vllm, "serve", opts.model, "--host", opts.host, "--port", str(port),
            "--served-model-name", served, *engine_flags(settings), *dp_flags, *opts.extra_args]
    proc = ProcessSpec(
        name="encoder-0", role="encoder", argv=tuple(argv), env=env, **dev,
        ports=ports if ports is not None else (
            (PortUse(port, "http", opts.host),) + ((PortUse(rpc, DP_RPC, opts.host),) if rpc is not None else ())),
        health=HealthCheck(f"http://{opts.host}:{port}/health", timeout_s=opts.ready_timeout_s),
        modules=("vllm",), python=engine_py,
        memory_fraction=float(node.settings.get("gpu_memory_utilization") or 0.9),
        writable_dirs=(storage,) if storage else ())
    return proc, (contract.name if contract else ec.get("ec_connector")), storage, note


@dataclass(frozen=True)
class Planned:
    """:func:`plan_document`'s answer: the plan (None when validation failed), the
    validation result, and the resolved topology."""

    plan: LaunchPlan | None
    validation: Any
    topology: Topology | None


def plan_document(doc: Any, config_path: str, opts: LaunchOptions, inventory: Any = None,
                  on_validated: Callable[[Any], None] | None = None,
                  suppress: Callable[[Any], list[Any]] | None = None, model: Any = None) -> Planned:
    """Validate ``doc`` (a loaded compiled config) for ``opts.platform`` and build its plan.

    ``on_validated(result)``: called with the validation result (every finding, errors,
    warnings and infos, as ``omni-pd validate`` gives them for the same options) right
    after validation and before anything is planned, so the caller can show them even
    when planning then refuses the config (``launch`` prints them as validate does).

    ``suppress(result)``: the findings of ``result`` that count, as ``validate`` keeps them
    after its suppressions (``# omni-pd: ignore[...]``, ``--select``/``--ignore``,
    ``[tool.omni-pd]``; the CLI passes validate's own, omni_pd/check/suppress.py ``apply``);
    ``result.diagnostics`` is set to them before ``on_validated``, so a suppressed error
    neither shows nor stops the plan. None: every finding counts.

    ``model``: the :class:`~omni_pd.check.context.ModelInfo` of the served checkpoint (the
    CLI reads ``--model DIR``'s ``config.json``: :meth:`~omni_pd.check.context.ModelInfo.
    from_model_dir`), so the model-dependent rules judge the launch as ``validate
    --model-info`` would (OPD603: a prefill TP above ``num_key_value_heads`` over NIXL with
    a smaller decode TP); None: unknown, those rules stay silent.

    ``inventory``: the :class:`~omni_pd.check.context.Inventory` of ``--inventory``; its
    placement, completed by :func:`omni_pd.compile.placement.resolve_placement` as expand
    completed it, is what validate judges (OPD503 and the per-host device and port rules)
    and what the plan places each process by (:attr:`LaunchOptions.placement`).

    One flow, validate -> plan (issue 38): :func:`validate_for_launch` validates and
    resolves once; :func:`plan_validated` plans from its result and only reads it.

    Validation errors leave ``plan`` None (the caller prints them). Raises
    :class:`~omni_pd.diagnostics.OmniPdError` OPD966 when the config is neither a PD config
    nor an encoder split (E -> PD or E -> P -> D),
    OPD006 when a planned port is outside 1..65535 (:func:`check_ports`).
    """
    res = validate_for_launch(doc, opts, inventory, model)
    kept = suppress or (lambda r: list(r.diagnostics))
    res.diagnostics[:] = kept(res)
    if on_validated is not None:
        on_validated(res)
    return plan_validated(res, doc.name, config_path, opts)


def validate_for_launch(doc: Any, opts: LaunchOptions, inventory: Any = None, model: Any = None) -> Any:
    """``omni-pd validate`` of ``doc`` as ``launch``/``render`` run it for ``opts``: the
    launch platform (``--platform cpu`` included: validate then judges its NIXL lease,
    OPD623), ``--engine-arg`` flags as global engine flags (OPD107 refuses one ``vllm
    serve`` would not accept), the visibility variable the engines start under
    (``--env``'s, else the launcher's: OPD402/OPD404 map devices as the plan does; cpu
    selects none), ``inventory`` and its placement (OPD503, the per-host device and port
    rules), ``model`` (:class:`~omni_pd.check.context.ModelInfo`: OPD603) and the ports
    the plan derives (``--port``, ``--engine-port-base``: OPD510 judges the port plan).
    Returns the :class:`~omni_pd.check.validate.ValidateResult`, which carries the
    resolved topology and placement :func:`plan_validated` plans from. Raises what
    :func:`~omni_pd.check.validate.validate_document` raises (OPD006 for bad usage)."""
    from omni_pd.check.serve_flags import parse_argv
    from omni_pd.check.validate import ValidateOptions, validate_document

    hit = visible_value(DEVICE_VARS.get(opts.platform, ()), opts.env, opts.launcher_env)
    seen = {hit[1]: hit[2]} if hit is not None else {}
    return validate_document(doc, ValidateOptions(
        platform=opts.platform, cli=parse_argv(opts.extra_args), inventory=inventory, env=seen, model=model,
        port=opts.port, engine_port_base=opts.engine_port_base))


def plan_validated(res: Any, name: str, config_path: str, opts: LaunchOptions) -> Planned:
    """The plan of a validated config: read from ``res`` (a
    :class:`~omni_pd.check.validate.ValidateResult` of :func:`validate_for_launch`, its
    ``diagnostics`` already the ones that count), nothing validated or resolved again:
    its ``topology`` (resolved for the launch platform), ``placement`` (where each process
    runs: :attr:`LaunchOptions.placement`) and ``target``. ``name``: the file's name for
    messages. ``plan`` is None when an error counts, or when nothing was resolved.
    Raises :class:`~omni_pd.diagnostics.OmniPdError` OPD966 when the config is neither a PD
    config nor an encoder split (E -> PD or E -> P -> D), OPD006 when a planned port is
    outside 1..65535 (:func:`check_ports`)."""
    from omni_pd.diagnostics import Diagnostic, OmniPdError, Severity

    if any(d.severity is Severity.ERROR for d in res.diagnostics):
        return Planned(None, res, None)
    topo = res.topology
    pipe = topo.pipeline if topo is not None and res.pipeline_name is not None else None
    if pipe is None or not (pipe.is_pd or pipe.encoder is not None):  # an encoder split is E->PD or E->P->D
        named = res.pipeline_name is not None
        if named and topo is None:  # nothing resolved (an error suppressed): nothing to plan
            return Planned(None, res, None)
        raise OmniPdError(Diagnostic(
            code="OPD966", severity=Severity.ERROR,
            message=f"{name} is not a PD config "
                    + (f"(pipeline `{res.pipeline_name}`)" if named else "(it names no `pipeline:`)"),
            help=f"compile it first: `omni-pd expand {config_path} -o pd.yaml`, then launch pd.yaml" if named
            else f"compile it first: `omni-pd expand {config_path} --pipeline NAME -o pd.yaml` "
                 "(NAME from `omni-pd pipelines`), then launch pd.yaml"))
    if res.placement is not None:
        opts = replace(opts, placement=res.placement)
    return Planned(check_ports(build_plan(topo, config_path, opts, res.target), opts), res, topo)
