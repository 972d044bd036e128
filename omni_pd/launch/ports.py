"""The launch plan's ports, after :func:`omni_pd.compile.port_plan.plan_ports` derived them:
the range check (OPD006, :func:`check_ports`), the ``--data-parallel-rpc-port`` flag and the
npu HCCL listener written into an engine's env. Pure.
"""

from __future__ import annotations

from typing import Any

from omni_pd.compile.port_plan import DP_RPC, DP_RPC_PORT_OFFSET, PORT_MAX, hccl_port
from omni_pd.compile.topology import StageNode
from omni_pd.launch.spec import LaunchPlan, PortUse, ProcessSpec


def _hccl_port(env: dict[str, str], node: StageNode, replica: int) -> int | None:
    """On npu: the ``HCCL_IF_BASE_PORT`` of instance ``replica`` of ``node``, written into
    ``env``: the stage's value + ``replica * span`` (expand reserves ``span`` = 16 ports per
    rank per instance; presets/targets/vllm_ascend.yaml ``rules.hccl``), so co-located
    instances listen apart (vllm-ascend#4725). None when the stage sets no base."""
    from omni_pd.compile import ascend

    port = hccl_port(env.get(ascend.hccl()["env"]), node, replica)
    if port is not None:
        env[ascend.hccl()["env"]] = str(port)
    return port


def _dp_flags(settings: dict[str, Any], rpc: int | None) -> tuple[dict[str, Any], list[str]]:
    """``settings`` without ``data_parallel_rpc_port`` and the flag that replaces it, when
    the engine has a planned data-parallel RPC port (``rpc``); as given otherwise."""
    if rpc is None:
        return settings, []
    return {k: v for k, v in settings.items() if k != "data_parallel_rpc_port"}, ["--data-parallel-rpc-port", str(rpc)]


def check_ports(plan: LaunchPlan, opts: Any) -> LaunchPlan:
    """``plan`` when every port it binds is a TCP port (1..:data:`PORT_MAX`).

    HTTP ports come from the options (``--port``; ``--engine-port-base`` + 0/100/200 +
    instance); connector ports from the compiled file (``expand --port-base``). Raises
    :class:`~omni_pd.diagnostics.OmniPdError` OPD006 (exit 2) naming the option to change
    and the value that fits (the highest base whose HTTP and data-parallel RPC ports all
    stay at or below :data:`PORT_MAX`; the lowest when a port falls below 1), so nothing
    reaches preflight's ``bind`` with a port the OS cannot take.
    """
    from omni_pd.diagnostics import Diagnostic, OmniPdError, Severity

    def from_base(p: ProcessSpec, u: PortUse) -> bool:  # a port --engine-port-base moves
        return p.role not in ("router", "omni") and (u is p.ports[0] or (
            u.purpose == DP_RPC and u.port == p.ports[0].port + DP_RPC_PORT_OFFSET))

    moved = [u.port for p in plan.processes for u in p.ports if from_base(p, u)]
    top = max(moved, default=PORT_MAX)  # every port the base moves must fit, DP RPC ports too
    layout = "(prefill instances listen on it +0.., decode on +100.., the encoder on +200)"
    for proc in plan.processes:
        for use in proc.ports:
            if 1 <= use.port <= PORT_MAX:
                continue
            engine_http = use.purpose == "http" and proc.role not in ("router", "omni")
            if engine_http and use.port < 1:
                low = min(u.port for p in plan.processes for u in p.ports[:1] if from_base(p, u))
                msg = (f"--engine-port-base {opts.engine_port_base}: {proc.name} would listen on HTTP port "
                       f"{use.port}, below 1")
                help = f"pass --engine-port-base {opts.engine_port_base + 1 - low} or higher {layout}"
            elif engine_http:
                msg = (f"--engine-port-base {opts.engine_port_base}: {proc.name} would listen on HTTP port "
                       f"{use.port}, above {PORT_MAX}")
                help = f"pass --engine-port-base {opts.engine_port_base - (top - PORT_MAX)} or lower {layout}"
            elif use.purpose == "http":
                msg = f"--port {opts.port}: {proc.name} would listen on port {use.port}, outside 1..{PORT_MAX}"
                help = f"pass --port with a port from 1 to {PORT_MAX}"
            elif use.purpose == DP_RPC and use.port == proc.ports[0].port + DP_RPC_PORT_OFFSET:
                msg = (f"--engine-port-base {opts.engine_port_base}: {proc.name} would bind its data-parallel RPC "
                       f"port {use.port} (its HTTP port + {DP_RPC_PORT_OFFSET}), above {PORT_MAX}")
                help = (f"pass --engine-port-base {opts.engine_port_base - (top - PORT_MAX)} or lower (a "
                        f"data_parallel_size > 1 engine binds its HTTP port + {DP_RPC_PORT_OFFSET} for vLLM's "
                        "data-parallel RPC)")
            else:
                msg = (f"{plan.config}: {proc.name} would bind {use.purpose} port {use.port} (from the config), "
                       f"outside 1..{PORT_MAX}")
                help = "re-run `omni-pd expand` with a lower --port-base"
            raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR, message=msg, help=help))
    return plan
