"""The pieces of ``launch --smoke`` one at a time (issue 16; the survivors of
``python bench/mutation.py omni_pd/launch/smoke.py`` that tests/test_smoke.py left):
the Prometheus text parser on escaped labels and blank lines, counters summed over
series and stages, the target of a plan without a decode health URL, the exact
requests and the exact report lines, and the HTTP helpers (no proxy, timeouts, bytes
that are not UTF-8)."""

from __future__ import annotations

import io
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from omni_pd.launch import smoke as sm
from omni_pd.launch.smoke import SmokeTarget, has_stage_counters, kv_received, samples, smoke, smoke_check, smoke_target

PT = "vllm:prompt_tokens_by_source_total"


# --- the text format -------------------------------------------------------------------------------

def test_samples_unescape_label_values_and_skip_blank_and_comment_lines() -> None:
    page = ('# HELP a_total help text\n'
            '# TYPE a_total counter\n'
            '\n'
            'a_total{path="C:\\\\tmp",quote="say \\"hi\\"",nl="x\\ny",plain="n"} 3 1700000000000\n'
            '\n'
            '#a comment without a space\n'
            'b_total 2.5\n'
            'c_total{x="1"} NaNish\n'
            '{bad="1"} 1\n'
            'd_total 4\n')
    assert list(samples(page)) == [
        ("a_total", {"path": "C:\\tmp", "quote": 'say "hi"', "nl": "x\ny", "plain": "n"}, 3.0),
        ("b_total", {}, 2.5),
        ("d_total", {}, 4.0)]


def test_kv_received_sums_every_matching_series() -> None:
    page = (f'{PT}{{engine="0",source="external_kv_transfer"}} 100\n'
            f'{PT}{{engine="0",source="local_compute"}} 7\n'
            'vllm:nixl_xfer_time_seconds_count{engine="0"} 3\n'
            f'{PT}{{engine="1",source="external_kv_transfer"}} 20\n')
    assert kv_received(page) == 123.0


def test_kv_received_per_stage_sums_only_that_stage() -> None:
    page = (f'{PT}{{stage="0",replica="0",source="external_kv_transfer"}} 500\n'
            f'{PT}{{stage="1",replica="0",source="external_kv_transfer"}} 100\n'
            f'{PT}{{stage="1",replica="1",source="external_kv_transfer"}} 26\n'
            f'{PT}{{source="external_kv_transfer"}} 9\n')
    assert kv_received(page, "1") == 126.0
    assert kv_received(page, "0") == 500.0
    assert kv_received(page) == 635.0


def test_stage_counters_need_the_prompt_token_family_of_that_stage() -> None:
    other = 'vllm:num_requests_running{stage="1",replica="0"} 0\n'
    assert not has_stage_counters(other, "1")
    assert not has_stage_counters(f'{PT}{{stage="0",source="local_compute"}} 1\n', "1")
    assert has_stage_counters(f'{PT}{{stage="1",source="local_compute"}} 0\n', "1")


# --- the target --------------------------------------------------------------------------------------

def _plan(runtime: str, entrypoint: str, processes=()):
    return SimpleNamespace(runtime=runtime, entrypoint=entrypoint, processes=list(processes))


def _proc(role: str, url: str | None):
    return SimpleNamespace(name=role + "-0", role=role, health=SimpleNamespace(url=url) if url else None)


def test_smoke_target_strips_a_trailing_slash_and_keeps_no_stage() -> None:
    assert smoke_target(_plan("vllm-omni", "http://h:8091/"), "m", None) == \
        SmokeTarget("http://h:8091/", "m", "http://h:8091/metrics", None, chat=True)
    assert smoke_target(_plan("vllm-omni", "http://h:8091"), "m", 0).decode_stage == "0"


def test_smoke_target_without_a_decode_process_or_health_url_is_not_measurable() -> None:
    assert smoke_target(_plan("vllm", "http://r:8000", [_proc("prefill", "http://p:8100/health")]), "m", 1) == \
        SmokeTarget("http://r:8000", "m", None, not_checked="the plan has no decode process")
    assert smoke_target(_plan("vllm", "http://r:8000", [_proc("decode", None)]), "m", 1).metrics_url is None
    assert smoke_target(_plan("vllm", "http://r:8000", [_proc("prefill", "http://p:8100/health"),
                                                        _proc("decode", "http://d:8200/health")]), "m", 1) == \
        SmokeTarget("http://r:8000", "m", "http://d:8200/metrics")


