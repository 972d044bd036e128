"""Router CPU per request: omni-pd's router against the floor of its own stack (a bare
aiohttp two-leg proxy) and against vllm-router, JSON and streaming, in one run.

    python bench/router_cpu.py                       # c=256, 3 rounds, JSON and stream
    python bench/router_cpu.py --profile DIR         # the Python kinds under cProfile (CPU clock)
    python bench/router_cpu.py --baseline DIR        # + the router of an older tree, side by side
    python bench/router_cpu.py log-line              # CPU of the per-request INFO log line
    python bench/router_cpu.py micro [DIR]           # request id and pick CPU, DIR's tree and this one
    python bench/router_cpu.py --kinds bare,bare-pyreqwest,bare-wreq,vllm-router --leave
                                                     # the floor on compiled leg clients (below)

Throughput on this shared 2-core machine moves with whatever else runs; the CPU time a
router process spends per request moves much less. So each kind serves the same closed
loop load (``--concurrency`` clients, ``--duration`` s, the fakes and client of
``bench/router_load.py``: P 20 ms, D 50 ms JSON or 32 SSE chunks 5 ms apart) and the
router process's CPU time (user + system, psutil, the process tree) is divided by the
requests it answered. Kinds run in turn, ``--rounds`` times, order rotated; min and median
over the rounds are reported, and the median of each round's difference to ``bare`` and to
``vllm-router`` (the kinds of a round ran back to back). ``--leave`` first checks what a
proxy must also do: a client that leaves during the prefill leg or mid-stream frees the
backend's work (router_load.py's fault check); decode's ``kv_transfer_params`` are checked
on every request (``kv_bad``).

Kinds:

* ``bare``: the floor of this stack, :func:`bare_proxy`: the same aiohttp primitives as the
  router (``web.Server`` low-level server with handler cancellation, one ``ClientSession``
  on one ``TCPConnector`` configured like ``PDRouter.start``, bytes bodies, a ``yarl.URL``
  parsed once, uvloop, orjson) and the minimum a correct NIXL proxy does per request:
  parse the client's body, POST P a prefill body (max_tokens 1, stream false,
  kv_transfer_params), parse P's answer, POST D the client's bytes with P's
  kv_transfer_params spliced in, relay D's answer (one block, or chunk by chunk). No
  request id, picking, retry, admission, timeouts per leg, error mapping or logging.
  ``bare-timeouts``: the same with the router's per-leg ``ClientTimeout`` (connect 5 s,
  socket read 3600 s), the one piece of per-request configuration aiohttp itself pays for.
* ``bare-<client>``: the same proxy and front, its two legs on another well-kept HTTP
  client (:data:`LEG_CLIENTS`; each a :class:`Legs` subclass, the NIXL contract shared in
  :meth:`Legs.two_legs`): ``pyreqwest`` and ``pyqwest`` (Rust reqwest/hyper), ``wreq``
  (Rust, a hyper fork), ``curl`` (curl_cffi's asyncio session on libcurl's multi
  interface). ``bare-granian[-<client>]``: granian's RSGI server as the front instead
  (:func:`rsgi_app`; one worker, one runtime thread, uvloop). ``-timeouts`` after any of
  them adds its client's connect / read timeouts. These packages are not omni-pd
  dependencies: ``pip install pyreqwest pyqwest wreq curl-cffi granian`` for the experiment.
* ``omni-pd``: ``python -m omni_pd.launch.router --connector nixl --workers 1`` at
  ``--log-level WARNING`` (as router_load.py runs it; ``--log-level`` changes it) and, with
  ``--info-log``, also at its default INFO as ``omni-pd-info`` (one log line per request,
  to a file, as under ``omni-pd launch``).
* ``omni-pd-before``, with ``--baseline DIR``: the same router from another source tree
  (e.g. ``git archive <commit> omni_pd | tar -x -C DIR``), so a change is measured side by
  side with what it replaces, in the same run.
* ``vllm-router``: vllm-router 0.1.17 from ``.cache/bench/venv`` when installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import router_load as rl  # noqa: E402  (fakes, client, process helpers)

REPO = rl.REPO


# --- the floor: a bare two-leg proxy, on aiohttp or a compiled client / front ---------------

LEG_CLIENTS = ("aiohttp", "pyreqwest", "pyqwest", "wreq", "curl")
JSON_CT = "application/json"


def bare_kind(kind: str) -> tuple[str, str, bool]:
    """``(front, leg client, leg_timeouts)`` of a bare kind: ``bare``, ``bare-timeouts``,
    ``bare-<client>`` or ``bare-granian-<client>`` (``<client>`` one of :data:`LEG_CLIENTS`;
    ``bare-granian`` alone means granian with aiohttp legs). Raises ``ValueError`` otherwise."""
    parts = kind.split("-")
    if parts[0] != "bare":
        raise ValueError(kind)
    rest, timeouts = parts[1:], False
    if rest[-1:] == ["timeouts"]:
        rest, timeouts = rest[:-1], True
    front = "granian" if rest[:1] == ["granian"] else "aiohttp"
    rest = rest[1:] if front == "granian" else rest
    client = rest[0] if rest else "aiohttp"
    if len(rest) > 1 or client not in LEG_CLIENTS:
        raise ValueError(kind)
    return front, client, timeouts


class Legs:
    """The two legs of the bare proxy on one HTTP client library; subclasses per library.
    :meth:`two_legs` is the shared NIXL contract: parse the client's body, POST P its prefill
    body, take P's ``kv_transfer_params``, POST D the client's bytes with them spliced in.
    It returns D's ``(status, content type, whole body or None, handle)``: a body when D
    sent a ``Content-Length``, else a handle for :meth:`chunk` (``None``/empty at the end)
    and :meth:`done`."""

    def __init__(self, p_url: str, d_url: str, leg_timeouts: bool) -> None:
        import orjson

        self.p_url, self.d_url = p_url + "/v1/completions", d_url + "/v1/completions"
        self.leg_timeouts = leg_timeouts
        self.loads, self.dumps = orjson.loads, orjson.dumps

    async def start(self) -> None:
        """Open the client (on the running loop)."""
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def prefill(self, body: bytes):
        """POST ``body`` to P; P's whole answer (bytes or a buffer orjson reads)."""
        raise NotImplementedError

    async def decode(self, body: bytes):
        """POST ``body`` to D; see the class doc for what it returns."""
        raise NotImplementedError

    def chunk(self, handle):
        """An awaitable of D's next body chunk, ``None`` or empty at the end."""
        raise NotImplementedError

    async def done(self, handle) -> None:
        """Release D's response: back to the pool when read to the end, else its connection closed."""
        raise NotImplementedError

    async def two_legs(self, raw: bytes):
        body = self.loads(raw)
        p_body = {**body, "max_tokens": 1, "stream": False, "kv_transfer_params": {"do_remote_decode": True}}
        kv = self.loads(await self.prefill(self.dumps(p_body)))["kv_transfer_params"]
        return await self.decode(raw.rstrip()[:-1] + b',"kv_transfer_params":' + self.dumps(kv) + b"}")


