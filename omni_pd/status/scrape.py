"""The I/O edge of ``omni-pd status``: GET ``/metrics`` and ``/health`` with timeouts, and
count the expired-KV-lease lines of the logs it can read. Nothing else here decides.

Only GETs: ``status`` never changes the deployment and sends no generation request
(``--probe`` goes through :func:`omni_pd.launch.smoke.smoke`, outside this module).
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from omni_pd.launch.smoke import kv_log_findings
from omni_pd.status.page import Page, PageError
from omni_pd.status.verdict import Scrape, Target

#: seconds one GET may take before the instance counts as not answering
TIMEOUT_S = 3.0
#: bytes of a ``/metrics`` page read at most (vLLM's page is ~60 KB; a vllm-omni server's
#: four stages ~300 KB)
MAX_PAGE = 16 * 1024 * 1024


def _get(url: str, timeout: float) -> tuple[int, bytes]:
    """``(HTTP status, body)`` of ``GET url`` (no proxy: the engines are on the cluster's
    own addresses). An HTTP error status is returned, not raised; a transport failure
    raises OSError or http.client.HTTPException."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as r:
            return r.status, r.read(MAX_PAGE)
    except urllib.error.HTTPError as e:
        return e.code, e.read(MAX_PAGE) if e.fp is not None else b""


def _why(e: BaseException) -> str:
    """A short reason: ``connection refused``, ``timed out``, or the exception's text."""
    reason = getattr(e, "reason", e)
    text = str(reason) or type(e).__name__
    if isinstance(reason, ConnectionRefusedError) or "Connection refused" in text:
        return "connection refused"
    if isinstance(reason, TimeoutError) or "timed out" in text:
        return "timed out"
    return f"{type(e).__name__}: {text}"


def scrape_url(base: str, *, router: bool = False, timeout: float = TIMEOUT_S,
               get: Callable[[str, float], tuple[int, bytes]] = _get) -> Scrape:
    """One instance now: ``GET <base>/health`` and, for an engine, ``GET <base>/metrics``
    (parsed); for omni-pd's router ``/health``'s JSON (it serves no ``/metrics``).
    Never raises for a server's failure: it is the :class:`Scrape`'s ``error``.
    ``timeout``: seconds per GET."""
    at = time.monotonic()
    base = base.rstrip("/")
    try:
        hs, hbody = get(base + "/health", timeout)
    except (OSError, http.client.HTTPException) as e:
        return Scrape(at, error=f"GET {base}/health: {_why(e)}")
    body = None
    if router:
        try:
            body = json.loads(hbody)
        except ValueError:
            body = None
        return Scrape(at, health=hs, health_body=body if isinstance(body, dict) else None)
    try:
        ms, mbody = get(base + "/metrics", timeout)
    except (OSError, http.client.HTTPException) as e:
        return Scrape(at, error=f"GET {base}/metrics: {_why(e)}", health=hs)
    if ms != 200:
        return Scrape(at, error=f"GET {base}/metrics: HTTP {ms}", health=hs)
    try:
        page = Page.parse(mbody.decode("utf-8", "replace"))
    except PageError as e:
        return Scrape(at, error=f"GET {base}/metrics: {e}", health=hs)
    return Scrape(at, page=page, health=hs)


def lease_lines(path: str) -> int | None:
    """How many expired/invalid KV lease lines (omni_pd/launch/smoke.py
    ``KV_LOG_PROBLEMS``, vLLM 0.30's NIXL messages) the log at ``path`` holds; None when
    it cannot be read."""
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    mine, other = kv_log_findings(text, path, ())
    return len(mine) + len(other)


def scrape_target(target: Target, *, timeout: float = TIMEOUT_S,
                  get: Callable[[str, float], tuple[int, bytes]] = _get) -> dict[str, Scrape]:
    """Every instance of ``target`` now, by name, in parallel; instances behind one URL (a
    vllm-omni server's stages) share one scrape. Each GET has ``timeout`` seconds."""
    urls = sorted({(i.url.rstrip("/"), i.role == "router") for i in target.instances})
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(urls)))) as pool:
        done = dict(zip(urls, pool.map(lambda u: scrape_url(u[0], router=u[1], timeout=timeout, get=get), urls)))
    out = {}
    for i in target.instances:
        s = done[(i.url.rstrip("/"), i.role == "router")]
        if i.log is not None:
            s = Scrape(s.at, s.page, s.error, s.health, s.health_body, lease_lines(i.log))
        out[i.name] = s
    return out
