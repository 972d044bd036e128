"""CPU per backend leg: aiohttp's ClientSession vs the router's leg client (omni_pd/launch/router/legs.py).

    python bench/router_legs_micro.py            # 20000 POSTs each, 32 at a time

A fake backend (aiohttp low-level server, its own process) answers every POST with a
small JSON body at once; the client process sends ``--requests`` POSTs of a
completion-sized body over pooled keep-alive connections, ``--concurrency`` at a time,
on uvloop when installed, and prints its own CPU time per request (user + system,
``time.process_time``). Only the client's CPU is compared; the backend is the same.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time

BODY = b'{"model":"m","prompt":"' + b"hello " * 50 + b'","max_tokens":1}'
ANSWER = b'{"id":"x","choices":[{"text":"a"}],"kv_transfer_params":{"remote_engine_id":"p"}}'


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

    c0 = time.process_time()
    await asyncio.gather(*(worker() for _ in range(conc)))
    return (time.process_time() - c0) / n * 1e6


async def with_aiohttp(url: str, n: int, conc: int) -> float:
    import aiohttp
    from yarl import URL

    u = URL(url)
    t = aiohttp.ClientTimeout(total=None, sock_read=60)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     cookie_jar=aiohttp.DummyCookieJar()) as s:
        async def one() -> None:
            async with s.post(u, data=BODY, headers={"Content-Type": "application/json", "X-Request-Id": "r"},
                              timeout=t) as r:
                await r.read()

        return await _drive(one, n, conc)


async def with_legs(url: str, n: int, conc: int) -> float:
    from yarl import URL

    from omni_pd.launch.router.legs import LegClient

    u = URL(url)
    c = LegClient()

    async def one() -> None:
        r = await c.post(u, BODY, {"X-Request-Id": "r"}, read_timeout=60)
        await r.read()
        r.release()

    try:
        return await _drive(one, n, conc)
    finally:
        await c.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--port", type=int, default=18299)
    a = ap.parse_args()
    srv = subprocess.Popen([sys.executable, __file__, "serve", str(a.port)], stdout=subprocess.PIPE, text=True)
    try:
        srv.stdout.readline()
        url = f"http://127.0.0.1:{a.port}/v1/completions"
        for _ in range(2):  # alternate, twice: the machine is shared
            for name, fn in (("aiohttp ClientSession", with_aiohttp), ("router leg client", with_legs)):
                us = _run(fn(url, a.requests, a.concurrency))
                print(f"{name:22} {us:6.1f} µs CPU per request", flush=True)
    finally:
        srv.kill()
        srv.wait()
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    else:
        sys.exit(main())
