"""Whose fault a failed ``launch --smoke`` is, and what it did not check (issue 16).

* A server that does not answer, answers an HTTP error, a body that is not JSON, or JSON
  that is not the OpenAI reply shape: the *server's* failure, exit 1, the line names the
  request (method and URL) and ``smoke.json`` says ``error_kind: server``.
* An exception in omni-pd's own smoke code (a ``KeyError`` in the counter parsing, ...):
  an *omni-pd bug*, exit 3 (the CLI's status for internal errors), the line says so and
  where; ``OMNI_PD_DEBUG=1`` lets it propagate with its traceback.
* No decode metrics URL: the KV transfer is *not checked* (the line and ``smoke.json``
  say why), and the encoder leg of an E -> P -> D split is still checked.

Fake HTTP servers on 127.0.0.1 stand for the entrypoint and decode's ``/metrics``."""

from __future__ import annotations

import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from omni_pd.launch import smoke as sm
from omni_pd.launch.smoke import SmokeTarget, smoke_check, smoke_target
from tests.test_smoke import NO_RUN_DIR

PT = "vllm:prompt_tokens_by_source_total"
BEFORE = f'{PT}{{engine="0",source="external_kv_transfer"}} 0\n'.encode()
AFTER = f'{PT}{{engine="0",source="external_kv_transfer"}} 126\n'.encode()


class Fake:
    """``GET /metrics``: ``BEFORE`` until a POST arrived, then ``AFTER``; every POST
    answers ``status`` with the raw bytes ``reply``."""

    def __init__(self, reply: bytes, status: int = 200):
        self.posts = 0
        srv = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):  # noqa: N802
                self._send(200, AFTER if srv.posts else BEFORE)

            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers["Content-Length"]))
                srv.posts += 1
                self._send(status, reply)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def check(reply: bytes, tmp_path, *, status: int = 200, chat: bool = False, metrics: bool = True):
    with Fake(reply, status) as srv:
        t = SmokeTarget(srv.url, "tiny", srv.url + "/metrics" if metrics else None, "1" if chat else None, chat=chat)
        out = io.StringIO()
        rc = smoke_check(t, out, report=tmp_path / "smoke.json")
    return rc, out.getvalue(), json.loads((tmp_path / "smoke.json").read_text()), srv.url


# --- the server's failure ------------------------------------------------------------------------------

@pytest.mark.parametrize("reply,chat,what", [
    (b'[{"text": "x"}]', False, "the reply is a JSON array, not an object"),
    (b'{"choices": "x"}', False, "`choices` is a JSON string, not an array"),
    (b'{"choices": [null]}', False, "`choices[0]` is a JSON null, not an object"),
    (b'{"choices": [{"text": 5}]}', False, "`choices[0].text` is a JSON number, not a string"),
    (b'{"choices": [{"message": "hi"}]}', True, "`choices[0].message` is a JSON string, not an object"),
    (b'{"choices": [{"message": {"content": ["a"]}}]}', True,
     "`choices[0].message.content` is a JSON array, not a string"),
])
def test_a_reply_of_the_wrong_shape_is_the_servers_failure(tmp_path, reply, chat, what):
    rc, out, rep, url = check(reply, tmp_path, chat=chat)
    path = "/v1/chat/completions" if chat else "/v1/completions"
    msg = f"smoke: request failed: POST {url}{path}: unexpected reply: {what}"
    assert (rc, out) == (1, msg + "\n")
    assert (rep["ok"], rep["error_kind"], rep["error"], rep["message"]) == (
        False, "server", f"POST {url}{path}: unexpected reply: {what}", msg)


def test_a_reply_that_is_not_json_is_the_servers_failure(tmp_path):
    rc, out, rep, url = check(b"<html>busy</html>", tmp_path)
    assert rc == 1
    assert out == (f"smoke: request failed: POST {url}/v1/completions: the reply is not JSON: "
                   "JSONDecodeError: Expecting value: line 1 column 1 (char 0)\n")
    assert rep["error_kind"] == "server"


