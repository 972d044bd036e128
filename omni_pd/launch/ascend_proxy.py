"""vllm-ascend's layerwise push protocol (``MooncakeLayerwiseConnector``) as a router.

With the layerwise connector prefill *pushes* KV layer by layer into blocks decode has
already allocated, so a request goes to decode first:

1. The client's request goes to a decode instance with ``kv_transfer_params =
   {"do_remote_decode": false, "do_remote_prefill": true, "metaserver":
   "http://<router>/v1/metaserver"}`` and header ``X-Request-Id: <id>``.
2. Decode's scheduler allocates the blocks and POSTs its ``kv_transfer_params`` to the
   metaserver URL: ``request_id`` (vLLM's request id without its 9-character suffix:
   ``cmpl-<id>-0`` for ``/v1/completions``, ``chatcmpl-<id>`` for chat),
   ``do_remote_decode: true``, ``remote_block_ids``, ``remote_engine_id``,
   ``remote_host``, ``remote_port``, ``remote_tp_size`` ... (:data:`METASERVER_FIELDS`).
3. The router's ``POST /v1/metaserver`` finds the request, picks a prefill instance and
   sends it the client's body with decode's message as ``kv_transfer_params``,
   ``stream: false``, ``max_tokens: 1``, ``min_tokens: 1`` (``max_completion_tokens: 1``
   when present), no ``stream_options``, same ``X-Request-Id`` (seed 004 step 4).
4. Prefill pushes the KV; decode generates; its answer (JSON or SSE) is relayed.

Failures: a metaserver call that does not come within ``metaserver_timeout`` seconds
gives **504** naming the decode instance; a prefill leg that fails (transport error,
5xx, a dropped connection mid-transfer) gives **502** naming the prefill instance; in
both cases decode's request is cancelled (its connection closed: vLLM aborts it, freeing
the blocks that wait for KV). A metaserver message missing a field vllm-ascend sends, or
for an unknown request, gets 400 (decode logs it and the client gets the 504 above).

Facts: presets/targets/vllm_ascend.yaml ``rules.push_protocol`` and ``extracted.*``
(vllm-ascend 0.23.0.post1 examples/disaggregated_prefill_v1/
load_balance_proxy_layerwise_server_example.py ``_handle_completions``, ``metaserver``,
``send_request_to_service``; kv_p2p/mooncake_layerwise_connector.py
``update_state_after_alloc``, ``get_external_request_id``).

This module is the protocol on its own (an aiohttp app, :func:`build_app`); the PD router
(:mod:`omni_pd.launch.router`) serves it for ``--connector MooncakeLayerwiseConnector``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import aiohttp
from aiohttp import web

log = logging.getLogger("omni_pd.router.ascend")

METASERVER_PATH = "/v1/metaserver"
GENERATE_ROUTES = ("/v1/completions", "/v1/chat/completions")
#: keys decode posts to the metaserver (vllm-ascend 0.23.0.post1 mooncake_layerwise_connector.py:953)
METASERVER_FIELDS = ("token_ids", "request_id", "do_remote_prefill", "do_remote_decode", "remote_block_ids",
                     "remote_block_size", "remote_engine_id", "remote_host", "remote_port", "remote_tp_size",
                     "remote_pcp_size", "remote_dcp_size", "remote_cached_tokens")


def api_request_id(path: str, request_id: str) -> str:
    """The ``request_id`` decode reports for ``X-Request-Id: request_id`` on ``path``:
    ``cmpl-<id>-0`` (completions) or ``chatcmpl-<id>`` (chat). Raises ValueError otherwise."""
    if path == "/v1/completions":
        return f"cmpl-{request_id}-0"
    if path == "/v1/chat/completions":
        return f"chatcmpl-{request_id}"
    raise ValueError(f"not a generation route: {path}")


def decode_body(body: Mapping[str, Any], metaserver_url: str) -> dict[str, Any]:
    """The client's body for decode, with the push-protocol ``kv_transfer_params``."""
    out = dict(body)
    out["kv_transfer_params"] = {"do_remote_decode": False, "do_remote_prefill": True, "metaserver": metaserver_url}
    return out