class AiohttpLegs(Legs):
    """One ``ClientSession`` on one ``TCPConnector`` configured like ``PDRouter.start``;
    ``leg_timeouts``: the router's per-leg ``ClientTimeout`` (connect 5 s, socket read 3600 s)."""

    async def start(self) -> None:
        import aiohttp
        from yarl import URL

        self.p_url, self.d_url = URL(self.p_url), URL(self.d_url)
        self.kw = ({"timeout": aiohttp.ClientTimeout(total=None, connect=5.0, sock_read=3600.0)}
                   if self.leg_timeouts else {})
        self.headers = {"Content-Type": JSON_CT}
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0, use_dns_cache=True),
            auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None),
            skip_auto_headers=("Accept-Encoding",), cookie_jar=aiohttp.DummyCookieJar())

    async def close(self) -> None:
        await self.session.close()

    async def prefill(self, body: bytes) -> bytes:
        p = await self.session.post(self.p_url, data=body, headers=self.headers, **self.kw)
        data = await p.read()
        p.release()
        return data

    async def decode(self, body: bytes):
        d = await self.session.post(self.d_url, data=body, headers=self.headers, **self.kw)
        if d.content_length is not None:
            data = await d.read()
            d.release()
            return d.status, JSON_CT, data, None
        return d.status, d.headers["Content-Type"], None, d

    def chunk(self, d):
        return d.content.readany()

    async def done(self, d) -> None:
        d.release()


class PyreqwestLegs(Legs):
    """pyreqwest (Rust reqwest/hyper, tokio runtime on its own thread): one pooled
    ``Client``, no decompression, no cookies; ``leg_timeouts``: connect 5 s and a 3600 s
    timeout per request (reqwest's per-request ``timeout`` is a total, its read timeout is
    client-wide: set too). Measured with 0.15.1 (``--leave``): a cancelled leg that awaits
    its answer is not passed on to the connection, the backend serves it in full."""

    async def start(self) -> None:
        from datetime import timedelta

        from pyreqwest.client import ClientBuilder

        b = (ClientBuilder().gzip(False).brotli(False).zstd(False).deflate(False).follow_redirects(False)
             .default_cookie_store(False).pool_idle_timeout(timedelta(seconds=30)).tcp_nodelay(True)
             .default_headers({"Content-Type": JSON_CT}))
        self.timeout = timedelta(seconds=3600) if self.leg_timeouts else None
        if self.leg_timeouts:
            b = b.connect_timeout(timedelta(seconds=5)).read_timeout(timedelta(seconds=3600))
        self.client = b.build()

    async def close(self) -> None:
        await self.client.close()

    def _req(self, url: str, body: bytes):
        r = self.client.post(url).body_bytes(body)
        return r.timeout(self.timeout) if self.timeout is not None else r

    def _streamed(self, url: str, body: bytes):
        # streamed_read_buffer_limit(0): without it pyreqwest reads up to 64 KiB of the body
        # before it hands back the headers, i.e. a whole SSE stream before its first byte
        return self._req(url, body).streamed_read_buffer_limit(0).build_streamed()

    async def prefill(self, body: bytes):
        p = await self._req(self.p_url, body).build().send()
        return memoryview(await p.bytes())

    async def decode(self, body: bytes):
        cm = self._streamed(self.d_url, body)
        d = await cm.__aenter__()
        ctype = d.get_header("content-type") or JSON_CT
        if d.get_header("content-length") is not None:
            data = await d.bytes()
            await cm.__aexit__(None, None, None)
            return d.status, ctype, bytes(data), None
        return d.status, ctype, None, (cm, d.body_reader)

    def chunk(self, h):
        return h[1].read_chunk()

    async def done(self, h) -> None:
        await h[0].__aexit__(None, None, None)


