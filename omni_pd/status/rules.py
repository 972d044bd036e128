"""``omni-pd status --emit prometheus-rules|grafana``: the same verdicts where a cluster
already looks. Pure: text out, nothing read.

Recording rules (``omni_pd:...``) compute, per scraped instance, what :mod:`.verdict`
computes from two scrapes (PromQL ``increase``/``rate`` over :data:`WINDOW`); the alerts
fire on the verdicts that exit 1:

* ``OmniPdInstanceDown``: ``up == 0`` for a prefill/decode target (instance down);
* ``OmniPdLocalPrefillFallback``: decode's share of prompt tokens from external KV transfer
  below :data:`~omni_pd.status.verdict.MIN_SHARE` while decode counts prompt tokens;
* ``OmniPdKVTransfersFailing``: a KV connector's failure counters grew (NIXL: failed
  transfers or notifications on any engine, expired KV leases on prefill, notifications
  after expiry; Mooncake, vLLM 0.33 and later: failed transfers or receives, expired KV).

Which series belong to decode or prefill is told by a selector: by default the label
``omni_pd_role`` (``decode``/``prefill``) that the scrape config attaches
(docs/launch.md shows the relabeling); ``--url``/run directory/config targets give the
``instance`` addresses (``host:port``) instead; ``render --target kubernetes`` selects by the
labels its PodMonitor attaches (:func:`kubernetes_selectors`). The Grafana dashboard's panel queries are
the recording rules' and alerts' own expressions (one source: :func:`rule_set`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Mapping
from urllib.parse import urlsplit

from omni_pd.status.verdict import CONNECTOR, FAILURES, MIN_SHARE, Target

#: the range of every rate/increase (PromQL duration)
WINDOW = "5m"
#: the connectors' failure counters, as :mod:`.verdict` reads them (NIXL: vLLM 0.30-0.34
#: nixl/stats.py, expired leases counted on prefill, notifications after expiry from 0.32;
#: Mooncake: 0.33-0.34 mooncake/stats.py)
FAILURE_COUNTERS = tuple(n for key in FAILURES for n in CONNECTOR[key])
#: the connectors' transfer counts (one ``_count`` of their transfer-time histograms)
TRANSFER_COUNTS = CONNECTOR["transfers"]


@dataclass(frozen=True)
class Selectors:
    """PromQL label matchers (without braces) of each role's series: ``decode``,
    ``prefill``, ``engines`` (both), ``targets`` (the scraped engines, for ``up``: omni-pd's
    router serves no ``/metrics``, so Prometheus cannot see it; ``omni-pd status`` reads
    its ``/health``)."""

    decode: str
    prefill: str
    engines: str
    targets: str


ROLE_LABEL = Selectors('omni_pd_role="decode"', 'omni_pd_role="prefill"', 'omni_pd_role=~"prefill|decode"',
                       'omni_pd_role=~"prefill|decode"')

#: the target labels ``render --target kubernetes``'s PodMonitor attaches (relabelled from
#: the pods' ``app.kubernetes.io/instance`` and ``llm-d.ai/role`` labels), which
#: :func:`kubernetes_selectors` selects by
DEPLOYMENT_LABEL = "omni_pd_deployment"
ROLE_LABEL_NAME = "omni_pd_role"


def kubernetes_selectors(name: str, runtime: str, stages: Mapping[str, int] | None = None) -> Selectors:
    """The :class:`Selectors` of the pods ``render --target kubernetes`` renders as
    deployment ``name`` (``render --name``) and scrapes with its PodMonitor: every series
    carries ``omni_pd_deployment="<name>"``; a plain-vLLM pair's also ``omni_pd_role``
    (``prefill``/``decode``); a vllm-omni pipeline's head pod serves every stage on one
    page, so its prefill and decode are the ``stage`` labels of ``stages`` (role -> compiled
    stage id; ``prefill`` and ``decode`` required). Raises ValueError for a vllm-omni
    runtime without both stage ids."""
    dep = f'{DEPLOYMENT_LABEL}="{name}"'
    if runtime != "vllm-omni":
        role = f"{dep},{ROLE_LABEL_NAME}"
        return Selectors(f'{role}="decode"', f'{role}="prefill"', f'{role}=~"prefill|decode"',
                         f'{role}=~"prefill|decode"')
    st = dict(stages or {})
    if "prefill" not in st or "decode" not in st:
        raise ValueError(f"a vllm-omni pipeline's rules need its prefill and decode stage ids, got {st}")
    p, d = st["prefill"], st["decode"]
    return Selectors(f'{dep},stage="{d}"', f'{dep},stage="{p}"', f'{dep},stage=~"{p}|{d}"', dep)


def _instances(target: Target, role: str) -> list[str]:
    return sorted({urlsplit(i.url).netloc for i in target.instances if i.role == role})


def selectors(target: Target | None) -> Selectors:
    """The :class:`Selectors` of ``target`` (``instance`` addresses; a vllm-omni server's
    stages by their ``stage`` label), or :data:`ROLE_LABEL` without one."""
    if target is None:
        return ROLE_LABEL

    def m(roles: tuple[str, ...], stage_of: str | None = None) -> str:
        addrs = sorted({a for r in roles for a in _instances(target, r)})
        out = f'instance=~"{"|".join(addrs)}"' if addrs else 'instance="none"'
        if stage_of is not None:
            stages = sorted({i.stage for i in target.instances if i.role == stage_of and i.stage is not None})
            if stages:
                out += f',stage=~"{"|".join(stages)}"'
        return out

    omni = target.runtime == "vllm-omni"
    return Selectors(m(("decode",), "decode" if omni else None), m(("prefill",), "prefill" if omni else None),
                     m(("prefill", "decode")), m(("prefill", "decode")))


def rule_set(target: Target | None = None, min_share: float = MIN_SHARE, sel: Selectors | None = None) -> dict:
    """The Prometheus rule file (as a dict: ``{"groups": [...]}``) of the recording rules
    and alerts; ``min_share`` 0..1; ``sel`` (when given) instead of ``target``'s
    :func:`selectors` (``render --target kubernetes``: :func:`kubernetes_selectors`)."""
    s = sel or selectors(target)
    by = "instance"  # per decode / prefill instance (a vllm-omni page: per stage too)
    by_d = by + (",stage" if "stage=" in s.decode else "")
    ext = f'sum by ({by_d}) (rate(vllm:prompt_tokens_by_source_total{{{s.decode},source="external_kv_transfer"}}[{WINDOW}]))'
    loc = f'sum by ({by_d}) (rate(vllm:prompt_tokens_by_source_total{{{s.decode},source="local_compute"}}[{WINDOW}]))'
    # one selector over the three counters: ``a + b`` would drop an instance missing one of them
    failures = (f'sum by ({by}) (increase({{__name__=~"{"|".join(FAILURE_COUNTERS)}",{s.engines}}}[{WINDOW}]))')
    rec = [
        {"record": f"omni_pd:decode_prompt_tokens_external:rate{WINDOW}", "expr": ext},
        {"record": f"omni_pd:decode_prompt_tokens_local:rate{WINDOW}", "expr": loc},
        {"record": f"omni_pd:decode_external_kv_share:ratio{WINDOW}",
         "expr": f"omni_pd:decode_prompt_tokens_external:rate{WINDOW} / (omni_pd:decode_prompt_tokens_external:"
                 f"rate{WINDOW} + omni_pd:decode_prompt_tokens_local:rate{WINDOW})"},
        {"record": f"omni_pd:kv_transfer_failures:increase{WINDOW}", "expr": failures},
        {"record": f"omni_pd:kv_transfers:rate{WINDOW}",
         "expr": f'sum by ({by}) (rate({{__name__=~"{"|".join(TRANSFER_COUNTS)}",{s.engines}}}[{WINDOW}]))'},
        {"record": f"omni_pd:ttft_seconds:p90_{WINDOW}",
         "expr": f"histogram_quantile(0.9, sum by ({by}, le) (rate(vllm:time_to_first_token_seconds_bucket"
                 f"{{{s.engines}}}[{WINDOW}])))"},
        {"record": f"omni_pd:inter_token_latency_seconds:p90_{WINDOW}",
         "expr": f"histogram_quantile(0.9, sum by ({by}, le) (rate(vllm:inter_token_latency_seconds_bucket"
                 f"{{{s.engines}}}[{WINDOW}])))"},
        {"record": "omni_pd:kv_cache_usage:ratio", "expr": f"max by ({by}) (vllm:kv_cache_usage_perc{{{s.engines}}})"},
    ]
    alerts = [
        {"alert": "OmniPdInstanceDown", "expr": f"up{{{s.targets}}} == 0", "for": "1m",
         "labels": {"severity": "critical", "verdict": "instance down"},
         "annotations": {"summary": "{{ $labels.instance }} does not answer its /metrics scrape",
                         "description": "a PD instance is down: the pair it belongs to is not doing PD "
                                        "(omni-pd status: instance down)"}},
        {"alert": "OmniPdLocalPrefillFallback",
         "expr": f"omni_pd:decode_external_kv_share:ratio{WINDOW} < {min_share:g}",
         "for": "5m", "labels": {"severity": "critical", "verdict": "falling back to local prefill"},
         "annotations": {"summary": "decode {{ $labels.instance }} computes its prompts itself",
                         "description": "only {{ $value | humanizePercentage }} of decode's prompt tokens came from "
                                        f"prefill over {WINDOW} (below {min_share:.0%}): vllm:prompt_tokens_by_source"
                                        "_total{source=\"external_kv_transfer\"} against local_compute"}},
        {"alert": "OmniPdKVTransfersFailing", "expr": f"omni_pd:kv_transfer_failures:increase{WINDOW} > 0",
         "labels": {"severity": "warning", "verdict": "transfers failing"},
         "annotations": {"summary": "KV transfers fail on {{ $labels.instance }}",
                         "description": "{{ $value }} KV connector failures (NIXL: failed transfers or "
                                        "notifications, expired KV leases, notifications after expiry; Mooncake: "
                                        f"failed transfers or receives, expired KV) in {WINDOW}"}},
    ]
    return {"groups": [{"name": "omni-pd-pd-health", "rules": rec + alerts}]}


def prometheus_rules(target: Target | None = None, min_share: float = MIN_SHARE) -> str:
    """The rule file as YAML text (``promtool check rules`` reads it)."""
    import io

    from ruamel.yaml import YAML

    y = YAML()
    y.width = 4096
    buf = io.StringIO()
    buf.write("# omni-pd status --emit prometheus-rules: PD health verdicts (docs/launch.md, `omni-pd status`)\n")
    y.dump(rule_set(target, min_share), buf)
    return buf.getvalue()


def grafana_dashboard(target: Target | None = None, min_share: float = MIN_SHARE, sel: Selectors | None = None,
                      name: str | None = None) -> dict:
    """A Grafana dashboard (its JSON model: ``title``, ``uid``, ``schemaVersion``,
    ``panels`` with ``gridPos`` and Prometheus ``targets``) whose panels query the
    recording rules and alerts of :func:`rule_set` (each panel's ``expr`` is a rule's
    ``expr``); ``sel`` as :func:`rule_set`'s; ``name``: a deployment's name in the title
    and ``uid`` (Grafana's uid: at most 40 characters), so two deployments' dashboards
    do not replace each other."""
    rules = rule_set(target, min_share, sel)["groups"][0]["rules"]
    panels = []
    for n, r in enumerate(rules):
        title = r.get("record") or r["alert"]
        kind = "stat" if "alert" in r or "share" in title else "timeseries"
        unit = {"share": "percentunit", "seconds": "s", "kv_cache": "percentunit"}
        panels.append({
            "id": n + 1, "type": kind, "title": title,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"h": 8, "w": 12, "x": 12 * (n % 2), "y": 8 * (n // 2)},
            "fieldConfig": {"defaults": {"unit": next((u for k, u in unit.items() if k in title), "short")},
                            "overrides": []},
            "options": {},
            "targets": [{"refId": "A", "expr": r["expr"], "legendFormat": "{{instance}}",
                         "datasource": {"type": "prometheus", "uid": "${datasource}"}}],
        })
    return {
        "title": "omni-pd: PD health" + (f" ({name})" if name else ""),
        "uid": f"omni-pd-{name}"[:40] if name else "omni-pd-pd-health", "schemaVersion": 39, "version": 1,
        "editable": True, "tags": ["omni-pd", "vllm", "pd"], "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus",
                                 "label": "Prometheus"}]},
        "panels": panels,
    }


def grafana_json(target: Target | None = None, min_share: float = MIN_SHARE) -> str:
    """:func:`grafana_dashboard` as indented JSON text."""
    return json.dumps(grafana_dashboard(target, min_share), indent=2) + "\n"
