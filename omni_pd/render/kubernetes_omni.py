"""Kubernetes manifests for a vllm-omni pipeline (``render --target kubernetes``, vllm-omni runtime).

One pod per host of the launch plan (:func:`omni_pd.launch.plan.build_plan`): without an
inventory the whole pipeline is one process (``vllm serve MODEL --omni``) in one pod; with
an inventory whose stages sit on several hosts it is vllm-omni's head (API server,
orchestrator and the first stage, :mod:`omni_pd.launch.omni_hosts`) on the head's host and
one headless process per other stage, and each host becomes one pod running that host's
processes. A host, not a stage, is the unit because stages on one host may share devices
(Talker and Code2Wav on one GPU) and a ``SharedMemoryConnector`` edge (same host only:
vllm-omni ``connectors/shm_connector.py``), and the device plugin gives a device to one
container only: so one container per pod, which starts the host's processes (``bash``
with ``wait -n`` when there are several) and exits when one does, and the kubelet restarts
it. Each pod is a Deployment of one replica with ``strategy: Recreate`` (two heads must
never be up at once: the stages register with whichever answers).

Addresses, each the pod's own (downward API ``status.podIP``):

* the head: ``--host`` and ``--omni-master-address`` = ``$(POD_IP)`` (it binds the
  registration socket and every stage control socket there: vllm-omni
  ``engine/stage_engine_startup.py``); a headless stage on the head's pod dials
  ``$(POD_IP)`` too, one on another pod the head's headless Service
  ``<name>-head`` (``publishNotReadyAddresses``: the head is ready only once every stage
  registered), and registers ``--omni-replica-address $(POD_IP)``;
* the compiled config: every pod reads it (``--deploy-config``), and expand wrote the
  inventory hosts' addresses into it. In the ConfigMap every such address is
  :data:`POD_IP_PLACEHOLDER`, which an init container replaces with the pod's IP in a copy
  under :data:`RUN_DIR` (``kv_ip``, a stage's ``VLLM_NIXL_SIDE_CHANNEL_HOST``: what that
  stage's own engine binds and advertises; the head reads only its own prefill's ``kv_ip``,
  ``entrypoints/pd_utils.py``), except an omni connector's ``host``/``sender_host``, which
  becomes ``auto``: the sender binds its route-probe address (``connectors/nixl_connector.py``)
  and the head tells a receiver the address the sender's replica registered
  (``engine/stage_engine_core_client.py`` ``_resolve_sender_host_from_config``); the head's
  copy of another pod's address would be its own.

Devices: a pod asks for as many as its stages' highest device id + 1 (ids restart at 0 on
every host: omni_pd/compile/placement.py), which the container sees as 0..n-1. Probes on
the head (``/health`` answers once every stage attached; readiness ``/v1/models``); a
headless stage serves no HTTP and has none. Not run on a cluster: the manifests are checked
offline (kubernetes-validate) and the process lines are the plan ``omni-pd launch`` runs.
"""

from __future__ import annotations

import re
import shlex
from typing import Any, Mapping, Sequence

from omni_pd.launch.spec import LaunchPlan, ProcessSpec

#: what the ConfigMap's config holds where a pod's own address goes (filled at pod start)
POD_IP_PLACEHOLDER = "__OMNI_PD_POD_IP__"
#: where the init container writes the pod's copy of the config
RUN_DIR = "/run/omni-pd"
#: where the ConfigMap is mounted
CONFIG_DIR = "/etc/omni-pd"
#: keys whose value is an omni connector's sender address (stage_edges.py: ``extra.host``)
_CONNECTOR_HOST_KEYS = ("host", "sender_host")


