"""``launch --smoke`` proves PD from decode's counters, on both runtimes (issue 10).

The ``/metrics`` pages in tests/fixtures/metrics/ were rendered by vLLM 0.30's
``PrometheusStatLogger`` (plain decode engine, ``engine`` label) and vllm-omni 0.30's
``OmniPrometheusStatLogger`` (``vllm serve --omni``: every stage on one page, ``stage`` +
``replica`` labels) through ``prometheus_client.generate_latest``: see
tests/oracle/metrics_pages.py, and tests/test_oracle_metrics.py, which regenerates them in
the oracle venv and compares. A fake server (stdlib ``http.server``) answers the smoke
request and flips its ``/metrics`` page from the "before" to the "after" page when the
request arrives, so :func:`smoke_check` runs its real HTTP path.
"""

from __future__ import annotations

import gzip
import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from omni_pd.compile.expand import expand_document
from omni_pd.compile.passes.pd_split import ExpandOptions
from omni_pd.io import load_file, parse_text
from omni_pd.launch.plan import LaunchOptions, plan_document
from omni_pd.launch.smoke import SmokeTarget, has_stage_counters, kv_received, samples, smoke_check, smoke_target
from omni_pd.resources import preset_path

ROOT = Path(__file__).resolve().parents[1]
PAGES = ROOT / "tests" / "fixtures" / "metrics"
OMNI_MODEL = "Qwen/Qwen3-Omni-30B-A3B-Instruct"


def page(name: str) -> str:
    with gzip.open(PAGES / f"{name}.prom.gz", "rt", encoding="utf-8") as f:
        return f.read()


def without_vllm_families(text: str) -> str:
    """The page of a vllm-omni server with stats off: the orchestrator builds no
    ``OmniPrometheusStatLogger`` (engine/orchestrator.py ``_init_metrics_state``), so no
    ``vllm:*`` family is registered; the ``vllm_omni:*`` ones stay."""
    return "\n".join(line for line in text.splitlines()
                     if not line.startswith(("vllm:", "# HELP vllm:", "# TYPE vllm:"))) + "\n"


# --- counters on the real pages ------------------------------------------------------------------

def test_plain_decode_page_counts_the_prompt_received_from_prefill():
    assert kv_received(page("vllm_decode_before")) == 0.0
    assert kv_received(page("vllm_decode_after_pd")) == 126.0  # 127-token prompt, last token recomputed


def test_omni_page_counts_only_the_decode_stage():
    after = page("omni_after_pd")
    assert kv_received(page("omni_before"), "1") == 0.0
    assert kv_received(after, "1") == 126.0
    assert kv_received(after, "0") == 0.0  # prefill computed it: its local_compute grew, not counted
    assert kv_received(after, "2") == 0.0
    local = {lb["stage"]: v for n, lb, v in samples(after)
             if n == "vllm:prompt_tokens_by_source_total" and lb["source"] == "local_compute"}
    assert local == {"0": 127.0, "1": 1.0, "2": 40.0, "3": 0.0}


def test_omni_page_after_a_recompute_shows_no_growth_for_decode():
    assert kv_received(page("omni_after_recompute"), "1") == kv_received(page("omni_after_pd"), "1")


def test_stage_counters_present_only_with_stats_on():
    assert has_stage_counters(page("omni_before"), "1")
    assert not has_stage_counters(page("omni_before"), "7")
    assert not has_stage_counters(without_vllm_families(page("omni_before")), "1")
    assert "vllm_omni:" in without_vllm_families(page("omni_before"))


def test_created_gauges_and_comments_are_not_counted():
    text = page("vllm_decode_after_pd")
    created = [v for n, lb, v in samples(text) if n == "vllm:prompt_tokens_by_source_created"]
    assert created and all(v > 1e9 for v in created)  # unix timestamps, would swamp the sum
    assert kv_received(text) == 126.0


# --- where the smoke request goes ----------------------------------------------------------------

def _plan(tmp_path, src: Path, opts: ExpandOptions, pipeline: str | None, model: str):
    res = expand_document(parse_text(src.read_text(), src.name), opts, pipeline=pipeline)
    cfg = tmp_path / "pd.yaml"
    cfg.write_text(res.text)
    planned = plan_document(load_file(cfg), str(cfg), LaunchOptions(model=model, port=8000, engine_port_base=8100))
    assert planned.plan is not None
    return planned


