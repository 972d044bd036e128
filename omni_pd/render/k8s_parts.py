"""Pod pieces both Kubernetes renderers use (:mod:`omni_pd.render.kubernetes`, plain-vLLM
pairs; :mod:`omni_pd.render.kubernetes_omni`, vllm-omni pipelines): labels, a process's
arguments and env with the pod's own address and Secret references, probes, Services, the
device resource per platform and the memory-backed ``/dev/shm``. Pure; the rules and their
sources are in :mod:`omni_pd.render.kubernetes`'s docstring.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from omni_pd.compile.devices import VISIBILITY_VARS
from omni_pd.launch.shell import flag_var
from omni_pd.launch.spec import ProcessSpec, is_secret, secret_flag

#: accelerator resource per platform (device plugins: NVIDIA k8s-device-plugin, ROCm k8s-device-plugin,
#: Ascend's ascend-device-plugin, whose resource for the Atlas 800 A2/A3 910 series is ``huawei.com/Ascend910``)
RESOURCE = {"cuda": "nvidia.com/gpu", "rocm": "amd.com/gpu", "npu": "huawei.com/Ascend910", "cpu": None}
#: env vars the launcher sets that a pod must not carry: every platform's visibility variable
#: (omni_pd/compile/devices.py); the device plugin gives the container its devices, seen as 0..n-1
DROP_ENV = VISIBILITY_VARS
#: the label LWS puts on every pod of a group, "0" on the leader (lws api/leaderworkerset/v1)
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
#: /dev/shm of an engine pod: memory-backed, not the container runtime's 64 MiB default. vLLM's
#: workers share tensors through it (PyTorch shared memory, NCCL, vLLM's shared-memory message
#: queue), which is why vLLM's Docker guide asks for --ipc=host or --shm-size, and the LWS vLLM
#: example mounts an emptyDir of medium Memory there
DSHM = {"name": "dshm", "emptyDir": {"medium": "Memory"}}

class RenderError(ValueError):
    """The plan has no Kubernetes rendering here. ``help``: what to do instead."""

    def __init__(self, message: str, help: str | None = None) -> None:
        super().__init__(message)
        self.help = help


def labels(name: str, component: str, stage: int | None = None) -> dict[str, str]:
    """The labels of an object: ``app.kubernetes.io/{name,instance,component}``, ``llm-d.ai/role``
    for prefill and decode (llm-d's role label), ``omni-pd.io/stage`` when ``stage`` is given."""
    out = {"app.kubernetes.io/name": "omni-pd", "app.kubernetes.io/instance": name,
           "app.kubernetes.io/component": component}
    if component in ("prefill", "decode"):
        out["llm-d.ai/role"] = component
    if stage is not None:
        out["omni-pd.io/stage"] = str(stage)
    return out


def port_of(spec: ProcessSpec) -> int:
    """The first port ``spec`` binds (its HTTP port)."""
    return spec.ports[0].port


def args_of(spec: ProcessSpec, secret_vars: list[str]) -> list[str]:
    """``spec.argv[1:]`` with ``--host`` = ``$(POD_IP)``, no ``engine_id`` in
    ``--kv-transfer-config``, and a secret flag's value (``--api-key K``, ``--api-key=K``)
    as ``$(VAR)`` (from the Secret; :func:`omni_pd.launch.shell.flag_var` names it)."""
    argv = list(spec.argv)
    out: list[str] = []
    i = 1
    while i < len(argv):
        a = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if a == "--host" and nxt is not None:
            out += [a, "$(POD_IP)"]
            i += 2
            continue
        if a == "--kv-transfer-config" and nxt is not None:
            kv = json.loads(nxt)
            kv.pop("engine_id", None)
            out += [a, json.dumps(kv, separators=(",", ":"))]
            i += 2
            continue
        flag = secret_flag(a, nxt) if nxt is not None else None
        if flag is not None and flag == a:  # --api-key VALUE
            secret_vars.append(flag_var(flag))
            out += [a, f"$({flag_var(flag)})"]
            i += 2
            continue
        flag = secret_flag("", a)
        if flag is not None:  # --api-key=VALUE
            secret_vars.append(flag_var(flag))
            out.append(f"{flag}$({flag_var(flag)})")
            i += 1
            continue
        out.append(a)
        i += 1
    return out


def env_of(spec: ProcessSpec, secret: str, secret_vars: Iterable[str], *, secrets: bool = True) -> list[dict[str, Any]]:
    """The container env of ``spec``: ``POD_IP`` first (downward API), the side-channel
    host as ``$(POD_IP)``, secret values as ``secretKeyRef`` (``secrets`` False: none)."""
    env: list[dict[str, Any]] = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    for k, v in spec.env.items():
        if k in DROP_ENV or k == "POD_IP":
            continue
        if k == "VLLM_NIXL_SIDE_CHANNEL_HOST":
            env.append({"name": k, "value": "$(POD_IP)"})
        elif is_secret(k):
            if secrets:
                env.append({"name": k, "valueFrom": {"secretKeyRef": {"name": secret, "key": k}}})
        else:
            env.append({"name": k, "value": str(v)})
    for var in secret_vars:
        if not any(e["name"] == var for e in env):
            env.append({"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": var}}})
    return env


