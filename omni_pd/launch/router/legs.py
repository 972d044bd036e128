"""The router's backend legs: a lean keep-alive HTTP/1.1 client on httptools (llhttp).

Why not aiohttp's client here: a leg is one POST to a ``vllm serve`` we launched, and
aiohttp's :class:`~aiohttp.ClientSession` spends ~57 µs of CPU per request on generic
machinery (cookies, tracing, redirects, proxies, per-request objects) against ~17 µs for
this client on the same loop (``python bench/router_legs_micro.py``; bench/RESULTS.md,
"Router under load"). The parser is httptools (MagicStack's binding of Node's llhttp, the
one uvicorn runs vLLM's own server on; it comes with ``uvicorn[standard]``, so a vLLM
host has it). The client-facing server stays on aiohttp (arbitrary clients, limits,
chunked uploads); health probes and ``/v1/models`` stay on aiohttp's client (not hot).
Without httptools the router uses aiohttp's client for legs too (:func:`available`).

What it does: one request at a time per connection (no pipelining), connections kept
per (scheme, host, port) while the backend keeps them alive (``should_keep_alive``; an
idle one is dropped after :data:`IDLE_S`, under uvicorn's 5 s keep-alive default, and as
soon as the backend closes it); a request sent on a reused connection that the backend
closed before answering a byte is sent once more on a new connection (the race with a
keep-alive expiry); ``Content-Length`` and chunked answers (decoded by the parser);
reading paused above :data:`HIGH_WATER` bytes buffered until the relay catches up;
timeouts: connect, the longest silence of the backend (``sock_read``), none on the
whole answer (the caller bounds a leg with ``asyncio.timeout`` when asked to).

Errors (all :class:`OSError`, so the router's transport-error handling applies):
:class:`BackendConnectError` (cannot connect; ``os_error``), :class:`BackendDisconnected`
(the backend closed the connection before the answer ended), :class:`BackendProtocolError`
(an answer that is not HTTP/1.x), :class:`asyncio.TimeoutError` (connect or silence).
"""

from __future__ import annotations

import asyncio
import collections
import socket
import ssl as ssl_mod
from typing import Any, AsyncIterator, Mapping

from multidict import CIMultiDict
from yarl import URL

try:  # pragma: no cover - which branch runs depends on the environment
    import httptools
except ImportError:  # pragma: no cover
    httptools = None

#: seconds an idle pooled connection is kept (uvicorn closes idle ones after 5 s)
IDLE_S = 4.0
#: bytes buffered from a backend before reading from it pauses
HIGH_WATER = 256 * 1024


def available() -> bool:
    """True when httptools is importable (else the router's legs use aiohttp's client)."""
    return httptools is not None


class BackendConnectError(ConnectionError):
    """The backend could not be reached; ``os_error`` is the connect failure."""

    def __init__(self, os_error: OSError):
        super().__init__(os_error.errno, str(os_error))
        self.os_error = os_error


class BackendDisconnected(ConnectionError):
    """The backend closed the connection before its answer ended."""

    def __init__(self, detail: str = "server disconnected"):
        super().__init__(detail)


class BackendProtocolError(OSError):
    """The backend's answer is not valid HTTP/1.x."""


class _Stale(Exception):
    """A reused connection was closed before a byte of the answer came (resend once)."""


