"""Per-host shell scripts for a launch plan (``omni-pd render --to DIR``). Pure.

:func:`render_scripts` turns a plan (every host's processes, :func:`omni_pd.launch.plan.
build_plan` with a placement) into one ``<host>.sh`` per host, plus ``deploy.yaml`` (the
compiled config, verbatim), ``placement.yaml`` (each stage's host and each host's
address, as resolved) and ``plan.json`` (the plan, secrets masked). Each script does what
``omni-pd launch --host NAME`` does on that host, without omni-pd's supervisor:

* waits for the peers its processes depend on (``GET /health`` on the peer host's
  address, with the plan's timeout);
* starts each process in its own session (``setsid``) with the plan's argv and env, its
  output in ``logs/<name>.log``, in dependency order, each once its dependencies answer;
* on exit (a child ending, Ctrl-C, SIGTERM) signals every process group it started;
* for an instance spanning hosts (``placement: {0: [A, B]}``), node rank 0's host starts the
  instance with the API server, each other host its headless workers
  (``--node-rank i --headless``), which are ready when node rank 0's ``/health`` answers.

Devices are mapped when the script runs, not when it is rendered: a stage's ``devices`` are
logical ids into the visibility variable the engine inherits (vllm-omni 0.30
``stage_runtime_setup``; omni_pd/compile/devices.py), and the host's own variable (set by a
scheduler: Slurm, a device plugin) is unknown at render time. Before starting anything the
script maps each engine's ids through the platform's variables
(:data:`omni_pd.compile.devices.DEVICE_VARS`; ROCm: ``CUDA_VISIBLE_DEVICES``, else
``HIP_VISIBLE_DEVICES``): logical id ``i`` is entry ``i`` of the first one set non-empty on the
host, the id itself when none is; an id past its last entry stops the script with a message
naming the engine, its stage, the id and the variable. The engine starts with every variable
of the platform set to the mapped list, as ``omni-pd launch`` does. A visible set the plan
already fixed (the stage's own env value of the variable, or ``render --env``) is written
as planned.

Secrets are never written: an env value or a flag value whose name is a secret
(:func:`omni_pd.launch.spec.is_secret`: ``HF_TOKEN``, ``--api-key``) is read from the
host's environment when the script runs (``${HF_TOKEN:?...}``), and the script stops
before starting anything when it is unset.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any, Mapping

from omni_pd.compile.devices import DEVICE_ENV, DEVICE_VARS
from omni_pd.launch.plan import WORKER_SUFFIX, for_host, hosts_of
from omni_pd.launch.shell import secret_ref, words
from omni_pd.launch.spec import LaunchPlan, ProcessSpec, is_secret, secret_flag

#: the file every script reads the compiled config from (next to the script)
DEPLOY = "deploy.yaml"

_PRELUDE = r'''set -euo pipefail
cd "$(dirname "$0")"
mkdir -p logs
pids=()
cleanup() {
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
  wait || true
}
trap cleanup EXIT INT TERM
# wait_healthy NAME URL TIMEOUT_S: poll URL until HTTP 200
wait_healthy() {
  local deadline=$((SECONDS + $3))
  until python3 -c 'import sys, urllib.request as u; u.build_opener(u.ProxyHandler({})).open(sys.argv[1], timeout=2)' "$2" 2>/dev/null; do
    if (( SECONDS >= deadline )); then echo "$1: GET $2 did not answer within $3 s" >&2; exit 1; fi
    sleep 1
  done
  echo "$1 healthy"
}
'''

#: the prelude's device mapping (only in a script with devices to map): omni_pd/compile/devices.py
#: ``physical_ids`` for a host whose ids all lie inside its visible set, in bash
_MAP_DEVICES = r'''# map_devices OUT WHAT IDS VAR...: set OUT to the physical ids of the logical device ids IDS
# ("0,1"): id i is entry i of the first VAR set non-empty on this host, the id itself when none
# is (omni_pd/compile/devices.py); an id past the variable's last entry stops the script
map_devices() {
  local out=$1 what=$2 ids=$3 var="" val="" name v id e
  shift 3
  for name in "$@"; do
    v=${!name:-}
    if [[ -z $var && -n ${v//[[:space:]]/} ]]; then var=$name; val=$v; fi
  done
  if [[ -z $var ]]; then
    printf -v "$out" %s "$ids"
    echo "$what: devices $ids ($* unset: the ids themselves)"
    return 0
  fi
  local -a parts=() vis=() got=()
  IFS=, read -ra parts <<< "${val//[[:space:]]/}"
  for e in "${parts[@]}"; do
    if [[ -n $e ]]; then vis+=("$e"); fi
  done
  for id in ${ids//,/ }; do
    if (( id >= ${#vis[@]} )); then
      echo "$what: logical device $id is outside $var=$val on this host (${#vis[@]} visible): nothing started" >&2
      exit 1
    fi
    got+=("${vis[id]}")
  done
  local IFS=,
  printf -v "$out" %s "${got[*]}"
  echo "$what: devices $ids -> ${got[*]} (entries of $var=$val)"
}
'''


def command_line(spec: ProcessSpec, devices: tuple[str, tuple[str, ...]] | None = None) -> tuple[str, tuple[str, ...]]:
    """The shell words that start ``spec`` (``env K=V ... argv``, each word quoted by
    :func:`omni_pd.launch.shell.words`, the quoting ``launch --dry-run`` prints too) and the
    names of the secret variables it reads from the host's environment. ``devices``:
    ``(shell variable, names)``: each variable of ``names`` in ``spec.env`` takes the value
    of that shell variable when the command runs (``CUDA_VISIBLE_DEVICES="$dev_prefill_0"``:
    the ids :data:`_MAP_DEVICES` mapped). Pure."""
    w = words(spec)
    env = list(w.env)
    if devices is not None:
        ref, names = devices
        env = [f'{k}="${{{ref}}}"' if k in names else word for k, word in zip(spec.env, env)]
    return " ".join(["env"] + env + list(w.argv)), w.secrets


def mapped_at_run_time(spec: ProcessSpec, platform: str) -> bool:
    """True when the script maps ``spec``'s devices on its host (:data:`_MAP_DEVICES`): an
    engine with logical devices on ``platform``'s variable whose visible set the plan left
    to the host (no stage env value of it, no ``render --env`` one: ``visible_devices`` None)."""
    return (spec.logical_devices is not None and spec.visible_devices is None
            and spec.device_env is not None and spec.device_env == DEVICE_ENV.get(platform))


def _shell_name(name: str) -> str:
    return "dev_" + re.sub(r"[^A-Za-z0-9_]", "_", name)


def host_script(plan: LaunchPlan, host: str | None, address: str | None = None, source: str | None = None,
                platform: str = "cuda", stages: Mapping[str, int] | None = None) -> str:
    """The script of ``host`` (None: the one host of a plan without placement): the
    processes of :func:`~omni_pd.launch.plan.for_host` in plan order. ``source``: the
    compiled config's name for the header (default: ``plan.config``). ``platform``: the
    plan's (``render --platform``), whose variables the devices are mapped through at run
    time (:func:`mapped_at_run_time`); ``stages``: role -> compiled stage id, for the
    messages. Pure."""
    part = for_host(plan, host) if host is not None else plan
    here = [p for p in part.processes if p.role != "peer"]
    peers = [p for p in part.processes if p.role == "peer"]
    where = f"host {host}" + (f" ({address})" if address else "") if host is not None else "this host"
    lines = ["#!/usr/bin/env bash",
             f"# Generated by `omni-pd render` from {source or plan.config}: run on {where}.",
             f"# Starts {', '.join(p.name for p in here)}"
             + (f"; waits for {', '.join(f'{p.name} on {p.host}' for p in peers)}" if peers else "") + ".",
             f"# Entrypoint of the deployment: {plan.entrypoint}. Logs: logs/<process>.log next to this script.",
             _PRELUDE.rstrip("\n")]
    names = DEVICE_VARS.get(platform, ())
    mapped = [p for p in here if mapped_at_run_time(p, platform)]
    maps: list[str] = []
    if mapped:
        lines.append(_MAP_DEVICES.rstrip("\n"))
        maps = ["# Devices, mapped before anything starts: each engine's logical ids index this host's",
                f"# {' (else '.join(names)}{')' * (len(names) - 1)} when set (e.g. by a scheduler), else are the "
                "ids themselves"]
        for p in mapped:
            stage = (stages or {}).get(p.role.removesuffix(WORKER_SUFFIX))  # a worker: its leader's stage
            what = p.name + (f" (stage {stage})" if stage is not None else "")
            maps.append(f"map_devices {_shell_name(p.name)} {shlex.quote(what)} {p.logical_devices} {' '.join(names)}")
    bodies: list[str] = []
    secrets: list[str] = []
    healthy: set[str] = set()
    by_name = {p.name: p for p in part.processes}
    for p in here:
        block = [f"# {p.name} ({p.role})"]
        for d in p.depends_on:
            if d in healthy:
                continue
            dep = by_name[d]
            assert dep.health is not None
            block.append(f"wait_healthy {shlex.quote(d)} {shlex.quote(dep.health.url)} {int(dep.health.timeout_s)}")
            healthy.add(d)
        cmd, sec = command_line(p, (_shell_name(p.name), names) if p in mapped else None)
        secrets += sec
        block.append(f"setsid {cmd} > logs/{p.name}.log 2>&1 &")
        block.append("pids+=($!)")
        block.append(f"echo \"started {p.name} (pid $!)\"")
        bodies.append("\n".join(block))
    # a peer no process here depends on (vllm-omni's head, for a host of headless stages) gates readiness
    tail = [f"wait_healthy {shlex.quote(p.name)} {shlex.quote(p.health.url)} {int(p.health.timeout_s)}"
            for p in here + peers if p.health is not None and p.name not in healthy]
    tail.append(f"echo \"{where}: all {len(here)} process(es) healthy\"")
    tail.append("wait -n")
    tail.append("echo \"a process exited: stopping\" >&2")
    tail.append("exit 1")
    checks = [f": {secret_ref(s)}" for s in dict.fromkeys(secrets)]
    return "\n".join(lines + checks + ([""] + maps if maps else []) + [""] + ["\n\n".join(bodies), ""] + tail) + "\n"


def placement_yaml(plan: LaunchPlan, placement: Any) -> str:
    """``placement.yaml``: hosts with their addresses and processes, and stage -> host."""
    lines = ["# The placement `omni-pd render` resolved (inventory placement, else its proposal).", "hosts:"]
    for h in hosts_of(plan):
        addr = placement.addresses.get(h)
        procs = ", ".join(p.name for p in plan.processes if p.host == h)
        lines.append(f"  {h}: {{address: {json.dumps(addr)}, processes: [{procs}]}}")
    lines.append("placement:")
    for sid in sorted(placement.stage_host):
        nodes = placement.nodes_of(sid)
        lines.append(f"  {sid}: " + (f"[{', '.join(nodes)}]" if len(nodes) > 1 else nodes[0]))
    return "\n".join(lines) + "\n"


def render_scripts(plan: LaunchPlan, config_text: str, placement: Any = None,
                   source: str | None = None, platform: str = "cuda",
                   stages: Mapping[str, int] | None = None) -> dict[str, str]:
    """Every file of ``render --to DIR``: ``{relative path: text}``.

    ``plan``: built with ``config`` = :data:`DEPLOY` (the scripts ``cd`` next to it);
    ``config_text``: the compiled config, written verbatim as ``deploy.yaml``;
    ``placement``: the :class:`~omni_pd.compile.placement.Placement` the plan was built
    with (None: one host, one ``local.sh``); ``source``: the config's file name for the
    scripts' header; ``platform``, ``stages``: as :func:`host_script` takes them. Raises
    ValueError when a rendered script
    would hold a secret value of the plan (a defect: secrets are referenced, never written).
    """
    files: dict[str, str] = {DEPLOY: config_text}
    hosts = hosts_of(plan)
    if placement is None or not hosts:
        files["local.sh"] = host_script(plan, None, source=source, platform=platform, stages=stages)
    else:
        for h in hosts:
            files[f"{h}.sh"] = host_script(plan, h, placement.addresses.get(h), source, platform, stages)
        files["placement.yaml"] = placement_yaml(plan, placement)
    files["plan.json"] = json.dumps(plan.to_json(), indent=2) + "\n"
    secrets = secret_values(plan)
    for name, text in files.items():
        if name.endswith(".sh") and any(v in text for v in secrets):
            raise ValueError(f"{name} would contain a secret value")
    return files


def secret_values(plan: LaunchPlan) -> set[str]:
    """The secret values in ``plan`` (env and flags), 4 characters or longer."""
    out: set[str] = set()
    for p in plan.processes:
        out |= {v for k, v in p.env.items() if is_secret(k) and len(v) >= 4}
        for i, a in enumerate(p.argv):
            flag = secret_flag(p.argv[i - 1] if i else "", a)
            value = a[len(flag):] if flag is not None and flag.endswith("=") else a
            if flag is not None and len(value) >= 4:
                out.add(value)
    return out


def executable(files: Mapping[str, str]) -> tuple[str, ...]:
    """The files of ``files`` to mark executable (the scripts)."""
    return tuple(n for n in files if n.endswith(".sh"))
