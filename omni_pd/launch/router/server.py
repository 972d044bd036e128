"""The router's HTTP front: aiohttp's low-level server on one event loop.

:class:`Front` maps the routes to a :class:`~.core.PDRouter`; :class:`RouterServer`
binds the listening socket up front (so a taken port fails before anything starts) and
serves the app on its own event loop, from a thread or from ``main``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from typing import Any, Awaitable, Mapping

import aiohttp
from aiohttp import web

import omni_pd.launch.router.codec as codec
from omni_pd.launch.router.backends import _host_for_url
from omni_pd.launch.router.core import LegError, PDRouter, describe_exc, error_payload

log = logging.getLogger("omni_pd.router")

#: largest request body accepted, bytes (multimodal requests carry base64 media)
MAX_BODY_BYTES = 256 * 1024 * 1024
#: routes that run the two-leg PD flow
GENERATE_ROUTES = ("/v1/completions", "/v1/chat/completions")
#: response headers of D relayed to the client
RELAYED_HEADERS = ("Content-Type", "Content-Encoding", "Cache-Control")
#: listen backlog (socketserver's default is 5: bursts of connects overflow it)
LISTEN_BACKLOG = 4096
#: seconds an idle client keep-alive connection is kept
CLIENT_KEEPALIVE_S = 75.0


def _json_response(status: int, obj: Any, headers: Mapping[str, str] | None = None) -> web.Response:
    resp = web.Response(status=status, body=codec.dumps(obj), headers=headers)
    resp.content_type = "application/json"
    return resp


def _error_response(err: LegError, extra: Mapping[str, str] | None = None) -> web.Response:
    headers = {**{k: v for k, v in err.headers.items() if k.lower() != "content-type"}, **(extra or {})}
    if err.raw is not None:
        ctype = err.headers.get("Content-Type", "application/json")
        resp = web.Response(status=err.status, body=err.raw, headers=headers)
        resp.headers["Content-Type"] = ctype
        return resp
    return _json_response(err.status, err.payload, headers)


class _Admission:
    """Bounded concurrency: at most ``limit`` generation requests in flight; the next one
    gets 503 with ``Retry-After`` (seconds) at once instead of queueing without bound."""

    def __init__(self, limit: int, retry_after_s: int = 1):
        self.limit, self.retry_after_s, self.inflight, self.rejected = limit, retry_after_s, 0, 0


class Front:
    """The router's request handler on aiohttp's low-level server (:class:`aiohttp.web.Server`:
    no application router, middleware or signals on the hot path; the routes are three
    string compares). POST :data:`GENERATE_ROUTES` run the P/D legs, GET ``/health`` and
    GET ``/v1/models``; every other route or method is a JSON 404/405. ``max_concurrency``:
    generation requests in flight before 503 + ``Retry-After``."""

    def __init__(self, router: PDRouter, *, max_concurrency: int = 1024):
        self.router = router
        self.admission = _Admission(max_concurrency)

    def __call__(self, request: web.BaseRequest) -> Awaitable[web.StreamResponse]:
        """The awaitable of the route's handler (aiohttp awaits it). A plain function, not a
        coroutine: the handler's coroutine goes to aiohttp as it is, so the route choice adds
        no frame that every resume of a request would pass through."""
        path, method = request.path, request.method
        if path in GENERATE_ROUTES and method == "POST":
            return self.generate(request, path)
        if path == "/health" and method in ("GET", "HEAD"):
            return self.health()
        if path == "/v1/models" and method in ("GET", "HEAD"):
            return self.models(request)
        return self.refuse(path, method)

    @staticmethod
    async def refuse(path: str, method: str) -> web.Response:
        """JSON 405 for a method the router never serves, else JSON 404 for an unknown route."""
        if method not in ("GET", "POST", "HEAD"):
            return _json_response(405, error_payload(405, f"method {method} not allowed",
                                                     err_type="invalid_request_error"))
        return _json_response(404, error_payload(
            404, f"no route {path}; the router serves POST {', '.join(GENERATE_ROUTES)}, "
                 "GET /health, GET /v1/models", err_type="not_found"))

    async def health(self) -> web.Response:
        status, body = await self.router.health()
        body["inflight"], body["rejected"] = self.admission.inflight, self.admission.rejected
        body["json"] = codec.BACKEND
        return _json_response(status, body)

    async def models(self, request: web.BaseRequest) -> web.Response:
        try:
            status, data, ctype = await self.router.models(request.headers.get("Authorization"))
        except LegError as err:
            return _error_response(err)
        resp = web.Response(status=status, body=data)
        resp.headers["Content-Type"] = ctype
        return resp

    async def generate(self, request: web.BaseRequest, path: str) -> web.StreamResponse:
        admission, router = self.admission, self.router
        if admission.inflight >= admission.limit:
            admission.rejected += 1
            return _json_response(503, error_payload(
                503, f"router at its concurrency limit ({admission.limit} requests in flight); retry",
                err_type="service_unavailable"), {"Retry-After": str(admission.retry_after_s)})
        admission.inflight += 1
        t0 = time.monotonic()
        rid, target, inst, resp, outcome, status = "-", None, None, None, "ok", 0
        try:
            try:
                raw, body = await _read_json(request)
                ctx, target, inst, resp = await router.dispatch(path, body, request.headers.get("Authorization"),
                                                                raw=raw)
                rid = ctx.request_id
            except LegError as err:
                status = err.status
                outcome = err.payload.get("error", {}).get("message", "") if err.payload else "prefill 4xx"
                return _error_response(err)
            status = resp.status
            out, outcome = await _relay(request, resp, rid, router.final)
            router.finish_decode(inst, resp, ok=outcome == "ok")
            inst = None
            return out
        except asyncio.CancelledError:
            outcome = "client gone"
            raise
        except Exception as exc:  # noqa: BLE001 - never a traceback to the client
            outcome = type(exc).__name__
            log.error("internal router error: %s", describe_exc(exc), exc_info=bool(os.environ.get("OMNI_PD_DEBUG")))
            status = 500
            return _json_response(500, error_payload(500, f"internal router error ({type(exc).__name__})",
                                                     err_type="internal_error"))
        finally:
            if inst is not None:
                router.finish_decode(inst, resp, ok=False)
            admission.inflight -= 1
            if log.isEnabledFor(logging.INFO):
                log.info("POST %s rid=%s prefill=%s decode=%s -> %s %s (%.3f s)", path, rid,
                         target.describe() if target else "-", inst.url if inst else (
                             "-" if resp is None else str(resp.url.origin())),
                         status, outcome, time.monotonic() - t0)


def _make_request(message, payload, protocol, writer, task) -> web.BaseRequest:
    """aiohttp's request factory with the router's body limit (:data:`MAX_BODY_BYTES`)."""
    return web.BaseRequest(message, payload, protocol, writer, task, asyncio.get_running_loop(),
                           client_max_size=MAX_BODY_BYTES)


async def _read_json(request: web.BaseRequest) -> tuple[bytes, dict[str, Any]]:
    """The request body: (bytes, its JSON object) (Content-Length or chunked). Raises
    LegError 400/413."""
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise LegError(413, error_payload(413, f"request body must be at most {MAX_BODY_BYTES} bytes",
                                          err_type="invalid_request_error")) from None
    try:
        body = codec.loads(raw)
    except ValueError as exc:
        raise LegError(400, error_payload(400, f"request body is not valid JSON: {exc}",
                                          err_type="invalid_request_error")) from None
    if not isinstance(body, dict):
        raise LegError(400, error_payload(400, "request body must be a JSON object",
                                          err_type="invalid_request_error"))
    return raw, body


async def _relay(request: web.BaseRequest, resp: aiohttp.ClientResponse,
                 request_id: str, leg: str = "decode") -> tuple[web.StreamResponse, str]:
    """Relay D's answer (its :data:`RELAYED_HEADERS` and ``X-Request-Id``): with a
    Content-Length as one block, else chunk by chunk as D produces it. Returns (response,
    outcome): "ok", "client gone" (the client's connection closed before the answer's end:
    nothing to report, the request is over), or "backend error" (D's stream cut short: the
    client's connection is closed with the stream unterminated, so it sees an error rather
    than a clean end).
    ``leg``: the answering pool's name in errors and logs (``pd`` without a P/D split)."""
    src = resp.headers
    out_headers = {name: src[name] for name in RELAYED_HEADERS if name in src}
    out_headers["X-Request-Id"] = request_id
    if resp.content_length is not None and "Transfer-Encoding" not in src:
        try:
            data = await resp.read()
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            log.warning("%s %s: body read failed: %s", leg, resp.url.origin(), describe_exc(exc))
            return _json_response(502, error_payload(
                502, f"{leg} backend {resp.url.origin()} failed: {describe_exc(exc)}",
                err_type="bad_gateway", backend=str(resp.url.origin()), leg=leg)), "backend error"
        return web.Response(status=resp.status, body=data, headers=out_headers), "ok"
    out = web.StreamResponse(status=resp.status, headers=out_headers)
    if request.version >= aiohttp.HttpVersion11:
        out.enable_chunked_encoding()
    try:
        await out.prepare(request)
    except ConnectionError:  # the client left before the headers: "Cannot write to closing transport"
        return out, "client gone"
    read = resp.content.readany
    try:
        while chunk := await read():
            try:
                await out.write(chunk)
            except ConnectionError:
                return out, "client gone"
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
        log.warning("%s %s: stream cut short: %s", leg, resp.url.origin(), describe_exc(exc))
        if request.transport is not None:
            request.transport.abort()
        return out, "backend error"
    try:
        await out.write_eof()
    except ConnectionError:  # the client left as the stream ended (its RST read, the handler not yet cancelled)
        return out, "client gone"
    return out, "ok"


