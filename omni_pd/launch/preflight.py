"""Check the machine before `omni-pd launch` starts anything (side effects: probes only).

Every finding is a :class:`~omni_pd.diagnostics.Diagnostic`:

* OPD960 (error) a planned port cannot be bound on its host (try-bind, no listen), is
  planned twice, or two data-parallel engines draw their DP ports from one ``VLLM_PORT``;
* OPD961 (error) an executable in a process's argv is missing or not executable;
* OPD962 (error) a Python module a process needs (vllm, the connector's package,
  vllm_omni, omni_pd for the plugin) is not importable by that process's interpreter;
* OPD963 (error) a device a process is given does not exist (CUDA: ``nvidia-smi``);
* OPD964 (error) the device memory the engines ask for (``gpu_memory_utilization`` x
  total, per device) exceeds what is free, where ``nvidia-smi`` can read it;
* OPD965 (info) a check that could not run here (e.g. no ``nvidia-smi``);
* OPD967 (error) a directory a process must write (EC shared storage) is not writable.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import subprocess
from omni_pd.diagnostics import Diagnostic, Severity
from omni_pd.launch.plan import DP_RPC, DP_RPC_PORT_OFFSET
from omni_pd.launch.spec import LaunchPlan, ProcessSpec


def bind_error(host: str, port: int) -> OSError | None:
    """The error of binding ``host:port`` (TCP, no listen), None when it binds.
    SO_REUSEADDR is set, as uvicorn and ZMQ set it, so connections lingering in
    TIME_WAIT from an earlier run do not count; a listener does."""
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return e
    return None


def port_free(host: str, port: int) -> tuple[bool, str]:
    """(True, "") when ``host:port`` can be bound, else (False, "EADDRINUSE (...)")."""
    e = bind_error(host, port)
    if e is None:
        return True, ""
    return False, errno.errorcode.get(e.errno or 0, str(e)) + f" ({e.strerror})"


def _listener(purpose: str) -> str:
    """The socket a port use binds: vLLM's API server serves ``/metrics`` on its HTTP port."""
    return "http" if purpose in ("http", "metrics") else purpose


def planned_port_clashes(plan: LaunchPlan) -> list[Diagnostic]:
    """OPD960 for every port ``plan`` gives to two listeners on one host: two processes
    (an engine's HTTP port, the router's, a KV side channel / bootstrap port from the
    stage env), or one process's HTTP port and its own side channel.
    Pure: reads the plan only, so ``launch --dry-run`` runs it too (:func:`plan_checks`)."""
    out: list[Diagnostic] = []
    seen: dict[tuple[str, int], tuple[str, str]] = {}
    for p in plan.processes:
        for u in p.ports:
            key = (u.host, u.port)
            if key in seen and (seen[key][0] != p.name or _listener(seen[key][1]) != _listener(u.purpose)):
                first, purpose = seen[key]
                out.append(Diagnostic(code="OPD960", severity=Severity.ERROR,
                                      message=f"port {u.port} on {u.host} is planned for both {first} ({purpose}) "
                                              f"and {p.name} ({u.purpose})",
                                      help="give each process its own port (see `omni-pd launch --help`)"))
                continue
            seen.setdefault(key, (p.name, u.purpose))
    return out


#: how many data-parallel process-group ports vLLM 0.30 draws per DP > 1 engine at startup
#: (vllm/config/parallel.py:910-927 ``get_open_ports_list(5)``)
DP_MASTER_PORTS = 5