class _ResponseIterLegs(Legs):
    """Legs whose streamed-D handle is ``(response, async iterator of its chunks)`` and whose
    response closes with ``aclose()`` (pyqwest, curl_cffi)."""

    async def chunk(self, h):
        try:
            return await h[1].__anext__()
        except StopAsyncIteration:
            return None

    async def done(self, h) -> None:
        await h[0].aclose()


class PyqwestLegs(_ResponseIterLegs):
    """pyqwest (Rust reqwest/hyper, tokio runtime on its own thread): one ``Client`` on one
    ``HTTPTransport``, no decompression, redirects or OpenTelemetry, idle connections kept
    (its default keeps 2 per host); ``leg_timeouts``: connect 5 s, each read 3600 s (its
    async client has no per-request timeout: ``asyncio.timeout`` around a leg is its way)."""

    async def start(self) -> None:
        import pyqwest

        self.transport = pyqwest.HTTPTransport(
            connect_timeout=5.0 if self.leg_timeouts else None, read_timeout=3600.0 if self.leg_timeouts else None,
            pool_idle_timeout=30.0, pool_max_idle_per_host=4096, enable_gzip=False, enable_brotli=False,
            enable_zstd=False, follow_redirects=False, enable_otel=False)
        self.client, self.request = pyqwest.Client(self.transport), pyqwest.Request
        self.headers = pyqwest.Headers({"Content-Type": JSON_CT})

    async def close(self) -> None:
        await self.transport.aclose()

    async def prefill(self, body: bytes):
        return (await self.client.post(self.p_url, self.headers, body)).content

    async def decode(self, body: bytes):
        # the transport's own execute: Client.stream is a Python async context manager
        d = await self.transport.execute(self.request("POST", self.d_url, self.headers, body))
        ctype = d.headers.get("content-type", JSON_CT)
        it = d.content.__aiter__()
        if "content-length" in d.headers:
            return d.status, ctype, b"".join([bytes(c) async for c in it]), None
        return d.status, ctype, None, (d, it)


class WreqLegs(Legs):
    """wreq (Rust, hyper fork, tokio runtime on its own thread): one pooled ``Client``,
    no decompression or cookies; ``leg_timeouts``: connect 5 s, read 3600 s."""

    async def start(self) -> None:
        from datetime import timedelta

        import wreq

        kw = dict(gzip=False, brotli=False, deflate=False, zstd=False, cookie_store=False, tcp_nodelay=True,
                  pool_idle_timeout=timedelta(seconds=30), headers={"Content-Type": JSON_CT},
                  redirect=wreq.redirect.Policy.none())
        if self.leg_timeouts:
            kw.update(connect_timeout=timedelta(seconds=5), read_timeout=timedelta(seconds=3600))
        self.client = wreq.Client(**kw)

    async def close(self) -> None:
        self.client.close()

    async def prefill(self, body: bytes):
        p = await self.client.post(self.p_url, body=body)
        return await p.bytes()

    async def decode(self, body: bytes):
        d = await self.client.post(self.d_url, body=body)
        ctype = d.headers.get("content-type")
        ctype = bytes(ctype).decode() if ctype else JSON_CT
        if d.content_length is not None:
            return d.status.as_int(), ctype, bytes(await d.bytes()), None
        return d.status.as_int(), ctype, None, d.stream().__aiter__()

    async def chunk(self, s):
        try:
            return await s.__anext__()
        except StopAsyncIteration:
            return None

    async def done(self, s) -> None:
        pass  # the stream ends with its last chunk; dropped, it drops the connection