def test_smoke_target_of_the_vllm_omni_runtime_is_the_servers_metrics_and_decodes_stage(tmp_path):
    planned = _plan(tmp_path, preset_path("qwen3_omni_moe"), ExpandOptions(), None, OMNI_MODEL)
    t = smoke_target(planned.plan, OMNI_MODEL, planned.topology.pd_pair[1].stage_id)
    assert t == SmokeTarget("http://127.0.0.1:8000", OMNI_MODEL, "http://127.0.0.1:8000/metrics", "1", chat=True)


def test_smoke_target_of_the_vllm_runtime_is_decodes_own_metrics(tmp_path):
    planned = _plan(tmp_path, ROOT / "tests" / "fixtures" / "llm.yaml", ExpandOptions(connector="NixlConnector"),
                    "llm", "tiny")
    t = smoke_target(planned.plan, "tiny", planned.topology.pd_pair[1].stage_id)
    assert t == SmokeTarget("http://127.0.0.1:8000", "tiny", "http://127.0.0.1:8200/metrics", None, chat=False)


# --- the check over HTTP ---------------------------------------------------------------------------

class FakeServer:
    """``/metrics`` returns ``before`` until a completion request arrived, then ``after``."""

    def __init__(self, before: str, after: str, status: int = 200):
        self.before, self.after, self.status = before, after, status
        self.requests: list[tuple[str, dict]] = []
        srv = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path != "/metrics":
                    return self._send(404, b"", "text/plain")
                text = srv.after if srv.requests else srv.before
                self._send(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                srv.requests.append((self.path, body))
                if srv.status != 200:
                    return self._send(srv.status, b'{"error": "boom"}', "application/json")
                if self.path == "/v1/chat/completions":
                    out = {"choices": [{"message": {"role": "assistant", "content": "x * 3"}}]}
                else:
                    out = {"choices": [{"text": " x * 3"}]}
                self._send(200, json.dumps(out).encode(), "application/json")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def run_check(before: str, after: str, *, omni: bool, status: int = 200, report: Path | None = None):
    with FakeServer(before, after, status) as srv:
        target = (SmokeTarget(srv.url, OMNI_MODEL, srv.url + "/metrics", "1", chat=True) if omni
                  else SmokeTarget(srv.url, "tiny", srv.url + "/metrics"))
        out = io.StringIO()
        rc = smoke_check(target, out, report=report)
    run_check.url = srv.url
    return rc, out.getvalue(), srv.requests


def test_omni_pd_request_passes_and_sends_a_text_only_chat_request():
    rc, out, reqs = run_check(page("omni_before"), page("omni_after_pd"), omni=True)
    assert rc == 0, out
    assert out.startswith("smoke: ok in ") and "'x * 3'" in out and "counters 0 -> 126, decode stage 1 on " in out
    [(path, body)] = reqs
    assert path == "/v1/chat/completions"
    assert body["modalities"] == ["text"] and body["temperature"] == 0 and body["model"] == OMNI_MODEL
    assert body["messages"][0]["role"] == "user" and len(body["messages"][0]["content"]) > 1000


def test_omni_recompute_fails_with_recomputed():
    rc, out, _ = run_check(page("omni_after_pd"), page("omni_after_recompute"), omni=True)
    assert rc == 1
    assert out.startswith("smoke: FAILED: decode answered 'x * 3' but its KV-received counters did not grow (126 -> 126")
    assert "recomputed the prompt" in out


def test_omni_without_stats_fails_instead_of_passing_blind():
    blind = without_vllm_families(page("omni_before"))
    rc, out, _ = run_check(blind, blind, omni=True)
    assert rc == 1
    assert "has no vllm:prompt_tokens_by_source series" in out and "--disable-log-stats" in out


def test_plain_vllm_pd_request_passes():
    rc, out, reqs = run_check(page("vllm_decode_before"), page("vllm_decode_after_pd"), omni=False)
    assert rc == 0, out
    assert "counters 0 -> 126" in out
    [(path, body)] = reqs
    assert path == "/v1/completions" and body["max_tokens"] == 8 and body["temperature"] == 0


@pytest.mark.parametrize("name", ["vllm_decode_after_pd", "vllm_decode_before"])
def test_plain_vllm_counters_that_do_not_grow_fail_with_recomputed(name):
    """Equal before/after counters are a failure (a `>=` in place of `>` would pass them)."""
    rc, out, _ = run_check(page(name), page(name), omni=False)
    assert rc == 1
    assert "did not grow" in out and "recomputed the prompt instead of using prefill's KV" in out


def test_a_failing_request_fails_the_smoke_check():
    rc, out, _ = run_check(page("omni_before"), page("omni_after_pd"), omni=True, status=500)
    assert rc == 1 and out.startswith(f"smoke: request failed: POST {run_check.url}/v1/chat/completions: HTTPError")


def test_no_metrics_url_is_reported_as_not_measurable():
    with FakeServer("", "") as srv:
        out = io.StringIO()
        rc = smoke_check(SmokeTarget(srv.url, "tiny", None), out)
    assert rc == 0 and out.getvalue().endswith("KV transfer not checked: no decode metrics URL\n")


# --- smoke.json: the result stays in the run directory (issue 13) ----------------------------------

@pytest.fixture
def clock(monkeypatch):
    """``time.monotonic`` of the smoke module: 10.0, then 12.5 (the request took 2.5 s)."""
    import itertools

    import omni_pd.launch.smoke as sm

    ticks = itertools.chain([10.0], itertools.repeat(12.5))
    monkeypatch.setattr(sm.time, "monotonic", lambda: next(ticks))


PROMPT_EXCERPT = ("def f0(x): return x * 0 def f1(x): return x * 1 def f2(x): return x * 2 def f3(x): return x * 3 "
                  "def f4(x): return x * 4 def f5(x): return x * 5 def f6(x): return x * 6 def f7(x): return x * 7 "
                  "def f8(x...")
#: smoke.json's not_checked entry of a target without engine logs (no run directory)
NO_RUN_DIR = ("the engines' logs are not known (no run directory), so expired or invalid KV of the request is not "
              "looked for")
COUNTERS = ['vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}', "vllm:nixl_xfer_time_seconds_count"]


def test_smoke_json_of_a_pd_pass_on_plain_vllm(tmp_path, clock):
    rc, out, _ = run_check(page("vllm_decode_before"), page("vllm_decode_after_pd"), omni=False,
                           report=tmp_path / "smoke.json")
    url = run_check.url
    assert rc == 0
    assert json.loads((tmp_path / "smoke.json").read_text()) == {
        "ok": True,
        "runtime": "vllm",
        "request": {"url": url + "/v1/completions", "model": "tiny", "max_tokens": 8, "prompt_chars": 1539,
                    "prompt_excerpt": PROMPT_EXCERPT},
        "answer_excerpt": " x * 3",
        "seconds": 2.5,
        "measured": {"metrics_url": url + "/metrics", "decode_stage": None, "counters": COUNTERS,
                     "counters_seen": True, "before": 0.0, "after": 126.0},
        "kv_log": None,
        "not_checked": {"kv_log": NO_RUN_DIR},
        "error": None,
        "error_kind": None,
        "message": f"smoke: ok in 2.50 s: ' x * 3'; decode received KV from prefill (counters 0 -> 126, {url}/metrics)",
    }
    assert out == json.loads((tmp_path / "smoke.json").read_text())["message"] + "\n"
    assert [p.name for p in tmp_path.iterdir()] == ["smoke.json"]  # atomic: no temp file left


def test_smoke_json_of_a_recompute_on_vllm_omni(tmp_path, clock):
    rc, out, _ = run_check(page("omni_after_pd"), page("omni_after_recompute"), omni=True,
                           report=tmp_path / "smoke.json")
    url = run_check.url
    assert rc == 1
    assert json.loads((tmp_path / "smoke.json").read_text()) == {
        "ok": False,
        "runtime": "vllm-omni",
        "request": {"url": url + "/v1/chat/completions", "model": OMNI_MODEL, "max_tokens": 8, "prompt_chars": 1539,
                    "prompt_excerpt": PROMPT_EXCERPT},
        "answer_excerpt": "x * 3",
        "seconds": 2.5,
        "measured": {"metrics_url": url + "/metrics", "decode_stage": "1", "counters": COUNTERS,
                     "counters_seen": True, "before": 126.0, "after": 126.0},
        "kv_log": None,
        "not_checked": {"kv_log": NO_RUN_DIR},
        "error": "decode's KV-received counters did not grow: it recomputed the prompt",
        "error_kind": "check",
        "message": out.rstrip("\n"),
    }


def test_smoke_json_of_a_failed_request(tmp_path):
    rc, out, _ = run_check(page("omni_before"), page("omni_after_pd"), omni=True, status=500,
                           report=tmp_path / "smoke.json")
    rep = json.loads((tmp_path / "smoke.json").read_text())
    assert rc == 1
    assert (rep["ok"], rep["answer_excerpt"], rep["seconds"]) == (False, None, None)
    failed = f'POST {run_check.url}/v1/chat/completions: HTTPError: HTTP Error 500: Internal Server Error: {{"error": "boom"}}'
    assert (rep["error"], rep["error_kind"]) == (failed, "server")
    assert rep["measured"]["before"] is None and rep["measured"]["counters"] == COUNTERS
    assert rep["message"] == out.rstrip("\n") == "smoke: request failed: " + failed


def test_smoke_json_when_kv_is_not_measurable(tmp_path, clock):
    with FakeServer("", "") as srv:
        rc = smoke_check(SmokeTarget(srv.url, "tiny", None), io.StringIO(), report=tmp_path / "smoke.json",
                         runtime="vllm-ascend")
    rep = json.loads((tmp_path / "smoke.json").read_text())
    assert rc == 0
    assert (rep["ok"], rep["runtime"], rep["measured"], rep["error"], rep["answer_excerpt"], rep["not_checked"]) == (
        True, "vllm-ascend", None, None, " x * 3", {"kv_transfer": "no decode metrics URL", "kv_log": NO_RUN_DIR})


def test_an_unwritable_smoke_json_is_said_and_keeps_the_verdict(tmp_path):
    (tmp_path / "run").write_text("a file, not a directory")
    rc, out, _ = run_check(page("vllm_decode_before"), page("vllm_decode_after_pd"), omni=False,
                           report=tmp_path / "run" / "smoke.json")
    assert rc == 0
    first, second = out.splitlines()
    assert first.startswith("smoke: ok in ")
    assert second.startswith(f"smoke: could not write {tmp_path / 'run' / 'smoke.json'}: ")


# --- the CLI wires it ------------------------------------------------------------------------------

@pytest.mark.parametrize("verdict", [0, 1])
def test_cli_launch_smoke_on_the_vllm_omni_runtime_checks_decodes_stage(tmp_path, monkeypatch, verdict):
    """`omni-pd launch --smoke` hands the supervisor a readiness callback that checks decode's
    stage on the omni server's /metrics; its verdict is the exit status."""
    import omni_pd.launch.smoke as smoke_mod
    import omni_pd.launch.supervisor as supervisor
    from omni_pd.cli import main

    res = expand_document(parse_text(preset_path("qwen3_omni_moe").read_text(), "qwen3_omni_moe.yaml"))
    cfg = tmp_path / "pd.yaml"
    cfg.write_text(res.text)
    seen: list[tuple] = []
    stream = io.StringIO()  # stands for Supervisor.report_stream()
    monkeypatch.setattr(smoke_mod, "smoke_check", lambda target, out, **kw: seen.append((target, out, kw)) or verdict)
    monkeypatch.setattr(supervisor, "run",
                        lambda plan, rd, on_ready=None, stay=True, grace_s=10.0, **kw: on_ready(stream))
    rc = main(["launch", str(cfg), "--model", OMNI_MODEL, "--smoke", "--once", "--no-preflight",
               "--port", "8123", "--run-dir", str(tmp_path / "run")])
    assert rc == verdict
    assert seen == [(SmokeTarget("http://127.0.0.1:8123", OMNI_MODEL, "http://127.0.0.1:8123/metrics", "1", chat=True,
                                  kv_logs=(str(tmp_path / "run" / "omni.log"),)),
                     stream, {"report": tmp_path / "run" / "smoke.json", "runtime": "vllm-omni"})]