# --- the request and the report ------------------------------------------------------------------------

class Server:
    """``/metrics`` serves ``pages`` in turn (the last one repeats); POSTs answer ``reply``;
    every request is recorded as (method, path, headers, body)."""

    def __init__(self, pages: list[bytes], reply: dict):
        self.pages, self.reply, self.seen = list(pages), reply, []
        srv = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                srv.seen.append(("GET", self.path, dict(self.headers), None))
                if self.path != "/metrics":
                    return self._send(404, b"")
                self._send(200, srv.pages.pop(0) if len(srv.pages) > 1 else srv.pages[0])

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                srv.seen.append(("POST", self.path, dict(self.headers), body))
                if self.path not in ("/v1/completions", "/v1/chat/completions"):
                    return self._send(404, b"{}")
                self._send(200, json.dumps(srv.reply).encode())

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def clock(monkeypatch):
    """``time.monotonic`` of the smoke module: 10.0, then 12.5 from then on (the request
    took 2.5 s)."""
    import itertools

    ticks = itertools.chain([10.0], itertools.repeat(12.5))
    monkeypatch.setattr(sm.time, "monotonic", lambda: next(ticks))


OMNI_BEFORE = (f'{PT}{{stage="0",replica="0",source="external_kv_transfer"}} 500\n'
               f'{PT}{{stage="1",replica="0",source="external_kv_transfer"}} 0\n').encode()
OMNI_AFTER = (f'{PT}{{stage="0",replica="0",source="external_kv_transfer"}} 500\n'
              f'{PT}{{stage="1",replica="0",source="external_kv_transfer"}} 126\n').encode()


def test_chat_request_and_result_on_a_vllm_omni_server(clock) -> None:
    srv = Server([OMNI_BEFORE, OMNI_AFTER], {"choices": [{"message": {"content": "x * 3"}}]})
    try:
        res = smoke(SmokeTarget(srv.url + "/", "M", srv.url + "/metrics", "1", chat=True), max_tokens=5)
    finally:
        srv.close()
    assert (res.text, res.kv_before, res.kv_after, res.seconds, res.counters_seen) == ("x * 3", 0.0, 126.0, 2.5, True)
    [g1, post, g2] = srv.seen
    assert (g1[:2], g2[:2]) == (("GET", "/metrics"), ("GET", "/metrics"))
    assert post[1] == "/v1/chat/completions"
    assert post[2]["Content-Type"] == "application/json"
    assert post[3] == {"model": "M", "messages": [{"role": "user", "content": sm.PROMPT}], "max_tokens": 5,
                       "temperature": 0, "modalities": ["text"]}


def test_chat_reply_without_content_is_empty_text(clock) -> None:
    srv = Server([OMNI_BEFORE, OMNI_AFTER], {"choices": [{"message": {"role": "assistant"}}]})
    try:
        assert smoke(SmokeTarget(srv.url, "M", srv.url + "/metrics", "1", chat=True)).text == ""
    finally:
        srv.close()


def test_completion_request_and_exact_report_on_plain_vllm(clock) -> None:
    before = f'{PT}{{engine="0",source="external_kv_transfer"}} 4\n'.encode()
    after = f'{PT}{{engine="0",source="external_kv_transfer"}} 130\n'.encode()
    srv = Server([before, after], {"choices": [{"text": " x * 3"}]})
    out = io.StringIO()
    try:
        rc = smoke_check(SmokeTarget(srv.url + "/", "tiny", srv.url + "/metrics"), out)
    finally:
        srv.close()
    assert rc == 0
    assert out.getvalue() == (f"smoke: ok in 2.50 s: ' x * 3'; decode received KV from prefill "
                              f"(counters 4 -> 130, {srv.url}/metrics)\n")
    post = srv.seen[1]
    assert post[1] == "/v1/completions" and post[2]["Content-Type"] == "application/json"
    assert post[3] == {"model": "tiny", "prompt": sm.PROMPT, "max_tokens": 8, "temperature": 0}


