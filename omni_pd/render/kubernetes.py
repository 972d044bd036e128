"""Kubernetes manifests for a plain-vLLM PD pair (``omni-pd render --target kubernetes``); a
vllm-omni pipeline's are :mod:`omni_pd.render.kubernetes_omni`'s (:func:`manifests` dispatches).

The llm-d shape (llm-d's Kustomize guide ``guides/pd-disaggregation``,
https://github.com/llm-d/llm-d): per role a workload and a Service, the PD router as its
own Deployment and Service in front (the entrypoint), the compiled deploy config as a
ConfigMap, and a kustomization named :data:`KUSTOMIZATION` so ``kubectl apply -k DIR`` applies it
all; ``kubectl apply -f DIR`` does too, since it reads only ``.yaml``/``.yml``/``.json`` files of a
directory and ``Kustomization`` is none (a ``kustomization.yaml`` there fails ``-f`` with "no
matches for kind Kustomization").

Workloads, per role (``replicas`` = the stage's ``num_replicas``, one group per instance):

* **Deployment**, one pod per instance, when the instance's world size (TP x PP x DP
  devices) fits one node: ``gpus_per_node`` (``render --gpus-per-node``) unset, or at
  least the world size;
* **LeaderWorkerSet** (kubernetes-sigs/lws ``leaderworkerset.x-k8s.io/v1``) when it does
  not: ``leaderWorkerTemplate.size`` = world / ``gpus_per_node`` pods, each asking for
  ``gpus_per_node`` devices. vLLM 0.30's own multi-node launch, no Ray: the leader runs
  ``vllm serve ... --nnodes N --node-rank 0 --master-addr $(POD_IP)`` (the API server,
  the engine core and its local workers; a DP head binds on that address; the
  torch.distributed store is torch's TCPStore, which listens on every interface of the pod,
  the one listener here not bound to the pod IP), each worker ``vllm serve ... --nnodes N --node-rank
  $(LWS_WORKER_INDEX) --master-addr $(LWS_LEADER_ADDRESS) --headless`` (no API server;
  vllm/entrypoints/cli/serve.py ``run_headless``; ``LWS_WORKER_INDEX`` is set by lws v0.6.0
  and later, ``LWS_LEADER_ADDRESS`` by every release). vLLM requires ``--nnodes`` to divide
  the world size (vllm/engine/arg_utils.py ``create_engine_config``), so a world size that
  is not a multiple of ``gpus_per_node`` is refused here. ``startupPolicy: LeaderCreated``: the leader
  is ready only once its workers joined, so ``LeaderReady`` would never start them;
  ``restartPolicy: RecreateGroupOnPodRestart``: one lost rank stops the whole instance;
* **DisaggregatedSet** (``disaggregatedset.x-k8s.io/v1``, lws v0.9.0 and later;
  ``disaggregated_set=True``, ``render --disaggregated-set``): both roles in one object,
  each role's spec a LeaderWorkerSet spec as above (size 1 when it fits one node), so the
  controller rolls prefill and decode together.

A role's Service selects its serving pods only (a LeaderWorkerSet's leaders:
``leaderworkerset.sigs.k8s.io/worker-index: "0"``, which LWS sets on every pod). Per pod:

* ``--host $(POD_IP)``, ``VLLM_NIXL_SIDE_CHANNEL_HOST`` and ``VLLM_HOST_IP`` from the pod IP
  (downward API ``status.podIP``): every listener binds and advertises the pod's own address
  (``VLLM_HOST_IP`` is vLLM's ``get_ip``, vllm/utils/network_utils.py: the address of a
  multi-node instance's message queues and of vllm-ascend's Mooncake side channel); no
  visibility variable (``CUDA_VISIBLE_DEVICES``, ``ASCEND_RT_VISIBLE_DEVICES``, ...);
* accelerator requests and limits: the devices of that pod (a pod per instance: its world
  size, a decode at DP 4 asks for four GPUs), :data:`RESOURCE` of the platform;
* no ``engine_id``: replicas of one workload share their arguments, so each engine takes
  vLLM's per-engine default (a fresh uuid4: vllm/config/kv_transfer.py ``KVTransferConfig``);
* probes on a serving pod: startup and liveness on ``/health``, readiness on
  ``/v1/models``. An engine with an API key (``--api-key``, ``VLLM_API_KEY``) answers
  ``/v1/*`` with 401 without it (vLLM's ``AuthenticationMiddleware`` guards ``/v1``,
  ``/health`` stays open: vllm/entrypoints/serve/middleware/authenticate.py), and an
  ``httpGet`` probe's headers are literal, so its readiness probe is an ``exec`` probe that
  sends ``Authorization: Bearer`` from the container's own (Secret-fed) variable. A
  headless worker serves no HTTP and has no probes;
* ``/dev/shm`` a memory-backed ``emptyDir`` (:data:`DSHM`);
* labels: ``app.kubernetes.io/{name,instance,component}``, ``llm-d.ai/role`` and
  ``omni-pd.io/stage``;
* secrets (``HF_TOKEN``, ``--api-key``, ``VLLM_API_KEY``) from a Kubernetes Secret
  (``secretKeyRef``), never written into a manifest; the router, which reads none of them
  (it relays the client's ``Authorization``: omni_pd/launch/router/__init__.py), gets none.

Monitoring (``monitoring.yaml``, listed last; ``render --no-monitoring`` leaves it out): a
PodMonitor over the engine pods, the PrometheusRule and Grafana dashboard ConfigMap of
``omni-pd status --emit`` selecting the labels that PodMonitor attaches
(:mod:`omni_pd.render.monitoring`).

Connectors whose router needs each prefill's own address (``router_protocol``
``bootstrap``: Mooncake) are refused: a Service hides the pods. Pure: :func:`render_kubernetes`
returns ``{file name: YAML text}``; :func:`validate_manifests` checks the objects offline
(core kinds with the ``kubernetes-validate`` package's schemas, LeaderWorkerSet and
DisaggregatedSet with their CRD schemas: :mod:`omni_pd.render.crd_schema`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from omni_pd.launch.plan import DP_RPC, MASTER_PURPOSE, drop_flags
from omni_pd.launch.spec import LaunchPlan, ProcessSpec
from omni_pd.render.k8s_parts import (DSHM, RESOURCE, RenderError, api_key_var as _api_key_var,  # noqa: F401
                                     args_of as _args, env_of as _env, labels as _labels, port_of as _port_of,
                                     probes as _probes, service as _service)

#: the engines' image of a plain-vLLM pair when ``render --image`` is not given
VLLM_IMAGE = "vllm/vllm-openai:v0.30.0"
#: the Kubernetes release whose schemas :func:`validate_manifests` uses by default
K8S_VERSION = "1.33"
#: vLLM 0.30's torch.distributed port of a multi-node instance (vllm/config/parallel.py ``master_port``)
MASTER_PORT = 29501
LWS_API = "leaderworkerset.x-k8s.io/v1"
DS_API = "disaggregatedset.x-k8s.io/v1"
#: the kustomization's file name: one of the three kustomize reads, and not one ``kubectl apply -f DIR`` reads
KUSTOMIZATION = "Kustomization"
#: flags of the API server only: a headless worker takes none of them (launch's own list
#: also drops --served-model-name; here the worker keeps the leader's arguments otherwise)
_SERVER_FLAGS = ("--host", "--port", "--api-key")


def _port_name(purpose: str, i: int) -> str:
    return "dp-rpc" if purpose == DP_RPC else f"kv-{i}"


def _flag_value(args: list[str], flag: str) -> str | None:
    for i, a in enumerate(args[:-1]):
        if a == flag:
            return args[i + 1]
    return None


@dataclass(frozen=True)
class Role:
    """One engine role's rendering: its pod templates and Service.

    ``leader``: the serving pod's template (the only one of a one-node instance);
    ``worker``: a headless worker's template (None: one node); ``size``: pods per instance;
    ``replicas``: instances."""

    role: str
    replicas: int
    size: int
    leader: dict[str, Any]
    worker: dict[str, Any] | None
    service: dict[str, Any]
    url: str


def nodes_of(role: str, world: int, gpus_per_node: int | None) -> int:
    """Pods (nodes) one instance of ``world`` devices spans with ``gpus_per_node`` devices
    per node: 1 when it fits (or the node size is unknown), else world / gpus_per_node.
    Raises :class:`RenderError` when the world size is not a multiple of the node size
    (vLLM 0.30 splits the world evenly over ``--nnodes``: vllm/engine/arg_utils.py)."""
    if gpus_per_node is None or world <= gpus_per_node:
        return 1
    if world % gpus_per_node:
        raise RenderError(f"{role}: an instance of {world} devices does not split evenly into nodes of "
                          f"{gpus_per_node} (vLLM 0.30 needs --nnodes to divide the world size)",
                          help=f"pass a --gpus-per-node that divides {world}, or size {role} to a multiple of "
                               f"{gpus_per_node}")
    return world // gpus_per_node


def _role(name: str, role: str, insts: list[ProcessSpec], *, image: str, secret: str, resource: str | None,
          stage: int | None, cm_name: str, gpus_per_node: int | None) -> Role:
    first = insts[0]
    port = _port_of(first)
    secret_vars: list[str] = []
    args = _args(first, secret_vars)
    world = len(first.devices.split(",")) if first.devices else 1
    # a compiled instance spanning hosts (its stage's nnodes, launch's --node-rank/--master-addr):
    # its devices are one node's; the pods of its LeaderWorkerSet take the place of the hosts
    spanned = int(_flag_value(args, "--nnodes") or 1)
    if spanned > 1:
        world *= spanned
        args = drop_flags(args, ("--nnodes", "--node-rank", "--master-addr"))
    size = spanned if spanned > 1 and gpus_per_node is None else nodes_of(role, world, gpus_per_node)
    # vLLM's own address (vllm/utils/network_utils.py get_ip): what vllm-ascend's Mooncake connector
    # advertises as its side channel, and a multi-node instance's message-queue address
    env = [e for e in _env(first, secret, secret_vars) if e["name"] != "VLLM_HOST_IP"] + [
        {"name": "VLLM_HOST_IP", "value": "$(POD_IP)"}]
    kv_ports = [{"name": _port_name(u.purpose, i), "containerPort": u.port}
                for i, u in enumerate(u for u in first.ports[1:] if u.purpose != MASTER_PURPOSE)]
    command = [first.argv[0].rsplit("/", 1)[-1]]
    labels = _labels(name, role, stage)
    mount = [{"name": "deploy-config", "mountPath": "/etc/omni-pd", "readOnly": True},
             {"name": "dshm", "mountPath": "/dev/shm"}]
    volumes = [{"name": "deploy-config", "configMap": {"name": cm_name}}, DSHM]
    resources = ({"resources": {"requests": {resource: world // size}, "limits": {resource: world // size}}}
                 if resource is not None else {})
    worker_c: dict[str, Any] | None = None
    extra_ports: list[dict[str, Any]] = []
    if size > 1:
        master = int(_flag_value(args, "--master-port") or MASTER_PORT)
        nodes = ["--nnodes", str(size)]
        key_var = _api_key_var(args, env)  # a worker serves no API: no key
        # a worker runs engine cores (and their KV side channels) only for data-parallel ranks
        dp = int(_flag_value(args, "--data-parallel-size") or 1)
        worker_ports = [p for p in kv_ports if p["name"] != "dp-rpc"] if dp > 1 else []
        worker_c = {"name": "vllm", "image": image, "command": command,
                    "args": drop_flags(args, _SERVER_FLAGS) + nodes + [
                        "--node-rank", "$(LWS_WORKER_INDEX)", "--master-addr", "$(LWS_LEADER_ADDRESS)", "--headless"],
                    "env": [e for e in env if e["name"] not in (key_var, "VLLM_API_KEY")],
                    **({"ports": worker_ports} if worker_ports else {}), "volumeMounts": mount, **resources}
        args = args + nodes + ["--node-rank", "0", "--master-addr", "$(POD_IP)"]
        extra_ports = [{"name": "dist", "containerPort": master}]
    leader_c: dict[str, Any] = {
        "name": "vllm", "image": image, "command": command, "args": args, "env": env,
        "ports": [{"name": "http", "containerPort": port}] + kv_ports + extra_ports,
        **_probes(port, first.health.timeout_s if first.health else 1200.0, _api_key_var(args, env)),
        "volumeMounts": mount, **resources,
    }
    tmpl = lambda c: {"metadata": {"labels": dict(labels)}, "spec": {"containers": [c], "volumes": volumes}}  # noqa: E731
    return Role(role=role, replicas=len(insts), size=size, leader=tmpl(leader_c),
                worker=tmpl(worker_c) if worker_c is not None else None,
                service=_service(name, role, port, leaders_only=size > 1), url=f"http://{name}-{role}:{port}")


def _deployment(name: str, component: str, replicas: int, template: dict[str, Any],
                labels: dict[str, str]) -> dict[str, Any]:
    selector = {k: labels[k] for k in ("app.kubernetes.io/instance", "app.kubernetes.io/component")}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": f"{name}-{component}", "labels": dict(labels)},  # copies: no YAML anchors
            "spec": {"replicas": replicas, "selector": {"matchLabels": selector}, "template": template}}


def _lws_spec(r: Role) -> dict[str, Any]:
    """A LeaderWorkerSet ``spec`` for ``r`` (see the module docstring). A one-node role
    (size 1) has only a ``workerTemplate``, which LWS then uses for the leader."""
    lwt: dict[str, Any] = {"size": r.size, "restartPolicy": "RecreateGroupOnPodRestart"}
    if r.worker is not None:
        lwt["leaderTemplate"] = r.leader
        lwt["workerTemplate"] = r.worker
    else:
        lwt["workerTemplate"] = r.leader
    return {"replicas": r.replicas, "startupPolicy": "LeaderCreated", "leaderWorkerTemplate": lwt}


def manifests(plan: LaunchPlan, config_text: str, *, name: str, image: str | None, router_image: str,
              platform: str, secret: str, stages: dict[str, int], gpus_per_node: int | None = None,
              disaggregated_set: bool = False, stage_devices: Mapping[int, Any] | None = None,
              addresses: Sequence[str] = (), monitoring: bool = True) -> list[tuple[str, list[dict[str, Any]]]]:
    """The objects of :func:`render_kubernetes`, grouped by file. ``stages``: role ->
    compiled stage id (labels); ``image``: the engines' image (None: :data:`VLLM_IMAGE`
    for plain vLLM; a vllm-omni pipeline needs one with vllm-omni and omni-pd);
    ``gpus_per_node``: devices one node offers (None: every instance fits one);
    ``disaggregated_set``: both roles in one DisaggregatedSet. A vllm-omni plan is
    :func:`omni_pd.render.kubernetes_omni.omni_manifests`'s, with ``stage_devices``
    (stage id -> devices) and ``addresses`` (the inventory hosts'). ``monitoring``: add
    ``monitoring.yaml`` (:func:`omni_pd.render.monitoring.monitoring_objects`: PodMonitor,
    PrometheusRule, Grafana dashboard ConfigMap) when the plan has a PD pair. Raises
    :class:`RenderError` for a plan it cannot render."""
    files = _workloads(plan, config_text, name=name, image=image, router_image=router_image, platform=platform,
                       secret=secret, stages=stages, gpus_per_node=gpus_per_node, disaggregated_set=disaggregated_set,
                       stage_devices=stage_devices, addresses=addresses)
    if monitoring and "prefill" in stages and "decode" in stages:
        from omni_pd.render.monitoring import monitoring_objects

        head = {"omni-pd.io/role": "head"} if plan.runtime == "vllm-omni" else None
        files.append(("monitoring.yaml", monitoring_objects(name, plan.runtime, stages, _labels(name, "monitoring"),
                                                            head_selector=head)))
    return files


def _workloads(plan: LaunchPlan, config_text: str, *, name: str, image: str | None, router_image: str,
               platform: str, secret: str, stages: dict[str, int], gpus_per_node: int | None,
               disaggregated_set: bool, stage_devices: Mapping[int, Any] | None,
               addresses: Sequence[str]) -> list[tuple[str, list[dict[str, Any]]]]:
    """:func:`manifests` without the monitoring objects."""
    from omni_pd.compile import connectors

    if plan.runtime == "vllm-omni":
        from omni_pd.render.kubernetes_omni import omni_manifests

        if gpus_per_node is not None or disaggregated_set:
            raise RenderError("--gpus-per-node and --disaggregated-set shape plain-vLLM PD pairs; a vllm-omni "
                              "pipeline is one pod per host of its placement",
                              help="drop them, or expand a thinker-only pipeline (plain vLLM) for LeaderWorkerSets")
        if image is None:
            raise RenderError("a vllm-omni pipeline needs an engine image with vllm-omni 0.30 and omni-pd installed "
                              f"(the default {VLLM_IMAGE} has neither)", help="pass --image IMAGE")
        return omni_manifests(plan, config_text, name=name, image=image, platform=platform, secret=secret,
                              stage_devices=stage_devices or {}, addresses=addresses)
    image = image or VLLM_IMAGE
    if plan.runtime != "vllm":
        raise RenderError(f"--target kubernetes has no rendering for the {plan.runtime} runtime")
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
    if gpus_per_node is not None and gpus_per_node < 1:
        raise RenderError(f"--gpus-per-node {gpus_per_node}: a node has at least one device")
    files: list[tuple[str, list[dict[str, Any]]]] = []
    cm_name = f"{name}-deploy-config"
    files.append(("configmap.yaml", [{"apiVersion": "v1", "kind": "ConfigMap",
                                      "metadata": {"name": cm_name, "labels": _labels(name, "config")},
                                      "data": {"deploy.yaml": config_text}}]))
    roles = [_role(name, role, [p for p in plan.processes if p.role == role], image=image, secret=secret,
                   resource=RESOURCE[platform], stage=stages.get(role), cm_name=cm_name, gpus_per_node=gpus_per_node)
             for role in ("prefill", "decode")]
    if disaggregated_set:
        ds = {"apiVersion": DS_API, "kind": "DisaggregatedSet",
              "metadata": {"name": name, "labels": _labels(name, "engines")},
              "spec": {"roles": [{"name": r.role, "spec": _lws_spec(r)} for r in roles]}}
        # every role is a LeaderWorkerSet here: its Service picks the leaders
        files.append(("disaggregatedset.yaml", [ds] + [_service(name, r.role, int(r.url.rsplit(":", 1)[1]),
                                                                leaders_only=True) for r in roles]))
    else:
        for r in roles:
            labels = _labels(name, r.role, stages.get(r.role))
            if r.worker is None:
                obj = _deployment(name, r.role, r.replicas, r.leader, labels)
            else:
                obj = {"apiVersion": LWS_API, "kind": "LeaderWorkerSet",
                       "metadata": {"name": f"{name}-{r.role}", "labels": dict(labels)}, "spec": _lws_spec(r)}
            files.append((f"{r.role}.yaml", [obj, r.service]))
    urls = {r.role: r.url for r in roles}
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
        "env": _env(router, secret, [], secrets=False), "ports": [{"name": "http", "containerPort": r_port}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5},
        "livenessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10},
    }
    r_labels = _labels(name, "router")
    files.append(("router.yaml", [_deployment(name, "router", 1, {"metadata": {"labels": dict(r_labels)},
                                                                  "spec": {"containers": [r_container]}}, r_labels),
                                  _service(name, "router", r_port, full_name=name)]))
    return files


def _in_namespace(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    """``obj`` with ``metadata.namespace`` set, right after ``metadata.name``."""
    meta = obj.get("metadata") or {}
    new_meta = {"name": meta["name"], "namespace": namespace} if "name" in meta else {"namespace": namespace}
    new_meta.update({k: v for k, v in meta.items() if k not in ("name", "namespace")})
    return {**obj, "metadata": new_meta}


def _literal_config(obj: dict[str, Any]) -> dict[str, Any]:
    """A ConfigMap's multi-line ``data`` values as YAML literal blocks (``|``): the deploy
    config stays readable in the file, as ``kubectl create configmap --from-file`` writes
    it, instead of one escaped line. Other objects unchanged."""
    if obj.get("kind") != "ConfigMap" or not isinstance(obj.get("data"), dict):
        return obj
    from ruamel.yaml.scalarstring import LiteralScalarString

    return {**obj, "data": {k: LiteralScalarString(v) if isinstance(v, str) and "\n" in v else v
                            for k, v in obj["data"].items()}}


#: a Kubernetes namespace name (RFC 1123 label)
NAMESPACE_RE = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"


def as_stream(files: dict[str, str]) -> str:
    """The rendered manifests (``files`` of :func:`render_kubernetes`) as one
    multi-document YAML, in the kustomization's order, for ``render --to -`` (``kubectl
    apply -f -``, as ``helm template`` prints). The kustomization itself is left out."""
    return "---\n".join(text for fname, text in files.items() if fname != KUSTOMIZATION)


def render_kubernetes(plan: LaunchPlan, config_text: str, *, name: str = "omni-pd", image: str | None = None,
                      router_image: str, platform: str, secret: str = "omni-pd-secrets",
                      stages: dict[str, int] | None = None, gpus_per_node: int | None = None,
                      disaggregated_set: bool = False, stage_devices: Mapping[int, Any] | None = None,
                      addresses: Sequence[str] = (), namespace: str | None = None,
                      monitoring: bool = True) -> dict[str, str]:
    """``{file name: YAML}``: :func:`manifests` as YAML documents, plus a
    kustomization (:data:`KUSTOMIZATION`) listing them. ``namespace``: set on every object
    and the kustomization (None: none, the namespace ``kubectl`` applies to). ``monitoring``:
    as :func:`manifests`'s (False: ``render --no-monitoring``, for a cluster without the
    Prometheus Operator's CRDs, where ``kubectl apply`` refuses a PodMonitor). The
    ConfigMap's deploy config is a literal block. Raises :class:`RenderError` (also when the
    compiled config itself holds a secret value: its ConfigMap would carry it), and
    ValueError when a manifest would hold one (a defect: secrets are Secret references).
    Pure."""
    import io

    from ruamel.yaml import YAML

    from omni_pd.render.scripts import secret_values

    yaml = YAML()
    yaml.default_flow_style = False
    yaml.width = 4096
    out: dict[str, str] = {}
    files = manifests(plan, config_text, name=name, image=image, router_image=router_image, platform=platform,
                      secret=secret, stages=stages or {}, gpus_per_node=gpus_per_node,
                      disaggregated_set=disaggregated_set, stage_devices=stage_devices, addresses=addresses,
                      monitoring=monitoring)
    for fname, objs in files:
        buf = io.StringIO()
        plain = json.loads(json.dumps(objs))  # no shared objects: no YAML anchors
        if namespace is not None:
            plain = [_in_namespace(o, namespace) for o in plain]
        yaml.dump_all([_literal_config(o) for o in plain], buf)
        out[fname] = buf.getvalue()
    buf = io.StringIO()
    kust: dict[str, Any] = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization"}
    if namespace is not None:
        kust["namespace"] = namespace
    kust["resources"] = [f for f, _ in files]
    yaml.dump(kust, buf)
    out[KUSTOMIZATION] = buf.getvalue()
    leaked = secret_values(plan)
    if any(v in config_text for v in leaked):
        raise RenderError("the compiled config holds a secret value (a secret env value of a stage), which its "
                          "ConfigMap would carry",
                          help="take it out of the config and pass it with --env NAME=VALUE: the manifests then "
                               "read it from the Secret")
    for fname, text in out.items():
        if any(v in text for v in leaked):
            raise ValueError(f"{fname} would contain a secret value")
    return out


def validate_manifests(files: dict[str, str], version: str = K8S_VERSION) -> list[str]:
    """Problems of the rendered objects, offline; [] when all validate. Core kinds against
    Kubernetes ``version``'s schemas (the ``kubernetes-validate`` package, strict: unknown
    fields are errors); LeaderWorkerSet and DisaggregatedSet against their bundled CRD
    schemas (:func:`omni_pd.render.crd_schema.validate_custom`), and each pod template in
    them as a core ``PodTemplate`` too; PodMonitor and PrometheusRule with
    :func:`omni_pd.render.monitoring.check` (their required fields, not a bundled schema). The kustomization is not a cluster object and is
    skipped. Raises ImportError when kubernetes-validate is not installed."""
    import kubernetes_validate
    from ruamel.yaml import YAML

    from omni_pd.render.crd_schema import FILES, validate_custom
    from omni_pd.render.monitoring import KINDS as MONITORING_KINDS, check as check_monitoring

    yaml = YAML(typ="safe")
    problems: list[str] = []

    def core(obj: dict[str, Any], where: str, under: str = "") -> None:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = "/".join(str(p) for p in e.path)
            problems.append(f"{where}: {path.removeprefix(under)}: {e.message}")

    for fname, text in files.items():
        if fname == KUSTOMIZATION:
            continue
        for obj in yaml.load_all(text):
            where = f"{fname}: {obj.get('kind')} {obj['metadata']['name']}"
            if obj.get("kind") in MONITORING_KINDS:
                problems += [f"{where}: {p}" for p in check_monitoring(obj)]
                continue
            if obj.get("kind") not in FILES:
                core(obj, where)
                continue
            problems += [f"{where}: {p}" for p in validate_custom(obj)]
            for path, tmpl in pod_templates(obj):
                core({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": tmpl},
                     f"{where}: {path}", under="template/")
    return problems


def pod_templates(obj: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(path, pod template) of every pod template in a LeaderWorkerSet or DisaggregatedSet."""
    specs = ([("spec", obj.get("spec", {}))] if obj.get("kind") == "LeaderWorkerSet" else
             [(f"spec/roles/{i}/spec", r.get("spec", {})) for i, r in enumerate(obj.get("spec", {}).get("roles", []))])
    out = []
    for path, spec in specs:
        lwt = spec.get("leaderWorkerTemplate", {})
        for key in ("leaderTemplate", "workerTemplate"):
            if key in lwt:
                out.append((f"{path}/leaderWorkerTemplate/{key}", lwt[key]))
    return out