def pod_config(config_text: str, addresses: Sequence[str]) -> str:
    """The compiled config as the ConfigMap holds it for pods: each omni connector
    ``host``/``sender_host`` equal to one of ``addresses`` (the inventory hosts') is
    ``auto``, every other value equal to one is :data:`POD_IP_PLACEHOLDER` (module
    docstring); comments and order kept. ``config_text`` unchanged when ``addresses`` is
    empty or none occurs. Pure."""
    from omni_pd.io import dump, parse_text

    if not addresses or not any(a in config_text for a in addresses):
        return config_text
    tree = parse_text(config_text, "deploy.yaml", own_output=True).tree
    own = set(addresses)

    def walk(node: Any) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for k, v in list(items):
            if isinstance(v, str) and v in own:
                node[k] = "auto" if k in _CONNECTOR_HOST_KEYS else POD_IP_PLACEHOLDER
            else:
                walk(v)

    walk(tree)
    head = ("# Kubernetes form of the compiled config (omni-pd render --target kubernetes): each host address is "
            f"{POD_IP_PLACEHOLDER},\n# which each pod's init container replaces with the pod's IP; omni connector "
            "hosts are auto (the sender's own address).\n")
    return head + dump(tree)


def _stage_ids(p: ProcessSpec, all_stages: Sequence[int]) -> list[int]:
    """The stages process ``p`` runs: its ``--stage-id``, else every stage (one process)."""
    argv = list(p.argv)
    return [int(argv[argv.index("--stage-id") + 1])] if "--stage-id" in argv else list(all_stages)