def shared_vllm_port(plan: LaunchPlan) -> list[Diagnostic]:
    """OPD960 for two ``data_parallel_size`` > 1 engines on one host whose ``VLLM_PORT``
    values are less than :data:`DP_MASTER_PORTS` apart.

    Such an engine's config draws its data-parallel process-group ports when it starts
    (vllm/config/parallel.py:910-927, no flag sets them) and binds them later, in the DP
    rank-0 engine core; with ``VLLM_PORT`` set the draw is the first free ports from
    ``VLLM_PORT`` upward (vllm/utils/network_utils.py:197-208 ``get_open_ports_list``), so
    two engines drawing from overlapping ranges before either binds pick the same ports
    (without ``VLLM_PORT`` the kernel picks them). A DP > 1 engine is one with a
    :data:`~omni_pd.launch.plan.DP_RPC` port in the plan. Pure."""
    out: list[Diagnostic] = []
    drawn: list[tuple[str, int, str]] = []  # (host, VLLM_PORT, process)
    for p in plan.processes:
        dp = next((u for u in p.ports if u.purpose == DP_RPC), None)
        raw = p.env.get("VLLM_PORT")
        if dp is None or raw is None or not raw.strip().isdigit():
            continue
        port = int(raw)
        for host, other, name in drawn:
            if host == dp.host and abs(other - port) < DP_MASTER_PORTS:
                out.append(Diagnostic(
                    code="OPD960", severity=Severity.ERROR,
                    message=f"{name} (VLLM_PORT={other}) and {p.name} (VLLM_PORT={port}) have data_parallel_size > 1 "
                            f"on {host}: vLLM draws each one's data-parallel ports from VLLM_PORT upward "
                            f"({DP_MASTER_PORTS} of them) before binding them, so both pick the same ports",
                    help="leave VLLM_PORT unset for these engines (vLLM then asks the kernel for free ports), or set "
                         f"it per stage (the stage's env) at least {DP_MASTER_PORTS} apart"))
        drawn.append((dp.host, port, p.name))
    return out


def plan_checks(plan: LaunchPlan) -> list[Diagnostic]:
    """The checks that need no system state (:func:`planned_port_clashes`,
    :func:`shared_vllm_port`); ``launch --dry-run`` runs these, a real launch runs them
    inside :func:`preflight`."""
    return planned_port_clashes(plan) + shared_vllm_port(plan)


def check_ports(plan: LaunchPlan) -> list[Diagnostic]:
    """OPD960 for every planned port that is planned twice on one host or drawn twice
    (:func:`plan_checks`) or cannot be bound (try-bind, each port once)."""
    out = plan_checks(plan)
    tried: set[tuple[str, int]] = set()
    for p in plan.processes:
        for u in p.ports:
            key = (u.host, u.port)
            if key in tried:
                continue
            tried.add(key)
            ok, why = port_free(u.host, u.port)
            if not ok:
                out.append(Diagnostic(code="OPD960", severity=Severity.ERROR, 
                                      message=f"port {u.port} on {u.host} ({p.name} {u.purpose}) cannot be bound: {why}",
                                      help=("stop what holds it (`ss -ltnp 'sport = :%d'`) or move it: " % u.port)
                                      + _move_hint(u.purpose)))
    return out


def _move_hint(purpose: str) -> str:
    """Which option moves a planned port of ``purpose``."""
    if purpose == "http":
        return "`--port`/`--engine-port-base`"
    if purpose == DP_RPC:
        return (f"`--engine-port-base` (a data_parallel_size > 1 engine's data-parallel RPC port is its HTTP port "
                f"+ {DP_RPC_PORT_OFFSET}) or the stage's `data_parallel_rpc_port`")
    return "`omni-pd expand --port-base N` (connector ports)"


def check_executables(plan: LaunchPlan) -> list[Diagnostic]:
    """OPD961 for argv[0] of each process that cannot be found/executed."""
    out = []
    for p in plan.processes:
        exe = p.argv[0]
        path = exe if os.sep in exe else shutil.which(exe)
        if not path or not os.access(path, os.X_OK):
            out.append(Diagnostic(code="OPD961", severity=Severity.ERROR,
                                  message=f"{p.name}: executable `{exe}` not found",
                                  help="install vLLM (`pip install vllm`) or pass its path with `--vllm PATH`"))
    return out


#: module -> pip package for the modules a plan checks that are no connector transport
_PACKAGES = {"vllm": "vllm", "vllm_omni": "vllm-omni", "omni_pd": "omni-pd"}