@pytest.mark.parametrize("reply", [{"choices": [{}]}, {"choices": []}, {}])
def test_completion_reply_without_text_is_empty_text(clock, reply) -> None:
    srv = Server([b"", b""], reply)
    try:
        assert smoke(SmokeTarget(srv.url, "tiny", None)).text == ""
    finally:
        srv.close()


def test_recompute_report_names_the_decode_stage_and_counts(clock) -> None:
    srv = Server([OMNI_AFTER, OMNI_AFTER], {"choices": [{"message": {"content": "x"}}]})
    out = io.StringIO()
    try:
        assert smoke_check(SmokeTarget(srv.url, "M", srv.url + "/metrics", "1", chat=True), out) == 1
    finally:
        srv.close()
    assert out.getvalue() == (f"smoke: FAILED: decode answered 'x' but its KV-received counters did not grow "
                              f"(126 -> 126, decode stage 1 on {srv.url}/metrics): it recomputed the prompt "
                              "instead of using prefill's KV\n")


def test_not_measurable_report(clock) -> None:
    srv = Server([b""], {"choices": [{"text": "y"}]})
    out = io.StringIO()
    try:
        assert smoke_check(SmokeTarget(srv.url, "tiny", None), out) == 0
    finally:
        srv.close()
    assert out.getvalue() == "smoke: completion in 2.50 s: 'y'; KV transfer not checked: no decode metrics URL\n"
    assert [s[0] for s in srv.seen] == ["POST"]  # no metrics page asked for


# --- the HTTP helpers ------------------------------------------------------------------------------------

def test_get_replaces_bytes_that_are_not_utf8() -> None:
    srv = Server([b"ok \xff\xfe 1\n"], {})
    try:
        assert sm._get(srv.url + "/metrics", 30) == "ok \ufffd\ufffd 1\n"
    finally:
        srv.close()


def test_requests_ignore_proxy_settings(monkeypatch) -> None:
    """Engines are local: an ``http_proxy`` in the environment must not be used."""
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    srv = Server([b"a 1\n"], {"choices": []})
    try:
        assert sm._get(srv.url + "/metrics", 30) == "a 1\n"
        assert sm._post(srv.url + "/v1/completions", {}, 30) == {"choices": []}
    finally:
        srv.close()