def loop_factory():
    """uvloop's event loop when installed (vLLM depends on it, so a vLLM host has it;
    ``pip install 'omni-pd[router]'`` elsewhere), else asyncio's default."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run_loop(coro) -> None:
    """Run ``coro`` to completion on a fresh event loop (:func:`loop_factory`)."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(coro)


class RouterServer:
    """The router bound to ``address`` (the socket is bound here: OSError when taken),
    served by :meth:`serve_forever` on a fresh event loop in the calling thread, stopped
    by :meth:`shutdown` from any thread. ``server_address`` is the bound (host, port)."""

    def __init__(self, address: tuple[str, int], router: PDRouter, *, max_concurrency: int = 1024,
                 backlog: int = LISTEN_BACKLOG):
        host, port = address
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
        except OSError:
            sock.close()
            raise
        self._sock, self.router, self.backlog = sock, router, backlog
        self.max_concurrency = max_concurrency
        self.server_address = sock.getsockname()[:2]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started, self._done = threading.Event(), threading.Event()

    @property
    def url(self) -> str:
        """``http://host:port`` the server listens on (the real port when 0 was asked)."""
        host, port = self.server_address[:2]
        return f"http://{_host_for_url(host)}:{port}"

    def serve_forever(self, poll_interval: float | None = None) -> None:
        """Serve until :meth:`shutdown` (``poll_interval``: accepted and ignored)."""
        try:
            run_loop(self.serve())
        finally:
            self._done.set()

    async def serve(self, on_started=None) -> None:
        """Serve on the running loop until :meth:`shutdown` / :meth:`request_stop`."""
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        await self.router.start()
        front = Front(self.router, max_concurrency=self.max_concurrency)
        low = web.Server(front, request_factory=_make_request, handler_cancellation=True, access_log=None,
                         keepalive_timeout=CLIENT_KEEPALIVE_S)
        runner = web.ServerRunner(low, shutdown_timeout=1.0)
        await runner.setup()
        site = web.SockSite(runner, self._sock, backlog=self.backlog)
        try:
            await site.start()
            self._started.set()
            if on_started is not None:
                on_started()
            await self._stop.wait()
        finally:
            await runner.cleanup()
            await self.router.aclose()

    def request_stop(self) -> None:
        """Ask the serving loop to stop (thread-safe; returns at once)."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    def shutdown(self) -> None:
        """Stop serving and wait until the loop has finished (call from another thread)."""
        if not self._started.wait(5):
            return
        self.request_stop()
        self._done.wait(10)

    def server_close(self) -> None:
        """Close the listening socket."""
        self._sock.close()