def pip_package(module: str) -> str:
    """The pip package that provides ``module``: a connector transport's (its
    ``import_name`` or that module's top-level package) from its connector module
    (``pip_package``, omni_pd/compile/connectors), vLLM, vllm-omni and omni-pd from
    :data:`_PACKAGES`, else the module name itself."""
    from omni_pd.compile import connectors

    for c in connectors.registry().values():
        if c.import_name and c.pip_package and module in (c.import_name, c.import_name.split(".")[0]):
            return c.pip_package
    return _PACKAGES.get(module, module)


def check_modules(plan: LaunchPlan, timeout_s: float = 60.0) -> list[Diagnostic]:
    """OPD962 for each module a process's interpreter cannot find (``find_spec``, no import)."""
    out = []
    by_py: dict[str, set[str]] = {}
    for p in plan.processes:
        if p.python and p.modules:
            by_py.setdefault(p.python, set()).update(p.modules)
    for py, mods in by_py.items():
        if not os.access(py, os.X_OK):
            out.append(Diagnostic(code="OPD962", severity=Severity.ERROR,
                                  message=f"interpreter `{py}` not found, so {', '.join(sorted(mods))} cannot be checked",
                                  help="pass the vLLM environment's python with `--python PATH`"))
            continue
        # a dotted name (mooncake.engine) imports its parent: a missing parent raises
        code = ("import importlib.util, sys\n"
                "def gone(m):\n"
                "    try:\n"
                "        return importlib.util.find_spec(m) is None\n"
                "    except (ImportError, ValueError):\n"
                "        return True\n"
                "print(' '.join(m for m in sys.argv[1:] if gone(m)))")
        try:
            r = subprocess.run([py, "-c", code, *sorted(mods)], capture_output=True, text=True, timeout=timeout_s)
            missing = r.stdout.split()
        except (OSError, subprocess.TimeoutExpired) as e:
            out.append(Diagnostic(code="OPD965", severity=Severity.INFO, message=f"could not run {py}: {e}"))
            continue
        for m in missing:
            pkg = pip_package(m)
            out.append(Diagnostic(code="OPD962", severity=Severity.ERROR,
                                  message=f"module `{m}` is not importable by {py}",
                                  help=f"`{py} -m pip install {pkg}`"))
    return out