@pytest.mark.parametrize("call", ["get", "post"])
def test_the_timeout_reaches_the_socket(call) -> None:
    """A server that accepts the connection and never answers: the call gives up."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    url = f"http://127.0.0.1:{s.getsockname()[1]}/metrics"
    try:
        with pytest.raises(sm.ServerError, match="timed out") as e:
            sm._get(url, 0.2) if call == "get" else sm._post(url, {}, 0.2)
        assert str(e.value).startswith(("GET " if call == "get" else "POST ") + url + ": ")
    finally:
        s.close()


# --- the encoder leg (E -> P -> D) ----------------------------------------------------------------------

class ECServer(Server):
    """An entrypoint whose encoder stores one item per image request and whose prefill
    log says it loaded it."""

    def __init__(self, storage, log, reply):
        super().__init__([b""], reply)
        self.storage, self.log = storage, log
        inner = self.httpd.RequestHandlerClass.do_POST
        srv = self

        def do_post(handler):
            (srv.storage / "h1").mkdir(parents=True, exist_ok=True)
            (srv.storage / "h1" / "encoder_cache.safetensors").write_bytes(b"x")
            srv.log.write_text("DEBUG x [example_connector.py:108] Success load encoder cache for hash h1\n")
            inner(handler)

        self.httpd.RequestHandlerClass.do_POST = do_post


def test_ec_smoke_sends_one_greedy_image_request_and_reports_exactly(tmp_path, clock) -> None:
    import base64

    storage, log = tmp_path / "ec", tmp_path / "prefill-0.log"
    storage.mkdir()
    srv = ECServer(storage, log, {"choices": [{"message": {"content": "a cat"}}]})
    out = io.StringIO()
    try:
        t = SmokeTarget(srv.url + "/", "M", None, ec_connector="ECExampleConnector", ec_storage=str(storage),
                        ec_log=str(log))
        rep: dict = {}
        assert sm.ec_smoke_check(t, out, rep) == 0
    finally:
        srv.close()
    assert out.getvalue() == (f"smoke: encoder ok in 2.50 s: E stored h1 and prefill loaded it ({log}); "
                              "answer 'a cat'\n")
    assert rep == {"ok": True, "storage": str(storage), "log": str(log), "stored": ["h1"], "loaded": ["h1"],
                   "answer_excerpt": "a cat", "seconds": 2.5, "error": None, "error_kind": None,
                   "message": f"smoke: encoder ok in 2.50 s: E stored h1 and prefill loaded it ({log}); answer 'a cat'"}
    [(method, path, headers, body)] = srv.seen
    assert (method, path, headers["Content-Type"]) == ("POST", "/v1/chat/completions", "application/json")
    image, question = body["messages"][0]["content"]
    assert body == {"model": "M", "max_tokens": 4, "temperature": 0,
                    "messages": [{"role": "user", "content": [image, question]}]}
    assert question == {"type": "text", "text": "What is in the image?"}
    assert image["type"] == "image_url" and image["image_url"]["url"].startswith("data:image/png;base64,")
    png = base64.b64decode(image["image_url"]["url"].split(",", 1)[1])
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_smoke_check_runs_the_encoder_check_after_the_kv_check(tmp_path, monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(sm, "smoke", lambda t: sm.SmokeResult("x", 0.0, 1.0, 0.5))
    monkeypatch.setattr(sm, "ec_smoke_check",
                        lambda t, out, rep: rep.update(error="E stored nothing") or calls.append((t, out)) or 7)
    out = io.StringIO()
    t = SmokeTarget("http://e", "M", "http://d/metrics", ec_storage=str(tmp_path))
    assert sm.smoke_check(t, out, report=tmp_path / "smoke.json") == 7 and calls == [(t, out)]
    rep = json.loads((tmp_path / "smoke.json").read_text())
    assert (rep["ok"], rep["error"], rep["encoder"]) == (False, "encoder leg: E stored nothing",
                                                         {"error": "E stored nothing"})
    assert sm.smoke_check(SmokeTarget("http://e", "M", "http://d/metrics"), out) == 0 and len(calls) == 1


def test_smoke_target_of_an_encoder_split_without_a_run_dir_or_prefill(tmp_path) -> None:
    base = dict(runtime="vllm", entrypoint="http://r:8000", ec_connector="ECExampleConnector", ec_storage="/s")
    with_p = SimpleNamespace(processes=[_proc("prefill", None), _proc("decode", "http://d:8200/health")], **base)
    assert smoke_target(with_p, "m", 2, None).ec_log is None
    no_p = SimpleNamespace(processes=[_proc("decode", "http://d:8200/health")], **base)
    assert smoke_target(no_p, "m", 2, str(tmp_path)).ec_log is None
    plain = SimpleNamespace(processes=[_proc("prefill", None)], runtime="vllm", entrypoint="http://r:8000")
    assert smoke_target(plain, "m", 2, str(tmp_path)) == SmokeTarget(
        "http://r:8000", "m", None, not_checked="the plan has no decode process",
        kv_logs=(str(tmp_path / "prefill-0.log"),))


def test_tiny_png_pixels_and_chunks_exactly() -> None:
    """A 2 x 2 image with seed 0x030201: the gradient (2x + seed, 2y + seed>>8, x + y + seed>>16)
    mod 256, filter byte 0 per row, valid CRCs, then IEND."""
    import struct
    import zlib

    png = sm.tiny_png(2, 2, seed=0x030201)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    chunks, i = [], 8
    while i < len(png):
        (n,) = struct.unpack(">I", png[i:i + 4])
        kind, data, (crc,) = png[i + 4:i + 8], png[i + 8:i + 8 + n], struct.unpack(">I", png[i + 8 + n:i + 12 + n])
        assert crc == zlib.crc32(kind + data) & 0xFFFFFFFF
        chunks.append((kind, data))
        i += 12 + n
    assert [k for k, _ in chunks] == [b"IHDR", b"IDAT", b"IEND"] and chunks[2][1] == b""
    assert chunks[0][1] == struct.pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0)
    assert zlib.decompress(chunks[1][1]) == bytes([0, 1, 2, 3, 3, 2, 4,
                                                   0, 1, 4, 4, 3, 4, 5])
    assert len(sm.tiny_png()) > 100 and sm.tiny_png(seed=1) != sm.tiny_png(seed=2)


# --- ec_smoke on its own: the request it sends and how it reads the consumer's log (issue 16 survivors) ---

class FakePost:
    """Stands for ``_post``: records (url, body, timeout); each call first runs ``then``
    (e.g. E storing an item) and answers ``reply``."""

    def __init__(self, reply, then=None):
        self.reply, self.then, self.calls = reply, then, []

    def __call__(self, url, body, timeout):
        self.calls.append((url, body, timeout))
        if self.then:
            self.then()
        return self.reply


def _store(storage, h="h1"):
    def go():
        (storage / h).mkdir(parents=True, exist_ok=True)
        (storage / h / "encoder_cache.safetensors").write_bytes(b"x")
    return go


LOAD = "DEBUG x [example_connector.py:108] Success load encoder cache for hash h1\n"


def test_ec_smoke_defaults_and_url(tmp_path, monkeypatch):
    post = FakePost({"choices": [{"message": {"content": "a"}}]}, _store(tmp_path))
    monkeypatch.setattr(sm, "_post", post)
    t = SmokeTarget("http://BOX/", "M", None, ec_connector="ECExampleConnector", ec_storage=str(tmp_path))
    res = sm.ec_smoke(t)
    [(url, body, timeout)] = post.calls
    assert (url, body["max_tokens"], timeout) == ("http://BOX/v1/chat/completions", 4, 300.0)
    assert (res.text, res.new, res.loaded) == ("a", {"h1"}, None)  # no log to read: loads not visible


def test_ec_smoke_names_the_request_of_a_reply_of_the_wrong_shape(tmp_path, monkeypatch):
    monkeypatch.setattr(sm, "_post", FakePost({"choices": [1]}))
    t = SmokeTarget("http://e:1/", "M", None, ec_connector="ECExampleConnector", ec_storage=str(tmp_path))
    with pytest.raises(sm.ServerError) as e:
        sm.ec_smoke(t)
    assert str(e.value) == ("POST http://e:1/v1/chat/completions: unexpected reply: `choices[0]` is a JSON number, "
                            "not an object")


@pytest.mark.parametrize("connector,log", [(None, True), ("NoSuchEC", True), ("ECExampleConnector", False)])
def test_without_a_load_line_or_a_log_loads_are_not_visible(tmp_path, monkeypatch, connector, log):
    """No EC contract (no load line to look for) or no consumer log: ``loaded`` is None
    (not visible), the log is not read."""
    storage, path = tmp_path / "ec", tmp_path / "prefill-0.log"
    path.write_text(LOAD)
    monkeypatch.setattr(sm, "_post", FakePost({"choices": []}, _store(storage)))
    t = SmokeTarget("http://e", "M", None, ec_connector=connector, ec_storage=str(storage),
                    ec_log=str(path) if log else None)
    assert sm.ec_smoke(t).loaded is None


def test_a_log_that_is_not_there_yet_shows_no_loads(tmp_path, monkeypatch):
    storage = tmp_path / "ec"
    monkeypatch.setattr(sm, "_post", FakePost({"choices": []}, _store(storage)))
    t = SmokeTarget("http://e", "M", None, ec_connector="ECExampleConnector", ec_storage=str(storage),
                    ec_log=str(tmp_path / "missing.log"))
    assert sm.ec_smoke(t).loaded is None


def test_a_log_with_bytes_that_are_not_utf8_is_still_read(tmp_path, monkeypatch):
    storage, path = tmp_path / "ec", tmp_path / "prefill-0.log"
    path.write_bytes(b"\xff\xfe garbage\n" + LOAD.encode())
    monkeypatch.setattr(sm, "_post", FakePost({"choices": []}, _store(storage)))
    t = SmokeTarget("http://e", "M", None, ec_connector="ECExampleConnector", ec_storage=str(storage),
                    ec_log=str(path))
    assert sm.ec_smoke(t).loaded == {"h1"}


class FakeTime:
    """``time.monotonic``/``time.sleep`` of the smoke module: sleeping advances the clock
    by 1.0 s whatever it is asked (the asked values are recorded), ``on_sleep`` runs at
    each sleep."""

    def __init__(self, on_sleep=None):
        self.t, self.asked, self.on_sleep = 0.0, [], on_sleep

    def monotonic(self):
        return self.t

    def sleep(self, s):
        self.asked.append(s)
        self.t += 1.0
        if self.on_sleep:
            self.on_sleep(len(self.asked))


def test_the_log_is_polled_until_the_load_line_arrives(tmp_path, monkeypatch):
    """The supervisor copies the engine's output with a lag: a DEBUG log without the load
    line yet is read again (every 0.2 s) until it appears."""
    storage, path = tmp_path / "ec", tmp_path / "prefill-0.log"
    path.write_text("DEBUG starting\n")
    clock = FakeTime(lambda n: n == 2 and path.write_text("DEBUG starting\n" + LOAD))
    monkeypatch.setattr(sm.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(sm.time, "sleep", clock.sleep)
    monkeypatch.setattr(sm, "_post", FakePost({"choices": []}, _store(storage)))
    t = SmokeTarget("http://e", "M", None, ec_connector="ECExampleConnector", ec_storage=str(storage),
                    ec_log=str(path))
    assert sm.ec_smoke(t).loaded == {"h1"}
    assert clock.asked == [0.2, 0.2]


def test_the_log_is_given_up_on_after_five_seconds(tmp_path, monkeypatch):
    """Reads at 0, 1, ..., 6 s of the fake clock: the check after the read at 5 s is not
    past the deadline (5 s), the one at 6 s is."""
    storage, path = tmp_path / "ec", tmp_path / "prefill-0.log"
    path.write_text("DEBUG starting\n")
    clock = FakeTime()
    monkeypatch.setattr(sm.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(sm.time, "sleep", clock.sleep)
    monkeypatch.setattr(sm, "_post", FakePost({"choices": []}, _store(storage)))
    t = SmokeTarget("http://e", "M", None, ec_connector="ECExampleConnector", ec_storage=str(storage),
                    ec_log=str(path))
    assert sm.ec_smoke(t).loaded == set()
    assert len(clock.asked) == 6


def test_smoke_target_strips_only_slashes():
    assert smoke_target(_plan("vllm-omni", "http://BOX/"), "m", None).metrics_url == "http://BOX/metrics"


# --- ec_smoke_check: the exact report of each outcome -------------------------------------------------

ECT = SmokeTarget("http://e", "M", None, ec_connector="ECExampleConnector", ec_storage="/s", ec_log="/l/p.log")


def _ec_rep(**kw):
    base = {"ok": False, "storage": "/s", "log": "/l/p.log", "stored": None, "loaded": None, "answer_excerpt": None,
            "seconds": None, "error": None, "error_kind": None, "message": None}
    return {**base, **kw}


@pytest.mark.parametrize("new,loaded,rc,rep", [
    (set(), None, 1, _ec_rep(
        stored=[], answer_excerpt="a", seconds=2.5, error="the encoder stored nothing", error_kind="check",
        message="smoke: FAILED: the image request answered 'a' but the encoder stored nothing in /s: the encoder leg "
                "did not run or E is not an ec_producer there")),
    ({"h2", "h1"}, None, 0, _ec_rep(
        ok=True, stored=["h1", "h2"], answer_excerpt="a", seconds=2.5,
        message="smoke: encoder ok in 2.50 s: E stored h1, h2 in /s; whether prefill loaded it is not visible "
                "without DEBUG logs (--env VLLM_LOGGING_LEVEL=DEBUG)")),
    ({"h3", "h1", "h2"}, {"h1"}, 1, _ec_rep(
        stored=["h1", "h2", "h3"], loaded=["h1"], answer_excerpt="a", seconds=2.5,
        error="prefill did not load the encoder's output", error_kind="check",
        message="smoke: FAILED: E stored h1, h2, h3 but prefill's log (/l/p.log) shows no load of h2, h3: it encoded "
                "the image itself")),
    ({"h1", "h2"}, {"h1", "h2"}, 0, _ec_rep(
        ok=True, stored=["h1", "h2"], loaded=["h1", "h2"], answer_excerpt="a", seconds=2.5,
        message="smoke: encoder ok in 2.50 s: E stored h1, h2 and prefill loaded it (/l/p.log); answer 'a'")),
])
def test_ec_smoke_check_reports_each_outcome_exactly(monkeypatch, new, loaded, rc, rep):
    monkeypatch.setattr(sm, "ec_smoke", lambda t: sm.ECSmokeResult("a", new, loaded, 2.50049))
    out, got = io.StringIO(), {"stale": 1, "stored": "old"}
    assert sm.ec_smoke_check(ECT, out, got) == rc
    assert got == {"stale": 1, **rep}
    assert out.getvalue() == rep["message"] + "\n"


def test_ec_smoke_check_of_a_server_failure_reports_exactly(monkeypatch):
    def fail(t):
        raise sm.ServerError("POST http://e/v1/chat/completions: HTTPError: HTTP Error 502: Bad Gateway")

    monkeypatch.setattr(sm, "ec_smoke", fail)
    out, got = io.StringIO(), {"stored": "old", "seconds": 9}
    assert sm.ec_smoke_check(ECT, out, got) == 1
    err = "POST http://e/v1/chat/completions: HTTPError: HTTP Error 502: Bad Gateway"
    assert got == _ec_rep(error=err, error_kind="server", message="smoke: image request failed: " + err)
    assert out.getvalue() == "smoke: image request failed: " + err + "\n"


def test_tiny_png_default_is_112_pixels_square_and_salted_by_urandom(monkeypatch):
    """112 x 112 by default (a few vision patches of Qwen's encoder); without a seed the
    salt comes from ``os.urandom``, so two runs send two images."""
    import struct

    png = sm.tiny_png(seed=0)
    assert struct.unpack(">II", png[16:24]) == (112, 112)
    monkeypatch.setattr(sm.os, "urandom", lambda n: bytes([0, 0, 0, 1][:n]).rjust(n, b"\0"))
    assert sm.tiny_png() == sm.tiny_png(seed=1)


def test_counter_names_join_several_labels_with_commas(monkeypatch):
    monkeypatch.setattr(sm, "KV_RECEIVED", (("a_total", {"x": "1", "y": "2"}), ("b_count", {})))
    assert sm._counter_names() == ['a_total{x="1",y="2"}', "b_count"]


def test_smoke_gives_each_metrics_read_30_s_and_the_request_300_s(monkeypatch):
    gets, posts = [], []
    monkeypatch.setattr(sm, "_get", lambda url, timeout: gets.append((url, timeout)) or "")
    monkeypatch.setattr(sm, "_post_reply", lambda url, body, timeout, headers=None: posts.append((url, timeout))
                        or ({"choices": []}, {}))
    sm.smoke(SmokeTarget("http://e", "M", "http://d/metrics"))
    assert gets == [("http://d/metrics", 30), ("http://d/metrics", 30)]
    assert posts == [("http://e/v1/completions", 300.0)]


def test_request_urls_strip_only_trailing_slashes():
    assert sm._request(SmokeTarget("http://BOX/", "M", None), 8)[0] == "http://BOX/v1/completions"
    assert sm._request(SmokeTarget("http://BOX//", "M", None, chat=True), 8)[0] == "http://BOX/v1/chat/completions"


def test_an_http_error_body_is_quoted_collapsed_and_cut():
    # CI's smoke said only "HTTP Error 500: Internal Server Error"; vLLM's body names the cause
    import urllib.error

    def err(body: bytes | None) -> urllib.error.HTTPError:
        return urllib.error.HTTPError("http://r/v1/completions", 500, "Internal Server Error", {},
                                      None if body is None else io.BytesIO(body))

    assert sm._error_body(err(b'{"error":\n  {"message": "KV load failed"}}')) == \
        ': {"error": {"message": "KV load failed"}}'
    assert sm._error_body(err(b"")) == sm._error_body(err(b" \n ")) == sm._error_body(err(None)) == ""
    assert sm._error_body(err(b"\xff ok")) == ": \ufffd ok"
    long = sm._error_body(err(b"x" * 201))
    assert long == ": " + "x" * sm.EXCERPT_CHARS + "..." and sm.EXCERPT_CHARS == 200
    assert sm._error_body(err(b"y" * 200)) == ": " + "y" * 200
