"""Kubernetes manifests for a plain-vLLM PD pair (``omni-pd render --target kubernetes``).

The llm-d shape (llm-d's Kustomize guide ``guides/pd-disaggregation``,
https://github.com/llm-d/llm-d): per role a Deployment (one pod per prefill or decode
instance, ``replicas`` = the stage's ``num_replicas``) and a Service, the PD router as its
own Deployment and Service in front (the entrypoint), the compiled deploy config as a
ConfigMap, and a ``kustomization.yaml`` so ``kubectl apply -k DIR`` applies it all. Per
pod:

* ``--host $(POD_IP)`` and ``VLLM_NIXL_SIDE_CHANNEL_HOST`` from the pod IP (downward API
  ``status.podIP``): every listener binds and advertises the pod's own address;
* accelerator requests and limits = the instance's world size (TP x PP x DP devices:
  a decode at DP 4 asks for four GPUs), ``nvidia.com/gpu`` on cuda, ``amd.com/gpu`` on rocm;
* no ``engine_id``: replicas of one Deployment share their arguments, so each engine takes
  vLLM's per-engine default (a fresh uuid4: vllm/config/kv_transfer.py ``KVTransferConfig``);
* probes: startup and liveness on ``/health``, readiness on ``/v1/models``;
* labels: ``app.kubernetes.io/{name,instance,component}``, ``llm-d.ai/role`` and
  ``omni-pd.io/stage``;
* secrets (``HF_TOKEN``, ``--api-key``) from a Kubernetes Secret (``secretKeyRef``), never
  written into a manifest.

Connectors whose router needs each prefill's own address (``router_protocol``
``bootstrap``: Mooncake) are refused: a Service hides the pods. Pure: :func:`render_kubernetes`
returns ``{file name: YAML text}``; :func:`validate_manifests` checks the objects with the
``kubernetes-validate`` package's schemas (no cluster).
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from omni_pd.launch.spec import LaunchPlan, ProcessSpec, is_secret

#: accelerator resource per platform (device plugins: NVIDIA k8s-device-plugin, ROCm k8s-device-plugin)
RESOURCE = {"cuda": "nvidia.com/gpu", "rocm": "amd.com/gpu", "cpu": None}
#: the Kubernetes release whose schemas :func:`validate_manifests` uses by default
K8S_VERSION = "1.33"
#: env vars the launcher sets that a pod must not carry (the device plugin picks devices)
_DROP_ENV = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


class RenderError(ValueError):
    """The plan has no Kubernetes rendering here. ``help``: what to do instead."""

    def __init__(self, message: str, help: str | None = None) -> None:
        super().__init__(message)
        self.help = help


def _labels(name: str, component: str, stage: int | None = None) -> dict[str, str]:
    out = {"app.kubernetes.io/name": "omni-pd", "app.kubernetes.io/instance": name,
           "app.kubernetes.io/component": component}
    if component in ("prefill", "decode"):
        out["llm-d.ai/role"] = component
    if stage is not None:
        out["omni-pd.io/stage"] = str(stage)
    return out


def _port_of(spec: ProcessSpec) -> int:
    return spec.ports[0].port


def _args(spec: ProcessSpec, secret_vars: list[str]) -> list[str]:
    """``spec.argv[1:]`` with ``--host`` = ``$(POD_IP)``, no ``engine_id`` in
    ``--kv-transfer-config``, and a secret flag's value as ``$(VAR)`` (from the Secret)."""
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
        if a.startswith("--") and "=" not in a and nxt is not None and is_secret(a[2:].replace("-", "_")):
            var = a[2:].replace("-", "_").upper()
            secret_vars.append(var)
            out += [a, f"$({var})"]
            i += 2
            continue
        out.append(a)
        i += 1
    return out