def test_an_http_error_names_the_request(tmp_path):
    rc, out, rep, url = check(b'{"error": "boom"}', tmp_path, status=503)
    assert (rc, out) == (1, f"smoke: request failed: POST {url}/v1/completions: HTTPError: HTTP Error 503: "
                            "Service Unavailable: {\"error\": \"boom\"}\n")
    assert (rep["error_kind"], rep["measured"]["before"]) == ("server", None)


def test_a_metrics_page_that_does_not_answer_names_the_get(tmp_path):
    with Fake(b"{}") as srv:
        t = SmokeTarget(srv.url, "tiny", srv.url + "/metrics")
    out = io.StringIO()  # the server is closed now: connection refused
    assert smoke_check(t, out) == 1
    assert out.getvalue().startswith(f"smoke: request failed: GET {srv.url}/metrics: URLError: ")


# --- omni-pd's own bug ---------------------------------------------------------------------------------

def _bug(*a, **kw):
    raise KeyError("stage")


def test_an_exception_in_omni_pds_own_code_is_reported_as_an_omni_pd_bug(tmp_path, monkeypatch):
    monkeypatch.delenv("OMNI_PD_DEBUG", raising=False)
    monkeypatch.setattr(sm, "kv_received", _bug)
    rc, out, rep, _ = check(b'{"choices": [{"text": "x"}]}', tmp_path)
    assert rc == sm.EXIT_BUG == 3
    assert out.startswith("smoke: omni-pd bug: KeyError: 'stage' (in test_smoke_faults.py:")
    assert out.endswith(" in _bug; a bug in omni-pd's smoke check, not a server failure: please report it, "
                        "OMNI_PD_DEBUG=1 shows the traceback)\n")
    assert (rep["ok"], rep["error_kind"], rep["error"]) == (False, "omni-pd bug", "KeyError: 'stage'")
    assert rep["message"] == out.rstrip("\n")


def test_an_omni_pd_bug_propagates_with_omni_pd_debug(tmp_path, monkeypatch):
    monkeypatch.setenv("OMNI_PD_DEBUG", "1")
    monkeypatch.setattr(sm, "kv_received", _bug)
    with pytest.raises(KeyError):
        check(b'{"choices": [{"text": "x"}]}', tmp_path)


def test_an_omni_pd_bug_in_the_encoder_check_is_reported_as_such(tmp_path, monkeypatch):
    monkeypatch.delenv("OMNI_PD_DEBUG", raising=False)
    monkeypatch.setattr(sm, "stored_items", _bug)
    out, rep = io.StringIO(), {}
    t = SmokeTarget("http://127.0.0.1:9", "M", None, ec_connector="ECExampleConnector", ec_storage=str(tmp_path))
    assert sm.ec_smoke_check(t, out, rep) == 3
    assert out.getvalue().startswith("smoke: omni-pd bug: KeyError: 'stage' (in test_smoke_faults.py:")
    assert (rep["ok"], rep["error_kind"], rep["error"]) == (False, "omni-pd bug", "KeyError: 'stage'")


def test_the_encoder_request_failing_is_the_servers(tmp_path):
    out, rep = io.StringIO(), {}
    with Fake(b"not json") as srv:
        t = SmokeTarget(srv.url, "M", None, ec_connector="ECExampleConnector", ec_storage=str(tmp_path))
        assert sm.ec_smoke_check(t, out, rep) == 1
    assert out.getvalue() == (f"smoke: image request failed: POST {srv.url}/v1/chat/completions: the reply is "
                              "not JSON: JSONDecodeError: Expecting value: line 1 column 1 (char 0)\n")
    assert rep["error_kind"] == "server"


# --- what was not checked -------------------------------------------------------------------------------

def _proc(name: str, role: str, url: str | None):
    return SimpleNamespace(name=name, role=role, health=SimpleNamespace(url=url) if url else None)