def gpu_inventory() -> list[tuple[int, int, int]] | None:
    """(index, total MiB, free MiB) per NVIDIA GPU from ``nvidia-smi``; None if absent."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        r = subprocess.run([exe, "--query-gpu=index,memory.total,memory.free", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    rows = []
    for line in r.stdout.splitlines():
        try:
            i, t, f = (int(x.strip()) for x in line.split(","))
        except ValueError:
            continue
        rows.append((i, t, f))
    return rows


def _device_entries(p: ProcessSpec) -> list[tuple[int, str, str | None]]:
    """(physical GPU index, how a message names it, the short form for a sum) for each
    device ``p`` runs on: with a remapped list (``visible_devices`` set) ``logical device
    1 (physical GPU 5 under CUDA_VISIBLE_DEVICES=4,5)`` and ``logical device 1 of
    CUDA_VISIBLE_DEVICES=4,5`` (:func:`omni_pd.compile.devices.device_name`), else ``GPU
    5`` and None. Entries vllm-omni drops (outside the visible set) and ids that are no
    index (a GPU UUID in the visibility variable) are skipped."""
    from omni_pd.compile.devices import device_name, parse_devices, parse_visible, passed_through, physical_ids

    visible = parse_visible(p.visible_devices)
    try:
        logical = parse_devices(p.logical_devices) if visible is not None else None
    except ValueError:
        logical = None
    if not isinstance(logical, tuple):
        return [(int(t), f"GPU {t.strip()}", None) for t in str(p.devices).split(",") if t.strip().isdigit()]
    through = passed_through(logical, visible)
    return [(int(phys), device_name(i, visible, p.device_env, all_outside=through),
             device_name(i, visible, p.device_env, all_outside=through, short=True))
            for i, phys in zip(logical, physical_ids(logical, visible)) if phys is not None and phys.isdigit()]


def check_devices(plan: LaunchPlan, platform: str,
                  inventory: list[tuple[int, int, int]] | None = None) -> list[Diagnostic]:
    """OPD963/OPD964 for CUDA processes (each asks ``memory_fraction`` of its devices;
    ``inventory``: as :func:`gpu_inventory`, None = ask ``nvidia-smi``).

    A process's ``devices`` are the physical ids it starts on (the plan mapped the
    stage's logical entries through the visibility variable:
    :func:`omni_pd.launch.plan.map_devices`); nvidia-smi ignores ``CUDA_VISIBLE_DEVICES``
    and lists physical indices, so those are what is looked up, and a message names the
    logical device and the physical one when a visibility variable remapped them."""
    if platform != "cuda":
        return []
    users = [p for p in plan.processes if p.devices]
    if not users:
        return []
    inv = inventory if inventory is not None else gpu_inventory()
    if inv is None:
        return [Diagnostic(code="OPD965", severity=Severity.INFO,
                           message="nvidia-smi not found: devices and device memory not checked")]
    gpus = {i: (t, f) for i, t, f in inv}
    out: list[Diagnostic] = []
    ask: dict[int, float] = {}
    who: dict[int, list[str]] = {}  # physical GPU -> the logical names that put engines on it
    for p in users:
        for dev, named, short in _device_entries(p):
            if dev not in gpus:
                out.append(Diagnostic(code="OPD963", severity=Severity.ERROR,
                                      message=f"{p.name} is given {named}, this machine has {sorted(gpus)}",
                                      help="change the stage's `devices:` (re-run `omni-pd expand --prefill-devices ...`)"
                                      + (f" or {p.device_env}" if p.visible_devices is not None else "")))
                continue
            ask[dev] = ask.get(dev, 0.0) + gpus[dev][0] * p.memory_fraction
            if short is not None:
                who.setdefault(dev, []).append(f"{p.name}'s {short}")
    for dev, mib in sorted(ask.items()):
        total, free = gpus[dev]
        if mib > free:
            on = f" ({'; '.join(who[dev])})" if dev in who else ""
            out.append(Diagnostic(code="OPD964", severity=Severity.ERROR,
                                  message=f"GPU {dev}{on}: engines ask {mib / 1024:.1f} GiB, {free / 1024:.1f} GiB of "
                                          f"{total / 1024:.1f} GiB is free",
                                  help="lower gpu_memory_utilization or free the GPU"))
    return out


def check_dirs(plan: LaunchPlan) -> list[Diagnostic]:
    """OPD967 for every directory a process must write (EC shared storage,
    ``ProcessSpec.writable_dirs``) that is not writable: an existing directory must be
    writable, a missing one must be creatable (its nearest existing parent writable;
    vLLM's ECExampleConnector creates ``<dir>/<mm_hash>/`` itself, example_connector.py).
    Checks this host only: a directory on another host (inventory) is not seen here."""
    out: list[Diagnostic] = []
    seen: set[str] = set()
    for p in plan.processes:
        for d in p.writable_dirs:
            if d in seen:
                continue
            seen.add(d)
            probe = os.path.abspath(d)
            while not os.path.exists(probe) and os.path.dirname(probe) != probe:
                probe = os.path.dirname(probe)
            if not os.path.isdir(probe):
                why = f"{probe} is not a directory"
            elif not os.access(probe, os.W_OK | os.X_OK):
                why = f"{probe} is not writable by this user" if probe == os.path.abspath(d) else (
                    f"it does not exist and {probe} is not writable, so it cannot be created")
            else:
                continue
            out.append(Diagnostic(
                code="OPD967", severity=Severity.ERROR,
                message=f"{p.name} must write encoder outputs to {d}: {why}",
                help="pick a writable directory both the encoder and prefill see (expand --ec-storage-path)"))
    return out


def preflight(plan: LaunchPlan, platform: str) -> list[Diagnostic]:
    """Every check above, in order: executables, modules, devices, ports, shared directories."""
    return (check_executables(plan) + check_modules(plan) + check_devices(plan, platform) + check_ports(plan)
            + check_dirs(plan))
