"""Server CPU per request of candidate router fronts (what the client-facing side costs).

    python bench/router_front_micro.py          # 20000 POSTs per front, 64 at a time, twice

Each front answers a completion-sized POST with a small JSON body at once, in its own
process on uvloop: aiohttp's low-level server (the router's front), granian's RSGI
interface (Rust HTTP server; ``pip install granian``; left out when missing) with one
worker and one runtime thread, and a bare httptools protocol with a task per request (a
lower bound for a hand-written Python front, not a server: no limits, no keep-alive
timeout, no chunked uploads; left out when httptools is missing). The client is aiohttp's
ClientSession, configured as the router's, in this process; the figure is the server
process tree's CPU time (user + system, psutil) per request.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
BODY = b'{"model":"m","prompt":"' + b"hello " * 50 + b'","max_tokens":32}'
ANSWER = b'{"id":"x","choices":[{"text":"decoded decoded decoded"}]}'


def _run(coro):
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def serve_aiohttp(port: int) -> None:
    from aiohttp import web

    async def handle(request):
        await request.read()
        return web.Response(body=ANSWER, headers={"Content-Type": "application/json", "X-Request-Id": "r"})

    async def main():
        runner = web.ServerRunner(web.Server(handle, access_log=None))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=4096).start()
        await asyncio.Event().wait()

    _run(main())


def serve_httptools(port: int) -> None:
    import socket

    import httptools

    resp = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Request-Id: r\r\nContent-Length: %d\r\n\r\n%s"
            % (len(ANSWER), ANSWER))

    class Proto(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport, self.parser, self.body = transport, httptools.HttpRequestParser(self), []
            transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def data_received(self, data):
            self.parser.feed_data(data)

        def on_body(self, body):
            self.body.append(body)

        def on_message_complete(self):
            self.body = []
            asyncio.get_running_loop().create_task(self.handle())

        async def handle(self):
            self.transport.write(resp)

    async def main():
        await asyncio.get_running_loop().create_server(Proto, "127.0.0.1", port, backlog=4096)
        await asyncio.Event().wait()

    _run(main())


async def rsgi_app(scope, proto):
    """granian RSGI application (``bench.router_front_micro:rsgi_app``)."""
    await proto()
    proto.response_bytes(200, [("content-type", "application/json"), ("x-request-id", "r")], ANSWER)


def wait_port(port: int, timeout: float = 20.0) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


async def drive(port: int, pid: int, n: int, conc: int) -> float:
    import psutil
    from yarl import URL

    root = psutil.Process(pid)
    procs = [root] + root.children(recursive=True)

    def cpu() -> float:
        return sum(t.user + t.system for t in (p.cpu_times() for p in procs))

    import aiohttp

    url, sent = URL(f"http://127.0.0.1:{port}/v1/completions"), 0
    headers = {"Content-Type": "application/json", "X-Request-Id": "r"}
    timeout = aiohttp.ClientTimeout(total=None, sock_read=30)
    client = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), cookie_jar=aiohttp.DummyCookieJar(),
                                   auto_decompress=False)

    async def worker() -> None:
        nonlocal sent
        while sent < n:
            sent += 1
            async with client.post(url, data=BODY, headers=headers, timeout=timeout) as r:
                await r.read()

    c0 = cpu()
    await asyncio.gather(*(worker() for _ in range(conc)))
    used = cpu() - c0
    await client.close()
    return used / n * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--port", type=int, default=18510)
    ap.add_argument("--quick", action="store_true",
                    help="200 requests, one pass, free ports (also $OMNI_PD_BENCH_QUICK=1)")
    a = ap.parse_args()
    passes = 2
    port = [a.port, a.port + 1, a.port + 2]
    if a.quick or os.environ.get("OMNI_PD_BENCH_QUICK", "") not in ("", "0"):
        sys.path.insert(0, str(HERE.parent))
        from common import free_port

        a.requests, a.concurrency, passes, port = 200, 8, 1, [free_port() for _ in range(3)]
    fronts = {"aiohttp low-level server": [sys.executable, str(HERE), "serve-aiohttp", str(port[0])]}
    if importlib.util.find_spec("httptools") is not None:
        fronts["httptools protocol (bare)"] = [sys.executable, str(HERE), "serve-httptools", str(port[1])]
    else:
        print("httptools not installed: its row is missing")
    granian = shutil.which("granian")
    if granian:
        fronts["granian RSGI (1 worker, 1 thread)"] = [
            granian, "--interface", "rsgi", "--host", "127.0.0.1", "--port", str(port[2]), "--workers", "1",
            "--runtime-threads", "1", "--no-ws", "--log-level", "warning", "router_front_micro:rsgi_app"]
    else:
        print("granian not installed: its row is missing")
    ports = {name: int(argv[argv.index("--port") + 1]) if "--port" in argv else int(argv[-1])
             for name, argv in fronts.items()}
    procs = {name: subprocess.Popen(argv, cwd=HERE.parent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    start_new_session=True) for name, argv in fronts.items()}
    try:
        for name in fronts:
            wait_port(ports[name])
        for _ in range(passes):  # in turn, twice: the machine is shared
            for name in fronts:
                us = _run(drive(ports[name], procs[name].pid, a.requests, a.concurrency))
                print(f"{name:34} {us:6.1f} µs server CPU per request", flush=True)
    finally:
        for p in procs.values():  # each in its own group (granian forks its workers)
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parents[1]))
    if len(sys.argv) > 2 and sys.argv[1] == "serve-aiohttp":
        serve_aiohttp(int(sys.argv[2]))
    elif len(sys.argv) > 2 and sys.argv[1] == "serve-httptools":
        serve_httptools(int(sys.argv[2]))
    else:
        sys.exit(main())