def test_smoke_target_says_why_decodes_counters_are_not_known():
    plan = SimpleNamespace(runtime="vllm", entrypoint="http://r:8000", processes=[_proc("prefill-0", "prefill", "x")])
    assert smoke_target(plan, "m", 1).not_checked == "the plan has no decode process"
    plan.processes.append(_proc("decode-0", "decode", None))
    assert smoke_target(plan, "m", 1).not_checked == "decode-0 has no health URL, so its /metrics is not known"
    plan.processes[1] = _proc("decode-0", "decode", "http://d:8200/health")
    assert smoke_target(plan, "m", 1).not_checked is None
    omni = SimpleNamespace(runtime="vllm-omni", entrypoint="http://s:8000", processes=[])
    assert smoke_target(omni, "m", 1).not_checked is None


def test_without_decode_metrics_the_kv_transfer_is_not_checked_and_said_so(tmp_path, monkeypatch):
    ticks = iter([10.0, 12.5])
    monkeypatch.setattr(sm.time, "monotonic", lambda: next(ticks))
    with Fake(b'{"choices": [{"text": "y"}]}') as srv:
        t = SmokeTarget(srv.url, "tiny", None, not_checked="decode-0 has no health URL, so its /metrics is not known")
        out = io.StringIO()
        assert smoke_check(t, out, report=tmp_path / "smoke.json") == 0
    msg = ("smoke: completion in 2.50 s: 'y'; KV transfer not checked: decode-0 has no health URL, so its /metrics "
           "is not known")
    assert out.getvalue() == msg + "\n"
    rep = json.loads((tmp_path / "smoke.json").read_text())
    assert (rep["ok"], rep["measured"], rep["not_checked"], rep["error"], rep["error_kind"], rep["message"]) == (
        True, None, {"kv_transfer": "decode-0 has no health URL, so its /metrics is not known", "kv_log": NO_RUN_DIR},
        None, None, msg)


def test_without_decode_metrics_the_encoder_leg_is_still_checked(tmp_path, monkeypatch):
    """Before: the early "not measurable" return skipped the encoder check and passed."""
    calls = []
    monkeypatch.setattr(sm, "smoke", lambda t: sm.SmokeResult("x", 0.0, 0.0, 0.5))
    monkeypatch.setattr(sm, "ec_smoke_check",
                        lambda t, out, rep: rep.update(error="the encoder stored nothing", error_kind="check")
                        or calls.append((t, out)) or 1)
    t = SmokeTarget("http://e", "M", None, ec_storage=str(tmp_path), not_checked="the plan has no decode process")
    out = io.StringIO()
    assert smoke_check(t, out, report=tmp_path / "smoke.json") == 1 and calls == [(t, out)]
    rep = json.loads((tmp_path / "smoke.json").read_text())
    assert (rep["ok"], rep["error"], rep["error_kind"], rep["not_checked"]) == (
        False, "encoder leg: the encoder stored nothing", "check",
        {"kv_transfer": "the plan has no decode process", "kv_log": NO_RUN_DIR})


@pytest.mark.parametrize("reply,chat,what", [
    (b'{"choices": [{"text": true}]}', False, "`choices[0].text` is a JSON boolean, not a string"),
    (b'{"choices": [{"text": 1.5}]}', False, "`choices[0].text` is a JSON number, not a string"),
    (b'{"choices": [{"text": {}}]}', False, "`choices[0].text` is a JSON object, not a string"),
    (b'"ok"', True, "the reply is a JSON string, not an object"),
    (b'{"choices": {}}', True, "`choices` is a JSON object, not an array"),
])
def test_every_json_type_is_named(tmp_path, reply, chat, what):
    rc, out, rep, url = check(reply, tmp_path, chat=chat)
    assert rc == 1 and rep["error"].endswith(f": unexpected reply: {what}")