class _Conn(asyncio.Protocol):
    """One keep-alive connection; carries one request/answer at a time."""

    def __init__(self, client: "LegClient", key: tuple[str, str, int]):
        self.client, self.key = client, key
        self.transport: asyncio.Transport | None = None
        self.loop = client.loop
        self.parser = None
        self.lost = False
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.resp: LegResponse | None = None
        self.head: asyncio.Future | None = None
        self.got_bytes = False
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.complete = False
        self.keep_alive = False
        self.timer: asyncio.TimerHandle | None = None
        self.read_timeout: float | None = None
        self.last_read = 0.0

    # asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        self.last_read = self.loop.time()
        if self.parser is None:  # bytes while idle: the backend broke the protocol
            self.transport.abort()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # pragma: no cover - never asked for
            self._fail(BackendProtocolError("backend switched protocols"))
        except httptools.HttpParserError as exc:
            self._fail(BackendProtocolError(f"invalid HTTP answer: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.client._forget(self)
        if self.parser is not None and not self.complete:
            self._fail(_Stale() if not self.got_bytes else BackendDisconnected())

    def pause_writing(self) -> None:  # pragma: no cover - request bodies are written at once
        pass

    def resume_writing(self) -> None:  # pragma: no cover
        pass

    # httptools callbacks --------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if 100 <= self.status < 200:  # an interim answer: the real one follows
            self.raw_headers = []
            return
        headers = CIMultiDict((n.decode("latin-1"), v.decode("latin-1")) for n, v in self.raw_headers)
        self.resp = LegResponse(self, self.status, headers)
        if self.head is not None and not self.head.done():
            self.head.set_result(self.resp)

    def on_body(self, body: bytes) -> None:
        resp = self.resp
        if resp is None:
            return
        resp._chunks.append(body)
        resp._buffered += len(body)
        if resp._buffered > HIGH_WATER and not resp._paused:
            resp._paused = True
            self.transport.pause_reading()
        resp._wake()

    def on_message_complete(self) -> None:
        if self.resp is None:  # end of an interim (1xx) answer
            return
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()  # llhttp forgets it once the next message starts
        self._stop_timer()
        self.resp._wake()

    # request ----------------------------------------------------------------------------
    def send(self, data: bytes, read_timeout: float | None) -> asyncio.Future:
        self.parser = httptools.HttpResponseParser(self)
        self.head = self.loop.create_future()
        self.read_timeout = read_timeout
        self.last_read = self.loop.time()
        if read_timeout is not None:
            self.timer = self.loop.call_at(self.last_read + read_timeout, self._check_silence)
        self.transport.write(data)
        return self.head

    def _check_silence(self) -> None:
        self.timer = None
        due = self.last_read + self.read_timeout
        if self.loop.time() < due:
            self.timer = self.loop.call_at(due, self._check_silence)
            return
        self._fail(asyncio.TimeoutError())
        self.transport.abort()

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _fail(self, exc: BaseException) -> None:
        self._stop_timer()
        if self.head is not None and not self.head.done():
            self.head.set_exception(exc)
        elif self.resp is not None:
            self.resp._error = exc if not isinstance(exc, _Stale) else BackendDisconnected()
            self.resp._wake()
        if self.transport is not None:
            self.transport.abort()

    def finish(self, reuse: bool) -> None:
        """The answer was consumed (or abandoned): back to the pool or closed."""
        self._stop_timer()
        keep = reuse and self.complete and self.keep_alive and not self.lost
        self.parser = None
        self._reset()
        if keep:
            self.client._release(self)
        elif self.transport is not None:
            self.transport.abort()


class LegResponse:
    """A backend's answer: ``status``, ``headers`` (case-insensitive), ``url``, the body
    by :meth:`read` or :meth:`iter_any`; end with :meth:`release` (connection kept when
    the answer was read to its end) or :meth:`close` (connection dropped: the backend
    sees the client leave). The names follow :class:`aiohttp.ClientResponse`."""

    def __init__(self, conn: _Conn, status: int, headers: CIMultiDict):
        self._conn, self.status, self.headers = conn, status, headers
        self.url: URL = URL()
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future | None = None
        self._error: BaseException | None = None
        self._done = False

    @property
    def content_length(self) -> int | None:
        value = self.headers.get("Content-Length")
        return int(value) if value is not None and value.isdigit() else None

    @property
    def content(self) -> "LegResponse":
        """``resp.content.iter_any()`` as on aiohttp."""
        return self

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _take(self) -> bytes:
        data = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        if self._paused:
            self._paused = False
            self._conn.transport.resume_reading()
        return data

    async def _wait(self) -> None:
        self._waiter = self._conn.loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def readany(self) -> bytes:
        """Every body byte buffered so far, waiting for some if none is; ``b""`` at the end.
        Raises the leg's error once the buffered bytes are taken."""
        conn = self._conn
        while True:
            if self._chunks:
                return self._take()
            if self._error is not None:
                raise self._error
            if conn.complete:
                return b""
            await self._wait()

    async def iter_any(self) -> AsyncIterator[bytes]:
        """The body as it arrives (every chunk buffered so far at each step)."""
        while True:
            chunk = await self.readany()
            if not chunk:
                return
            yield chunk

    async def read(self) -> bytes:
        """The whole body. Raises the leg's error (BackendDisconnected, TimeoutError)."""
        conn = self._conn
        while not conn.complete:
            if self._error is not None:
                raise self._error
            await self._wait()
        return self._take() if self._chunks else b""

    def release(self) -> None:
        """Done with the answer: the connection goes back to the pool if the answer ended."""
        if not self._done:
            self._done = True
            self._conn.finish(reuse=True)

    def close(self) -> None:
        """Drop the connection now (an unfinished answer: the backend aborts the request)."""
        if not self._done:
            self._done = True
            self._conn.finish(reuse=False)


class LegClient:
    """Pooled keep-alive POSTs to backends (one event loop). :meth:`post` returns a
    :class:`LegResponse` with the status and headers read and the body unread."""

    def __init__(self, *, connect_timeout: float = 5.0, user_agent: str = "omni-pd-router"):
        self.loop = asyncio.get_running_loop()
        self.connect_timeout = connect_timeout
        self.user_agent = user_agent.encode()
        self._idle: dict[tuple[str, str, int], list[_Conn]] = {}
        self._open: set[_Conn] = set()
        self._ssl: ssl_mod.SSLContext | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._heads: dict[tuple[str, str, int, str], bytes] = {}

    async def post(self, url: URL, body: bytes, headers: Mapping[str, str], *,
                   read_timeout: float | None) -> LegResponse:
        """POST ``body`` (JSON bytes) to ``url`` with ``headers`` (str values; CR/LF
        refused with ValueError). Raises BackendConnectError, BackendDisconnected,
        BackendProtocolError, asyncio.TimeoutError."""
        key = (url.scheme, url.raw_host, url.port)
        path = url.raw_path_qs
        hk = key + (path,)
        head = self._heads.get(hk)
        if head is None:
            host = url.raw_host if ":" not in url.raw_host else f"[{url.raw_host}]"
            head = self._heads[hk] = (f"POST {path} HTTP/1.1\r\nHost: {host}:{url.port}\r\n".encode()
                                      + b"User-Agent: " + self.user_agent
                                      + b"\r\nAccept: */*\r\nContent-Type: application/json\r\n")
        parts = [head]
        for name, value in headers.items():
            if name.lower() == "content-type":
                continue
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                raise ValueError(f"header {name!r} has a line break")
            parts.append(f"{name}: {value}\r\n".encode("utf-8", "surrogateescape"))
        parts.append(b"Content-Length: %d\r\n\r\n" % len(body))
        parts.append(body)
        data = b"".join(parts)
        for attempt in (0, 1):
            conn, reused = await self._acquire(key)
            try:
                resp = await conn.send(data, read_timeout)
            except _Stale:
                if reused and attempt == 0:
                    continue
                raise BackendDisconnected() from None
            except BaseException:
                conn.finish(reuse=False)
                raise
            resp.url = url
            return resp
        raise AssertionError("unreachable")  # pragma: no cover

    async def _acquire(self, key: tuple[str, str, int]) -> tuple[_Conn, bool]:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.lost and not conn.transport.is_closing():
                return conn, True
        scheme, host, port = key
        ssl = None
        if scheme == "https":
            if self._ssl is None:
                self._ssl = ssl_mod.create_default_context()
            ssl = self._ssl
        try:
            _, conn = await asyncio.wait_for(
                self.loop.create_connection(lambda: _Conn(self, key), host, port, ssl=ssl),
                self.connect_timeout)
        except OSError as exc:
            raise BackendConnectError(exc) from None
        self._open.add(conn)
        return conn, False

    def _release(self, conn: _Conn) -> None:
        conn.idle_since = self.loop.time()
        self._idle.setdefault(conn.key, []).append(conn)
        if self._sweeper is None:
            self._sweeper = self.loop.call_later(IDLE_S, self._sweep)

    def _forget(self, conn: _Conn) -> None:
        """A connection closed (by either side): out of the open set and the idle pool."""
        self._open.discard(conn)
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    def _sweep(self) -> None:
        """Close connections idle for more than :data:`IDLE_S`."""
        self._sweeper = None
        cutoff = self.loop.time() - IDLE_S
        for key, conns in list(self._idle.items()):
            keep = []
            for c in conns:
                if c.lost:
                    continue
                if c.idle_since < cutoff:
                    c.transport.close()
                else:
                    keep.append(c)
            self._idle[key] = keep
        if any(self._idle.values()):
            self._sweeper = self.loop.call_later(IDLE_S, self._sweep)

    async def close(self) -> None:
        """Close every connection."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conn in list(self._open):
            if conn.transport is not None:
                conn.transport.abort()
        self._open.clear()
        self._idle.clear()

    def state(self) -> dict[str, Any]:
        """Open and idle connection counts (for ``/health``)."""
        return {"open": len(self._open), "idle": sum(len(v) for v in self._idle.values())}