def _env(spec: ProcessSpec, secret: str, secret_vars: Iterable[str]) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    for k, v in spec.env.items():
        if k in _DROP_ENV or k == "POD_IP":
            continue
        if k == "VLLM_NIXL_SIDE_CHANNEL_HOST":
            env.append({"name": k, "value": "$(POD_IP)"})
        elif is_secret(k):
            env.append({"name": k, "valueFrom": {"secretKeyRef": {"name": secret, "key": k}}})
        else:
            env.append({"name": k, "value": str(v)})
    for var in secret_vars:
        if not any(e["name"] == var for e in env):
            env.append({"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": var}}})
    return env


def _probes(port: int, startup_s: float) -> dict[str, Any]:
    def get(path: str) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": "http"}}

    return {
        "startupProbe": {**get("/health"), "periodSeconds": 10, "failureThreshold": max(1, int(startup_s // 10))},
        "livenessProbe": {**get("/health"), "periodSeconds": 10, "failureThreshold": 3},
        "readinessProbe": {**get("/v1/models"), "periodSeconds": 5, "failureThreshold": 3},
    }


def _deployment(name: str, component: str, replicas: int, container: dict[str, Any], stage: int | None,
                volumes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    labels = _labels(name, component, stage)
    selector = {k: labels[k] for k in ("app.kubernetes.io/instance", "app.kubernetes.io/component")}
    spec: dict[str, Any] = {"containers": [container]}
    if volumes:
        spec["volumes"] = volumes
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": f"{name}-{component}", "labels": dict(labels)},  # copies: no YAML anchors
            "spec": {"replicas": replicas, "selector": {"matchLabels": selector},
                     "template": {"metadata": {"labels": dict(labels)}, "spec": spec}}}


def _service(name: str, component: str, port: int, *, full_name: str | None = None) -> dict[str, Any]:
    labels = _labels(name, component)
    selector = {k: labels[k] for k in ("app.kubernetes.io/instance", "app.kubernetes.io/component")}
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": full_name or f"{name}-{component}", "labels": labels},
            "spec": {"selector": selector, "ports": [{"name": "http", "port": port, "targetPort": "http"}]}}


def manifests(plan: LaunchPlan, config_text: str, *, name: str, image: str, router_image: str,
              platform: str, secret: str, stages: dict[str, int]) -> list[tuple[str, list[dict[str, Any]]]]:
    """The objects of :func:`render_kubernetes`, grouped by file. ``stages``: role ->
    compiled stage id (labels). Raises :class:`RenderError` for a plan it cannot render."""
    from omni_pd.compile import connectors

    if plan.runtime != "vllm":
        raise RenderError("--target kubernetes renders plain-vLLM PD pairs (the llm-d shape); this config runs on "
                          "the vllm-omni runtime",
                          help="render --target scripts, or expand a thinker-only pipeline for Kubernetes")
    if any(p.role == "encoder" for p in plan.processes):  # before the KV connector: E -> PD has none
        raise RenderError("an encoder split (E->P->D, E->PD) has no Kubernetes rendering yet",
                          help="render --target scripts")
    contract = connectors.get(plan.connector)
    if contract is None or contract.router_protocol != "pull":
        raise RenderError(f"{plan.connector}: its router needs each prefill pod's own address "
                          f"(router protocol {getattr(contract, 'router_protocol', 'unknown')}), which a Service hides",
                          help="expand with --connector NixlConnector for Kubernetes")
    if platform not in RESOURCE:
        raise RenderError(f"--platform {platform}: no Kubernetes device resource known here",
                          help=f"one of {', '.join(RESOURCE)}")
    resource = RESOURCE[platform]
    files: list[tuple[str, list[dict[str, Any]]]] = []
    cm_name = f"{name}-deploy-config"
    files.append(("configmap.yaml", [{"apiVersion": "v1", "kind": "ConfigMap",
                                      "metadata": {"name": cm_name, "labels": _labels(name, "config")},
                                      "data": {"deploy.yaml": config_text}}]))
    urls: dict[str, str] = {}
    for role in ("prefill", "decode"):
        insts = [p for p in plan.processes if p.role == role]
        first = insts[0]
        port = _port_of(first)
        secret_vars: list[str] = []
        args = _args(first, secret_vars)
        world = len(first.devices.split(",")) if first.devices else 1
        container: dict[str, Any] = {
            "name": "vllm", "image": image, "command": [first.argv[0].rsplit("/", 1)[-1]], "args": args,
            "env": _env(first, secret, secret_vars),
            "ports": [{"name": "http", "containerPort": port}]
                     + [{"name": f"kv-{i}", "containerPort": u.port} for i, u in enumerate(first.ports[1:])],
            **_probes(port, first.health.timeout_s if first.health else 1200.0),
            "volumeMounts": [{"name": "deploy-config", "mountPath": "/etc/omni-pd", "readOnly": True}],
        }
        if resource is not None:
            container["resources"] = {"requests": {resource: world}, "limits": {resource: world}}
        dep = _deployment(name, role, len(insts), container, stages.get(role),
                          volumes=[{"name": "deploy-config", "configMap": {"name": cm_name}}])
        files.append((f"{role}.yaml", [dep, _service(name, role, port)]))
        urls[role] = f"http://{name}-{role}:{port}"
    router = plan.process("router")
    r_args = _args(router, [])
    for role in ("prefill", "decode"):
        # one Service per role in front of its pods (NIXL decode pulls from the pod prefill names
        # in kv_transfer_params, so a Service is enough for pull)
        flag = f"--{role}"
        idx = [i for i, a in enumerate(r_args) if a == flag]
        for i in reversed(idx[1:]):
            del r_args[i:i + 2]
        if idx:
            r_args[idx[0] + 1] = urls[role]
    r_port = _port_of(router)
    r_container: dict[str, Any] = {
        "name": "router", "image": router_image, "command": ["python"], "args": r_args,
        "env": _env(router, secret, []), "ports": [{"name": "http", "containerPort": r_port}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5},
        "livenessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10},
    }
    files.append(("router.yaml", [_deployment(name, "router", 1, r_container, None),
                                  _service(name, "router", r_port, full_name=name)]))
    return files


def render_kubernetes(plan: LaunchPlan, config_text: str, *, name: str = "omni-pd", image: str,
                      router_image: str, platform: str, secret: str = "omni-pd-secrets",
                      stages: dict[str, int] | None = None) -> dict[str, str]:
    """``{file name: YAML}``: :func:`manifests` as YAML documents, plus a
    ``kustomization.yaml`` listing them. Raises :class:`RenderError`. Pure."""
    import io

    from ruamel.yaml import YAML

    yaml = YAML()
    yaml.default_flow_style = False
    yaml.width = 4096
    out: dict[str, str] = {}
    files = manifests(plan, config_text, name=name, image=image, router_image=router_image, platform=platform,
                      secret=secret, stages=stages or {})
    for fname, objs in files:
        buf = io.StringIO()
        yaml.dump_all(objs, buf)
        out[fname] = buf.getvalue()
    buf = io.StringIO()
    yaml.dump({"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
               "resources": [f for f, _ in files]}, buf)
    out["kustomization.yaml"] = buf.getvalue()
    return out


def validate_manifests(files: dict[str, str], version: str = K8S_VERSION) -> list[str]:
    """Problems of the rendered objects against Kubernetes ``version``'s schemas
    (the ``kubernetes-validate`` package, strict: unknown fields are errors); [] when all
    validate. The kustomization is not a cluster object and is skipped. Raises
    ImportError when kubernetes-validate is not installed."""
    import kubernetes_validate
    from ruamel.yaml import YAML

    yaml = YAML(typ="safe")
    problems: list[str] = []
    for fname, text in files.items():
        if fname == "kustomization.yaml":
            continue
        for obj in yaml.load_all(text):
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                where = "/".join(str(p) for p in e.path)
                problems.append(f"{fname}: {obj.get('kind')} {obj['metadata']['name']}: {where}: {e.message}")
    return problems
