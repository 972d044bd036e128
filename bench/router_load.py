"""Load benchmark of the PD router (issue 15): omni-pd's router vs vllm-router vs a direct
two-leg client (the floor), against fake prefill/decode servers, in one run.

    python bench/router_load.py                 # everything, writes bench/router_load.json
    python bench/router_load.py --quick         # concurrency 1, 16, 64 only
    python bench/router_load.py --duration 2    # seconds per point (default 3)
    python bench/router_load.py --also-workers 2 --results bench/RESULTS.md   # + a 2-worker column, report

Each point runs the kinds in turn, ``--rounds`` times (default 3, the order rotated each
round) and reports the median round: the machine is shared. Per point it also records the
CPU time (user + system, psutil) of the router's process tree, of the two fakes and of the
client, per answered request, so the report shows where the cores go.

Fakes (aiohttp, one process per instance, loopback): P answers after ``--p-delay`` (20 ms)
with NIXL-style ``kv_transfer_params``; D answers JSON after ``--d-delay`` (50 ms) or an SSE
stream of ``--chunks`` (32) events ``--chunk-gap`` (5 ms) apart, and counts requests
whose ``kv_transfer_params`` are not P's (a router that loses them is wrong, not fast).
The client is a closed loop (``C`` workers, each sends its next request when the last
one ends) in its own process; a request with no answer within 30 s, or a connection
error, is *unanswered*; a 503 is a deliberate refusal. vllm-router runs from a
throwaway venv (``.cache/bench/venv``, ``pip install vllm-router==0.1.17``); without it
its column is left out and said so.

Fault runs: a client that leaves during the decode stream and during the prefill leg
(how long until each backend sees it); a decode instance killed and restarted under load
(failed requests, throughput before / while down / after); 100 idle connections held
open during a load run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VLLM_ROUTER = REPO / ".cache" / "bench" / "venv" / "bin" / "vllm-router"
P_PARAMS = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "fake-p",
            "remote_block_ids": [1, 2], "remote_host": "127.0.0.1", "remote_port": 5600, "tp_size": 1}


# --- fake backends ---------------------------------------------------------------------


def run_fake(role: str, port: int, p_delay: float, d_delay: float, chunks: int, gap: float) -> None:
    from aiohttp import web

    stats = {"requests": 0, "kv_bad": 0, "cancelled": [], "started": 0}

    async def gen(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        stats["requests"] += 1
        if role == "prefill":
            try:
                await asyncio.sleep(float(body.get("_p_delay", p_delay)))
            except asyncio.CancelledError:
                stats["cancelled"].append(time.time())
                raise
            return web.json_response({"id": "x", "choices": [{"text": "a"}], "kv_transfer_params": P_PARAMS})
        kv = body.get("kv_transfer_params") or {}
        if kv.get("remote_engine_id") != "fake-p" or kv.get("remote_block_ids") != [1, 2]:
            stats["kv_bad"] += 1
        if not body.get("stream"):
            await asyncio.sleep(d_delay)
            return web.json_response({"id": "x", "choices": [{"text": "decoded " * 8}]})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for i in range(chunks):
                await resp.write(b'data: {"choices":[{"text":"t%d"}]}\n\n' % i)
                await asyncio.sleep(gap)
            await resp.write(b"data: [DONE]\n\n")
        except (ConnectionError, asyncio.CancelledError):
            stats["cancelled"].append(time.time())
            raise
        return resp

    async def get(request: web.Request) -> web.Response:
        if request.path == "/stats":
            return web.json_response(stats)
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/v1/completions", gen)
    app.router.add_post("/v1/chat/completions", gen)
    app.router.add_get("/{tail:.*}", get)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, backlog=4096,
                handler_cancellation=True)


# --- client ------------------------------------------------------------------------------


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


async def client(target: str, conc: int, duration: float, stream: bool, p_url: str, d_url: str,
                 idle: int = 0) -> dict:
    import aiohttp

    body = {"model": "m", "prompt": "hello " * 50, "max_tokens": 32, "stream": stream}
    lat, ttfb, codes, unanswered = [], [], {}, 0
    per_second: dict[int, int] = {}
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=30)
    idle_socks = []
    for _ in range(idle):
        s = socket.create_connection(("127.0.0.1", int(target.rsplit(":", 1)[1])))
        idle_socks.append(s)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as sess:
        cpu0 = time.process_time()
        t_start = time.monotonic()
        stop_at = t_start + duration

        async def one() -> None:
            nonlocal unanswered
            t0 = time.monotonic()
            try:
                if target == "direct":  # the floor: the client runs both legs itself
                    p_body = {**body, "max_tokens": 1, "stream": False,
                              "kv_transfer_params": {"do_remote_decode": True}}
                    async with sess.post(p_url + "/v1/completions", json=p_body) as r:
                        kv = (await r.json())["kv_transfer_params"]
                    url, data = d_url + "/v1/completions", {**body, "kv_transfer_params": kv}
                else:
                    url, data = target + "/v1/completions", body
                async with sess.post(url, json=data) as r:
                    first = None
                    async for _chunk in r.content.iter_any():
                        if first is None:
                            first = time.monotonic()
                    status = r.status
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                unanswered += 1
                return
            t1 = time.monotonic()
            codes[status] = codes.get(status, 0) + 1
            if status == 200:
                lat.append(t1 - t0)
                ttfb.append((first or t1) - t0)
                per_second[int(t1 - t_start)] = per_second.get(int(t1 - t_start), 0) + 1

        async def worker() -> None:
            while time.monotonic() < stop_at:
                await one()

        await asyncio.gather(*(worker() for _ in range(conc)))
        wall = time.monotonic() - t_start
        cpu = time.process_time() - cpu0
    for s in idle_socks:
        s.close()
    return {"ok": len(lat), "codes": codes, "unanswered": unanswered, "rps": len(lat) / wall,
            "p50_ms": _ms(pct(lat, 0.5)), "p99_ms": _ms(pct(lat, 0.99)), "ttfb_p50_ms": _ms(pct(ttfb, 0.5)),
            "per_second": [per_second.get(i, 0) for i in range(int(wall) + 1)], "client_cpu_s": cpu}


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1000, 1)


# --- orchestration -----------------------------------------------------------------------


def median_round(rounds: list[dict]) -> dict:
    """One figure per kind and point from several rounds: the round with the median
    throughput (its latencies with it), unanswered requests, 503s and ``kv_bad`` summed over
    all rounds, CPU per request the median of each group, every round's req/s kept."""
    by_rps = sorted(rounds, key=lambda r: r["rps"])
    out = dict(by_rps[(len(by_rps) - 1) // 2])
    out["unanswered"] = sum(r["unanswered"] for r in rounds)
    out["kv_bad"] = sum(r["kv_bad"] for r in rounds)
    codes: dict[str, int] = {}
    for r in rounds:
        for code, n in r["codes"].items():
            codes[str(code)] = codes.get(str(code), 0) + n
    out["codes"] = codes
    out["cpu_us_per_request"] = {g: round(statistics.median(r["cpu_us_per_request"][g] for r in rounds))
                                 for g in rounds[0]["cpu_us_per_request"]}
    out["rounds_rps"] = [round(r["rps"], 1) for r in rounds]
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 20.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer 200 within {timeout} s")


class Procs:
    """Child processes of the run (each in its own group; all stopped at exit)."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, argv: list[str], log: str | None = None, **kw) -> subprocess.Popen:
        err = open(log, "w") if log else subprocess.DEVNULL
        p = subprocess.Popen(argv, stdout=err, stderr=subprocess.STDOUT, start_new_session=True, **kw)
        self.procs.append(p)
        return p

    def stop(self, p: subprocess.Popen) -> None:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()

    def close(self) -> None:
        for p in self.procs:
            self.stop(p)


def fake(procs: Procs, role: str, port: int, a: argparse.Namespace) -> subprocess.Popen:
    p = procs.start([sys.executable, __file__, "fake", role, str(port), str(a.p_delay), str(a.d_delay),
                     str(a.chunks), str(a.chunk_gap)])
    wait_http(f"http://127.0.0.1:{port}/health")
    return p


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by process ``pid`` and its live descendants
    (the router's forked workers; a Rust router's threads are in its own figure)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


def start_router(procs: Procs, kind: str, port: int, prefills: list[str], decodes: list[str],
                 a: argparse.Namespace) -> subprocess.Popen:
    if kind.startswith("omni-pd"):
        workers = int(kind.rsplit("-w", 1)[1]) if "-w" in kind else a.workers
        argv = [sys.executable, "-m", "omni_pd.launch.router", "--connector", "nixl", "--port", str(port),
                "--log-level", "WARNING", "--health-interval", "1", "--workers", str(workers)]
        for u in prefills:
            argv += ["--prefill", u]
        for u in decodes:
            argv += ["--decode", u]
    else:
        argv = [str(VLLM_ROUTER), "--vllm-pd-disaggregation", "--kv-connector", "nixl", "--port", str(port),
                "--policy", "round_robin", "--log-level", "warning", "--health-check-interval-secs", "1", "--prometheus-port", str(free_port())]
        for u in prefills:
            argv += ["--prefill", u]
        for u in decodes:
            argv += ["--decode", u]
    log = f"/tmp/router_load-{kind}-{port}.log"
    proc = procs.start(argv, log=log, cwd=REPO)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 60)
    except RuntimeError as e:
        raise RuntimeError(f"{kind}: {e}; its log: {Path(log).read_text()[-1500:]}") from None
    return proc


def run_client(target: str, conc: int, duration: float, stream: bool, p_url: str, d_url: str,
               idle: int = 0) -> dict:
    out = subprocess.run([sys.executable, __file__, "client", target, str(conc), str(duration),
                          "1" if stream else "0", p_url, d_url, str(idle)],
                         capture_output=True, text=True, timeout=duration + 120)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout)


def stats(url: str) -> dict:
    import urllib.request

    with urllib.request.urlopen(url + "/stats", timeout=5) as r:
        return json.loads(r.read())


async def leave_early(url: str, stream: bool, after_first: bool, delay: float) -> float:
    """Send one request, leave (close the socket) after the first byte or ``delay`` s;
    returns the wall-clock time of leaving."""
    host, port = url.rsplit("/", 1)[-1].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    body = json.dumps({"model": "m", "prompt": "x", "max_tokens": 32, "stream": stream,
                       "_p_delay": 3.0 if not after_first else 0.02}).encode()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    await writer.drain()
    if after_first:
        await reader.read(1)
    else:
        await asyncio.sleep(delay)
    t = time.time()
    writer.transport.abort()
    return t


START, END = "<!-- router-load:start -->", "<!-- router-load:end -->"


def name_of(kind: str, r: dict) -> str:
    """Column title of a kind (``omni-pd-w2``: the omni-pd router with 2 workers)."""
    if kind.startswith("omni-pd-w"):
        return f"omni-pd router, {kind.rsplit('-w', 1)[1]} workers"
    return {"direct": "direct two-leg client (floor)", "vllm-router": "vllm-router 0.1.17",
            "omni-pd": f"omni-pd router ({r.get('omni_pd_workers', '?')} worker(s), default)"}[kind]


def _load_cell(k: str, x: dict | None, stream: bool) -> str:
    """req/s · p50 · p99 · unanswered (503s) [· TTFB] [· kv_bad] of one point."""
    if x is None:
        return "-"
    cell = f"{x['rps']:.0f} · {x['p50_ms']} · {x['p99_ms']} · {x['unanswered']}"
    if x["codes"].get("503"):
        cell += f" ({x['codes']['503']})"
    if stream:
        cell += f" · TTFB {x['ttfb_p50_ms']}"
    if x["kv_bad"]:
        cell += f" · kv_bad {x['kv_bad']}"
    return cell


def _cpu_cell(k: str, x: dict | None, stream: bool) -> str:
    """CPU µs per request: router · fakes · client (no router for the floor)."""
    cpu = (x or {}).get("cpu_us_per_request")
    if cpu is None:
        return "-"
    return f"{cpu['router'] if k != 'direct' else '-'} · {cpu['fakes']} · {cpu['client']}"


def _table(r: dict, kinds: list[str], names: dict[str, str], cell) -> list[str]:
    """One Markdown table, a row per (mode, concurrency) and a column per kind."""
    lines = ["| mode | concurrency | " + " | ".join(names[k] for k in kinds) + " |",
             "|---|---|" + "---|" * len(kinds)]
    for stream in (False, True):
        for c in sorted({x["concurrency"] for x in r["load"]}):
            row = [cell(k, next((y for y in r["load"] if y["kind"] == k and y["concurrency"] == c
                                 and y["stream"] == stream), None), stream) for k in kinds]
            lines.append(f"| {'stream' if stream else 'JSON'} | {c} | " + " | ".join(row) + " |")
    return lines


def render(r: dict) -> str:
    """The RESULTS.md section for one run (req/s · p50 · p99 ms · unanswered · TTFB p50), the
    CPU per request of each process group, and the fault runs."""
    kinds = ["direct"] + r["peers"]
    names = {k: name_of(k, r) for k in kinds}
    su = r["setup"]
    lines = [START, "## Router under load (issue 15): `python bench/router_load.py`", "",
             f"Fake P ({su['p_delay_s'] * 1000:g} ms) and D ({su['d_delay_s'] * 1000:g} ms JSON, or {su['chunks']} SSE "
             f"chunks {su['chunk_gap_s'] * 1000:g} ms apart), one instance each, loopback, a closed-loop client "
             f"({su['duration_s']:g} s per point, {su.get('rounds', 1)} rounds with the kinds in turn, the median "
             f"round shown), all in one run on {r['machine']['cpus']} shared cores (load average "
             f"{', '.join(f'{x:.1f}' for x in r['machine']['loadavg'])} at the start, "
             f"{', '.join(f'{x:.1f}' for x in r['machine'].get('loadavg_end', ()))} at the end). Cell: req/s · "
             "p50 ms · p99 ms · unanswered over all rounds (503s, deliberate, in brackets); stream rows add time to "
             "first byte p50. "
             "Every run checked decode got prefill's kv_transfer_params (`kv_bad` 0 unless noted).", "",
             *_table(r, kinds, names, _load_cell),
             "", "CPU per answered request, µs (user + system, psutil, over each point): the router's process "
             "tree · the two fakes · the client. The floor has no router; its client runs both legs.", "",
             *_table(r, kinds, names, _cpu_cell)]
    f = r["faults"]
    lines += ["", "Faults (same run):", ""]
    for k in r.get("fault_peers", r["peers"]):
        left = f.get("client_leaves_backend_sees_it_after_s", {}).get(k, {})
        kill = f.get("decode_killed_and_restarted", {}).get(k, {})
        idle = f.get("idle_100", {}).get(k, {})
        failed = sum(v for code, v in kill.get("codes", {}).items() if code != "200") + kill.get("unanswered", 0)
        th = kill.get("throughput", {})
        lines.append(
            f"* {names[k]}: a client leaving mid-stream is seen by decode after {left.get('decode')} s, during the "
            f"prefill leg by prefill after {left.get('prefill')} s (None: never); one of two decodes SIGKILLed for "
            f"3 s under c=16 JSON load: {failed} failed requests of {kill.get('ok', 0) + failed}, req/s before "
            f"{th.get('before_rps')}, while down {th.get('down_rps')}, after {th.get('after_rps')} (restarted "
            f"instance served {th.get('restarted_instance_served')}); 100 idle connections open: "
            f"{idle.get('rps', 0):.0f} req/s, p99 {idle.get('p99_ms')} ms, {idle.get('unanswered')} unanswered.")
    lines += [""] + [f"Note: {n}" for n in r.get("notes", [])] + [END]
    return "\n".join(lines) + "\n"


def write_results(r: dict, path: Path) -> None:
    """Replace (or append) the router-load section of ``path``."""
    text = path.read_text() if path.exists() else ""
    sec = render(r)
    if START in text and END in text:
        text = text[:text.index(START)] + sec + text[text.index(END) + len(END) + 1:]
    else:
        text = text.rstrip("\n") + "\n\n" + sec
    path.write_text(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="the cheap mode (also $OMNI_PD_BENCH_QUICK=1): omni-pd and the direct client, json, "
                         "8 clients for 0.5 s, one round, no peer, no faults, nothing written unless --out")
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--p-delay", type=float, default=0.02)
    ap.add_argument("--d-delay", type=float, default=0.05)
    ap.add_argument("--chunks", type=int, default=32)
    ap.add_argument("--chunk-gap", type=float, default=0.005)
    ap.add_argument("--workers", type=int, default=None,
                    help="omni-pd router --workers (default: the router's own default for this host)")
    ap.add_argument("--also-workers", default="", help="comma-separated worker counts run as extra omni-pd columns")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds per point, kinds in turn (default 3; the median round is reported)")
    ap.add_argument("--conc", default=None, help="comma-separated concurrencies (default 1,16,64,256,1024)")
    ap.add_argument("--modes", default="json,stream", help="json, stream or both (default both)")
    ap.add_argument("--no-peer", action="store_true", help="leave vllm-router out (iterating on omni-pd)")
    ap.add_argument("--no-faults", action="store_true", help="skip the fault runs (iterating)")
    ap.add_argument("--out", default=None, help="write the figures as JSON here (default bench/router_load.json)")
    ap.add_argument("--results", default=None, help="update this RESULTS.md's router-load section")
    a = ap.parse_args()
    a.quick = a.quick or os.environ.get("OMNI_PD_BENCH_QUICK", "") not in ("", "0")
    if a.quick:
        a.duration, a.rounds, a.modes, a.no_peer, a.no_faults = 0.5, 1, "json", True, True
        a.conc = a.conc or "8"
    elif a.out is None:
        a.out = str(REPO / "bench" / "router_load.json")
    concs = [int(x) for x in a.conc.split(",")] if a.conc else [1, 16, 64, 256, 1024]
    if a.workers is None:
        from omni_pd.launch.router.sizing import default_workers

        a.workers = default_workers()
    extra = [f"omni-pd-w{int(w)}" for w in a.also_workers.split(",") if w.strip()]
    kinds = ["omni-pd"] + extra + (["vllm-router"] if VLLM_ROUTER.exists() and not a.no_peer else [])
    fault_kinds = [k for k in kinds if k in ("omni-pd", "vllm-router")]
    modes = [m == "stream" for m in a.modes.split(",")]
    result: dict = {"machine": {"cpus": os.cpu_count(), "loadavg": os.getloadavg()}, "omni_pd_workers": a.workers,
                    "setup": {"p_delay_s": a.p_delay, "d_delay_s": a.d_delay, "chunks": a.chunks,
                              "chunk_gap_s": a.chunk_gap, "duration_s": a.duration, "rounds": a.rounds},
                    "peers": kinds, "fault_peers": fault_kinds, "load": [], "faults": {}}
    if "vllm-router" not in kinds:
        result["notes"] = [f"vllm-router not found at {VLLM_ROUTER}: its column is missing"]
    procs = Procs()
    try:
        pp, dp = free_port(), free_port()
        fake_p = fake(procs, "prefill", pp, a)
        fake_d = fake(procs, "decode", dp, a)
        p_url, d_url = f"http://127.0.0.1:{pp}", f"http://127.0.0.1:{dp}"
        ports = {k: free_port() for k in kinds}
        router_proc = {k: start_router(procs, k, ports[k], [p_url], [d_url], a) for k in kinds}
        everyone = ["direct"] + kinds
        for stream in modes:
            for c in concs:
                runs: dict[str, list[dict]] = {k: [] for k in everyone}
                for rnd in range(a.rounds):  # the kinds in turn, rotated each round: the machine is shared
                    for k in everyone[rnd % len(everyone):] + everyone[:rnd % len(everyone)]:
                        target = "direct" if k == "direct" else f"http://127.0.0.1:{ports[k]}"
                        bad0 = stats(d_url)["kv_bad"]
                        cpu0 = {"router": tree_cpu_s(router_proc[k].pid) if k in router_proc else 0.0,
                                "fakes": tree_cpu_s(fake_p.pid) + tree_cpu_s(fake_d.pid)}
                        r = run_client(target, c, a.duration, stream, p_url, d_url)
                        cpu1 = {"router": tree_cpu_s(router_proc[k].pid) if k in router_proc else 0.0,
                                "fakes": tree_cpu_s(fake_p.pid) + tree_cpu_s(fake_d.pid)}
                        r.update(kind=k, concurrency=c, stream=stream, kv_bad=stats(d_url)["kv_bad"] - bad0)
                        n = max(r["ok"], 1)
                        r["cpu_us_per_request"] = {
                            "router": round((cpu1["router"] - cpu0["router"]) / n * 1e6),
                            "fakes": round((cpu1["fakes"] - cpu0["fakes"]) / n * 1e6),
                            "client": round(r.pop("client_cpu_s") / n * 1e6)}
                        runs[k].append(r)
                        print(f"{'stream' if stream else 'json':6} c={c:<5} {k:12} {r['rps']:7.1f} req/s  "
                              f"p50 {r['p50_ms']} p99 {r['p99_ms']} ttfb {r['ttfb_p50_ms']} ms  "
                              f"unanswered {r['unanswered']} codes {r['codes']} kv_bad {r['kv_bad']} "
                              f"cpu us/req {r['cpu_us_per_request']}", flush=True)
                for k in everyone:
                    result["load"].append(median_round(runs[k]))
        # faults: a client leaving during the decode stream / during the prefill leg
        for k in ([] if a.no_faults else fault_kinds):
            url = f"http://127.0.0.1:{ports[k]}"
            out = {}
            for leg, after_first in (("decode", True), ("prefill", False)):
                backend = d_url if leg == "decode" else p_url
                n0 = len(stats(backend)["cancelled"])
                t_left = asyncio.run(leave_early(url, True, after_first, 0.3))
                time.sleep(2.0 if leg == "decode" else 3.5)
                c = stats(backend)["cancelled"][n0:]
                out[leg] = round(c[0] - t_left, 3) if c else None
            result["faults"].setdefault("client_leaves_backend_sees_it_after_s", {})[k] = out
            print(f"client leaves: {k} backend sees it after {out} s (None: never)", flush=True)
        # 100 idle connections held open during a c=16 JSON run
        for k in ([] if a.no_faults else fault_kinds):
            r = run_client(f"http://127.0.0.1:{ports[k]}", 16, a.duration, False, p_url, d_url, idle=100)
            result["faults"].setdefault("idle_100", {})[k] = r
            print(f"100 idle: {k} {r['rps']:.1f} req/s p99 {r['p99_ms']} unanswered {r['unanswered']}", flush=True)
        # a decode instance killed and restarted under load (2 decodes)
        for k in ([] if a.no_faults else fault_kinds):
            d2p = free_port()
            d2 = fake(procs, "decode", d2p, a)
            d2_url = f"http://127.0.0.1:{d2p}"
            rp = free_port()
            start_router(procs, k, rp, [p_url], [d_url, d2_url], a)
            import threading

            box: dict = {}
            t = threading.Thread(target=lambda: box.update(r=run_client(
                f"http://127.0.0.1:{rp}", 16, 9.0, False, p_url, d_url)))
            t.start()
            time.sleep(2.0)
            procs.stop(d2)
            time.sleep(3.0)
            d2 = procs.start([sys.executable, __file__, "fake", "decode", str(d2p), str(a.p_delay), str(a.d_delay),
                              str(a.chunks), str(a.chunk_gap)])
            t.join()
            r = box["r"]
            ps = r["per_second"]
            r["throughput"] = {"before_rps": sum(ps[0:2]) / 2, "down_rps": sum(ps[3:5]) / 2,
                               "after_rps": sum(ps[7:9]) / 2,
                               "restarted_instance_served": stats(d2_url)["requests"]}
            result["faults"].setdefault("decode_killed_and_restarted", {})[k] = r
            print(f"decode killed/restarted: {k} failed {sum(v for c, v in r['codes'].items() if c != '200')} "
                  f"unanswered {r['unanswered']} {r['throughput']}", flush=True)
            procs.stop(d2)
    finally:
        procs.close()
    result["machine"]["loadavg_end"] = os.getloadavg()
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {a.out}")
    if a.results:
        write_results(result, Path(a.results))
        print(f"updated {a.results}")
    return 1 if any(r.get("kv_bad") for r in result["load"]) else 0  # lost kv_transfer_params: wrong, not fast


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "fake":
        role, port, pd_, dd, ch, gap = sys.argv[2:8]
        run_fake(role, int(port), float(pd_), float(dd), int(ch), float(gap))
    elif len(sys.argv) > 1 and sys.argv[1] == "client":
        target, conc, dur, stream, p_url, d_url, idle = sys.argv[2:9]
        print(json.dumps(asyncio.run(client(target, int(conc), float(dur), stream == "1", p_url, d_url,
                                            int(idle)))))
    else:
        sys.exit(main())