class CurlLegs(_ResponseIterLegs):
    """curl_cffi's ``AsyncSession`` (libcurl's multi interface driven from the asyncio
    loop; the maintained asyncio binding of libcurl: pycurl has none): ``max_clients`` 1024
    handles, no redirects or Accept-Encoding; ``leg_timeouts``: (connect 5 s, read 3600 s),
    else none (its default is 30 s)."""

    async def start(self) -> None:
        from curl_cffi.requests import AsyncSession

        self.session = AsyncSession(max_clients=1024, allow_redirects=False, default_headers=False,
                                    timeout=(5.0, 3600.0) if self.leg_timeouts else None)
        self.headers = {"Content-Type": JSON_CT}

    async def close(self) -> None:
        await self.session.close()

    async def prefill(self, body: bytes):
        return (await self.session.post(self.p_url, data=body, headers=self.headers, accept_encoding=None)).content

    async def decode(self, body: bytes):
        d = await self.session.post(self.d_url, data=body, headers=self.headers, accept_encoding=None, stream=True)
        ctype = d.headers.get("content-type") or JSON_CT
        if d.headers.get("content-length") is not None:
            data = await d.acontent()
            await d.aclose()
            return d.status_code, ctype, data, None
        return d.status_code, ctype, None, (d, d.aiter_content().__aiter__())


def make_legs(client: str, p_url: str, d_url: str, leg_timeouts: bool) -> Legs:
    """The :class:`Legs` of ``client`` (one of :data:`LEG_CLIENTS`)."""
    return {"aiohttp": AiohttpLegs, "pyreqwest": PyreqwestLegs, "pyqwest": PyqwestLegs,
            "wreq": WreqLegs, "curl": CurlLegs}[client](p_url, d_url, leg_timeouts)


def bare_proxy(port: int, p_url: str, d_url: str, leg_timeouts: bool = False, client: str = "aiohttp") -> None:
    """Serve the minimal NIXL two-leg proxy (see the module doc) on aiohttp's low-level
    server at ``port`` until SIGTERM, its legs on ``client`` (:func:`make_legs`)."""
    import asyncio

    from aiohttp import web

    legs = make_legs(client, p_url, d_url, leg_timeouts)

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        if request.path == "/health":
            return web.Response(body=b"{}", content_type=JSON_CT)
        status, ctype, data, h = await legs.two_legs(await request.read())
        if data is not None:
            return web.Response(status=status, body=data, headers={"Content-Type": ctype})
        out = web.StreamResponse(status=status, headers={"Content-Type": ctype})
        out.enable_chunked_encoding()
        try:  # a client that leaves cancels this task: done() then closes D's connection
            await out.prepare(request)
            while chunk := await legs.chunk(h):
                # aiohttp's chunks are bytes; pyreqwest's its own Bytes (a buffer aiohttp refuses)
                await out.write(chunk if type(chunk) is bytes else memoryview(chunk))
        finally:
            await legs.done(h)
        await out.write_eof()
        return out

    async def main() -> None:
        await legs.start()
        runner = web.ServerRunner(web.Server(handle, handler_cancellation=True, access_log=None,
                                             keepalive_timeout=75.0))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=4096).start()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await runner.cleanup()
        await legs.close()

    from omni_pd.launch.router.server import run_loop

    run_loop(main())


_rsgi: dict = {}


async def rsgi_app(scope, proto) -> None:
    """The same proxy as a granian RSGI application (``granian --interface rsgi
    router_cpu:rsgi_app``, cwd ``bench/``), its legs from ``ROUTER_CPU_LEGS`` = ``client,P
    URL,D URL,0|1``. RSGI has no handler cancellation: a client that leaves is seen only
    when a write to it fails (the router would race ``proto.client_disconnect()``)."""
    legs = _rsgi.get("legs")
    if legs is None:
        client, p_url, d_url, timeouts = os.environ["ROUTER_CPU_LEGS"].split(",")
        legs = make_legs(client, p_url, d_url, timeouts == "1")
        await legs.start()
        _rsgi["legs"] = legs
    if scope.path == "/health":
        proto.response_bytes(200, [("content-type", JSON_CT)], b"{}")
        return
    status, ctype, data, h = await legs.two_legs(await proto())
    if data is not None:
        proto.response_bytes(status, [("content-type", ctype)], data)
        return
    out = proto.response_stream(status, [("content-type", ctype)])
    try:
        while chunk := await legs.chunk(h):
            await out.send_bytes(bytes(chunk))
    finally:
        await legs.done(h)


def profiled(out: str, what: str, args: list[str]) -> int:
    """Run ``what`` (``bare``: :func:`bare_proxy` with ``args`` port, P URL, D URL; ``router``:
    omni-pd's router with ``args`` as for ``python -m omni_pd.launch.router``) under
    cProfile on the process CPU clock; the stats go to ``out`` when it stops (SIGTERM)."""
    import cProfile

    prof = cProfile.Profile(time.process_time)
    try:
        if what == "bare":
            prof.runcall(bare_proxy, int(args[0]), args[1], args[2], args[3] == "1", args[4])
            return 0
        from omni_pd.launch.router.cli import main

        return prof.runcall(main, args)
    finally:
        prof.dump_stats(out)


