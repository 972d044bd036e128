"""A configurable child process for the supervisor tests (stdlib only).

    python child.py [--port P] [--healthy-after S] [--exit-after S] [--exit-code N]
                    [--ignore-term] [--grandchild FILE] [--escaped-grandchild FILE]
                    [--print-env NAME]... [--lines N] [--stderr LINE] [--pidfile FILE]

``--port``: serve ``GET /health`` on 127.0.0.1:P (503 until ``--healthy-after``
seconds have passed, then 200; the first 200 prints ``served 200 at <time.time()>``).
Prints ``start <pid> at <time.time()>`` first. ``--grandchild``: spawn a sleeping
grandchild in the same process group and write its pid to FILE;
``--escaped-grandchild``: one that calls setsid (leaves the group). ``--ignore-term``:
ignore SIGTERM (the grandchildren too). ``--daemon FILE``: a double-forked sleeper in its
own session (its parent exits: it is re-parented away from this child).
``--spawn-on-term FILE``: SIGTERM starts a setsid sleeper, then exits 1 s later. Without
``--exit-after`` it runs until killed.
"""

from __future__ import annotations

import argparse
import http.server
import os
import signal
import subprocess
import sys
import threading
import time

SLEEPER = "import signal, time\n{ign}\ntime.sleep(600)"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int)
    ap.add_argument("--healthy-after", type=float, default=0.0)
    ap.add_argument("--exit-after", type=float)
    ap.add_argument("--exit-code", type=int, default=0)
    ap.add_argument("--ignore-term", action="store_true")
    ap.add_argument("--grandchild")
    ap.add_argument("--escaped-grandchild")
    ap.add_argument("--print-env", action="append", default=[])
    ap.add_argument("--lines", type=int, default=0)
    ap.add_argument("--stderr")
    ap.add_argument("--pidfile")
    ap.add_argument("--unhealthy-while", help="/health answers 503 while this file exists")
    ap.add_argument("--daemon", help="double-fork a setsid sleeper (re-parented away: no longer a descendant)")
    ap.add_argument("--kv-transfer-config", help="printed as 'kv-transfer-config <value>' at start")
    ap.add_argument("--spawn-on-term", help="on SIGTERM: start a setsid sleeper, write its pid here, exit 1 s later")
    a = ap.parse_args()

    t0 = time.monotonic()
    print(f"start {os.getpid()} at {time.time():.6f}", flush=True)
    if a.kv_transfer_config is not None:
        print(f"kv-transfer-config {a.kv_transfer_config}", flush=True)
    if a.pidfile:
        _write(a.pidfile, os.getpid())
    if a.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ign = "signal.signal(signal.SIGTERM, signal.SIG_IGN)" if a.ignore_term else ""
    if a.grandchild:
        g = subprocess.Popen([sys.executable, "-c", SLEEPER.format(ign=ign)])
        _write(a.grandchild, g.pid)
    if a.escaped_grandchild:
        g = subprocess.Popen([sys.executable, "-c", SLEEPER.format(ign=ign)], start_new_session=True)
        _write(a.escaped_grandchild, g.pid)
    if a.daemon:  # the intermediate starts the sleeper in its own session and exits at once
        code = ("import subprocess, sys\n"
                "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)\n"
                f"open({a.daemon + '.tmp'!r}, 'w').write(str(g.pid))\n")
        subprocess.run([sys.executable, "-c", code], check=True)
        os.replace(a.daemon + ".tmp", a.daemon)
    if a.spawn_on_term:
        def on_term(_n: int, _f: object) -> None:
            g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
            _write(a.spawn_on_term, g.pid)
            time.sleep(1.0)
            os._exit(0)

        signal.signal(signal.SIGTERM, on_term)
    for name in a.print_env:
        print(f"{name}={os.environ.get(name, '')}", flush=True)
    for i in range(a.lines):
        print(f"line {i}", flush=True)
    if a.stderr:
        print(a.stderr, file=sys.stderr, flush=True)

    if a.port is not None:
        served = threading.Event()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                ok = self.path == "/health" and time.monotonic() - t0 >= a.healthy_after
                if a.unhealthy_while and os.path.exists(a.unhealthy_while):
                    ok = False
                self.send_response(200 if ok else 503)
                self.end_headers()
                if ok and not served.is_set():
                    served.set()
                    print(f"served 200 at {time.time():.6f}", flush=True)

            def log_message(self, *args: object) -> None:
                pass

        srv = http.server.ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()

    if a.exit_after is not None:
        time.sleep(a.exit_after)
        print(f"exiting with {a.exit_code}", flush=True)
        return a.exit_code
    while True:
        time.sleep(3600)


def _write(path: str, pid: int) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(pid))
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
