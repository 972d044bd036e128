"""``render --target kubernetes``'s monitoring objects, in ``monitoring.yaml`` beside the
manifests (``render --no-monitoring`` leaves it out): the verdicts of ``omni-pd status``
where a cluster already looks, from the code ``status --emit`` uses
(:mod:`omni_pd.status.rules`).

* a **PodMonitor** (``monitoring.coreos.com/v1``, the Prometheus Operator's): scrapes
  ``/metrics`` on the ``http`` port of the engine pods render writes (a plain-vLLM pair:
  the prefill and decode pods, a LeaderWorkerSet's leaders only, since its headless
  workers have no ``http`` port; a vllm-omni pipeline: the head pod, whose page holds every
  stage's series by ``stage`` label) and relabels each target with
  ``omni_pd_deployment`` (the pod's ``app.kubernetes.io/instance``: ``render --name``) and,
  for a plain pair, ``omni_pd_role`` (the pod's ``llm-d.ai/role``). render itself emits no
  scrape annotations and its Services carry every role, so without it nothing tells
  Prometheus which series are decode's. omni-pd's router serves no ``/metrics`` and is not
  scraped;
* a **PrometheusRule** (``monitoring.coreos.com/v1``): ``spec`` is
  :func:`omni_pd.status.rules.rule_set` with
  :func:`~omni_pd.status.rules.kubernetes_selectors` (the labels the PodMonitor attaches);
* a **ConfigMap** labelled ``grafana_dashboard: "1"`` (the label Grafana's dashboard
  sidecar, e.g. kube-prometheus-stack's, loads by default) holding
  :func:`omni_pd.status.rules.grafana_dashboard` over the same rules.

The Prometheus Operator picks PodMonitors and PrometheusRules by its ``podMonitorSelector``
/ ``ruleSelector`` (kube-prometheus-stack's default: the label ``release: <helm release>``);
docs/launch.md shows how to add it. Pure.
"""

from __future__ import annotations

from typing import Any, Mapping

#: the Prometheus Operator's API group and version of PodMonitor and PrometheusRule
MONITORING_API = "monitoring.coreos.com/v1"
#: the label Grafana's dashboard sidecar selects ConfigMaps by (its chart default) and its value
GRAFANA_LABEL = ("grafana_dashboard", "1")
#: kinds :func:`check` validates (no bundled CRD schema for them: see :func:`check`)
KINDS = ("PodMonitor", "PrometheusRule")


def monitoring_objects(name: str, runtime: str, stages: Mapping[str, int], labels: dict[str, str], *,
                       head_selector: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """[PodMonitor, PrometheusRule, Grafana dashboard ConfigMap] of deployment ``name``.
    ``runtime``: ``vllm`` or ``vllm-omni``; ``stages``: role -> compiled stage id (a
    vllm-omni pipeline needs ``prefill`` and ``decode``); ``labels``: the objects' own
    labels; ``head_selector``: extra pod labels that pick a vllm-omni pipeline's head pod.
    Raises ValueError for a vllm-omni runtime without the PD pair's stage ids."""
    import json

    from omni_pd.status.rules import (DEPLOYMENT_LABEL, ROLE_LABEL_NAME, grafana_dashboard, kubernetes_selectors,
                                      rule_set)

    sel = kubernetes_selectors(name, runtime, stages)
    match: dict[str, Any] = {"matchLabels": {"app.kubernetes.io/instance": name}}
    relabel = [{"sourceLabels": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"],
                "targetLabel": DEPLOYMENT_LABEL, "action": "replace"}]
    if runtime == "vllm-omni":
        match["matchLabels"].update(head_selector or {})
    else:
        match["matchExpressions"] = [{"key": "llm-d.ai/role", "operator": "In", "values": ["prefill", "decode"]}]
        relabel.append({"sourceLabels": ["__meta_kubernetes_pod_label_llm_d_ai_role"],
                        "targetLabel": ROLE_LABEL_NAME, "action": "replace"})
    pod_monitor = {"apiVersion": MONITORING_API, "kind": "PodMonitor",
                   "metadata": {"name": f"{name}-engines", "labels": dict(labels)},
                   "spec": {"selector": match,
                            "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": "15s",
                                                     "relabelings": relabel}]}}
    rule = {"apiVersion": MONITORING_API, "kind": "PrometheusRule",
            "metadata": {"name": f"{name}-pd-health", "labels": dict(labels)},
            "spec": rule_set(sel=sel)}
    dash = {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"{name}-grafana-dashboard", "labels": {**labels, GRAFANA_LABEL[0]: GRAFANA_LABEL[1]}},
            "data": {f"{name}-pd-health.json": json.dumps(grafana_dashboard(sel=sel, name=name), indent=2) + "\n"}}
    return [pod_monitor, rule, dash]


def check(obj: dict[str, Any]) -> list[str]:
    """Problems of a PodMonitor or PrometheusRule (offline; [] when none): the fields the
    Prometheus Operator's CRDs require and this module writes (PodMonitor: ``spec.selector``,
    ``spec.podMetricsEndpoints[].port``, ``relabelings[].targetLabel``; PrometheusRule:
    ``spec.groups[].name`` unique, each rule an ``expr`` and exactly one of ``record`` /
    ``alert``, ``for`` a Prometheus duration, labels and annotations strings). Not the
    CRDs' whole schemas: those are not bundled here."""
    import re

    out: list[str] = []
    spec = obj.get("spec")
    if obj.get("apiVersion") != MONITORING_API:
        out.append(f"apiVersion {obj.get('apiVersion')!r}: expected {MONITORING_API}")
    if not isinstance(spec, dict):
        return out + ["spec: missing"]
    if obj.get("kind") == "PodMonitor":
        if not isinstance(spec.get("selector"), dict):
            out.append("spec/selector: missing")
        eps = spec.get("podMetricsEndpoints")
        if not isinstance(eps, list) or not eps:
            out.append("spec/podMetricsEndpoints: missing or empty")
        for i, ep in enumerate(eps or []):
            if not isinstance(ep.get("port"), str):
                out.append(f"spec/podMetricsEndpoints/{i}/port: not a port name")
            for j, r in enumerate(ep.get("relabelings") or []):
                if r.get("action", "replace") == "replace" and not r.get("targetLabel"):
                    out.append(f"spec/podMetricsEndpoints/{i}/relabelings/{j}: replace without targetLabel")
        return out
    duration = re.compile(r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?"
                          r"(([0-9]+)ms)?)$")
    groups = spec.get("groups")
    if not isinstance(groups, list):
        return out + ["spec/groups: not a list"]
    names = [g.get("name") for g in groups]
    if len(set(names)) != len(names) or not all(isinstance(n, str) and n for n in names):
        out.append("spec/groups: names missing or not unique")
    for i, g in enumerate(groups):
        for j, r in enumerate(g.get("rules") or []):
            where = f"spec/groups/{i}/rules/{j}"
            if not isinstance(r.get("expr"), str):
                out.append(f"{where}/expr: missing")
            if ("record" in r) == ("alert" in r):
                out.append(f"{where}: exactly one of record and alert")
            if "for" in r and not duration.match(str(r["for"])):
                out.append(f"{where}/for: {r['for']!r} is not a duration")
            for key in ("labels", "annotations"):
                if not all(isinstance(v, str) for v in (r.get(key) or {}).values()):
                    out.append(f"{where}/{key}: values must be strings")
    return out
