"""``omni-pd status`` end to end over HTTP against stand-in engines (issue 37).

Each stand-in (stdlib ``http.server``) answers ``/health`` and serves a recorded vLLM 0.30
page (tests/fixtures/status/, see tests/test_status_verdict.py) at ``/metrics``: the
"before" page on its first scrape, the "after" page from then on, so the real scrape path
(two GETs per instance, the window, the parser) runs. The router stand-in answers
``/health`` with omni-pd's router's JSON. Also: the three ways to say where a deployment
is (run directory, --config, --url), the exit statuses, and no traceback on bad input.
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from omni_pd.cli import main

ROOT = Path(__file__).resolve().parents[1]
PAGES = ROOT / "tests" / "fixtures" / "status"
LEASE_LOG = ROOT / "tests" / "fixtures" / "smoke_logs" / "prefill-0.nixl-lease-expired.log"


def _page(name: str) -> bytes:
    with gzip.open(PAGES / f"{name}.prom.gz", "rb") as f:
        return f.read()


class Engine:
    """A stand-in engine: ``/health`` 200 (or ``health``), ``/metrics`` the pages in turn
    (the last one repeated); ``json_health``: a router's ``/health`` body."""

    def __init__(self, pages: list[bytes], health: int = 200, json_health: dict | None = None):
        self.pages, self.health, self.json_health, self.gets = list(pages), health, json_health, []
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self):
                outer.gets.append(self.path)
                if self.path == "/health":
                    body = json.dumps(outer.json_health).encode() if outer.json_health is not None else b""
                    self.send_response(outer.health)
                elif self.path == "/metrics" and outer.pages:
                    body = outer.pages[0] if len(outer.pages) == 1 else outer.pages.pop(0)
                    self.send_response(200)
                else:
                    body = b"not found"
                    self.send_response(404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):  # a generation request: status must never send one
                outer.gets.append("POST " + self.path)
                self.send_response(500)
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def engines():
    made: list[Engine] = []

    def make(*a, **kw) -> Engine:
        e = Engine(*a, **kw)
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_status(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["status", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_healthy_pair_over_http_is_pd_working_and_sends_no_request(engines, capsys):
    p = engines([_page("pd_prefill_before"), _page("pd_prefill_after")])
    d = engines([_page("pd_decode_before"), _page("pd_decode_after")])
    rc, out, err = run_status(capsys, "--url", f"prefill={p.url}", "--url", f"decode={d.url}", "--window", "0.2",
                              "--format", "json")
    rep = json.loads(out)
    assert rc == 0 and rep["exit"] == 0
    (pair,) = rep["pairs"]
    assert (pair["verdict"], pair["basis"], pair["pair"]) == ("PD working", "window", "prefill-0 -> decode-0")
    assert pair["share"] == pytest.approx(378 / 381)
    dec = rep["instances"][1]
    assert dec["prompt_tokens"] == {"external_kv_transfer": 378.0, "local_compute": 3.0, "local_cache_hit": 0.0}
    assert dec["connector"]["transfers"] == 3.0 and dec["requests"] == 3.0
    assert p.gets == d.gets == ["/health", "/metrics", "/health", "/metrics"]


def test_the_table_shows_the_numbers_of_the_json(engines, capsys):
    p = engines([_page("fallback_prefill_before"), _page("fallback_prefill_after")])
    d = engines([_page("fallback_decode_before"), _page("fallback_decode_after")])
    rc, out, _ = run_status(capsys, "--url", f"prefill={p.url}", "--url", f"decode={d.url}", "--window", "0.1")
    assert rc == 1
    verdict = next(line for line in out.splitlines() if line.startswith("│ prefill-0 -> decode-0"))
    assert "falling back to local prefill" in verdict and "decode computed 381 of 381 prompt tokens" in verdict
    row = next(line for line in out.splitlines() if line.startswith("│ decode-0"))
    cells = [c.strip() for c in row.strip("│").split("│")]
    assert cells[:10] == ["decode-0", "decode", "up", "3", "0/381", "25.0%", "1/2", "0", "600 ms / 725 ms",
                          "40 ms / 48 ms"]


def test_run_directory_reads_the_plan_and_the_logs(engines, capsys, tmp_path):
    p = engines([_page("pd_prefill_after")])
    d = engines([_page("pd_decode_after")])
    r = engines([b""], json_health={"status": "ok", "instances": [
        {"role": "prefill", "index": 0, "url": p.url, "healthy": True, "served": 3, "failures": 0, "error": None},
        {"role": "decode", "index": 0, "url": d.url, "healthy": True, "served": 3, "failures": 0, "error": None}]})
    plan = {"runtime": "vllm", "model": "tiny", "connector": "NixlConnector", "entrypoint": r.url, "config": "pd.yaml",
            "processes": [
                {"name": "prefill-0", "role": "prefill", "argv": ["vllm", "serve", "--served-model-name", "tiny"],
                 "health": {"url": p.url + "/health"}},
                {"name": "decode-0", "role": "decode", "argv": [], "health": {"url": d.url + "/health"}},
                {"name": "router", "role": "router", "argv": [], "health": {"url": r.url + "/health"}}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "prefill-0.log").write_text("")
    rc, out, _ = run_status(capsys, str(tmp_path), "--window", "0", "--format", "json")
    rep = json.loads(out)
    assert (rc, rep["pairs"][0]["verdict"], rep["pairs"][0]["basis"]) == (0, "PD working", "since start")
    assert rep["source"] == f"run directory {tmp_path}"
    assert [b["healthy"] for b in rep["instances"][2]["backends"]] == [True, True]
    # the prefill log gets vLLM's expired-lease lines: transfers failing, exit 1
    shutil.copy(LEASE_LOG, tmp_path / "prefill-0.log")
    rc, out, _ = run_status(capsys, str(tmp_path), "--window", "0", "--format", "json")
    rep = json.loads(out)
    assert (rc, rep["pairs"][0]["verdict"]) == (1, "transfers failing")
    assert rep["pairs"][0]["evidence"][0] == "prefill-0: 2 expired/invalid KV lease lines in its log"


def test_prefill_stopped_is_instance_down_exit_1(engines, capsys):
    d = engines([_page("pd_decode_after")])
    dead = f"http://127.0.0.1:{_free_port()}"
    rc, out, _ = run_status(capsys, "--url", f"prefill={dead}", "--url", f"decode={d.url}", "--window", "0",
                            "--format", "json")
    rep = json.loads(out)
    assert (rc, rep["pairs"][0]["verdict"]) == (1, "instance down")
    assert rep["pairs"][0]["evidence"] == [f"prefill-0 ({dead}) down: GET {dead}/health: connection refused"]


def test_nothing_reachable_is_exit_2_with_a_line(capsys):
    dead = f"http://127.0.0.1:{_free_port()}"
    rc, out, err = run_status(capsys, "--url", f"decode={dead}", "--window", "0", "--format", "json")
    assert rc == 2 and json.loads(out)["exit"] == 2
    assert "status: no instance answered (--url); is the deployment running?" in err


@pytest.mark.parametrize("args, message", [
    ([], "status needs one of RUN_DIR, --config or --url"),
    (["--url", "decode=http://x:1", "--config", "pd.yaml"], "status takes one of RUN_DIR, --config, --url; got "
                                                             "--config and --url"),
    (["--url", "decode=ftp://x"], "--url 'decode=ftp://x': expected ROLE=http://HOST:PORT"),
    (["--url", "prefill=http://x:1"], "--url: no decode=URL given"),
    (["--url", "decode=http://x:1", "--min-share", "1.5"], "--min-share 1.5 is outside 0..1"),
])
def test_bad_input_is_a_diagnostic_and_exit_2(capsys, args, message):
    rc, out, err = run_status(capsys, *args)
    assert rc == 2
    assert "error[OPD006]: " + message in out + err
    assert "Traceback" not in out + err


def test_config_gives_the_addresses_launch_and_render_compute(capsys, tmp_path):
    pd = tmp_path / "pd.yaml"
    assert main(["expand", "-q", str(ROOT / "tests" / "fixtures" / "llm.yaml"), "--pipeline", "llm", "--connector",
                 "NixlConnector", "-o", str(pd)]) == 0
    capsys.readouterr()
    port, base = _free_port(), 8100
    rc, out, _ = run_status(capsys, "--config", str(pd), "--port", str(port), "--engine-port-base", "29100",
                            "--window", "0", "--format", "json", "--timeout", "0.5")
    rep = json.loads(out)
    assert rc == 2
    assert [(i["name"], i["role"], i["url"]) for i in rep["instances"]] == [
        ("prefill-0", "prefill", "http://127.0.0.1:29100"), ("decode-0", "decode", "http://127.0.0.1:29200"),
        ("router", "router", f"http://127.0.0.1:{port}")]
    assert base == 8100


def test_vllm_omni_stage_urls(engines, capsys):
    with gzip.open(ROOT / "tests" / "fixtures" / "metrics" / "omni_before.prom.gz", "rb") as f:
        before = f.read()
    with gzip.open(ROOT / "tests" / "fixtures" / "metrics" / "omni_after_pd.prom.gz", "rb") as f:
        after = f.read()
    s = engines([before, after])
    rc, out, _ = run_status(capsys, "--url", f"prefill={s.url}#stage=0", "--url", f"decode={s.url}#stage=1",
                            "--window", "0.1", "--format", "json")
    rep = json.loads(out)
    assert (rc, rep["runtime"], rep["pairs"][0]["verdict"]) == (0, "vllm-omni", "PD working")
    assert rep["pairs"][0]["share"] == pytest.approx(126 / 127)
    assert s.gets == ["/health", "/metrics", "/health", "/metrics"]  # one server, scraped once per round


def test_emit_grafana_panels_query_the_rules(capsys):
    from omni_pd.status.rules import rule_set

    rc, out, _ = run_status(capsys, "--emit", "grafana")
    dash = json.loads(out)
    assert rc == 0
    assert {"title", "uid", "schemaVersion", "panels"} <= set(dash)
    exprs = [p["targets"][0]["expr"] for p in dash["panels"]]
    assert exprs == [r["expr"] for r in rule_set()["groups"][0]["rules"]]
    assert all({"id", "type", "title", "gridPos", "targets", "datasource"} <= set(p) for p in dash["panels"])


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(not PROMTOOL, reason="promtool not installed (Debian: apt-get install prometheus)")
@pytest.mark.parametrize("where", [
    [],  # the omni_pd_role label of the scrape config
    ["--url", "prefill=http://10.0.0.1:8100", "--url", "decode=http://10.0.0.2:8200"],
    ["--url", "prefill=http://10.0.0.1:8000#stage=0", "--url", "decode=http://10.0.0.1:8000#stage=1"],
])
def test_emitted_rules_pass_promtool_check(capsys, tmp_path, where):
    rc, out, _ = run_status(capsys, "--emit", "prometheus-rules", *where)
    assert rc == 0
    (tmp_path / "rules.yaml").write_text(out)
    proc = subprocess.run([PROMTOOL, "check", "rules", str(tmp_path / "rules.yaml")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 11 rules found" in proc.stdout
    if "#stage=1" in " ".join(where):
        assert 'vllm:prompt_tokens_by_source_total{instance=~"10.0.0.1:8000",stage=~"1",' in out


@pytest.mark.skipif(not PROMTOOL, reason="promtool not installed (Debian: apt-get install prometheus)")
def test_each_alert_fires_on_a_recorded_series(capsys, tmp_path):
    """``promtool test rules``: the counters of the recorded pages, as Prometheus would scrape
    them every minute (decode: 126 external + 1 local token per request while PD works; then
    127 local per request: the fallback), a NIXL failure on prefill, prefill's target down."""
    rc, out, _ = run_status(capsys, "--emit", "prometheus-rules")
    (tmp_path / "rules.yaml").write_text(out)
    dec = 'instance="d:8200",job="vllm",omni_pd_role="decode"'
    pre = 'instance="p:8100",job="vllm",omni_pd_role="prefill"'
    test = {
        "rule_files": ["rules.yaml"], "evaluation_interval": "1m",
        "tests": [
            {"interval": "1m", "input_series": [
                # 20 min of PD (one request a minute), then 20 min of fallback
                {"series": f'vllm:prompt_tokens_by_source_total{{{dec},source="external_kv_transfer"}}',
                 "values": "0+126x20 2520+0x20"},
                {"series": f'vllm:prompt_tokens_by_source_total{{{dec},source="local_compute"}}',
                 "values": "0+1x20 20+127x20"},
                {"series": f"vllm:nixl_num_failed_transfers_total{{{dec}}}", "values": "0x40"},
                {"series": f"vllm:nixl_num_kv_expired_reqs_total{{{pre}}}", "values": "0x30 1+0x10"},
                {"series": f"up{{{pre}}}", "values": "1x35 0x5"},
                {"series": f"up{{{dec}}}", "values": "1x40"}],
             "promql_expr_test": [
                 {"expr": "omni_pd:decode_external_kv_share:ratio5m", "eval_time": "15m",
                  "exp_samples": [{"labels": 'omni_pd:decode_external_kv_share:ratio5m{instance="d:8200"}',
                                   "value": 126 / 127}]},
                 {"expr": "omni_pd:decode_external_kv_share:ratio5m", "eval_time": "35m",
                  "exp_samples": [{"labels": 'omni_pd:decode_external_kv_share:ratio5m{instance="d:8200"}',
                                   "value": 0}]}],
             "alert_rule_test": [
                 {"alertname": "OmniPdLocalPrefillFallback", "eval_time": "15m", "exp_alerts": []},
                 {"alertname": "OmniPdLocalPrefillFallback", "eval_time": "35m", "exp_alerts": [
                     {"exp_labels": {"instance": "d:8200", "severity": "critical",
                                     "verdict": "falling back to local prefill"},
                      "exp_annotations": {
                          "summary": "decode d:8200 computes its prompts itself",
                          "description": "only 0% of decode's prompt tokens came from prefill over 5m (below 80%): "
                                         'vllm:prompt_tokens_by_source_total{source="external_kv_transfer"} against '
                                         "local_compute"}}]},
                 {"alertname": "OmniPdKVTransfersFailing", "eval_time": "29m", "exp_alerts": []},
                 {"alertname": "OmniPdKVTransfersFailing", "eval_time": "32m", "exp_alerts": [
                     {"exp_labels": {"instance": "p:8100", "severity": "warning", "verdict": "transfers failing"},
                      "exp_annotations": {"summary": "KV transfers fail on p:8100",
                                          "description": "1 KV connector failures (NIXL: failed transfers or notifications, "
                                                         "expired KV leases, notifications after expiry; Mooncake: "
                                                         "failed transfers or receives, expired KV) in 5m"}}]},
                 {"alertname": "OmniPdInstanceDown", "eval_time": "35m", "exp_alerts": []},
                 {"alertname": "OmniPdInstanceDown", "eval_time": "37m", "exp_alerts": [
                     {"exp_labels": {"instance": "p:8100", "job": "vllm", "omni_pd_role": "prefill",
                                     "severity": "critical", "verdict": "instance down"},
                      "exp_annotations": {"summary": "p:8100 does not answer its /metrics scrape",
                                          "description": "a PD instance is down: the pair it belongs to is not doing "
                                                         "PD (omni-pd status: instance down)"}}]},
             ]}]}
    (tmp_path / "test.yaml").write_text(json.dumps(test))
    proc = subprocess.run([PROMTOOL, "test", "rules", "test.yaml"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


class Generating(Engine):
    """A router stand-in that also answers ``POST /v1/completions`` (for ``--probe``)."""

    def __init__(self, pages: list[bytes]):
        super().__init__(pages)
        outer = self
        handler = self.server.RequestHandlerClass

        def do_POST(h):
            n = int(h.headers.get("Content-Length", 0))
            outer.gets.append("POST " + h.path + " " + json.loads(h.rfile.read(n))["model"])
            body = json.dumps({"choices": [{"text": " ok"}]}).encode()
            h.send_response(200)
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)

        handler.do_POST = do_POST


def test_probe_sends_one_request_inside_the_window_and_says_so(engines, capsys):
    d = engines([_page("pd_decode_before"), _page("pd_decode_after")])
    r = Generating([b""])
    try:
        rc, out, err = run_status(capsys, "--url", f"decode={d.url}", "--url", f"router={r.url}", "--window", "0.1",
                                  "--probe", "--model", "tiny", "--format", "json")
    finally:
        r.close()
    assert rc == 0 and json.loads(out)["pairs"][0]["basis"] == "window"
    assert [g for g in r.gets if g.startswith("POST")] == ["POST /v1/completions tiny"]
    assert f"status: --probe: sent one greedy request to {r.url}: answered in " in err
    # without a model name the probe is not sent, and says why
    rc, out, err = run_status(capsys, "--url", f"decode={d.url}", "--window", "0", "--probe")
    assert "status: --probe: not sent (the entrypoint or the model is not known" in err
    assert not any(g.startswith("POST") for g in d.gets)


def test_watch_redraws_until_interrupted_and_exits_with_the_last_verdict(engines, monkeypatch):
    import io

    from omni_pd.status import command

    d = engines([_page("pd_decode_after")])
    target = command.resolve_target(None, None, None, [f"decode={d.url}"])
    calls = []
    real = command.measure

    def measure(t, opts, **kw):
        calls.append(opts.window_s)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(t, command.Options(window_s=0), **kw)

    monkeypatch.setattr(command, "measure", measure)
    out = io.StringIO()
    rc = command.run(target, command.Options(window_s=0, watch=True), out=out)
    assert (rc, calls) == (0, [2.0, 2.0, 2.0])  # --window 0 under --watch: a 2 s window
    assert "PD working" in out.getvalue()
    # --format json under --watch: one object per window and line
    calls.clear()
    out = io.StringIO()
    assert command.run(target, command.Options(window_s=1, watch=True, fmt="json"), out=out) == 0
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and [json.loads(x)["pairs"][0]["verdict"] for x in lines] == ["PD working"] * 2


def test_vllm_omni_run_directory_reads_the_pd_stages_of_its_config(tmp_path):
    from omni_pd.status.sources import from_config, from_run_dir

    pd = tmp_path / "pd.yaml"
    assert main(["expand", "-q", "-o", str(pd)]) == 0  # the bundled Qwen3-Omni preset, four stages under PD
    t = from_config(pd, port=8000)
    assert [(i.name, i.role, i.url, i.stage) for i in t.instances] == [
        ("prefill (stage 0)", "prefill", "http://127.0.0.1:8000", "0"),
        ("decode (stage 1)", "decode", "http://127.0.0.1:8000", "1")]
    plan = {"runtime": "vllm-omni", "model": "m", "entrypoint": "http://127.0.0.1:9000", "config": str(pd),
            "processes": [{"name": "omni", "role": "omni", "argv": [], "health": {"url": "http://127.0.0.1:9000/health"}}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    t = from_run_dir(tmp_path)
    assert [(i.url, i.stage, i.log) for i in t.instances] == [
        ("http://127.0.0.1:9000", "0", str(tmp_path / "omni.log")), ("http://127.0.0.1:9000", "1", None)]
    assert (t.runtime, t.entrypoint, t.model) == ("vllm-omni", "http://127.0.0.1:9000", "m")


def test_config_and_inventory_give_each_hosts_address_as_launch_plans_it(capsys, tmp_path):
    """The two-host NIXL golden of tests/test_placement_launch.py: prefill on A, decode and the
    router on B; status looks where launch --inventory / render put them."""
    (tmp_path / "hosts.yaml").write_text("hosts:\n  A: {address: 10.201.0.1, count: 1}\n"
                                         "  B: {address: 10.201.0.2, count: 1}\nplacement: {0: A, 1: B}\n")
    pd = ROOT / "tests" / "golden" / "placement_llm_nixl_two_hosts.yaml"
    rc, out, _ = run_status(capsys, "--emit", "prometheus-rules", "--config", str(pd), "--inventory",
                            str(tmp_path / "hosts.yaml"), "--platform", "cpu", "--port", "18000",
                            "--engine-port-base", "18100")
    assert rc == 0
    assert ('expr: sum by (instance) (rate(vllm:prompt_tokens_by_source_total{instance=~"10.201.0.2:18200",'
            'source="external_kv_transfer"}[5m]))') in out
    assert 'expr: up{instance=~"10.201.0.1:18100|10.201.0.2:18200"} == 0' in out


def test_vllm_omni_server_with_a_dead_stage_is_instance_down_exit_1_from_its_run_directory(engines, capsys, tmp_path):
    """The CPU rehearsal's server after its prefill stage's engine core was killed: ``/health``
    503, ``/metrics`` still served (tests/fixtures/status/omni_cpu_broken.prom.gz), its log's
    lines in the run directory (tests/fixtures/status/omni_cpu_broken.log). RUN_DIR: prefill
    (stage 0) down from the log, decode (stage 1) up, exit 1; ``--url`` (no log): both down on
    one line, exit 1, and no "no instance answered" (the server answered)."""
    srv = engines([_page("omni_cpu_broken")], health=503)
    pd = tmp_path / "pd.yaml"
    assert main(["expand", "-q", "-o", str(pd)]) == 0
    plan = {"runtime": "vllm-omni", "model": "m", "entrypoint": srv.url, "config": str(pd),
            "processes": [{"name": "omni", "role": "omni", "argv": [], "health": {"url": srv.url + "/health"}}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    shutil.copy(PAGES / "omni_cpu_broken.log", tmp_path / "omni.log")
    capsys.readouterr()
    rc, out, err = run_status(capsys, str(tmp_path), "--window", "0", "--format", "json")
    rep = json.loads(out)
    assert (rc, rep["exit"], rep["pairs"][0]["verdict"]) == (1, 1, "instance down"), rep
    assert [(i["name"], i["up"], i["health"]) for i in rep["instances"]] == [
        ("prefill (stage 0)", False, 503), ("decode (stage 1)", True, 503)]
    assert rep["pairs"][0]["evidence"][0].startswith(f"prefill (stage 0) ({srv.url}) down: stage 0's engine died: "
                                                     "its log says '[Orchestrator] Stage-0 replica-0 is dead")
    assert "no instance answered" not in err
    rc, out, err = run_status(capsys, "--url", f"prefill={srv.url}#stage=0", "--url", f"decode={srv.url}#stage=1",
                              "--window", "0")
    assert rc == 1 and "no instance answered" not in err, out + err
    assert "decode (stage 1) and prefill (stage 0)" in out and "/health answered HTTP 503" in out, out
    assert [g for g in srv.gets if g.startswith("POST")] == []
