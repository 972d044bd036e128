"""The router's backend leg client (`omni_pd.launch.router.legs`) and JSON codec
(`omni_pd.launch.router.codec`), against scripted asyncio TCP servers: exact request
bytes, keep-alive reuse, chunked answers, the stale keep-alive resend, timeouts and
transport errors; the codec's two backends and the decode body splice."""

from __future__ import annotations

import asyncio
import json

import pytest
from yarl import URL

from omni_pd.launch.router import codec, legs
from omni_pd.launch.router.core import describe_exc
from omni_pd.launch.router.protocol import decode_request_bytes

needs_httptools = pytest.mark.skipif(not legs.available(), reason="httptools not installed")

BODY = b'{"model":"m","prompt":"hi"}'
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}"


class Script:
    """A TCP server; ``answer(n_conn, n_req, request_bytes, writer)`` answers each request
    (a coroutine). Records connections and the raw requests."""

    def __init__(self, answer):
        self.answer, self.conns, self.requests, self.writers = answer, 0, [], []

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader, writer):
        self.writers.append(writer)
        self.conns += 1
        conn = self.conns
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                n = int([ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length:")][0]
                        .split(b":")[1])
                req = head + await reader.readexactly(n)
                self.requests.append(req)
                if not await self.answer(conn, len(self.requests), req, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    async def stop(self):
        self.server.close()


def run(coro):
    return asyncio.run(coro)


@needs_httptools
def test_keep_alive_reuses_one_connection_and_sends_exact_bytes():
    async def answer(conn, n, req, w):
        w.write(OK)
        return True

    async def main():
        s = Script(answer)
        base = await s.start()
        c = legs.LegClient()
        bodies = []
        for i in range(4):
            r = await c.post(URL(base + "/v1/completions"), BODY, {"X-Request-Id": f"r{i}", "Authorization": "B k"},
                             read_timeout=5)
            bodies.append((r.status, r.headers["content-type"], await r.read()))
            r.release()
        assert c.state() == {"open": 1, "idle": 1}
        s.server.close()
        for w in list(s.writers):
            w.close()
        for _ in range(50):  # the backend closing an idle connection takes it out of the pool
            if c.state() == {"open": 0, "idle": 0}:
                break
            await asyncio.sleep(0.01)
        assert c.state() == {"open": 0, "idle": 0}
        await c.close()
        await s.stop()
        return s, bodies, base

    s, bodies, base = run(main())
    assert bodies == [(200, "application/json", b'{"ok":true}')] * 4
    assert s.conns == 1 and len(s.requests) == 4
    host = base.removeprefix("http://")
    assert s.requests[0] == (
        b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\nUser-Agent: omni-pd-router\r\nAccept: */*\r\n"
        b"Content-Type: application/json\r\nX-Request-Id: r0\r\nAuthorization: B k\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (host.encode(), len(BODY), BODY))


@needs_httptools
def test_chunked_answer_streams_as_it_comes_and_connection_close_is_not_pooled():
    async def answer(conn, n, req, w):
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                b"Connection: close\r\n\r\n")
        for part in (b"data: a\n\n", b"data: b\n\n"):
            w.write(b"%x\r\n%s\r\n" % (len(part), part))
            await w.drain()
            await asyncio.sleep(0.05)
        w.write(b"0\r\n\r\n")
        return False

    async def main():
        s = Script(answer)
        base = await s.start()
        c = legs.LegClient()
        got = []
        for _ in range(2):
            r = await c.post(URL(base + "/x"), BODY, {}, read_timeout=5)
            assert r.content_length is None and r.headers["Transfer-Encoding"] == "chunked"
            got.append([chunk async for chunk in r.content.iter_any()])
            r.release()
        await c.close()
        await s.stop()
        return s, got

    s, got = run(main())
    assert got == [[b"data: a\n\n", b"data: b\n\n"]] * 2  # each chunk as it came, not batched at the end
    assert s.conns == 2  # "Connection: close" answers are not reused


@needs_httptools
def test_a_reused_connection_closed_before_answering_is_resent_once_on_a_new_one():
    async def answer(conn, n, req, w):
        if n == 2:  # the keep-alive expiry race: the backend drops the reused connection unanswered
            return False
        w.write(OK)
        return True

    async def main():
        s = Script(answer)
        base = await s.start()
        c = legs.LegClient()
        out = []
        for _ in range(2):
            r = await c.post(URL(base + "/x"), BODY, {}, read_timeout=5)
            out.append(await r.read())
            r.release()
        await c.close()
        await s.stop()
        return s, out

    s, out = run(main())
    assert out == [b'{"ok":true}'] * 2 and s.conns == 2 and len(s.requests) == 3


@needs_httptools
def test_a_new_connection_closed_before_answering_is_an_error_not_a_resend():
    async def answer(conn, n, req, w):
        return False

    async def main():
        s = Script(answer)
        base = await s.start()
        c = legs.LegClient()
        with pytest.raises(legs.BackendDisconnected) as ei:
            await c.post(URL(base + "/x"), BODY, {}, read_timeout=5)
        await c.close()
        await s.stop()
        return s, ei.value

    s, exc = run(main())
    assert len(s.requests) == 1 and describe_exc(exc) == "server disconnected"


@needs_httptools
def test_answer_cut_mid_body_silence_timeout_and_refused_connect():
    async def answer(conn, n, req, w):
        if conn == 1:
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
            return False
        await asyncio.sleep(3)  # silent
        return False

    async def main():
        s = Script(answer)
        base = await s.start()
        c = legs.LegClient(connect_timeout=2)
        r = await c.post(URL(base + "/x"), BODY, {}, read_timeout=5)
        with pytest.raises(legs.BackendDisconnected):
            await r.read()
        r.close()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(asyncio.TimeoutError):
            await c.post(URL(base + "/x"), BODY, {}, read_timeout=0.2)
        waited = loop.time() - t0
        await s.stop()
        s.server.close()
        await s.server.wait_closed()
        with pytest.raises(legs.BackendConnectError) as ei:
            await c.post(URL(base + "/x"), BODY, {}, read_timeout=5)
        await c.close()
        return waited, ei.value

    waited, exc = run(main())
    assert 0.2 <= waited < 2.5
    assert describe_exc(exc) == "connection refused" and isinstance(exc, ConnectionError)


@needs_httptools
def test_header_line_breaks_are_refused():
    async def main():
        c = legs.LegClient()
        with pytest.raises(ValueError, match="line break"):
            await c.post(URL("http://127.0.0.1:9/x"), BODY, {"X-A": "a\r\nX-Injected: 1"}, read_timeout=1)
        await c.close()

    run(main())


# --- codec and the decode body ---------------------------------------------------------


@pytest.mark.parametrize("loads,dumps", [(codec.std_loads, codec.std_dumps), (codec.loads, codec.dumps)],
                         ids=["json", "default"])
def test_codec_backends_agree(loads, dumps):
    value = {"a": [1, 2.5, None, True], "s": "é\u2028", "big": 2 ** 70, "n": {"x": {}}}
    assert loads(dumps(value)) == value
    assert dumps({"a": 1, "b": [1, 2]}) == b'{"a":1,"b":[1,2]}'
    assert loads(json.dumps({"k": "v"}).encode("utf-16")) == {"k": "v"}  # what json reads, both read
    with pytest.raises(ValueError):
        loads(b"{not json")


def test_decode_bytes_splice_is_the_same_value_as_the_re_encoded_body():
    kv = {"remote_engine_id": "p", "remote_block_ids": [[1, 2]]}
    raw = b'  {"model": "m", "prompt": "a}b", "n": 1}\n'
    body = json.loads(raw)
    out = decode_request_bytes(body, raw, kv)
    assert out == b'{"model": "m", "prompt": "a}b", "n": 1,"kv_transfer_params":' + codec.dumps(kv) + b"}"
    assert json.loads(out) == {**body, "kv_transfer_params": kv}
    assert decode_request_bytes(body, raw, None) is raw  # nothing to add: the client's bytes
    # re-encoded: the key already there, an empty object, UTF-16 text, no raw bytes
    for b, r in ((dict(body, kv_transfer_params={"x": 1}), json.dumps(dict(body, kv_transfer_params={"x": 1})).encode()),
                 ({}, b"{}"), (body, json.dumps(body).encode("utf-16-le")), (body, None)):
        out = decode_request_bytes(b, r, kv)
        assert json.loads(out) == {**b, "kv_transfer_params": kv} and out.startswith(b"{")
