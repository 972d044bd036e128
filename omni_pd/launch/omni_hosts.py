"""A vllm-omni pipeline whose stages sit on several hosts: vllm-omni's head and its headless stages. Pure.

How vllm-omni 0.30 runs one pipeline across hosts (0.30.0 wheel, ``vllm_omni/``):

* **Head**: ``vllm serve MODEL --omni --deploy-config F --stage-id N --omni-master-address
  ADDR --omni-master-port P`` (plus the API server's ``--host``/``--port``). ``--stage-id``
  turns on single-stage mode (engine/omni_engine_base.py: an int ``stage_id`` kwarg sets
  ``single_stage_mode``) and is one int: the head runs stage N's engine itself and treats
  **every other stage as remote** (engine/stage_runtime.py ``DistStageRuntime.
  _get_launch_mode``). So each other stage, on the head's host too, is one headless process.
  ``entrypoints/cli/serve.py`` ``validate``: ``--stage-id`` needs both master flags.
* **What the head opens**: the registration socket, a ZMQ ROUTER bound on
  ``tcp://ADDR:P`` (engine/stage_engine_startup.py ``OmniMasterServer._serve``); the
  omni coordinator's ROUTER and PUB on ``ADDR`` at two ephemeral ports
  (distributed/omni_coordinator/runtime.py ``get_open_ports_list(count=2)``); per stage
  replica a handshake, an input and an output socket on ``ADDR`` at three ephemeral ports
  (``OmniMasterServer._allocate_route_locked``). **All stage control sockets are the
  head's**: a headless stage only connects (``StageAllocation``: "client binds ROUTER,
  engine connects DEALER"). ``ADDR`` must be the head host's routable address (it is
  bound *and* handed to the stages as the connect address). Only ``P`` is fixed; the
  rest come from the head's ephemeral range, which a firewall between the hosts must pass.
  The head waits for each remote stage's registration up to ``--stage-init-timeout``
  (default 300 s: ``_initialize_remote_replica`` -> ``get_stage_config(timeout_s=...)``)
  and answers ``/health`` only once every stage is attached.
* **Headless stage**: ``vllm serve MODEL --omni --deploy-config F --stage-id N --headless
  --omni-master-address ADDR --omni-master-port P [--omni-replica-address OWN]``
  (``serve.py`` ``run_headless``): it needs **the same model path and the same deploy
  file** as the head (it resolves the stage config itself: ``resolve_omni_config(model,
  deploy_config_path=...)``, then ``resolved.stage_by_id(N)``), ``worker_backend``
  ``multi_process``, no ``--api-server-count``. It registers with the head
  (``register_stage_with_omni_master``, a DEALER to ``ADDR:P``; ZMQ connects lazily, so it
  may start before the head, and waits 300 s for the reply) sending
  ``replica_bind_address``: ``--omni-replica-address``, else the source address of a UDP
  route probe towards the master (``_detect_local_bind_address``). The head keeps it as
  the replica's ``replica_host`` and advertises it for that stage's KV and payload
  connector endpoints (stage_runtime.py 1597; stage_engine_core_client.py
  ``_resolve_contact_host``). It opens no HTTP port (no ``/health`` of its own).
  ``--omni-dp-size-local K`` starts K replicas of the stage in that one process; the head
  overrides its own stage's ``num_replicas`` with its own value of the flag
  (``DistStageRuntime._validate_single_stage_mode_replica_constraints``).
* **Stage data**: each stage's KV connector (``kv_ip``, side channels) and omni connectors
  (omni_pd/compile/stage_edges.py) run in the stage's worker on its own host; the head's
  orchestrator only routes requests. Measured on two network namespaces (tests/
  test_e2e_two_hosts_omni.py): head with prefill on A, headless decode, Talker and
  Code2Wav on B, MooncakeConnector over TCP, SharedMemoryConnector between B's stages.

:func:`omni_processes` builds those processes for a placement; the launch plan
(:func:`omni_pd.launch.plan.build_plan`) uses it when the stages of a vllm-omni pipeline
are on more than one host.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from omni_pd.compile.port_plan import OMNI_MASTER_PORT_OFFSET, OMNI_MASTER_PURPOSE
from omni_pd.launch.spec import HealthCheck, PortUse, ProcessSpec

#: the head's ``--omni-master-port``: ``--engine-port-base`` + this (the encoder instance of
#: the vllm runtime takes + 200, decode + 100)
MASTER_PORT_OFFSET = OMNI_MASTER_PORT_OFFSET
#: what a head's ``/health`` may take across hosts: every stage loads before it answers
HEAD_STAGE_INIT_TIMEOUT_S = 900
#: the head's process name (the one-host plan's name for the single omni process)
HEAD = "omni"
#: roles of the processes: the head serves the API, a headless stage only an engine
HEAD_ROLE, STAGE_ROLE = "omni", "omni-stage"


def head_stage(stage_ids: Sequence[int]) -> int:
    """The stage the head runs itself: the first stage (the pipeline's entry, which takes
    the requests; under PD the Thinker's prefill). Raises ValueError for no stages."""
    if not stage_ids:
        raise ValueError("a pipeline without stages")
    return min(stage_ids)


def stage_name(stage_id: int) -> str:
    """Process name of a headless stage: ``stage-<id>``."""
    return f"stage-{stage_id}"


def omni_processes(*, vllm: str, model: str, config_path: str, served: str, stage_host: Mapping[int, str],
                   address: Callable[[str], str], http_port: int, master_port: int, extra_args: Sequence[str],
                   env: Mapping[str, str], ports_of: Callable[[int, str], Sequence[PortUse]],
                   modules: tuple[str, ...], python: str | None, ready_timeout_s: float) -> tuple[ProcessSpec, ...]:
    """The head and one headless process per other stage, in start order (head first).

    ``stage_host``: stage id -> host (every stage of the pipeline); ``address(host)``: the
    address that host binds and advertises; ``http_port``: the head's API port;
    ``master_port``: its ``--omni-master-port``; ``extra_args``: launch's ``--engine-arg``
    flags, given to every process (a headless stage applies its own command line's flags
    to its stage: serve.py ``run_headless`` ``cli_overrides``); ``env``: every process's env;
    ``ports_of(stage, bind)``: the connector ports that stage's engine binds (preflight). The head's health check is its
    ``/health``; the headless stages have none (they open no HTTP port) and nothing waits
    for them: the head answers ``/health`` once they registered. Pure."""
    head_sid = head_stage(sorted(stage_host))
    head_host = stage_host[head_sid]
    master = address(head_host)
    common = ("--omni", "--deploy-config", config_path, "--omni-master-address", master,
              "--omni-master-port", str(master_port))
    head = ProcessSpec(
        name=HEAD, role=HEAD_ROLE,
        argv=(vllm, "serve", model, *common, "--stage-id", str(head_sid),
              "--stage-init-timeout", str(HEAD_STAGE_INIT_TIMEOUT_S),
              "--host", master, "--port", str(http_port), "--served-model-name", served, *extra_args),
        env=dict(env),
        ports=(PortUse(http_port, "http", master), PortUse(master_port, OMNI_MASTER_PURPOSE, master))
        + tuple(ports_of(head_sid, master)),
        health=HealthCheck(f"http://{master}:{http_port}/health", timeout_s=ready_timeout_s),
        modules=modules, python=python, host=head_host)
    out = [head]
    for sid in sorted(stage_host):
        if sid == head_sid:
            continue
        h = stage_host[sid]
        own = address(h)
        out.append(ProcessSpec(
            name=stage_name(sid), role=STAGE_ROLE,
            argv=(vllm, "serve", model, *common, "--stage-id", str(sid), "--headless",
                  "--omni-replica-address", own, *extra_args),
            env=dict(env), ports=tuple(ports_of(sid, own)), health=None,
            modules=modules, python=python, host=h))
    return tuple(out)


def unsupported(nodes: Sequence[Any]) -> str | None:
    """Why omni-pd does not start this pipeline across hosts, or None when it does:
    a stage with ``num_replicas`` > 1 (each process would need ``--omni-dp-size-local``
    and the head pre-allocates that many slots per remote stage; not run here)."""
    many = [n.stage_id for n in nodes if int(getattr(n, "num_replicas", 1) or 1) > 1]
    if many:
        return (f"stage {', '.join(map(str, many))} has num_replicas > 1: omni-pd has not run vllm-omni's "
                "headless stages with replicas (--omni-dp-size-local)")
    return None