def prefill_body(body: Mapping[str, Any], kv_transfer_params: Mapping[str, Any]) -> dict[str, Any]:
    """The client's body for prefill: decode's metaserver message as ``kv_transfer_params``,
    one token (``max_tokens``/``min_tokens`` 1, ``max_completion_tokens`` 1 when present),
    ``stream`` false, no ``stream_options``."""
    out = dict(body)
    out["kv_transfer_params"] = dict(kv_transfer_params)
    out["stream"] = False
    out["max_tokens"] = 1
    out["min_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out.pop("stream_options", None)
    return out


def missing_fields(message: Any) -> list[str]:
    """The :data:`METASERVER_FIELDS` a metaserver message lacks (all of them if not a dict)."""
    if not isinstance(message, dict):
        return list(METASERVER_FIELDS)
    return [k for k in METASERVER_FIELDS if k not in message]


def _error(status: int, message: str, **extra: Any) -> web.Response:
    payload = {"error": {"message": message, "type": "bad_gateway" if status >= 500 else "invalid_request_error",
                         "code": status, **extra}}
    return web.Response(status=status, body=json.dumps(payload).encode(), content_type="application/json")


@dataclass
class _Pending:
    path: str
    body: dict[str, Any]
    headers: dict[str, str]
    decode: str
    metaserver_called: asyncio.Event = field(default_factory=asyncio.Event)
    prefill_failed: asyncio.Future | None = None
    prefill: str | None = None


class PushProxy:
    """The push-protocol router: ``prefills``/``decodes`` are base URLs
    (``http://host:port``), taken in turn. ``public_url``: the router's address as decode
    reaches it (the metaserver URL is ``public_url + /v1/metaserver``). Timeouts in
    seconds: ``metaserver_timeout`` (decode's call), ``prefill_timeout`` (the prefill leg)."""

    def __init__(self, prefills: Sequence[str], decodes: Sequence[str], public_url: str, *,
                 metaserver_timeout: float = 30.0, prefill_timeout: float = 600.0):
        if not prefills or not decodes:
            raise ValueError("the push protocol needs at least one prefill and one decode URL")
        self.prefills, self.decodes = [u.rstrip("/") for u in prefills], [u.rstrip("/") for u in decodes]
        self.metaserver_url = public_url.rstrip("/") + METASERVER_PATH
        self.metaserver_timeout, self.prefill_timeout = metaserver_timeout, prefill_timeout
        self._p, self._d = itertools.cycle(self.prefills), itertools.cycle(self.decodes)
        self.pending: dict[str, _Pending] = {}
        self.session: aiohttp.ClientSession | None = None

    async def start(self, _app: web.Application | None = None) -> None:
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))

    async def close(self, _app: web.Application | None = None) -> None:
        if self.session is not None:
            await self.session.close()

    # POST /v1/completions, /v1/chat/completions -----------------------------------------
    async def generate(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object")
        rid = str(uuid.uuid4())
        headers = {"X-Request-Id": rid}
        if request.headers.get("Authorization") is not None:
            headers["Authorization"] = request.headers["Authorization"]
        decode = next(self._d)
        pend = _Pending(request.path, body, headers, decode, prefill_failed=asyncio.get_running_loop().create_future())
        key = api_request_id(request.path, rid)
        self.pending[key] = pend
        assert self.session is not None
        d_task = asyncio.create_task(self.session.post(
            decode + request.path, json=decode_body(body, self.metaserver_url), headers=headers))
        try:
            called = asyncio.create_task(pend.metaserver_called.wait())
            done, _ = await asyncio.wait({called, d_task}, timeout=self.metaserver_timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
            if not done:
                called.cancel()
                return _error(504, f"decode {decode} did not call the metaserver within {self.metaserver_timeout:g} s "
                                   "(is it a MooncakeLayerwiseConnector kv_consumer?)", backend=decode, leg="decode")
            if d_task in done and not pend.metaserver_called.is_set():
                called.cancel()
                return await self._decode_answer(request, d_task, pend)  # an error answered before any KV wait
            done, _ = await asyncio.wait({pend.prefill_failed, d_task}, return_when=asyncio.FIRST_COMPLETED)
            if pend.prefill_failed in done:
                return _error(502, f"prefill {pend.prefill} failed: {pend.prefill_failed.result()}",
                              backend=pend.prefill, leg="prefill")
            return await self._decode_answer(request, d_task, pend)
        finally:
            self.pending.pop(key, None)
            if not d_task.done():
                d_task.cancel()
            elif not d_task.cancelled() and d_task.exception() is None:
                d_task.result().close()

    async def _decode_answer(self, request: web.Request, d_task: asyncio.Task, pend: _Pending) -> web.StreamResponse:
        try:
            resp = d_task.result()
        except (aiohttp.ClientError, OSError) as exc:
            return _error(502, f"decode {pend.decode} failed: {exc}", backend=pend.decode, leg="decode")
        out = web.StreamResponse(status=resp.status)
        out.content_type = resp.content_type
        await out.prepare(request)
        try:
            async for chunk in resp.content.iter_any():
                await out.write(chunk)
        except (aiohttp.ClientError, OSError) as exc:
            log.warning("decode %s dropped the answer: %s", pend.decode, exc)
        await out.write_eof()
        return out

    # POST /v1/metaserver ------------------------------------------------------------------
    async def metaserver(self, request: web.Request) -> web.Response:
        try:
            msg = await request.json()
        except ValueError:
            msg = None
        missing = missing_fields(msg)
        if missing:
            log.error("metaserver call without %s", ", ".join(missing))
            return _error(400, f"metaserver message lacks {', '.join(missing)}")
        pend = self.pending.get(str(msg["request_id"]))
        if pend is None:
            return _error(400, f"unknown request_id {msg['request_id']!r}")
        pend.metaserver_called.set()
        pend.prefill = next(self._p)
        asyncio.create_task(self._prefill_leg(pend, msg))
        return web.json_response({})

    async def _prefill_leg(self, pend: _Pending, msg: dict[str, Any]) -> None:
        assert self.session is not None and pend.prefill_failed is not None
        why = None
        try:
            async with self.session.post(pend.prefill + pend.path, json=prefill_body(pend.body, msg),
                                         headers=pend.headers,
                                         timeout=aiohttp.ClientTimeout(total=self.prefill_timeout)) as resp:
                raw = await resp.read()
                if resp.status >= 300:
                    why = f"HTTP {resp.status}: {raw[:300].decode('utf-8', 'replace')}"
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if why is not None and not pend.prefill_failed.done():
            log.warning("prefill %s failed: %s", pend.prefill, why)
            pend.prefill_failed.set_result(why)

    async def health(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "connector": "MooncakeLayerwiseConnector",
                                  "prefill_instances": len(self.prefills), "decode_instances": len(self.decodes),
                                  "pending": len(self.pending)})


def build_app(proxy: PushProxy) -> web.Application:
    """The aiohttp application: the generation routes, ``POST /v1/metaserver``, ``GET /health``."""
    app = web.Application()
    for path in GENERATE_ROUTES:
        app.router.add_post(path, proxy.generate)
    app.router.add_post(METASERVER_PATH, proxy.metaserver)
    app.router.add_get("/health", proxy.health)
    app.on_startup.append(proxy.start)
    app.on_cleanup.append(proxy.close)
    return app


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m omni_pd.launch.router --connector MooncakeLayerwiseConnector --port 8000
    --prefill URL ... --decode URL ... [--public-url http://<this host>:8000]``: serve the
    push protocol until SIGINT/SIGTERM. Exit 2 on bad usage, 1 when the port is taken."""
    import argparse
    import socket
    import sys

    p = argparse.ArgumentParser(prog="omni-pd router (MooncakeLayerwiseConnector)")
    p.add_argument("--connector", default="MooncakeLayerwiseConnector")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--prefill", action="append", default=[], help="prefill base URL (repeat)")
    p.add_argument("--decode", action="append", default=[], help="decode base URL (repeat)")
    p.add_argument("--public-url", default=None,
                   help="the router's URL as decode reaches it (default http://HOST:PORT; decode calls <it>/v1/metaserver)")
    p.add_argument("--metaserver-timeout", type=float, default=30.0)
    p.add_argument("--prefill-timeout", type=float, default=600.0)
    ns, _unknown = p.parse_known_args(argv)
    if ns.connector.lower() != "mooncakelayerwiseconnector":
        p.error(f"--connector {ns.connector}: this front serves MooncakeLayerwiseConnector only")
    if not ns.prefill or not ns.decode:
        p.error("give at least one --prefill and one --decode")
    if not 0 <= ns.port <= 65535:  # bind() would raise OverflowError, not OSError
        p.error(f"--port {ns.port} is outside 0..65535")
    for url in (*ns.prefill, *ns.decode):
        if not url.startswith(("http://", "https://")):
            p.error(f"{url}: expected a base URL such as http://10.0.0.1:8100")
    if ns.host in ("0.0.0.0", "::") and ns.public_url is None:
        p.error("--host binds every address: give --public-url, the address decode instances reach this router at")
    public = ns.public_url or f"http://{ns.host}:{ns.port}"
    sock = socket.socket(socket.AF_INET6 if ":" in ns.host else socket.AF_INET)
    try:
        sock.bind((ns.host, ns.port))
    except OSError as exc:
        print(f"error: cannot listen on {ns.host}:{ns.port}: {exc}", file=sys.stderr)
        return 1
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    proxy = PushProxy(ns.prefill, ns.decode, public, metaserver_timeout=ns.metaserver_timeout,
                      prefill_timeout=ns.prefill_timeout)
    web.run_app(build_app(proxy), sock=sock, print=None)
    return 0
