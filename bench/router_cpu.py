"""Router CPU per request: omni-pd's router against the floor of its own stack (a bare
aiohttp two-leg proxy) and against vllm-router, JSON and streaming, in one run.

    python bench/router_cpu.py                       # c=256, 3 rounds, JSON and stream
    python bench/router_cpu.py --profile DIR         # the Python kinds under cProfile (CPU clock)
    python bench/router_cpu.py --baseline DIR        # + the router of an older tree, side by side
    python bench/router_cpu.py log-line              # CPU of the per-request INFO log line
    python bench/router_cpu.py micro [DIR]           # request id and pick CPU, DIR's tree and this one

Throughput on this shared 2-core machine moves with whatever else runs; the CPU time a
router process spends per request moves much less. So each kind serves the same closed
loop load (``--concurrency`` clients, ``--duration`` s, the fakes and client of
``bench/router_load.py``: P 20 ms, D 50 ms JSON or 32 SSE chunks 5 ms apart) and the
router process's CPU time (user + system, psutil, the process tree) is divided by the
requests it answered. Kinds run in turn, ``--rounds`` times, order rotated; min and median
over the rounds are reported.

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


# --- the floor: a bare aiohttp two-leg proxy ------------------------------------------------


def bare_proxy(port: int, p_url: str, d_url: str, leg_timeouts: bool = False) -> None:
    """Serve the minimal NIXL two-leg proxy on ``port`` (see the module doc) until SIGTERM.
    ``leg_timeouts``: each leg gets the router's default ``ClientTimeout`` (connect 5 s, each
    socket read 3600 s: ``core.Timeouts``) instead of none."""
    import asyncio

    import aiohttp
    import orjson
    from aiohttp import web
    from yarl import URL

    p_target, d_target = URL(p_url + "/v1/completions"), URL(d_url + "/v1/completions")
    state: dict = {}
    kw = {"timeout": aiohttp.ClientTimeout(total=None, connect=5.0, sock_read=3600.0)} if leg_timeouts else {}

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        session = state["session"]
        raw = await request.read()
        body = orjson.loads(raw)
        p_body = {**body, "max_tokens": 1, "stream": False, "kv_transfer_params": {"do_remote_decode": True}}
        p = await session.post(p_target, data=orjson.dumps(p_body), headers={"Content-Type": "application/json"}, **kw)
        kv = orjson.loads(await p.read())["kv_transfer_params"]
        p.release()
        d_body = raw.rstrip()[:-1] + b',"kv_transfer_params":' + orjson.dumps(kv) + b"}"
        d = await session.post(d_target, data=d_body, headers={"Content-Type": "application/json"}, **kw)
        if d.content_length is not None:
            data = await d.read()
            d.release()
            return web.Response(status=d.status, body=data, content_type="application/json")
        out = web.StreamResponse(status=d.status, headers={"Content-Type": d.headers["Content-Type"]})
        out.enable_chunked_encoding()
        await out.prepare(request)
        while chunk := await d.content.readany():
            await out.write(chunk)
        d.release()
        await out.write_eof()
        return out

    async def health(request: web.BaseRequest) -> web.StreamResponse:
        if request.path == "/health":
            return web.Response(body=b"{}", content_type="application/json")
        return await handle(request)

    async def main() -> None:
        state["session"] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0, use_dns_cache=True),
            auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None),
            skip_auto_headers=("Accept-Encoding",), cookie_jar=aiohttp.DummyCookieJar())
        runner = web.ServerRunner(web.Server(health, handler_cancellation=True, access_log=None,
                                             keepalive_timeout=75.0))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=4096).start()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await runner.cleanup()
        await state["session"].close()

    from omni_pd.launch.router.server import run_loop

    run_loop(main())


def profiled(out: str, what: str, args: list[str]) -> int:
    """Run ``what`` (``bare``: :func:`bare_proxy` with ``args`` port, P URL, D URL; ``router``:
    omni-pd's router with ``args`` as for ``python -m omni_pd.launch.router``) under
    cProfile on the process CPU clock; the stats go to ``out`` when it stops (SIGTERM)."""
    import cProfile

    prof = cProfile.Profile(time.process_time)
    try:
        if what == "bare":
            prof.runcall(bare_proxy, int(args[0]), args[1], args[2], args[3] == "1")
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
    if kind in ("bare", "bare-timeouts"):
        argv = [sys.executable, __file__, "bare", str(port), p_url, d_url, str(int(kind == "bare-timeouts"))]
        if profile:
            argv[1:2] = [__file__, "profiled", f"{profile}/{kind}.prof"]
        p = procs.start(argv, log=f"/tmp/router_cpu-{kind}.log")
        rl.wait_http(f"http://127.0.0.1:{port}/health")
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


def measure(kind_pid: int, target: str, conc: int, duration: float, stream: bool, p_url: str, d_url: str) -> dict:
    c0 = rl.tree_cpu_s(kind_pid)
    r = rl.run_client(target, conc, duration, stream, p_url, d_url)
    c1 = rl.tree_cpu_s(kind_pid)
    n = max(r["ok"], 1)
    return {"us": (c1 - c0) / n * 1e6, "rps": r["rps"], "ok": r["ok"], "unanswered": r["unanswered"],
            "codes": r["codes"]}


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
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    a = ap.parse_args()
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
            served[k] += rl.run_client(f"http://127.0.0.1:{ports[k]}", a.concurrency, 1.0, False, p_url, d_url)["ok"]
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
                    print(f"{mode:6} {k:13} {m['us']:7.1f} µs/req  {m['rps']:7.1f} req/s  ok {m['ok']} "
                          f"unanswered {m['unanswered']} codes {m['codes']}", flush=True)
            for k in kinds:
                us = [m["us"] for m in runs[k]]
                # paired with the floor of the same round (the kinds ran back to back): the
                # difference moves less with the machine's load than either figure
                diff = ([x - b["us"] for x, b in zip(us, runs["bare"])] if "bare" in runs and k != "bare" else None)
                result["points"].setdefault(mode, {})[k] = {
                    "over_bare_us_median": None if diff is None else round(statistics.median(diff), 1),
                    "us_min": round(min(us), 1), "us_median": round(statistics.median(us), 1),
                    "rps_median": round(statistics.median(m["rps"] for m in runs[k])),
                    "unanswered": sum(m["unanswered"] for m in runs[k]), "rounds_us": [round(x, 1) for x in us]}
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
          "bare) · median req/s")
    for mode, per in result["points"].items():
        for k, v in per.items():
            over = "-" if v.get("over_bare_us_median") is None else f"{v['over_bare_us_median']:+.1f}"
            print(f"{mode:6} {k:14} {v['us_min']:7.1f} · {v['us_median']:7.1f} · {over:>7}   "
                  f"{v['rps_median']} req/s  unanswered {v['unanswered']}")
    for k, v in result.get("profile", {}).items():
        print(f"cProfile {k:14} {v['calls_per_request']:7.1f} Python calls per request, "
              f"{v['profiled_us_per_request']:7.1f} profiled µs per request, "
              f"{100 * v['own_code_share']:4.1f} % in omni-pd's own files")
    print(f"load average {result['loadavg_start']} -> {result['loadavg_end']}")
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "bare":
        bare_proxy(int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5] == "1")
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
