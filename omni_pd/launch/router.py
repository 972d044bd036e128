"""PD router: one OpenAI-compatible HTTP front for N prefill and M decode `vllm serve`.

``omni-pd launch`` starts one ``vllm serve`` per prefill (P) and per decode (D) instance
of a single-LLM pipeline and this router in front of them::

    python -m omni_pd.launch.router --connector NixlConnector --port 8000 \\
        --prefill http://10.0.0.1:8100 --decode http://10.0.0.2:8200

    python -m omni_pd.launch.router --connector MooncakeConnector --port 8000 \\
        --prefill http://10.0.0.1:8100,25201 --prefill http://10.0.0.1:8101,25203 \\
        --decode http://10.0.0.2:8200

``--prefill URL[,BOOTSTRAP_PORT]`` (upstream's space form ``--prefill URL PORT`` is accepted
too); the bootstrap port is the prefill engine's ``VLLM_MOONCAKE_BOOTSTRAP_PORT``
(Mooncake only; default 8998, vLLM's default).

Routes
------
``POST /v1/completions``, ``POST /v1/chat/completions``
    Two legs per request, chosen round-robin (P and D cycle independently; xPyD). Both
    legs carry the same ``X-Request-Id`` (a fresh UUID, echoed in the response) and the
    client's ``Authorization`` header. D's answer is relayed: JSON with its
    ``Content-Length``, or a stream (SSE) chunk by chunk as D produces it.
``GET /health``
    200 only when every backend's ``/health`` answers 200 and the connector is ready
    (Mooncake: every prefill's engine ids are known); else 503. The body is JSON with
    one entry per backend either way.
``GET /v1/models``
    Proxied to a decode instance (round-robin, the next one on a connection error).

The prefill leg (both connectors; :func:`prefill_request_body`)
----------------------------------------------------------------
``max_tokens`` = 1 (and ``max_completion_tokens`` = 1 when present), ``min_tokens`` and
``min_completion_tokens`` removed, ``stop`` and ``stop_token_ids`` removed (vLLM's
defaults are empty), ``ignore_eos`` = true, ``stream`` = false, ``stream_options``
removed, ``kv_transfer_params`` set by the connector. Why: P must finish its one token
with ``FINISHED_LENGTH_CAPPED`` for the connector to keep the KV blocks for D (Mooncake
keeps them only then; NIXL on 0.11 only then, later also on STOPPED —
vllm_kv_connectors.md §3.1/§3.2), so nothing may stop it earlier (a stop string, a stop
token, EOS), and ``min_tokens`` > 1 would fail vLLM's ``min_tokens <= max_tokens``
check. The toy proxies (§4.1, §4.2) set max_tokens/stream and drop min_tokens and
stream_options; clearing stop conditions and EOS is omni-pd's addition.

Connector contracts (:data:`CONNECTORS`, keyed by the ``kv_connector`` name)
---------------------------------------------------------------------------
NixlConnector (sequential; vLLM ``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py``)
    P gets ``{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id":
    null, "remote_block_ids": null, "remote_host": null, "remote_port": null}``; the
    router waits for P's JSON answer and gives D the original body with P's
    ``kv_transfer_params`` dict verbatim (every key, including ones added by newer vLLM).
    A P answer without ``kv_transfer_params`` is logged and D runs without them (D then
    computes the prompt itself: correct output, no disaggregation), as upstream does.
MooncakeConnector (concurrent, vLLM >= 0.18 protocol;
``examples/disaggregated/mooncake_connector/mooncake_connector_proxy.py``)
    After P's ``/health`` is 200 the router reads ``GET http://<P host>:<bootstrap
    port>/query`` (``{dp_rank: {"engine_id": ...}}``) and cycles over every (P, dp rank).
    Per request ``transfer_id = "xfer-<request id>"``; P gets ``{"do_remote_decode": true,
    "do_remote_prefill": false, "transfer_id": ...}`` and header ``X-data-parallel-rank``;
    D gets, at the same time, the original body with ``{"do_remote_decode": false,
    "do_remote_prefill": true, "remote_bootstrap_addr": "http://<P host>:<port>",
    "remote_engine_id": <engine id of that dp rank>, "transfer_id": ...}``. D's answer is
    relayed once P's leg has succeeded; if P's leg fails first, D's request is aborted.
    Until every prefill's engine ids are known, generation requests get 503.

Errors
------
Always JSON ``{"error": {"message", "type", "code", ...}}``, never a traceback. A prefill
leg that cannot be reached, times out, answers 5xx or answers non-JSON gives **502**
naming the backend (``"backend"``, ``"leg": "prefill"``); a 4xx from P (the client's
request is invalid, e.g. an unknown model or a bad API key) is relayed with P's status
and body. A decode backend that cannot be reached gives 502 naming it; any HTTP answer of
D is relayed as it is. A body that is not a JSON object gives 400.

Secrets: the incoming ``Authorization`` header is passed through to both legs and to
``/v1/models``; no header value is ever logged. There is no fallback to
``$OPENAI_API_KEY`` (the toy proxies' behaviour), so an unauthenticated client cannot use
the router's credentials.

Only the Python standard library is used: the router runs under omni-pd's own
interpreter, next to no vLLM install.
"""

from __future__ import annotations

import argparse
import http.client
import ipaddress
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, ClassVar, Mapping, Sequence
from urllib.parse import urlsplit

log = logging.getLogger("omni_pd.router")

