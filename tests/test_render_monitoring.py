"""``render --target kubernetes``'s monitoring.yaml (issue 37): a PodMonitor, a PrometheusRule
and a Grafana dashboard ConfigMap beside the manifests, from ``omni-pd status --emit``'s code.

The goldens are tests/golden/render_k8s_*/monitoring.yaml (tests/test_render_kubernetes.py
compares them). Here: the PodMonitor picks exactly the pods that serve ``/metrics`` among
the rendered workloads (plain vLLM: prefill and decode, a LeaderWorkerSet's leaders; a
vllm-omni pipeline: the head pod); the target labels its relabelings give those pods are
the ones the PrometheusRule's expressions select, proven by ``promtool test rules`` firing
the fallback alert on the decode pod's series; the rule and dashboard are
:func:`omni_pd.status.rules.rule_set` / ``grafana_dashboard`` over
:func:`~omni_pd.status.rules.kubernetes_selectors`; ``--no-monitoring`` leaves the file out.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("kubernetes_validate")

from ruamel.yaml import YAML  # noqa: E402

from omni_pd.cli import main  # noqa: E402
from omni_pd.render.kubernetes import pod_templates, validate_manifests  # noqa: E402
from omni_pd.status.rules import grafana_dashboard, kubernetes_selectors, rule_set  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
PROMTOOL = shutil.which("promtool")


def _objs(golden: str) -> list[dict]:
    y = YAML(typ="safe")
    return [o for f in sorted((GOLDEN / golden).iterdir()) if f.name != "Kustomization"
            for o in y.load_all(f.read_text())]


def _pods(objs: list[dict]) -> list[tuple[str, dict]]:
    """(where, pod template) of every workload."""
    out = []
    for o in objs:
        where = f"{o['kind']}/{o['metadata']['name']}"
        if o["kind"] == "Deployment":
            out.append((where, o["spec"]["template"]))
        elif o["kind"] in ("LeaderWorkerSet", "DisaggregatedSet"):
            out += [(f"{where}/{p.split('/')[-1]}" + (f"@{p.split('/')[2]}" if "roles" in p else ""), t)
                    for p, t in pod_templates(o)]
    return out


def _selects(sel: dict, labels: dict) -> bool:
    ok = all(labels.get(k) == v for k, v in sel.get("matchLabels", {}).items())
    for e in sel.get("matchExpressions", []):
        assert e["operator"] == "In"
        ok = ok and labels.get(e["key"]) in e["values"]
    return ok


def _scraped(golden: str) -> dict[str, dict[str, str]]:
    """Pods the PodMonitor scrapes (selected, with a container port of its endpoint's name)
    -> the target labels its relabelings give them (Prometheus' ``__meta_kubernetes_pod_label_*``:
    the pod label with every character outside ``[a-zA-Z0-9_]`` as ``_``)."""
    objs = _objs(golden)
    (pm,) = [o for o in objs if o["kind"] == "PodMonitor"]
    (ep,) = pm["spec"]["podMetricsEndpoints"]
    out = {}
    for where, tmpl in _pods(objs):
        labels = tmpl["metadata"]["labels"]
        ports = {p["name"] for c in tmpl["spec"]["containers"] for p in c.get("ports", [])}
        if not _selects(pm["spec"]["selector"], labels) or ep["port"] not in ports:
            continue
        meta = {"__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", k): v for k, v in labels.items()}
        target = {}
        for r in ep["relabelings"]:
            assert r["action"] == "replace"
            target[r["targetLabel"]] = ";".join(meta.get(s, "") for s in r["sourceLabels"])
        out[where] = target
    return out


def test_the_pod_monitor_scrapes_the_engines_that_serve_metrics_and_labels_their_role():
    assert _scraped("render_k8s_1p1d_tp2") == {
        "Deployment/omni-pd-prefill": {"omni_pd_deployment": "omni-pd", "omni_pd_role": "prefill"},
        "Deployment/omni-pd-decode": {"omni_pd_deployment": "omni-pd", "omni_pd_role": "decode"}}
    # prefill TP 4 / decode DP 4 on nodes of 2 GPUs: the leaders only (the headless workers serve no HTTP)
    assert _scraped("render_k8s_tp_across_nodes") == {
        "LeaderWorkerSet/omni-pd-prefill/leaderTemplate": {"omni_pd_deployment": "omni-pd", "omni_pd_role": "prefill"},
        "LeaderWorkerSet/omni-pd-decode/leaderTemplate": {"omni_pd_deployment": "omni-pd", "omni_pd_role": "decode"}}
    assert _scraped("render_k8s_disaggregatedset") == {
        "DisaggregatedSet/omni-pd/leaderTemplate@0": {"omni_pd_deployment": "omni-pd", "omni_pd_role": "prefill"},
        "DisaggregatedSet/omni-pd/leaderTemplate@1": {"omni_pd_deployment": "omni-pd", "omni_pd_role": "decode"}}
    # a vllm-omni pipeline: its head pod's page holds every stage (the other host's pod is not scraped)
    assert _scraped("render_k8s_omni_two_hosts") == {"Deployment/omni-pd-head": {"omni_pd_deployment": "omni-pd"}}


@pytest.mark.parametrize("golden, runtime, stages", [("render_k8s_1p1d_tp2", "vllm", {"prefill": 0, "decode": 1}),
                                                     ("render_k8s_omni_one_pod", "vllm-omni",
                                                      {"prefill": 0, "decode": 1})])
def test_rule_and_dashboard_are_the_status_emit_code_over_the_pod_monitor_labels(golden, runtime, stages):
    objs = _objs(golden)
    (rule,) = [o for o in objs if o["kind"] == "PrometheusRule"]
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap" and "grafana_dashboard" in o["metadata"]["labels"]]
    sel = kubernetes_selectors("omni-pd", runtime, stages)
    assert rule["spec"] == rule_set(sel=sel)
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dash = json.loads(cm["data"]["omni-pd-pd-health.json"])
    assert dash == grafana_dashboard(sel=sel, name="omni-pd")
    assert (dash["uid"], dash["title"]) == ("omni-pd-omni-pd", "omni-pd: PD health (omni-pd)")
    assert [p["targets"][0]["expr"] for p in dash["panels"]] == [r["expr"] for r in rule["spec"]["groups"][0]["rules"]]
    if runtime == "vllm":
        assert sel.decode == 'omni_pd_deployment="omni-pd",omni_pd_role="decode"'
    else:
        assert (sel.decode, sel.prefill, sel.targets) == ('omni_pd_deployment="omni-pd",stage="1"',
                                                         'omni_pd_deployment="omni-pd",stage="0"',
                                                         'omni_pd_deployment="omni-pd"')


def test_a_vllm_omni_rule_set_needs_the_pd_stages():
    with pytest.raises(ValueError, match="prefill and decode stage ids, got {'prefill': 0}"):
        kubernetes_selectors("x", "vllm-omni", {"prefill": 0})


def _promtool_fires_fallback_on(tmp_path: Path, golden: str, series_labels: dict[str, str], decode_stage: str | None):
    """``promtool test rules`` with the golden's PrometheusRule: decode's series (with the
    labels a scrape of the pod gets: the PodMonitor's, plus ``instance``, ``job``,
    ``namespace``, ``pod``) take 126 of 127 prompt tokens from prefill, then none."""
    (rule,) = [o for o in _objs(golden) if o["kind"] == "PrometheusRule"]
    (tmp_path / "rules.yaml").write_text(json.dumps(rule["spec"]))
    lab = {**series_labels, "instance": "10.1.2.3:8200", "job": "default/omni-pd-engines", "namespace": "default",
           "pod": "omni-pd-decode-0"}
    if decode_stage is not None:
        lab["stage"], lab["replica"] = decode_stage, "0"
    base = ",".join(f'{k}="{v}"' for k, v in sorted(lab.items()))
    exp = {"instance": "10.1.2.3:8200", **({"stage": decode_stage} if decode_stage else {})}
    exp_text = ",".join(f'{k}="{v}"' for k, v in sorted(exp.items()))
    test = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [
            {"series": f'vllm:prompt_tokens_by_source_total{{{base},source="external_kv_transfer"}}',
             "values": "0+126x20 2520+0x20"},
            {"series": f'vllm:prompt_tokens_by_source_total{{{base},source="local_compute"}}',
             "values": "0+1x20 20+127x20"}],
        "promql_expr_test": [{"expr": "omni_pd:decode_external_kv_share:ratio5m", "eval_time": "15m",
                              "exp_samples": [{"labels": f"omni_pd:decode_external_kv_share:ratio5m{{{exp_text}}}",
                                               "value": 126 / 127}]}],
        "alert_rule_test": [
            {"alertname": "OmniPdLocalPrefillFallback", "eval_time": "15m", "exp_alerts": []},
            {"alertname": "OmniPdLocalPrefillFallback", "eval_time": "35m", "exp_alerts": [{
                "exp_labels": {**exp, "severity": "critical", "verdict": "falling back to local prefill"},
                "exp_annotations": {
                    "summary": "decode 10.1.2.3:8200 computes its prompts itself",
                    "description": "only 0% of decode's prompt tokens came from prefill over 5m (below 80%): "
                                   'vllm:prompt_tokens_by_source_total{source="external_kv_transfer"} against '
                                   "local_compute"}}]}]}]}
    (tmp_path / "test.yaml").write_text(json.dumps(test))
    return subprocess.run([PROMTOOL, "test", "rules", "test.yaml"], capture_output=True, text=True, cwd=tmp_path)


@pytest.mark.skipif(not PROMTOOL, reason="promtool not installed (Debian: apt-get install prometheus)")
def test_the_rules_select_the_series_of_the_scraped_decode_pod(tmp_path):
    labels = _scraped("render_k8s_1p1d_tp2")["Deployment/omni-pd-decode"]
    proc = _promtool_fires_fallback_on(tmp_path, "render_k8s_1p1d_tp2", labels, None)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the same series under another deployment's name (render --name other) are not this deployment's
    proc = _promtool_fires_fallback_on(tmp_path, "render_k8s_1p1d_tp2", {**labels, "omni_pd_deployment": "other"},
                                       None)
    assert proc.returncode == 1 and "OmniPdLocalPrefillFallback" in proc.stdout + proc.stderr
    # vllm-omni: decode is stage 1 of the head pod's page
    head = _scraped("render_k8s_omni_one_pod")["Deployment/omni-pd-head"]
    proc = _promtool_fires_fallback_on(tmp_path, "render_k8s_omni_one_pod", head, "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = _promtool_fires_fallback_on(tmp_path, "render_k8s_omni_one_pod", head, "0")  # prefill's stage
    assert proc.returncode == 1


@pytest.mark.skipif(not PROMTOOL, reason="promtool not installed (Debian: apt-get install prometheus)")
def test_the_prometheus_rule_spec_passes_promtool_check(tmp_path):
    for golden in ("render_k8s_1p1d_tp2", "render_k8s_omni_two_hosts"):
        (rule,) = [o for o in _objs(golden) if o["kind"] == "PrometheusRule"]
        (tmp_path / "r.yaml").write_text(json.dumps(rule["spec"]))
        proc = subprocess.run([PROMTOOL, "check", "rules", str(tmp_path / "r.yaml")], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "SUCCESS: 11 rules found" in proc.stdout


def test_no_monitoring_leaves_the_file_out(tmp_path, capsys):
    pd = tmp_path / "pd.yaml"
    assert main(["expand", "-q", str(ROOT / "tests" / "fixtures" / "llm.yaml"), "--pipeline", "llm", "--connector",
                 "NixlConnector", "-o", str(pd)]) == 0
    for flag, files in (("--no-monitoring", ["Kustomization", "configmap.yaml", "decode.yaml", "prefill.yaml",
                                             "router.yaml"]),
                        ("--monitoring", ["Kustomization", "configmap.yaml", "decode.yaml", "monitoring.yaml",
                                          "prefill.yaml", "router.yaml"])):
        to = tmp_path / flag.strip("-")
        assert main(["render", str(pd), "--to", str(to), "--target", "kubernetes", "--model", "m", flag]) == 0
        assert sorted(p.name for p in to.iterdir()) == files
        kust = YAML(typ="safe").load((to / "Kustomization").read_text())
        assert kust["resources"] == [f for f in ("configmap.yaml", "prefill.yaml", "decode.yaml", "router.yaml",
                                                 "monitoring.yaml") if f in files]
    capsys.readouterr()


def test_validation_checks_the_operator_kinds():
    text = (GOLDEN / "render_k8s_1p1d_tp2" / "monitoring.yaml").read_text()
    assert validate_manifests({"monitoring.yaml": text}) == []
    bad = text.replace("    - alert: OmniPdInstanceDown\n", "    - alert: OmniPdInstanceDown\n      record: x\n", 1)
    bad = bad.replace("      for: 1m\n", "      for: one minute\n", 1).replace("  - port: http\n", "  - port: 8100\n")
    assert validate_manifests({"monitoring.yaml": bad}) == [
        "monitoring.yaml: PodMonitor omni-pd-engines: spec/podMetricsEndpoints/0/port: not a port name",
        "monitoring.yaml: PrometheusRule omni-pd-pd-health: spec/groups/0/rules/8: exactly one of record and alert",
        "monitoring.yaml: PrometheusRule omni-pd-pd-health: spec/groups/0/rules/8/for: 'one minute' is not a "
        "duration"]