@pytest.mark.parametrize("reply,chat", [
    ({}, True), ({"choices": None}, True), ({"choices": []}, True), ({"choices": [{}]}, True),
    ({"choices": [{"message": None}]}, True), ({"choices": [{"message": {"content": None}}]}, True),
    ({"choices": [{}]}, False), ({"choices": [{"text": None}]}, False),
])
def test_absent_or_null_parts_are_empty_text(reply, chat):
    assert sm.answer_text(reply, chat, "POST u") == ""


def test_answer_text_reads_the_right_field():
    both = {"choices": [{"text": "completion", "message": {"content": "chat"}}, {"text": "second"}]}
    assert (sm.answer_text(both, False, "r"), sm.answer_text(both, True, "r")) == ("completion", "chat")


def test_a_reply_cut_short_is_the_servers_failure(tmp_path):
    """The server promises 100 bytes and closes after 10: ``http.client.IncompleteRead``
    (an ``HTTPException``, no ``OSError``)."""
    import socket as so

    s = so.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    port = s.getsockname()[1]

    def serve():
        c, _ = s.accept()
        c.settimeout(5)
        req = b""
        while b"\r\n\r\n" not in req:  # the whole request head: closing with unread bytes sends a RST
            req += c.recv(65536)
        head, _, body = req.partition(b"\r\n\r\n")
        want = int(next((ln.split(b":", 1)[1] for ln in head.split(b"\r\n")
                         if ln.lower().startswith(b"content-length:")), b"0"))
        while len(body) < want:
            body += c.recv(65536)
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"choices\"")
        c.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        with pytest.raises(sm.ServerError) as e:
            sm._post(f"http://127.0.0.1:{port}/v1/completions", {}, 10)
    finally:
        t.join(5)
        s.close()
    assert str(e.value).startswith(f"POST http://127.0.0.1:{port}/v1/completions: IncompleteRead: ")


def test_a_reply_that_is_no_unicode_is_the_servers_failure(tmp_path):
    with Fake(b"\xff\xfe\xfa") as srv:
        with pytest.raises(sm.ServerError, match=r": the reply is not JSON: UnicodeDecodeError: "):
            sm._post(srv.url + "/v1/completions", {}, 10)


def test_smoke_json_when_decodes_counters_are_not_on_the_page(tmp_path, monkeypatch):
    monkeypatch.setattr(sm, "smoke", lambda t: sm.SmokeResult("x", 0.0, 0.0, 1.23456, counters_seen=False))
    t = SmokeTarget("http://s", "M", "http://s/metrics", "1", chat=True)
    out = io.StringIO()
    assert smoke_check(t, out, report=tmp_path / "smoke.json") == 1
    msg = ("smoke: FAILED: decode answered 'x' but decode stage 1 on http://s/metrics has no "
           "vllm:prompt_tokens_by_source series, so whether it recomputed the prompt cannot be told (is "
           "--disable-log-stats set?)")
    assert out.getvalue() == msg + "\n"
    rep = json.loads((tmp_path / "smoke.json").read_text())
    assert (rep["ok"], rep["error"], rep["error_kind"], rep["message"], rep["seconds"], rep["not_checked"]) == (
        False, "decode's counters are not on the metrics page", "check", msg, 1.235, {"kv_log": NO_RUN_DIR})
    assert rep["measured"] == {"metrics_url": "http://s/metrics", "decode_stage": "1",
                               "counters": ['vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}',
                                            "vllm:nixl_xfer_time_seconds_count"],
                               "counters_seen": False, "before": 0.0, "after": 0.0}


def test_smoke_json_is_indented_two_spaces_and_ends_with_a_newline(tmp_path, monkeypatch):
    monkeypatch.setattr(sm, "smoke", lambda t: sm.SmokeResult("x", 0.0, 1.0, 1.0))
    smoke_check(SmokeTarget("http://e", "M", "http://d/metrics"), io.StringIO(), report=tmp_path / "smoke.json")
    text = (tmp_path / "smoke.json").read_text()
    assert text.startswith('{\n  "ok": true,\n  "runtime": "vllm",\n  "request": {\n    "url": "http://e/v1/completions",')
    assert text.endswith('"\n}\n')