def profile_summary(path: str, requests: int) -> dict:
    """Python function calls (cProfile counts every coroutine resume as a call) and
    profiled CPU per request, and the share of that CPU in omni-pd's own files. The
    counts cover the warm-up too (its connection set-ups) and move with load: compare
    kinds of one run only."""
    import pstats

    st = pstats.Stats(path)
    total = sum(v[2] for v in st.stats.values()) or 1e-9
    ours = sum(v[2] for k, v in st.stats.items() if "omni_pd" in k[0])
    mine = sum(v[2] for k, v in st.stats.items() if k[0].endswith("router_cpu.py"))
    return {"requests": requests, "calls_per_request": round(st.total_calls / max(requests, 1), 1),
            "profiled_us_per_request": round(total / max(requests, 1) * 1e6, 1),
            "own_code_share": round((ours + mine) / total, 3)}


def log_line_us(lean: bool, n: int = 20000) -> float:
    """CPU µs of the router's per-request INFO line (its format and message, to a file, as
    ``Front.generate`` writes it), with or without ``cli.lean_log_records``."""
    import logging
    import tempfile

    from omni_pd.launch.router import cli

    if lean:
        cli.lean_log_records()
    with tempfile.TemporaryFile("w") as f:
        handler = logging.StreamHandler(f)
        handler.setFormatter(logging.Formatter(cli.LOG_FORMAT))
        log = logging.getLogger("omni_pd.router.bench")
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
        args = ("/v1/completions", "53c91c53-3d53-4338-aca5-000000000001", "http://127.0.0.1:8100",
                "http://127.0.0.1:8200", 200, "ok", 0.0734)
        c0 = time.process_time()
        for _ in range(n):
            if log.isEnabledFor(logging.INFO):
                log.info("POST %s rid=%s prefill=%s decode=%s -> %s %s (%.3f s)", *args)
        return (time.process_time() - c0) / n * 1e6


def log_line_main(rounds: int = 7) -> int:
    """Print the per-request log line's CPU, default records vs lean, each in a fresh
    process, in turn, ``rounds`` times (min and median)."""
    got: dict[str, list[float]] = {"default": [], "lean": []}
    for _ in range(rounds):
        for name in got:
            out = subprocess.run([sys.executable, __file__, "log-line", name], capture_output=True, text=True,
                                 check=True)
            got[name].append(float(out.stdout))
    for name, us in got.items():
        print(f"log line, {name:7} records: min {min(us):5.1f} µs, median {statistics.median(us):5.1f} µs")
    return 0


def micro_one() -> dict:
    """CPU µs of the router's per-request pieces in the tree this process imports omni_pd
    from: the request id and one pick (``PDRouter._pick``) with 1, 2, 4, 8 instances."""
    import timeit
    import uuid

    from omni_pd.launch.router import core
    from omni_pd.launch.router.backends import parse_backend
    from omni_pd.launch.router.protocol import connector_class

    def best(fn) -> float:
        return round(min(timeit.repeat(fn, number=50000, repeat=7)) / 50000 * 1e6, 2)

    rid = getattr(core, "request_ids", None) or (lambda: str(uuid.uuid4()))
    out = {"request_id_us": best(rid), "pick_us": {}}
    for n in (1, 2, 4, 8):
        r = core.PDRouter([parse_backend(f"127.0.0.1:{8000 + i}") for i in range(n)],
                          [parse_backend(f"127.0.0.1:{9000 + i}") for i in range(n)], connector_class("nixl"))
        targets = r.strategy.prefill_targets()
        out["pick_us"][n] = {"decode": best(lambda: r._pick("decode", [], None, lambda u: u)),
                             "prefill": best(lambda: r._pick("prefill", [], targets, lambda u: u.instance))}
    return out


def frames_us(extra: int, n: int = 20000, resumes: int = 4) -> float:
    """CPU µs per task of a coroutine that suspends ``resumes`` times, awaited through
    ``extra`` more coroutine frames (each only ``return await`` of the next), on uvloop
    when installed: what a layer of ``async def f(): return await g()`` costs a leg."""
    import asyncio

    async def leaf(loop) -> None:
        for _ in range(resumes):
            fut = loop.create_future()
            loop.call_soon(fut.set_result, None)
            await fut

    async def layer(loop, depth: int) -> None:
        if depth == 0:
            return await leaf(loop)
        return await layer(loop, depth - 1)

    async def main() -> float:
        loop = asyncio.get_running_loop()
        c0 = time.process_time()
        await asyncio.gather(*(layer(loop, extra) for _ in range(n)))
        return (time.process_time() - c0) / n * 1e6

    from omni_pd.launch.router.server import run_loop

    box: list[float] = []

    async def run() -> None:
        box.append(await main())

    run_loop(run())
    return box[0]


