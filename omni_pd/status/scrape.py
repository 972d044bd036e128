"""The I/O edge of ``omni-pd status``: GET ``/metrics`` and ``/health`` with timeouts, and
count the expired-KV-lease lines of the logs it can read. Nothing else here decides.

Only GETs: ``status`` never changes the deployment and sends no generation request
(``--probe`` goes through :func:`omni_pd.launch.smoke.smoke`, outside this module).
"""

from __future__ import annotations

import http.client
import json
import re
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
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


#: vllm-omni 0.30's orchestrator evicting a replica whose engine core died
#: (vllm_omni/engine/orchestrator.py ``_handle_dead_replica``, logged at ERROR)
OMNI_DEAD = re.compile(r"\[Orchestrator\] Stage-(?P<stage>\d+) replica-(?P<replica>\d+) is dead; evicting it"
                       r" and failing its in-flight requests")
#: vllm-omni 0.30 starting its orchestrator (vllm_omni/engine/omni_engine_base.py): the stages start anew
OMNI_START = "[OmniEngine] Launching Orchestrator thread"


def omni_dead_stages(text: str) -> dict[str, str]:
    """The stages a vllm-omni server's log says died since its orchestrator last started:
    stage id -> the eviction line (from ``[Orchestrator]``, without the engine's error text).
    vllm-omni 0.30 starts no replacement for an evicted replica (a replica that registers
    again, distributed membership, is not followed here)."""
    start = text.rfind(OMNI_START)
    out: dict[str, str] = {}
    for m in OMNI_DEAD.finditer(text, max(start, 0)):
        out.setdefault(m.group("stage"), m.group(0))
    return out


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return None


def scrape_target(target: Target, *, timeout: float = TIMEOUT_S,
                  get: Callable[[str, float], tuple[int, bytes]] = _get) -> dict[str, Scrape]:
    """Every instance of ``target`` now, by name, in parallel; instances behind one URL (a
    vllm-omni server's stages) share one scrape. Each GET has ``timeout`` seconds."""
    urls = sorted({(i.url.rstrip("/"), i.role == "router") for i in target.instances})
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(urls)))) as pool:
        done = dict(zip(urls, pool.map(lambda u: scrape_url(u[0], router=u[1], timeout=timeout, get=get), urls)))
    dead: dict[str, dict[str, str] | None] = {}  # a vllm-omni server's log, read once for all its stages
    if target.runtime == "vllm-omni":
        for i in target.instances:
            if i.stage is not None and i.log is not None and dead.get(i.url.rstrip("/")) is None:
                text = _read(i.log)
                dead[i.url.rstrip("/")] = omni_dead_stages(text) if text is not None else None
    out = {}
    for i in target.instances:
        s = done[(i.url.rstrip("/"), i.role == "router")]
        if i.log is not None:
            s = replace(s, lease_lines=lease_lines(i.log))
        if i.stage is not None and dead.get(i.url.rstrip("/")) is not None:
            s = replace(s, dead_stages=dead[i.url.rstrip("/")])
        out[i.name] = s
    return out