#: vLLM's default ``VLLM_MOONCAKE_BOOTSTRAP_PORT`` (vllm_kv_connectors.md §3.2).
DEFAULT_MOONCAKE_BOOTSTRAP_PORT = 8998
#: largest request body accepted, bytes (multimodal requests carry base64 media)
MAX_BODY_BYTES = 256 * 1024 * 1024
#: bytes read from D per relay step when streaming
RELAY_CHUNK = 64 * 1024
#: routes that run the two-leg PD flow
GENERATE_ROUTES = ("/v1/completions", "/v1/chat/completions")


# --- backends ----------------------------------------------------------------------------


def _host_for_url(host: str) -> str:
    """``host`` as it appears in a URL: IPv6 literals get brackets."""
    try:
        if isinstance(ipaddress.ip_address(host), ipaddress.IPv6Address):
            return f"[{host}]"
    except ValueError:
        pass
    return host


@dataclass(frozen=True)
class Backend:
    """One ``vllm serve`` HTTP endpoint.

    ``url``: normalized base URL ``scheme://host:port`` (no path, no trailing slash).
    ``bootstrap_port``: the Mooncake bootstrap port of a prefill engine, else None.
    """

    url: str
    scheme: str
    host: str
    port: int
    bootstrap_port: int | None = None

    @property
    def bootstrap_addr(self) -> str:
        """``http://<host>:<bootstrap port>``: what Mooncake's D dials (``remote_bootstrap_addr``;
        vLLM's decode side appends ``/query``). Raises ValueError without a bootstrap port."""
        if self.bootstrap_port is None:
            raise ValueError(f"prefill {self.url} has no Mooncake bootstrap port")
        return f"http://{_host_for_url(self.host)}:{self.bootstrap_port}"

    def connection(self, timeout: float, port: int | None = None) -> http.client.HTTPConnection:
        """A new, unconnected ``http.client`` connection to this backend (or to ``port`` on
        the same host). ``timeout`` in seconds applies to connect and to each socket read."""
        cls = http.client.HTTPSConnection if self.scheme == "https" and port is None else http.client.HTTPConnection
        return cls(self.host, port if port is not None else self.port, timeout=timeout)


def parse_backend(text: str, *, bootstrap_port: int | None = None) -> Backend:
    """Parse ``http://host:port`` (or ``host:port``, http assumed) into a :class:`Backend`.

    ``URL,PORT`` sets the bootstrap port (overrides ``bootstrap_port``). A missing port
    means 80/443. Raises ValueError naming the bad text.
    """
    raw = text.strip()
    if "," in raw:
        raw, _, bp = raw.rpartition(",")
        bootstrap_port = _parse_port(bp, what="bootstrap port", text=text)
    if "://" not in raw:
        raw = "http://" + raw
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{text!r}: scheme must be http or https")
    if not parts.hostname:
        raise ValueError(f"{text!r}: no host")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"{text!r}: give the server's base URL without a path (e.g. http://host:8100)")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:  # urlsplit: port out of range / not a number
        raise ValueError(f"{text!r}: bad port ({exc})") from None
    host = parts.hostname
    return Backend(url=f"{parts.scheme}://{_host_for_url(host)}:{port}", scheme=parts.scheme,
                   host=host, port=port, bootstrap_port=bootstrap_port)