def micro_main(baseline: str | None) -> int:
    """Print :func:`micro_one` for ``baseline`` (if given) and this tree, side by side."""
    trees = ([("before", baseline)] if baseline else []) + [("this tree", str(REPO))]
    for name, tree in trees:
        out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "micro-one"], capture_output=True,
                             text=True, check=True, cwd=tree, env={**os.environ, "PYTHONPATH": tree})
        m = json.loads(out.stdout)
        picks = ", ".join(f"{n}: {v['decode']}/{v['prefill']}" for n, v in m["pick_us"].items())
        print(f"{name:9}: request id {m['request_id_us']} µs; one pick (decode/prefill) by instances {picks} µs")
    got: dict[int, list[float]] = {0: [], 3: []}
    for _ in range(5):
        for extra in got:
            got[extra].append(frames_us(extra))
    print(f"a task suspending 4 times: {min(got[0]):.1f} µs; through 3 more coroutine frames: {min(got[3]):.1f} µs "
          "(min of 5)")
    return 0


# --- the run ----------------------------------------------------------------------------------


def start(procs: rl.Procs, kind: str, port: int, p_url: str, d_url: str, profile: str | None,
          baseline: str | None = None, log_level: str = "WARNING") -> subprocess.Popen:
    if kind.startswith("bare"):
        front, client, timeouts = bare_kind(kind)
        needs = [("curl_cffi", "curl-cffi") if client == "curl" else (client, client)]
        needs += [("granian", "granian")] if front == "granian" else []
        for mod, pkg in needs:
            if importlib.util.find_spec(mod) is None:
                raise SystemExit(f"{kind}: needs {pkg} (not an omni-pd dependency): pip install {pkg}")
        if front == "granian":  # one worker, one runtime thread, uvloop: as the aiohttp front runs
            env = {**os.environ, "ROUTER_CPU_LEGS": f"{client},{p_url},{d_url},{int(timeouts)}",
                   "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
            argv = [sys.executable, "-m", "granian", "--interface", "rsgi", "--host", "127.0.0.1", "--port",
                    str(port), "--workers", "1", "--runtime-threads", "1", "--loop", "uvloop", "--backlog", "4096",
                    "--no-ws", "--log-level", "warning", "router_cpu:rsgi_app"]
            p = procs.start(argv, log=f"/tmp/router_cpu-{kind}.log", cwd=Path(__file__).resolve().parent, env=env)
        else:
            argv = [sys.executable, __file__, "bare", str(port), p_url, d_url, str(int(timeouts)), client]
            if profile:
                argv[1:2] = [__file__, "profiled", f"{profile}/{kind}.prof"]
            p = procs.start(argv, log=f"/tmp/router_cpu-{kind}.log")
        rl.wait_http(f"http://127.0.0.1:{port}/health", 30)
        return p
    if kind == "vllm-router":
        a = argparse.Namespace(workers=1)
        return rl.start_router(procs, "vllm-router", port, [p_url], [d_url], a)
    level = "INFO" if kind == "omni-pd-info" else log_level
    args = ["--connector", "nixl", "--port", str(port), "--log-level", level, "--health-interval", "1",
            "--workers", "1", "--prefill", p_url, "--decode", d_url]
    if profile:
        argv = [sys.executable, str(Path(__file__).resolve()), "profiled", f"{profile}/{kind}.prof", "router", *args]
    else:
        argv = [sys.executable, "-m", "omni_pd.launch.router", *args]
    src, env = REPO, None
    if kind == "omni-pd-before":
        src, env = Path(baseline), {**os.environ, "PYTHONPATH": baseline}
    # the INFO router's per-request lines go to a file, like a launcher's router log
    p = procs.start(argv, log=f"/tmp/router_cpu-{kind}-{port}.log", cwd=src, env=env)
    rl.wait_http(f"http://127.0.0.1:{port}/health", 60)
    return p


def client_leaves(url: str, p_url: str, d_url: str) -> dict:
    """Seconds until each backend sees a client that left: mid-stream (decode) and during
    the prefill leg (prefill's answer held 3 s); None: not within 2 s / 3.5 s. The check of
    router_load.py's fault runs (its ``leave_early`` and the fakes' ``/stats``)."""
    import asyncio

    out = {}
    for leg, after_first in (("decode", True), ("prefill", False)):
        backend = d_url if leg == "decode" else p_url
        n0 = len(rl.stats(backend)["cancelled"])
        t_left = asyncio.run(rl.leave_early(url, True, after_first, 0.3))
        time.sleep(2.0 if leg == "decode" else 3.5)
        c = rl.stats(backend)["cancelled"][n0:]
        out[leg] = round(c[0] - t_left, 3) if c else None
    return out


def first_thread_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid``'s first thread: the asyncio loop of the
    Python proxies (a compiled client's runtime threads are the rest of the process's figure).
    Meaningful for single-process kinds only (granian serves from a child process)."""
    import psutil

    try:
        return next((t.user_time + t.system_time for t in psutil.Process(pid).threads() if t.id == pid), 0.0)
    except psutil.NoSuchProcess:
        return 0.0


def measure(kind_pid: int, target: str, conc: int, duration: float, stream: bool, p_url: str, d_url: str) -> dict:
    c0, l0 = rl.tree_cpu_s(kind_pid), first_thread_cpu_s(kind_pid)
    r = rl.run_client(target, conc, duration, stream, p_url, d_url)
    c1, l1 = rl.tree_cpu_s(kind_pid), first_thread_cpu_s(kind_pid)
    n = max(r["ok"], 1)
    return {"us": (c1 - c0) / n * 1e6, "first_thread_us": (l1 - l0) / n * 1e6, "rps": r["rps"], "ok": r["ok"],
            "unanswered": r["unanswered"], "codes": r["codes"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="json,stream")
    ap.add_argument("--kinds", default=None, help="comma-separated (default bare,omni-pd,vllm-router if installed)")
    ap.add_argument("--baseline", default=None,
                    help="source tree of an earlier omni_pd: adds the kind omni-pd-before, run from it")
    ap.add_argument("--log-level", default="WARNING", help="--log-level of omni-pd and omni-pd-before")
    ap.add_argument("--info-log", action="store_true", help="also omni-pd at its default --log-level INFO")
    ap.add_argument("--profile", default=None,
                    help="run the Python kinds under cProfile; write <kind>.prof to this directory and report "
                         "function calls per request")
    ap.add_argument("--py-spy", default=None, dest="py_spy",
                    help="sample omni-pd's router with py-spy (raw collapsed stacks to this file) during the run")
    ap.add_argument("--leave", action="store_true",
                    help="first check each kind frees its backend work when a client leaves (prefill leg, mid-stream)")
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    ap.add_argument("--quick", action="store_true",
                    help="bare and omni-pd, json, 8 clients for 0.5 s, one round (also $OMNI_PD_BENCH_QUICK=1)")
    a = ap.parse_args()
    warm = 1.0
    if a.quick or os.environ.get("OMNI_PD_BENCH_QUICK", "") not in ("", "0"):
        a.concurrency, a.duration, a.rounds, a.modes, warm = 8, 0.5, 1, "json", 0.3
        a.kinds = a.kinds or "bare,omni-pd"
    if a.kinds:
        kinds = a.kinds.split(",")
    else:
        kinds = (["bare", "bare-timeouts"] + (["omni-pd-before"] if a.baseline else []) + ["omni-pd"]
                 + (["omni-pd-info"] if a.info_log else [])
                 + (["vllm-router"] if rl.VLLM_ROUTER.exists() and not a.profile else []))
    fa = argparse.Namespace(p_delay=0.02, d_delay=0.05, chunks=32, chunk_gap=0.005)
    procs = rl.Procs()
    result: dict = {"loadavg_start": os.getloadavg(), "concurrency": a.concurrency, "duration_s": a.duration,
                    "rounds": a.rounds, "points": {}}
    try:
        pp, dp = rl.free_port(), rl.free_port()
        rl.fake(procs, "prefill", pp, fa)
        rl.fake(procs, "decode", dp, fa)
        p_url, d_url = f"http://127.0.0.1:{pp}", f"http://127.0.0.1:{dp}"
        ports = {k: rl.free_port() for k in kinds}
        pids = {k: start(procs, k, ports[k], p_url, d_url, a.profile, a.baseline, a.log_level).pid for k in kinds}
        served = {k: 0 for k in kinds}  # every answered request, warm-up included (profiles cover them all)
        for k in kinds:  # warm-up at the measured concurrency: backend connections opened before measuring
            served[k] += rl.run_client(f"http://127.0.0.1:{ports[k]}", a.concurrency, warm, False, p_url, d_url)["ok"]
        for k in kinds if a.leave else []:
            result.setdefault("client_leaves_backend_sees_it_after_s", {})[k] = got = client_leaves(
                f"http://127.0.0.1:{ports[k]}", p_url, d_url)
            print(f"client leaves: {k} backend sees it after {got} s (None: not seen)", flush=True)
        spy = None
        if a.py_spy:
            spy = subprocess.Popen(["py-spy", "record", "-p", str(pids["omni-pd"]), "-f", "raw", "-r", "200",
                                    "-o", a.py_spy], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for mode in a.modes.split(","):
            stream = mode == "stream"
            runs: dict[str, list[dict]] = {k: [] for k in kinds}
            for rnd in range(a.rounds):
                for k in kinds[rnd % len(kinds):] + kinds[:rnd % len(kinds)]:
                    m = measure(pids[k], f"http://127.0.0.1:{ports[k]}", a.concurrency, a.duration, stream,
                                p_url, d_url)
                    runs[k].append(m)
                    served[k] += m["ok"]
                    print(f"{mode:6} {k:13} {m['us']:7.1f} µs/req (first thread {m['first_thread_us']:6.1f})  "
                          f"{m['rps']:7.1f} req/s  ok {m['ok']} "
                          f"unanswered {m['unanswered']} codes {m['codes']}", flush=True)
            for k in kinds:
                us = [m["us"] for m in runs[k]]
                # paired with the floor of the same round (the kinds ran back to back): the
                # difference moves less with the machine's load than either figure
                diff = ([x - b["us"] for x, b in zip(us, runs["bare"])] if "bare" in runs and k != "bare" else None)
                vr = ([x - b["us"] for x, b in zip(us, runs["vllm-router"])]
                      if "vllm-router" in runs and k != "vllm-router" else None)
                result["points"].setdefault(mode, {})[k] = {
                    "over_bare_us_median": None if diff is None else round(statistics.median(diff), 1),
                    "over_vllm_router_us_median": None if vr is None else round(statistics.median(vr), 1),
                    "rounds_below_vllm_router": None if vr is None else sum(d < 0 for d in vr),
                    "us_min": round(min(us), 1), "us_median": round(statistics.median(us), 1),
                    "first_thread_us_median": round(statistics.median(m["first_thread_us"] for m in runs[k]), 1),
                    "rps_median": round(statistics.median(m["rps"] for m in runs[k])),
                    "unanswered": sum(m["unanswered"] for m in runs[k]), "rounds_us": [round(x, 1) for x in us]}
        # a proxy that loses prefill's kv_transfer_params is wrong, not fast: decode counts them
        result["kv_bad"] = rl.stats(d_url)["kv_bad"]
        if spy is not None:
            spy.send_signal(2)  # SIGINT: py-spy writes its samples and exits
            spy.wait(30)
        if a.profile:
            for k in kinds:  # SIGTERM: each stops cleanly and writes its stats
                os.kill(pids[k], signal.SIGTERM)
            for k in kinds:
                out = Path(a.profile) / f"{k}.prof"
                deadline = time.monotonic() + 15
                while not out.exists() and time.monotonic() < deadline:
                    time.sleep(0.2)
                time.sleep(0.5)
                result.setdefault("profile", {})[k] = profile_summary(str(out), served[k])
    finally:
        procs.close()
    result["loadavg_end"] = os.getloadavg()
    print("\nrouter CPU µs per request (min · median over rounds · median of the per-round difference to "
          "bare · the same to vllm-router, rounds below it) · median req/s")
    for mode, per in result["points"].items():
        for k, v in per.items():
            over = "-" if v.get("over_bare_us_median") is None else f"{v['over_bare_us_median']:+.1f}"
            vr = ("-" if v.get("over_vllm_router_us_median") is None
                  else f"{v['over_vllm_router_us_median']:+.1f} ({v['rounds_below_vllm_router']}/{len(v['rounds_us'])})")
            print(f"{mode:6} {k:14} {v['us_min']:7.1f} · {v['us_median']:7.1f} · {over:>7} · {vr:>14}   "
                  f"{v['rps_median']} req/s  unanswered {v['unanswered']}  (first thread {v['first_thread_us_median']})")
    for k, v in result.get("profile", {}).items():
        print(f"cProfile {k:14} {v['calls_per_request']:7.1f} Python calls per request, "
              f"{v['profiled_us_per_request']:7.1f} profiled µs per request, "
              f"{100 * v['own_code_share']:4.1f} % in omni-pd's own files")
    for k, got in result.get("client_leaves_backend_sees_it_after_s", {}).items():
        print(f"client leaves: {k:14} backend sees it after {got} s (None: not seen)")
    print(f"decode requests without prefill's kv_transfer_params: {result.get('kv_bad')}")
    print(f"load average {result['loadavg_start']} -> {result['loadavg_end']}")
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    return 1 if result.get("kv_bad") else 0  # a proxy that loses kv_transfer_params is wrong, not fast


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "bare":
        bare_proxy(int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5] == "1", sys.argv[6])
    elif len(sys.argv) > 2 and sys.argv[1] == "log-line":
        print(log_line_us(sys.argv[2] == "lean"))
    elif len(sys.argv) > 1 and sys.argv[1] == "log-line":
        sys.exit(log_line_main())
    elif len(sys.argv) > 1 and sys.argv[1] == "micro-one":
        print(json.dumps(micro_one()))
    elif len(sys.argv) > 1 and sys.argv[1] == "micro":
        sys.exit(micro_main(sys.argv[2] if len(sys.argv) > 2 else None))
    elif len(sys.argv) > 1 and sys.argv[1] == "profiled":
        sys.exit(profiled(sys.argv[2], sys.argv[3], sys.argv[4:]))
    else:
        sys.exit(main())
