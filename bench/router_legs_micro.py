"""CPU per backend leg for configurations of aiohttp's ClientSession (the router's leg client).

    python bench/router_legs_micro.py            # 10000 POSTs per configuration, 32 at a time, 5 rounds

A fake backend (aiohttp low-level server, its own process) answers every POST with a
small JSON body at once; the client process sends ``--requests`` POSTs of a
completion-sized body over pooled keep-alive connections, ``--concurrency`` at a time,
on uvloop when installed, and prints its own CPU time per request (user + system,
``time.process_time``) for each configuration, cumulative from aiohttp's defaults to the
router's (omni_pd/launch/router/core.py ``PDRouter.start`` / ``_post``). Only the client's
CPU is compared; the backend is the same. Each knob is one of aiohttp's documented
ClientSession / TCPConnector / request arguments:

* ``defaults``: ``ClientSession()`` as documented in the quickstart, ``json=`` body, a
  ``str`` URL and a ``ClientTimeout`` built per request, ``async with``.
* ``+bytes body, parsed URL, shared timeout``: the body serialised once (``data=bytes``), the
  ``yarl.URL`` parsed once, one ``ClientTimeout`` object reused.
* ``+connector, no cookies, no decompression``: ``TCPConnector(limit=0, keepalive_timeout=30,
  ttl_dns_cache)``, ``DummyCookieJar()``, ``auto_decompress=False`` (the router before tuning).
* ``+skip_auto_headers``: no ``User-Agent``/``Accept``/``Accept-Encoding`` (a proxy relays
  bytes; asking for gzip it would not decompress is wrong anyway).
* ``+session default headers``: ``Content-Type`` set once on the session, only
  ``X-Request-Id`` per request.
* ``+no sock_read``: the leg's timeout without ``sock_read`` (no timer re-armed per read;
  what the read timeout costs).
* ``+read_bufsize 64 KiB``: the session's read buffer (default 256 KiB).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

BODY_OBJ = {"model": "m", "prompt": "hello " * 50, "max_tokens": 1}
BODY = json.dumps(BODY_OBJ, separators=(",", ":")).encode()
ANSWER = b'{"id":"x","choices":[{"text":"a"}],"kv_transfer_params":{"remote_engine_id":"p"}}'
SKIP = ("User-Agent", "Accept", "Accept-Encoding")


def serve(port: int) -> None:
    from aiohttp import web

    async def handle(request: web.BaseRequest) -> web.Response:
        await request.read()
        return web.Response(body=ANSWER, content_type="application/json")

    async def main() -> None:
        runner = web.ServerRunner(web.Server(handle))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        print("ready", flush=True)
        await asyncio.Event().wait()

    _run(main())


def _run(coro):
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


async def _drive(one, n: int, conc: int) -> float:
    sent = 0

    async def worker() -> None:
        nonlocal sent
        while sent < n:
            sent += 1
            await one()

    for _ in range(conc):  # warm the pool: connections opened outside the measurement
        await one()
    c0 = time.process_time()
    await asyncio.gather(*(worker() for _ in range(conc)))
    return (time.process_time() - c0) / n * 1e6


async def defaults(url: str, n: int, conc: int) -> float:
    import aiohttp

    async with aiohttp.ClientSession() as s:
        async def one() -> None:
            async with s.post(url, json=BODY_OBJ, headers={"X-Request-Id": "r"},
                              timeout=aiohttp.ClientTimeout(total=None, sock_read=60)) as r:
                await r.read()

        return await _drive(one, n, conc)


def _configured(level: int):
    """The router's configuration with the first ``level`` tuning steps applied."""

    async def run(url: str, n: int, conc: int) -> float:
        import aiohttp
        from yarl import URL

        u = URL(url)
        timeout = aiohttp.ClientTimeout(total=None, connect=5, sock_read=None if level >= 5 else 60)
        kw = {}
        if level >= 2:
            kw.update(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0, ttl_dns_cache=300),
                      cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False,
                      timeout=aiohttp.ClientTimeout(total=None))
        if level >= 3:
            kw["skip_auto_headers"] = SKIP
        if level >= 4:
            kw["headers"] = {"Content-Type": "application/json"}
        if level >= 6:
            kw["read_bufsize"] = 2 ** 16
        async with aiohttp.ClientSession(**kw) as s:
            async def one() -> None:
                hdrs = {"X-Request-Id": "r"} if level >= 4 else {"Content-Type": "application/json", "X-Request-Id": "r"}
                r = await s.post(u, data=BODY, headers=hdrs, timeout=timeout)
                await r.read()
                r.release()

            return await _drive(one, n, conc)

    return run


CONFIGS = [("defaults", defaults),
           ("+bytes body, parsed URL, shared timeout", _configured(1)),
           ("+connector, no cookies, no decompression", _configured(2)),
           ("+skip_auto_headers", _configured(3)),
           ("+session default headers", _configured(4)),
           ("+no sock_read", _configured(5)),
           ("+read_bufsize 64 KiB", _configured(6))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5, help="configurations in turn, this many times (median)")
    ap.add_argument("--port", type=int, default=18299)
    ap.add_argument("--quick", action="store_true",
                    help="200 requests, one round, a free port (also $OMNI_PD_BENCH_QUICK=1)")
    a = ap.parse_args()
    if a.quick or os.environ.get("OMNI_PD_BENCH_QUICK", "") not in ("", "0"):
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from common import free_port

        a.requests, a.concurrency, a.rounds, a.port = 200, 8, 1, free_port()
    srv = subprocess.Popen([sys.executable, __file__, "serve", str(a.port)], stdout=subprocess.PIPE, text=True)
    got: dict[str, list[float]] = {name: [] for name, _ in CONFIGS}
    try:
        srv.stdout.readline()
        url = f"http://127.0.0.1:{a.port}/v1/completions"
        for _ in range(a.rounds):  # in turn: the machine is shared
            for name, fn in CONFIGS:
                got[name].append(_run(fn(url, a.requests, a.concurrency)))
                print(f"{name:42} {got[name][-1]:6.1f} µs CPU per request", flush=True)
    finally:
        srv.kill()
        srv.wait()
    print("\nµs CPU per request over the rounds (min: least disturbed by other load; median):")
    for name, us in got.items():
        print(f"{name:42} min {min(us):6.1f}   median {sorted(us)[len(us) // 2]:6.1f}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    else:
        sys.exit(main())