def api_key_var(args: list[str], env: list[dict[str, Any]]) -> str | None:
    """The variable an engine's API key is in: ``--api-key``'s (``API_KEY``), else
    ``VLLM_API_KEY`` when the container has it (vllm/entrypoints/serve/middleware/register.py:
    the flag wins over the variable); None: the engine takes no key."""
    for a in args:
        if a == "--api-key" or a.startswith("--api-key="):
            return flag_var("--api-key")
    return "VLLM_API_KEY" if any(e["name"] == "VLLM_API_KEY" for e in env) else None


def probes(port: int, startup_s: float, key_var: str | None) -> dict[str, Any]:
    """Startup and liveness probes on ``/health`` (startup allowed ``startup_s``), readiness on
    ``/v1/models``: ``httpGet``, or an ``exec`` probe sending the API key in ``key_var``."""
    def get(path: str) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": "http"}}

    if key_var is None:
        ready: dict[str, Any] = get("/v1/models")
    else:  # GET /v1/models with the key, from the container's own variable (no key in the manifest)
        code = ("import os, urllib.request as u; u.build_opener(u.ProxyHandler({})).open(u.Request("
                f"'http://%s:{port}/v1/models' % os.environ['POD_IP'], headers={{'Authorization': "
                f"'Bearer ' + os.environ['{key_var}']}}), timeout=5)")
        ready = {"exec": {"command": ["python3", "-c", code]}, "timeoutSeconds": 10}
    return {
        "startupProbe": {**get("/health"), "periodSeconds": 10, "failureThreshold": max(1, int(startup_s // 10))},
        "livenessProbe": {**get("/health"), "periodSeconds": 10, "failureThreshold": 3},
        "readinessProbe": {**ready, "periodSeconds": 5, "failureThreshold": 3},
    }


def service(name: str, component: str, port: int, *, full_name: str | None = None,
             leaders_only: bool = False) -> dict[str, Any]:
    """A Service ``<name>-<component>`` (or ``full_name``) on ``port`` -> the pods' ``http``
    port, selecting the component's pods (``leaders_only``: a LeaderWorkerSet's leaders)."""
    lab = labels(name, component)
    selector = {k: lab[k] for k in ("app.kubernetes.io/instance", "app.kubernetes.io/component")}
    if leaders_only:
        selector[WORKER_INDEX_LABEL] = "0"
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": full_name or f"{name}-{component}", "labels": lab},
            "spec": {"selector": selector, "ports": [{"name": "http", "port": port, "targetPort": "http"}]}}