def _dns(name: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-") or "host"


def omni_manifests(plan: LaunchPlan, config_text: str, *, name: str, image: str, platform: str, secret: str,
                   stage_devices: Mapping[int, Any], addresses: Sequence[str]) -> list[tuple[str, list[dict]]]:
    """The objects for a vllm-omni ``plan``, grouped by file (module docstring).
    ``stage_devices``: compiled stage id -> its devices (a tuple of ids, else none counted);
    ``addresses``: the inventory hosts' addresses (the placement's). Raises
    :class:`~omni_pd.render.k8s_parts.RenderError`."""
    from omni_pd.launch.omni_hosts import HEAD
    from omni_pd.render.k8s_parts import (DSHM, RESOURCE, RenderError, api_key_var as _api_key_var,
                                          args_of as _args, env_of as _env, labels as _labels, probes as _probes,
                                          service as _service)

    if platform not in RESOURCE:
        raise RenderError(f"--platform {platform}: no Kubernetes device resource known here",
                          help=f"one of {', '.join(RESOURCE)}")
    resource = RESOURCE[platform]
    head = plan.process(HEAD)
    hosts: list[str | None] = list(dict.fromkeys([head.host] + [p.host for p in plan.processes]))
    pods = {h: [p for p in plan.processes if p.host == h] for h in hosts}
    names = {h: "head" if h == head.host else _dns(f"host-{h}") for h in hosts}
    if len(set(names.values())) != len(names):
        raise RenderError(f"host names {', '.join(map(str, hosts))} give one Kubernetes name twice",
                          help="rename the inventory's hosts")
    text = pod_config(config_text, addresses)
    rewritten = text != config_text
    cm_name = f"{name}-deploy-config"
    deploy_path = f"{RUN_DIR if rewritten else CONFIG_DIR}/deploy.yaml"
    files: list[tuple[str, list[dict]]] = [("configmap.yaml", [{
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": cm_name, "labels": _labels(name, "config")},
        "data": {"deploy.yaml": text}}])]
    all_stages = sorted(stage_devices)
    head_dns = f"{name}-head"
    workloads: list[dict] = []
    for h in hosts:
        procs, component = pods[h], names[h]
        on_head = h == head.host
        secret_vars: list[str] = []
        lines: list[list[str]] = []
        for p in procs:
            args = _args(p, secret_vars)
            for flag, value in (("--deploy-config", deploy_path), ("--omni-replica-address", "$(POD_IP)"),
                                ("--omni-master-address", "$(POD_IP)" if on_head else head_dns)):
                if flag in args:
                    args[args.index(flag) + 1] = value
            lines.append([p.argv[0].rsplit("/", 1)[-1]] + args)
        stages = sorted({s for p in procs for s in _stage_ids(p, all_stages)})
        count = max((max(d) + 1 for s in stages if isinstance(d := stage_devices.get(s), tuple) and d), default=0)
        env = [e for e in _env(procs[0], secret, secret_vars) if e["name"] != "VLLM_HOST_IP"] + [
            {"name": "VLLM_HOST_IP", "value": "$(POD_IP)"}]
        if len(lines) == 1:
            command, args = lines[0][:1], lines[0][1:]
        else:  # the host's processes in one container: the first to exit stops the others
            script = "\n".join(["trap 'trap - TERM INT; kill 0; wait' TERM INT"]
                               + [" ".join(shlex.quote(w) for w in ln) + " &" for ln in lines]
                               + ["wait -n", 'echo "a process of this pod exited: stopping the others" >&2',
                                  "trap - TERM INT; kill 0; wait; exit 1"])
            command, args = ["bash", "-c", script], []
        ports: list[dict] = []
        for p in procs:
            for u in p.ports:
                pname = ("http" if u.purpose == "http" else "omni-master" if u.purpose.startswith("omni master")
                         else f"kv-{len([q for q in ports if q['name'].startswith('kv-')])}")
                if all(q["containerPort"] != u.port for q in ports):
                    ports.append({"name": pname, "containerPort": u.port})
        mounts = [{"name": "dshm", "mountPath": "/dev/shm"}]
        volumes: list[dict] = [{"name": "deploy-config", "configMap": {"name": cm_name}}, DSHM]
        c: dict[str, Any] = {"name": "vllm-omni", "image": image, "command": command}
        if args:
            c["args"] = args
        c["env"] = env
        if ports:
            c["ports"] = ports
        if on_head:
            c.update(_probes(ports[0]["containerPort"], head.health.timeout_s if head.health else 1200.0,
                             _api_key_var(lines[0], env)))
        pod: dict[str, Any] = {"containers": [c], "volumes": volumes}
        if rewritten:
            mounts.append({"name": "run", "mountPath": RUN_DIR})
            volumes.append({"name": "run", "emptyDir": {}})
            pod["initContainers"] = [{
                "name": "pod-config", "image": image, "command": ["sh", "-c", (
                    f'sed "s/{POD_IP_PLACEHOLDER}/$POD_IP/g" {CONFIG_DIR}/deploy.yaml > {RUN_DIR}/deploy.yaml')],
                "env": env[:1], "volumeMounts": [
                    {"name": "deploy-config", "mountPath": CONFIG_DIR, "readOnly": True},
                    {"name": "run", "mountPath": RUN_DIR}]}]
        else:
            mounts.insert(0, {"name": "deploy-config", "mountPath": CONFIG_DIR, "readOnly": True})
        c["volumeMounts"] = mounts
        if resource is not None and count:
            c["resources"] = {"requests": {resource: count}, "limits": {resource: count}}
        labels = _labels(name, component)
        labels["omni-pd.io/role"] = "head" if on_head else "stages"
        labels["omni-pd.io/stages"] = "-".join(map(str, stages))
        selector = {k: labels[k] for k in ("app.kubernetes.io/instance", "app.kubernetes.io/component")}
        workloads.append({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": f"{name}-{component}", "labels": dict(labels)},
            "spec": {"replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": selector},
                     "template": {"metadata": {"labels": dict(labels)}, "spec": pod}}})
    services = [_service(name, "head", head.ports[0].port, full_name=name)]
    master = [u for u in head.ports if u.purpose.startswith("omni master")]
    if master and len(hosts) > 1:
        svc = _service(name, "head", master[0].port, full_name=head_dns)
        svc["spec"]["clusterIP"] = "None"  # headless: the name resolves to the head pod's own IP
        svc["spec"]["publishNotReadyAddresses"] = True
        svc["spec"]["ports"] = [{"name": "omni-master", "port": master[0].port, "targetPort": "omni-master"}]
        services.append(svc)
    files.append(("omni.yaml", workloads + services))
    return files