def _parse_port(value: str, *, what: str, text: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise ValueError(f"{text!r}: {what} must be a number, found {value!r}") from None
    if not 1 <= port <= 65535:
        raise ValueError(f"{text!r}: {what} {port} is outside 1..65535")
    return port


# --- request bodies (pure) --------------------------------------------------------------

#: keys removed from the prefill body (see the module docstring for why)
PREFILL_DROP = ("min_tokens", "min_completion_tokens", "stop", "stop_token_ids", "stream_options")


def prefill_request_body(body: Mapping[str, Any], kv_transfer_params: Mapping[str, Any]) -> dict[str, Any]:
    """The body P receives: a copy of the client's ``body`` (a JSON object, unchanged) with
    ``max_tokens`` = 1, ``max_completion_tokens`` = 1 if present, ``min_tokens``,
    ``min_completion_tokens``, ``stop``, ``stop_token_ids`` and ``stream_options`` removed,
    ``ignore_eos`` = true, ``stream`` = false and ``kv_transfer_params`` (copied).

    Source: vLLM toy_proxy_server.py / mooncake_connector_proxy.py (max_tokens, stream,
    stream_options, min_tokens); stop conditions: omni-pd, so P ends LENGTH_CAPPED.
    """
    out = {k: v for k, v in body.items() if k not in PREFILL_DROP}
    out["max_tokens"] = 1
    if "max_completion_tokens" in body:
        out["max_completion_tokens"] = 1
    out["ignore_eos"] = True
    out["stream"] = False
    out["kv_transfer_params"] = dict(kv_transfer_params)
    return out


def decode_request_body(body: Mapping[str, Any], kv_transfer_params: Mapping[str, Any] | None) -> dict[str, Any]:
    """The body D receives: the client's ``body`` unchanged, with ``kv_transfer_params``
    replaced by the connector's (a copy). ``None`` leaves the body as the client sent it."""
    out = dict(body)
    if kv_transfer_params is not None:
        out["kv_transfer_params"] = dict(kv_transfer_params)
    return out


# --- connector strategies ---------------------------------------------------------------


@dataclass(frozen=True)
class PrefillTarget:
    """One unit of the prefill rotation: a backend and, for Mooncake, one DP rank of it."""

    backend: Backend
    dp_rank: int | None = None

    def describe(self) -> str:
        return self.backend.url if self.dp_rank is None else f"{self.backend.url}[dp{self.dp_rank}]"


def transfer_id_for(request_id: str) -> str:
    """Mooncake ``transfer_id`` of a request: ``xfer-<request id>`` (upstream proxy format)."""
    return f"xfer-{request_id}"


class ConnectorStrategy:
    """How one KV connector's routing contract is carried between P and D.

    Subclasses set ``name`` (the vLLM ``kv_connector`` name) and ``concurrent`` (P and D
    dispatched together, or D after P's answer), and override the ``*_kv_params`` methods.
    """

    name: ClassVar[str]
    concurrent: ClassVar[bool] = False

    def __init__(self, prefills: Sequence[Backend]):
        self.prefills = list(prefills)

    def start(self, http_get: Callable[[Backend, str, int | None], tuple[int, bytes]],
              stop: threading.Event, interval: float) -> None:
        """Begin background discovery, if the connector needs any (default: none)."""

    def not_ready_reason(self) -> str | None:
        """Why generation requests cannot be routed yet, or None when ready."""
        return None

    def prefill_targets(self) -> list[PrefillTarget]:
        """The prefill rotation, in round-robin order (default: one entry per backend)."""
        return [PrefillTarget(p) for p in self.prefills]

    def prefill_headers(self, target: PrefillTarget) -> dict[str, str]:
        """Extra headers of the prefill leg (default: none)."""
        return {}

    def prefill_kv_params(self, request_id: str, target: PrefillTarget) -> dict[str, Any]:
        """``kv_transfer_params`` of the prefill leg."""
        raise NotImplementedError

    def decode_kv_params(self, request_id: str, target: PrefillTarget,
                         prefill_response: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """``kv_transfer_params`` of the decode leg. ``prefill_response`` is P's JSON answer
        (sequential connectors) or None (concurrent ones, called before P answers). None
        means "send D the client's body unchanged"."""
        raise NotImplementedError

    def state(self) -> dict[str, Any]:
        """Connector state for ``/health`` (JSON-able; no secrets)."""
        return {}


class NixlStrategy(ConnectorStrategy):
    """NixlConnector, pull mode: P first; D gets P's returned ``kv_transfer_params`` verbatim.

    Source: vLLM ``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py``;
    vllm_kv_connectors.md §3.1 (P answers ``do_remote_prefill, remote_block_ids,
    remote_engine_id, remote_host, remote_port, tp_size`` + newer keys per release).
    """

    name = "NixlConnector"
    concurrent = False

    def prefill_kv_params(self, request_id, target):
        return {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                "remote_block_ids": None, "remote_host": None, "remote_port": None}

    def decode_kv_params(self, request_id, target, prefill_response):
        params = (prefill_response or {}).get("kv_transfer_params")
        return params if isinstance(params, dict) else None


@dataclass
class _BootstrapState:
    ready: bool = False
    engine_ids: dict[int, str] = field(default_factory=dict)
    error: str | None = "waiting for prefill /health"


def parse_bootstrap_query(data: Any) -> dict[int, str]:
    """Engine id per DP rank from a Mooncake bootstrap ``GET /query`` answer.

    Shape (vLLM >= 0.18 ``mooncake_connector.py``): ``{"<dp_rank>": {"engine_id": str,
    "worker_addr": {...}}, ...}``. Returns ``{dp_rank: engine_id}`` (non-empty). Raises
    ValueError on any other shape.
    """
    if not isinstance(data, dict) or not data:
        raise ValueError(f"expected a non-empty JSON object, found {type(data).__name__}")
    out: dict[int, str] = {}
    for key, entry in data.items():
        try:
            rank = int(key)
        except (TypeError, ValueError):
            raise ValueError(f"dp rank {key!r} is not an integer") from None
        engine_id = entry.get("engine_id") if isinstance(entry, dict) else None
        if not isinstance(engine_id, str) or not engine_id:
            raise ValueError(f"dp rank {rank} has no engine_id")
        out[rank] = engine_id
    return dict(sorted(out.items()))


class MooncakeStrategy(ConnectorStrategy):
    """MooncakeConnector, vLLM >= 0.18 protocol: P and D at once, joined by ``transfer_id``.

    Source: vLLM ``examples/disaggregated/mooncake_connector/mooncake_connector_proxy.py``;
    vllm_kv_connectors.md §3.2 (P answers no kv_transfer_params; D needs all of
    ``remote_bootstrap_addr``, ``remote_engine_id``, ``transfer_id`` or silently runs
    without a transfer).
    """

    name = "MooncakeConnector"
    concurrent = True

    def __init__(self, prefills: Sequence[Backend]):
        missing = [p.url for p in prefills if p.bootstrap_port is None]
        prefills = [p if p.bootstrap_port is not None
                    else Backend(p.url, p.scheme, p.host, p.port, DEFAULT_MOONCAKE_BOOTSTRAP_PORT)
                    for p in prefills]
        super().__init__(prefills)
        if missing:
            log.info("MooncakeConnector: no bootstrap port given for %s; using %d",
                     ", ".join(missing), DEFAULT_MOONCAKE_BOOTSTRAP_PORT)
        self._lock = threading.Lock()
        self._state = {p.url: _BootstrapState() for p in self.prefills}

    def start(self, http_get, stop, interval):
        for p in self.prefills:
            threading.Thread(target=self._discover, args=(p, http_get, stop, interval),
                             name=f"mooncake-bootstrap {p.url}", daemon=True).start()

    def _discover(self, p: Backend, http_get, stop: threading.Event, interval: float) -> None:
        """Wait for P's /health 200, then read its bootstrap /query (upstream order)."""
        st = self._state[p.url]
        while not stop.is_set():
            try:
                status, _ = http_get(p, "/health", None)
                if status != 200:
                    raise ValueError(f"prefill /health answered {status}")
                status, raw = http_get(p, "/query", p.bootstrap_port)
                if status != 200:
                    raise ValueError(f"bootstrap {p.bootstrap_addr}/query answered {status}")
                engine_ids = parse_bootstrap_query(json.loads(raw))
            except (OSError, http.client.HTTPException, ValueError) as exc:
                with self._lock:
                    st.error = str(exc) or type(exc).__name__
                stop.wait(interval)
                continue
            with self._lock:
                st.engine_ids, st.ready, st.error = engine_ids, True, None
            log.info("MooncakeConnector: prefill %s engine ids %s", p.url, engine_ids)
            return

    def not_ready_reason(self):
        with self._lock:
            pending = [f"{url} ({st.error})" for url, st in self._state.items() if not st.ready]
        if pending:
            return "waiting for the Mooncake bootstrap /query of prefill " + ", ".join(pending)
        return None

    def prefill_targets(self):
        with self._lock:
            return [PrefillTarget(p, rank) for p in self.prefills
                    for rank in self._state[p.url].engine_ids]

    def prefill_headers(self, target):
        return {"X-data-parallel-rank": str(target.dp_rank)}

    def prefill_kv_params(self, request_id, target):
        return {"do_remote_decode": True, "do_remote_prefill": False,
                "transfer_id": transfer_id_for(request_id)}

    def decode_kv_params(self, request_id, target, prefill_response):
        with self._lock:
            engine_id = self._state[target.backend.url].engine_ids[target.dp_rank]
        return {"do_remote_decode": False, "do_remote_prefill": True,
                "remote_bootstrap_addr": target.backend.bootstrap_addr,
                "remote_engine_id": engine_id, "transfer_id": transfer_id_for(request_id)}

    def state(self):
        with self._lock:
            return {"bootstrap": {
                url: {"addr": next(p.bootstrap_addr for p in self.prefills if p.url == url),
                      "ready": st.ready, "engine_ids": {str(k): v for k, v in st.engine_ids.items()},
                      "error": st.error}
                for url, st in self._state.items()}}


#: connector name -> strategy class. Adding a connector is one entry here.
CONNECTORS: dict[str, type[ConnectorStrategy]] = {
    NixlStrategy.name: NixlStrategy,
    MooncakeStrategy.name: MooncakeStrategy,
}


def connector_class(name: str) -> type[ConnectorStrategy]:
    """The strategy for ``name``: a key of :data:`CONNECTORS`, case-insensitive, with or
    without the ``Connector`` suffix (``nixl``, ``Mooncake``). Raises ValueError listing the
    known names."""
    want = name.strip().lower()
    for key, cls in CONNECTORS.items():
        if want in (key.lower(), key.lower().removesuffix("connector")):
            return cls
    raise ValueError(f"unknown connector {name!r}; the router knows {', '.join(CONNECTORS)}")


# --- the router --------------------------------------------------------------------------


class LegError(Exception):
    """A leg failed: ``status`` and JSON ``payload`` are what the client receives."""

    def __init__(self, status: int, payload: dict[str, Any], headers: Mapping[str, str] | None = None,
                 raw: bytes | None = None):
        super().__init__(payload.get("error", {}).get("message", "") if payload else "")
        self.status, self.payload, self.headers, self.raw = status, payload, dict(headers or {}), raw


def error_payload(status: int, message: str, *, err_type: str, **extra: Any) -> dict[str, Any]:
    """OpenAI-style error body ``{"error": {"message", "type", "code", **extra}}``."""
    return {"error": {"message": message, "type": err_type, "code": status, **extra}}


def _bad_gateway(leg: str, backend: Backend, detail: str) -> LegError:
    return LegError(502, error_payload(502, f"{leg} backend {backend.url} failed: {detail}",
                                       err_type="bad_gateway", backend=backend.url, leg=leg))


def _error_detail(raw: bytes, limit: int = 500) -> str:
    """A short, printable reason out of a backend's error body."""
    try:
        data = json.loads(raw)
        if isinstance(data, dict):
            err = data.get("error", data.get("message", data.get("detail")))
            if isinstance(err, dict):
                err = err.get("message", err)
            if err is not None:
                text = err if isinstance(err, str) else json.dumps(err)
                return text[:limit]
    except ValueError:
        pass
    return raw[:limit].decode("utf-8", "replace")


def _abort(conn: http.client.HTTPConnection | None) -> None:
    """Close ``conn`` so a blocked read in another thread returns and the backend sees the
    client go away (vLLM aborts a request whose connection closes)."""
    if conn is None:
        return
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    conn.close()


class PDRouter:
    """Routing state shared by the HTTP handler threads.

    ``prefills``/``decodes``: backends, in round-robin order. ``connector``: a
    :class:`ConnectorStrategy` subclass. Times in seconds: ``timeout`` bounds each socket
    read from a backend (a non-streaming generation must answer within it),
    ``connect_timeout`` each connect, ``health_timeout`` each ``/health`` probe,
    ``discovery_interval`` the pause between Mooncake bootstrap attempts.
    """

    def __init__(self, prefills: Sequence[Backend], decodes: Sequence[Backend],
                 connector: type[ConnectorStrategy], *, timeout: float = 3600.0,
                 connect_timeout: float = 5.0, health_timeout: float = 2.0,
                 discovery_interval: float = 1.0):
        if not prefills or not decodes:
            raise ValueError("the router needs at least one prefill and one decode backend")
        self.decodes = list(decodes)
        self.strategy = connector(prefills)
        self.prefills = self.strategy.prefills
        self.timeout, self.connect_timeout = timeout, connect_timeout
        self.health_timeout, self.discovery_interval = health_timeout, discovery_interval
        self._lock = threading.Lock()
        self._n = 0
        self._models_n = 0
        self._stop = threading.Event()

    # lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        """Start the connector's background discovery (Mooncake engine ids)."""
        self.strategy.start(self._http_get, self._stop, self.discovery_interval)

    def close(self) -> None:
        """Stop background threads."""
        self._stop.set()

    # backend I/O ---------------------------------------------------------------------
    def _connect(self, backend: Backend, port: int | None = None,
                 timeout: float | None = None) -> http.client.HTTPConnection:
        connect_timeout = self.connect_timeout if timeout is None else min(self.connect_timeout, timeout)
        conn = backend.connection(connect_timeout, port)
        conn.connect()
        conn.sock.settimeout(timeout if timeout is not None else self.timeout)
        return conn

    def _http_get(self, backend: Backend, path: str, port: int | None = None,
                  headers: Mapping[str, str] | None = None) -> tuple[int, bytes]:
        """GET ``path`` (on ``port`` of the backend's host if given); returns (status, body).
        Raises OSError / http.client.HTTPException on transport failure."""
        conn = self._connect(backend, port, timeout=self.health_timeout)
        try:
            conn.request("GET", path, headers=dict(headers or {}))
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def _post(self, conn: http.client.HTTPConnection, path: str, body: dict[str, Any],
              headers: Mapping[str, str]) -> http.client.HTTPResponse:
        data = json.dumps(body).encode()
        conn.request("POST", path, body=data, headers={
            "Content-Type": "application/json", "Content-Length": str(len(data)), **headers})
        return conn.getresponse()

    # selection -----------------------------------------------------------------------
    def pick(self) -> tuple[PrefillTarget, Backend]:
        """Next (prefill target, decode backend), round-robin, each list cycling on its own
        (the toy proxies' rule). Raises LegError(503) while the connector is not ready."""
        reason = self.strategy.not_ready_reason()
        targets = self.strategy.prefill_targets()
        if reason or not targets:
            raise LegError(503, error_payload(503, f"router not ready: {reason or 'no prefill target'}",
                                              err_type="service_unavailable"))
        with self._lock:
            n = self._n
            self._n += 1
        return targets[n % len(targets)], self.decodes[n % len(self.decodes)]

    # the two legs ----------------------------------------------------------------------
    def prefill(self, target: PrefillTarget, path: str, body: dict[str, Any],
                headers: Mapping[str, str]) -> dict[str, Any]:
        """Run the prefill leg to completion and return P's JSON answer (a dict).

        Raises LegError: 502 (unreachable, timeout, 5xx, non-JSON answer) naming the
        backend, or P's own status and body for a 4xx.
        """
        backend = target.backend
        conn = None
        try:
            conn = self._connect(backend)
            resp = self._post(conn, path, body, headers)
            raw = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            raise _bad_gateway("prefill", backend, _describe_exc(exc)) from None
        finally:
            if conn is not None:
                conn.close()
        if 400 <= resp.status < 500:
            raise LegError(resp.status, {}, {"Content-Type": resp.getheader("Content-Type", "application/json")},
                           raw=raw)
        if not 200 <= resp.status < 300:
            raise _bad_gateway("prefill", backend, f"HTTP {resp.status}: {_error_detail(raw)}")
        try:
            data = json.loads(raw)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise _bad_gateway("prefill", backend, "answer is not a JSON object")
        return data

    def open_decode(self, backend: Backend, path: str, body: dict[str, Any],
                    headers: Mapping[str, str],
                    on_connect: Callable[[http.client.HTTPConnection], bool] | None = None,
                    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Send the decode leg and return (connection, response) with the headers read and
        the body unread (the caller relays and closes). ``on_connect(conn)`` is called once
        connected; returning False cancels before the request is sent. Raises LegError(502)
        naming the backend when it cannot be reached."""
        conn = None
        try:
            conn = self._connect(backend)
            if on_connect is not None and not on_connect(conn):
                raise ConnectionAbortedError("cancelled")
            return conn, self._post(conn, path, body, headers)
        except (OSError, http.client.HTTPException) as exc:
            if conn is not None:
                conn.close()
            raise _bad_gateway("decode", backend, _describe_exc(exc)) from None

    def dispatch(self, path: str, body: dict[str, Any], auth: str | None
                 ) -> tuple[str, PrefillTarget, Backend, http.client.HTTPConnection, http.client.HTTPResponse]:
        """Run one PD request. Returns (request id, prefill target, decode backend, D's
        connection, D's response with the body unread). Raises LegError."""
        target, decode = self.pick()
        rid = str(uuid.uuid4())
        common = {"X-Request-Id": rid}
        if auth is not None:
            common["Authorization"] = auth
        s = self.strategy
        p_body = prefill_request_body(body, s.prefill_kv_params(rid, target))
        p_headers = {**common, **s.prefill_headers(target)}
        if not s.concurrent:
            p_answer = self.prefill(target, path, p_body, p_headers)
            kv = s.decode_kv_params(rid, target, p_answer)
            if kv is None:
                log.warning("rid=%s prefill %s answered without kv_transfer_params; decode %s "
                            "computes the prompt itself", rid, target.describe(), decode.url)
            conn, resp = self.open_decode(decode, path, decode_request_body(body, kv), common)
            return rid, target, decode, conn, resp
        return (rid, target, decode,
                *self._dispatch_concurrent(target, decode, path, p_body, p_headers,
                                           decode_request_body(body, s.decode_kv_params(rid, target, None)),
                                           common))

    def _dispatch_concurrent(self, target, decode, path, p_body, p_headers, d_body, d_headers):
        """P and D at once; D's response is handed back only after P's leg succeeded."""
        changed = threading.Event()
        p_out: dict[str, Any] = {}
        d_out: dict[str, Any] = {}
        cancel = threading.Event()
        d_conn: list[http.client.HTTPConnection] = []

        def run_p():
            try:
                p_out["answer"] = self.prefill(target, path, p_body, p_headers)
            except LegError as exc:
                p_out["error"] = exc
            finally:
                p_out["done"] = True
                changed.set()

        def on_connect(conn):
            d_conn.append(conn)
            return not cancel.is_set()

        def run_d():
            try:
                d_out["result"] = self.open_decode(decode, path, d_body, d_headers, on_connect)
            except LegError as exc:
                d_out["error"] = exc
            finally:
                d_out["done"] = True
                changed.set()

        threading.Thread(target=run_p, name="prefill-leg", daemon=True).start()
        threading.Thread(target=run_d, name="decode-leg", daemon=True).start()
        while True:
            changed.wait()
            changed.clear()
            if "error" in d_out:
                raise d_out["error"]  # P finishes on its own; its blocks expire on P's timeout
            if "error" in p_out:
                cancel.set()
                _abort(d_conn[0] if d_conn else None)
                if "result" in d_out:
                    _abort(d_out["result"][0])
                raise p_out["error"]
            if p_out.get("done") and d_out.get("done"):
                return d_out["result"]

    # health and models ---------------------------------------------------------------
    def health(self) -> tuple[int, dict[str, Any]]:
        """Probe every backend's ``/health`` at once. Returns (200 or 503, JSON body):
        ``{"status": "ok"|"unavailable", "connector", "ready", "backends": [{"role", "url",
        "healthy", "status", "error"}], **connector state}``."""
        entries = [{"role": "prefill", "url": p.url} for p in self.prefills] + \
                  [{"role": "decode", "url": d.url} for d in self.decodes]
        backends = self.prefills + self.decodes

        def probe(i: int) -> None:
            try:
                status, _ = self._http_get(backends[i], "/health")
                entries[i].update(healthy=status == 200, status=status, error=None)
            except (OSError, http.client.HTTPException) as exc:
                entries[i].update(healthy=False, status=None, error=_describe_exc(exc))

        threads = [threading.Thread(target=probe, args=(i,), daemon=True) for i in range(len(backends))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        reason = self.strategy.not_ready_reason()
        ok = reason is None and all(e["healthy"] for e in entries)
        return (200 if ok else 503), {"status": "ok" if ok else "unavailable",
                                      "connector": self.strategy.name, "ready": reason is None,
                                      "reason": reason, "backends": entries, **self.strategy.state()}

    def models(self, auth: str | None) -> tuple[int, bytes, str]:
        """``GET /v1/models`` of a decode backend (round-robin; the next one on a transport
        error). Returns (status, body, content type). Raises LegError(502) when none answers."""
        with self._lock:
            start = self._models_n
            self._models_n += 1
        headers = {"Authorization": auth} if auth is not None else {}
        last: LegError | None = None
        for i in range(len(self.decodes)):
            d = self.decodes[(start + i) % len(self.decodes)]
            conn = None
            try:
                conn = self._connect(d, timeout=max(self.health_timeout, 10.0))
                conn.request("GET", "/v1/models", headers=headers)
                resp = conn.getresponse()
                return resp.status, resp.read(), resp.getheader("Content-Type", "application/json")
            except (OSError, http.client.HTTPException) as exc:
                last = _bad_gateway("decode", d, _describe_exc(exc))
            finally:
                if conn is not None:
                    conn.close()
        assert last is not None
        raise last


def _describe_exc(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# --- HTTP front ---------------------------------------------------------------------------


class RouterHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 handler; ``self.server.router`` is the :class:`PDRouter`."""

    protocol_version = "HTTP/1.1"
    server_version = "omni-pd-router"
    server: "RouterServer"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s %s", self.address_string(), format % args)

    # responses -------------------------------------------------------------------------
    def _send_bytes(self, status: int, data: bytes, content_type: str = "application/json",
                    headers: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _send_json(self, status: int, obj: Any, headers: Mapping[str, str] | None = None) -> None:
        self._send_bytes(status, json.dumps(obj).encode(), headers=headers)

    def _send_error(self, err: LegError, headers: Mapping[str, str] | None = None) -> None:
        if err.raw is not None:
            self._send_bytes(err.status, err.raw, err.headers.get("Content-Type", "application/json"), headers)
        else:
            self._send_json(err.status, err.payload, headers)

    def _relay(self, resp: http.client.HTTPResponse, headers: Mapping[str, str]) -> str:
        """Relay D's response: with its Content-Length as one block, else chunk by chunk
        (chunked transfer encoding; raw bytes then close for an HTTP/1.0 client). Returns
        "ok", "client gone" or "backend error" (a stream cut short: the client's stream
        is left unterminated so it sees an error)."""
        self.send_response(resp.status)
        for name in ("Content-Type", "Content-Encoding", "Cache-Control"):
            value = resp.getheader(name)
            if value is not None:
                self.send_header(name, value)
        for k, v in headers.items():
            self.send_header(k, v)
        length = resp.getheader("Content-Length")
        if length is not None and resp.getheader("Transfer-Encoding") is None:
            try:
                data = resp.read()
            except (OSError, http.client.HTTPException):
                self.send_header("Content-Length", "0")
                self.end_headers()
                self.close_connection = True
                return "backend error"
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            try:
                self.wfile.write(data)
            except OSError:
                return "client gone"
            return "ok"
        chunked = self.request_version != "HTTP/1.0"
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.close_connection = True
        self.end_headers()
        while True:
            try:
                data = resp.read1(RELAY_CHUNK)
            except (OSError, http.client.HTTPException):
                self.close_connection = True
                return "backend error"
            try:
                if not data:
                    if chunked:
                        self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                    return "ok"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
                self.wfile.flush()
            except OSError:
                self.close_connection = True
                return "client gone"

    # request parsing -------------------------------------------------------------------
    def _read_json_body(self) -> dict[str, Any]:
        length = self.headers.get("Content-Length")
        if length is None:
            self.close_connection = True
            raise LegError(411, error_payload(411, "a Content-Length header is required",
                                              err_type="invalid_request_error"))
        try:
            n = int(length)
        except ValueError:
            n = -1
        if n < 0 or n > MAX_BODY_BYTES:
            self.close_connection = True
            raise LegError(413 if n > 0 else 400, error_payload(
                413 if n > 0 else 400, f"request body must be 0..{MAX_BODY_BYTES} bytes",
                err_type="invalid_request_error"))
        raw = self.rfile.read(n)
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise LegError(400, error_payload(400, f"request body is not valid JSON: {exc}",
                                              err_type="invalid_request_error")) from None
        if not isinstance(body, dict):
            raise LegError(400, error_payload(400, "request body must be a JSON object",
                                              err_type="invalid_request_error"))
        return body

    # routes ----------------------------------------------------------------------------
    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        path = self.path.split("?", 1)[0]
        router = self.server.router
        try:
            if path == "/health":
                status, body = router.health()
                self._send_json(status, body)
            elif path == "/v1/models":
                try:
                    status, data, ctype = router.models(self.headers.get("Authorization"))
                    self._send_bytes(status, data, ctype)
                except LegError as err:
                    self._send_error(err)
            else:
                self._not_found(path)
        except OSError:
            self.close_connection = True  # client gone
        except Exception as exc:  # noqa: BLE001 - never a traceback to the client
            self._internal_error(exc)

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        path = self.path.split("?", 1)[0]
        if path not in GENERATE_ROUTES:
            self._not_found(path)
            return
        router = self.server.router
        t0 = time.monotonic()
        rid, target, decode, conn = "-", None, None, None
        try:
            body = self._read_json_body()
            rid, target, decode, conn, resp = router.dispatch(path, body, self.headers.get("Authorization"))
            outcome = self._relay(resp, {"X-Request-Id": rid})
            status = resp.status
        except LegError as err:
            self._send_error(err)
            status, outcome = err.status, err.payload.get("error", {}).get("message", "") or "prefill 4xx"
        except OSError:
            self.close_connection = True
            status, outcome = 0, "client gone"
        except Exception as exc:  # noqa: BLE001 - never a traceback to the client
            self._internal_error(exc)
            status, outcome = 500, type(exc).__name__
        finally:
            if conn is not None:
                conn.close()
        log.info("POST %s rid=%s prefill=%s decode=%s -> %s %s (%.3f s)", path, rid,
                 target.describe() if target else "-", decode.url if decode else "-",
                 status, outcome, time.monotonic() - t0)

    def do_PUT(self) -> None:  # noqa: N802
        self._method_not_allowed()

    do_DELETE = do_PATCH = do_PUT

    def _not_found(self, path: str) -> None:
        # a POST body left unread must not be parsed as the next request
        close = {"Connection": "close"} if self.command != "GET" else None
        self._send_json(404, error_payload(404, f"no route {path}; the router serves POST "
                                           f"{', '.join(GENERATE_ROUTES)}, GET /health, GET /v1/models",
                                           err_type="not_found"), close)

    def _method_not_allowed(self) -> None:
        self._send_json(405, error_payload(405, f"method {self.command} not allowed",
                                           err_type="invalid_request_error"), {"Connection": "close"})

    def _internal_error(self, exc: BaseException) -> None:
        log.error("internal router error: %s", _describe_exc(exc),
                  exc_info=bool(os.environ.get("OMNI_PD_DEBUG")))
        try:
            self._send_json(500, error_payload(500, f"internal router error ({type(exc).__name__})",
                                               err_type="internal_error"))
        except OSError:
            pass
        self.close_connection = True


class RouterServer(ThreadingHTTPServer):
    """A threading HTTP server (one thread per client connection) holding a :class:`PDRouter`."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], router: PDRouter):
        host = address[0]
        if ":" in host:
            self.address_family = socket.AF_INET6
        self.router = router
        super().__init__(address, RouterHandler)

    @property
    def url(self) -> str:
        """``http://host:port`` the server listens on (the real port when 0 was asked)."""
        host, port = self.server_address[:2]
        return f"http://{_host_for_url(host)}:{port}"


# --- CLI ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RouterConfig:
    """Parsed command line. Times in seconds."""

    host: str
    port: int
    connector: type[ConnectorStrategy]
    prefills: tuple[Backend, ...]
    decodes: tuple[Backend, ...]
    timeout: float = 3600.0
    connect_timeout: float = 5.0
    health_timeout: float = 2.0
    log_level: str = "INFO"


def build_parser() -> argparse.ArgumentParser:
    """The router's argparse parser (``python -m omni_pd.launch.router --help``)."""
    p = argparse.ArgumentParser(
        prog="python -m omni_pd.launch.router",
        description="PD router for single-LLM pipelines: sends each request to a prefill and a "
                    "decode vllm serve, carrying the KV connector's kv_transfer_params.")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on; 0 = any free (default 8000)")
    p.add_argument("--connector", required=True,
                   help=f"KV connector of the P/D engines: {', '.join(CONNECTORS)} (or nixl, mooncake)")
    p.add_argument("--prefill", action="append", nargs="+", default=[], metavar="URL",
                   help="prefill base URL, repeatable. MooncakeConnector: URL,BOOTSTRAP_PORT "
                        f"(or URL BOOTSTRAP_PORT; default port {DEFAULT_MOONCAKE_BOOTSTRAP_PORT})")
    p.add_argument("--decode", action="append", default=[], metavar="URL",
                   help="decode base URL, repeatable")
    p.add_argument("--timeout", type=float, default=3600.0,
                   help="seconds a backend may stay silent on a request (default 3600)")
    p.add_argument("--connect-timeout", type=float, default=5.0, help="seconds per connect (default 5)")
    p.add_argument("--health-timeout", type=float, default=2.0,
                   help="seconds per backend /health probe (default 2)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def parse_args(argv: Sequence[str] | None = None) -> RouterConfig:
    """Parse the command line into a :class:`RouterConfig`; bad usage exits with status 2
    and an argparse message."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        connector = connector_class(ns.connector)
    except ValueError as exc:
        parser.error(str(exc))
    prefills = []
    for words in ns.prefill:
        try:
            if len(words) > 2:
                raise ValueError(f"--prefill takes URL[,BOOTSTRAP_PORT] or URL BOOTSTRAP_PORT, got {words}")
            bp = None
            if len(words) == 2 and words[1].lower() != "none":
                bp = _parse_port(words[1], what="bootstrap port", text=" ".join(words))
            backend = parse_backend(words[0], bootstrap_port=bp)
        except ValueError as exc:
            parser.error(f"--prefill: {exc}")
        if backend.bootstrap_port is not None and connector is not MooncakeStrategy:
            parser.error(f"--prefill {' '.join(words)}: a bootstrap port applies to MooncakeConnector only")
        prefills.append(backend)
    decodes = []
    for text in ns.decode:
        try:
            decodes.append(parse_backend(text))
        except ValueError as exc:
            parser.error(f"--decode: {exc}")
    if not prefills or not decodes:
        parser.error("give at least one --prefill and one --decode")
    if not 0 <= ns.port <= 65535:
        parser.error(f"--port {ns.port} is outside 0..65535")
    for name in ("timeout", "connect_timeout", "health_timeout"):
        if getattr(ns, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    return RouterConfig(host=ns.host, port=ns.port, connector=connector, prefills=tuple(prefills),
                        decodes=tuple(decodes), timeout=ns.timeout, connect_timeout=ns.connect_timeout,
                        health_timeout=ns.health_timeout, log_level=ns.log_level)


def make_server(config: RouterConfig, *, discovery_interval: float = 1.0) -> RouterServer:
    """Bind the router (raises OSError when the address is taken) and start the connector's
    background discovery. Serve with ``serve_forever()``; stop with ``shutdown()``, then
    ``server_close()`` and ``router.close()``."""
    router = PDRouter(config.prefills, config.decodes, config.connector, timeout=config.timeout,
                      connect_timeout=config.connect_timeout, health_timeout=config.health_timeout,
                      discovery_interval=discovery_interval)
    server = RouterServer((config.host, config.port), router)
    router.start()
    return server


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse, bind, serve until SIGTERM/SIGINT. Exit status 0 on a clean stop,
    1 when the address cannot be bound, 2 on bad usage."""
    config = parse_args(argv)
    logging.basicConfig(level=config.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        server = make_server(config)
    except OSError as exc:
        print(f"error: cannot listen on {config.host}:{config.port}: {exc}", file=sys.stderr)
        return 1

    def stop(signum: int, frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("listening on %s (connector %s; prefill %s; decode %s)", server.url, config.connector.name,
             ", ".join(p.url if p.bootstrap_port is None else f"{p.url} bootstrap {p.bootstrap_port}"
                       for p in server.router.prefills),
             ", ".join(d.url for d in config.decodes))
    try:
        server.serve_forever()
    finally:
        server.router.close()
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
