"""The router's transport: pooled backend connections, legs with retry, health polling.

:class:`PDRouter` owns one :class:`aiohttp.ClientSession` (keep-alive connections to
every backend, reused across requests), one :class:`~.backends.Pool` per role, the
connector strategy (:mod:`.protocol`) and the optional pre-legs (:class:`PreLeg`). It
runs on one asyncio event loop; nothing here blocks it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import uuid
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, ClassVar, Mapping, Sequence

import aiohttp
from yarl import URL

import omni_pd.launch.router.codec as codec

from omni_pd.launch.router.backends import Backend, Instance, Pool, _host_for_url
from omni_pd.launch.router.protocol import (
    ConnectorStrategy, NoKVStrategy, PrefillTarget, decode_request_bytes, prefill_request_body)

log = logging.getLogger("omni_pd.router")


class LegError(Exception):
    """A leg failed: ``status`` and JSON ``payload`` are what the client receives.

    ``retryable``: the failure says nothing about the request (the backend could not be
    reached, dropped the connection, timed out, or answered 5xx/503), so another instance
    may serve it. ``raw``: a backend's own body relayed verbatim (4xx from P).
    """

    def __init__(self, status: int, payload: dict[str, Any], headers: Mapping[str, str] | None = None,
                 raw: bytes | None = None, retryable: bool = False):
        super().__init__(payload.get("error", {}).get("message", "") if payload else "")
        self.status, self.payload, self.headers, self.raw = status, payload, dict(headers or {}), raw
        self.retryable = retryable


def error_payload(status: int, message: str, *, err_type: str, **extra: Any) -> dict[str, Any]:
    """OpenAI-style error body ``{"error": {"message", "type", "code", **extra}}``."""
    return {"error": {"message": message, "type": err_type, "code": status, **extra}}


def bad_gateway(leg: str, backend: Backend, detail: str, *, retryable: bool = True) -> LegError:
    """502 naming the backend and the leg."""
    return LegError(502, error_payload(502, f"{leg} backend {backend.url} failed: {detail}",
                                       err_type="bad_gateway", backend=backend.url, leg=leg),
                    retryable=retryable)


def error_detail(raw: bytes, limit: int = 500) -> str:
    """A short, printable reason out of a backend's error body."""
    try:
        data = codec.loads(raw)
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


def describe_exc(exc: BaseException) -> str:
    """A short, secret-free description of a transport failure."""
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return "timed out"
    if isinstance(exc, aiohttp.ClientConnectorError):
        if isinstance(exc.os_error, ConnectionRefusedError):
            return "connection refused"
        return f"cannot connect ({exc.os_error.strerror or type(exc.os_error).__name__})"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "server disconnected"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


#: transport failures of a leg (the backend, not the request, is at fault)
TRANSPORT_ERRORS = (aiohttp.ClientError, OSError, asyncio.TimeoutError)


class RequestIds:
    """The ``X-Request-Id`` of each client request (P, D and every pre-leg get it; Mooncake's
    ``transfer_id`` is built from it): ``str(uuid.uuid4())``-shaped text (8-4-4-4-12 hex,
    version-4 bits) whose first four groups are drawn once per process (74 random bits,
    drawn again in a forked worker by :func:`os.register_at_fork`) and whose last group is
    a per-process counter. Unique within a process; across workers and restarts two
    processes share a prefix with probability ~2^-74 per pair. Calling it costs a counter
    step and a format instead of :func:`uuid.uuid4`'s ``os.urandom`` system call and
    :class:`uuid.UUID` object (bench/RESULTS.md, "Router CPU per request")."""

    def __init__(self) -> None:
        self.reseed()

    def reseed(self) -> None:
        """A fresh random prefix and a counter from 0 (a forked worker's ids are its own)."""
        self.prefix = str(uuid.uuid4())[:23]
        self._count = itertools.count()

    def __call__(self) -> str:
        return f"{self.prefix}-{next(self._count) & 0xFFFFFFFFFFFF:012x}"


#: the process's request ids (:class:`RequestIds`); reseeded in the child after a fork
request_ids = RequestIds()
os.register_at_fork(after_in_child=request_ids.reseed)


@dataclass
class LegContext:
    """What a leg of one client request knows: the request id, the route, the headers
    every leg carries (``X-Request-Id``, the client's ``Authorization``)."""

    router: "PDRouter"
    request_id: str
    path: str
    headers: dict[str, str]

    async def call_json(self, role: str, path: str, body: dict[str, Any],
                        headers: Mapping[str, str] | None = None) -> tuple[Instance, dict[str, Any]]:
        """POST ``body`` to an instance of pool ``role`` (picked, retried elsewhere on a
        transport failure or 5xx) and return (instance, JSON answer). Raises LegError."""
        unit, answer = await self.router.json_leg(
            role, path, lambda unit: (body, {**self.headers, **(headers or {})}))
        return unit, answer


class PreLeg:
    """A leg that runs before the P/D legs of every generation request: the seam for an
    encoder (E in E->P->D) or any other producer whose answer the consumer request needs.

    Subclasses set ``role`` (the name of their instance pool, e.g. ``encode``; the router
    is built with ``pre_legs=[(leg, backends)]``) and implement :meth:`apply`, which gets
    the client's body and returns the body P and D will see (e.g. with
    ``ec_transfer_params`` merged in). Inside, ``ctx.call_json(self.role, path, item)``
    sends one request (per media item, say) with picking, least-outstanding balancing,
    health skipping, retry on another instance and cancellation when the client leaves, all
    provided by the router; a LegError raised propagates to the client as is. The P/D
    protocol (:mod:`.protocol`) is not involved.
    """

    role: ClassVar[str]

    async def apply(self, ctx: LegContext, body: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError


@dataclass(frozen=True)
class Timeouts:
    """Seconds. ``read``: longest silence of a backend on a request (each socket read);
    ``prefill``: whole prefill leg (None = no bound beyond ``read``); ``connect``: each
    connect; ``health``: each ``/health`` / bootstrap probe."""

    read: float = 3600.0
    prefill: float | None = None
    connect: float = 5.0
    health: float = 2.0


class PDRouter:
    """Routing state and the legs of every request (one asyncio loop).

    ``prefills``/``decodes``: backends in pool order (duplicates are separate instances).
    ``connector``: a :class:`ConnectorStrategy` subclass, or None for a front without a
    P/D split (E -> PD): no prefills, and ``decodes`` are instances that run prefill and
    decode themselves (pool ``pd``); each request, after the pre-legs, goes to one of them
    whole, as vLLM's disaggregated-encoder example proxy does with
    ``--prefill-servers-urls disable`` (examples/online_serving/disaggregated_encoder/
    disagg_epd_proxy.py ``maybe_prefill``). ``balance``:
    ``least_outstanding`` | ``round_robin``. ``retries``: extra instances a failed leg
    is tried on while nothing has reached the client. ``health_interval``: seconds
    between background ``/health`` polls (``discovery_interval`` while a prefill's
    Mooncake ids are unknown). ``pre_legs``: ``[(PreLeg, backends)]``.
    """

    def __init__(self, prefills: Sequence[Backend], decodes: Sequence[Backend],
                 connector: type[ConnectorStrategy] | None, *, timeouts: Timeouts = Timeouts(),
                 balance: str = "least_outstanding", retries: int = 2, health_interval: float = 2.0,
                 discovery_interval: float = 1.0, pre_legs: Sequence[tuple[PreLeg, Sequence[Backend]]] = ()):
        #: no P/D split: every request goes whole to the ``pd`` pool (see the class doc)
        self.aggregated = connector is None
        if self.aggregated and (prefills or not decodes):
            raise ValueError("a router without a KV connector takes prefill+decode instances only, at least one")
        if not self.aggregated and (not prefills or not decodes):
            raise ValueError("the router needs at least one prefill and one decode backend")
        self.strategy = (connector or NoKVStrategy)(prefills)
        self.prefills = self.strategy.prefills
        self.decodes = list(decodes)
        #: the pool whose answer reaches the client: ``decode``, or ``pd`` without a P/D split
        self.final = "pd" if self.aggregated else "decode"
        self.pools: dict[str, Pool] = {"prefill": Pool("prefill", self.prefills, balance),
                                       self.final: Pool(self.final, self.decodes, balance)}
        self.pre_legs = [leg for leg, _ in pre_legs]
        for leg, backends in pre_legs:
            self.pools[leg.role] = Pool(leg.role, backends, balance)
        self.strategy.bind(self.pools["prefill"].instances)
        self.timeouts, self.retries = timeouts, retries
        self.health_interval, self.discovery_interval = health_interval, discovery_interval
        self.session: aiohttp.ClientSession | None = None
        self._poller: asyncio.Task | None = None
        self._urls: dict[tuple[str, str], URL] = {}  # (base URL, path) -> parsed once
        t = timeouts
        self._leg_timeouts = {
            leg: aiohttp.ClientTimeout(total=t.prefill if leg == "prefill" else None, connect=t.connect,
                                       sock_read=t.read) for leg in ("prefill", "other")}

    # lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        """Open the pooled client session and start the health poller."""
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0, use_dns_cache=True),
            auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None),
            # no "Accept-Encoding: gzip, deflate": with auto_decompress off the router would
            # get a compressed prefill answer it must parse, or relay one the client never asked for
            skip_auto_headers=("Accept-Encoding",),
            cookie_jar=aiohttp.DummyCookieJar())  # a proxy keeps no cookies between clients
        await self.probe_all()
        self._poller = asyncio.create_task(self._poll_loop())

    async def aclose(self) -> None:
        """Stop the poller and close every backend connection."""
        if self._poller is not None:
            self._poller.cancel()
            try:
                await self._poller
            except asyncio.CancelledError:
                pass
            self._poller = None
        if self.session is not None:
            await self.session.close()
            self.session = None

    def close(self) -> None:
        """Compatibility no-op: the server closes the router when it stops."""

    def instances(self) -> list[Instance]:
        return [i for pool in self.pools.values() for i in pool.instances]

    # health ----------------------------------------------------------------------------
    async def get(self, backend: Backend, path: str, port: int | None = None) -> tuple[int, bytes]:
        """GET ``path`` on the backend (or on ``port`` of its host); (status, body).
        Raises OSError on any transport failure (so strategies need not know aiohttp)."""
        scheme = backend.scheme if port is None else "http"
        url = f"{scheme}://{_host_for_url(backend.host)}:{port or backend.port}{path}"
        t = aiohttp.ClientTimeout(total=self.timeouts.health, connect=min(self.timeouts.connect,
                                                                           self.timeouts.health))
        try:
            async with self.session.get(url, timeout=t) as resp:
                return resp.status, await resp.read()
        except TRANSPORT_ERRORS as exc:
            raise OSError(describe_exc(exc)) from None

    async def probe(self, inst: Instance) -> dict[str, Any]:
        """One ``/health`` probe; updates ``inst`` (and the connector on a prefill)."""
        try:
            status, _ = await self.get(inst.backend, "/health")
            healthy, error = status == 200, (None if status == 200 else f"/health answered {status}")
        except OSError as exc:
            status, healthy, error = None, False, str(exc)
        self._mark(inst, healthy, error)
        if healthy and inst.role == "prefill":
            await self.strategy.on_healthy(inst, self.get)
        return {"role": inst.role, "url": inst.url, "healthy": healthy, "status": status, "error": error}

    def _mark(self, inst: Instance, healthy: bool, error: str | None) -> None:
        if inst.mark(healthy, error):
            log.warning("%s is %s%s", inst.describe(), "up" if healthy else "down",
                        f" ({error})" if error else "")
            if not healthy and inst.role == "prefill":
                self.strategy.on_down(inst)

    async def probe_all(self) -> list[dict[str, Any]]:
        """Probe every instance at once (one task each on this loop)."""
        return list(await asyncio.gather(*(self.probe(i) for i in self.instances())))

    async def _poll_loop(self) -> None:
        while True:
            pending = self.strategy.not_ready_reason() or any(not i.healthy for i in self.instances())
            await asyncio.sleep(self.discovery_interval if pending else self.health_interval)
            try:
                await self.probe_all()
            except Exception as exc:  # noqa: BLE001 - the poller must outlive any surprise
                log.error("health poll failed: %s", describe_exc(exc))

    async def health(self) -> tuple[int, dict[str, Any]]:
        """Probe every backend now. Returns (200 or 503, JSON body): ``{"status":
        "ok"|"unavailable", "connector", "ready", "reason", "backends": [{"role", "url",
        "healthy", "status", "error"}], "instances": [...load state...], **connector
        state}``; 200 only when every backend is healthy and the connector is ready."""
        entries = await self.probe_all()
        reason = self.strategy.not_ready_reason()
        ok = reason is None and all(e["healthy"] for e in entries)
        return (200 if ok else 503), {"status": "ok" if ok else "unavailable",
                                      "connector": self.strategy.name, "ready": reason is None,
                                      "reason": reason, "backends": entries,
                                      "instances": [i.state() for i in self.instances()],
                                      **self.strategy.state()}

    # legs ------------------------------------------------------------------------------
    def _timeout(self, leg: str) -> aiohttp.ClientTimeout:
        return self._leg_timeouts["prefill" if leg == "prefill" else "other"]

    def _post(self, inst: Instance, path: str, body: dict[str, Any] | bytes, headers: Mapping[str, str],
              leg: str) -> Awaitable[aiohttp.ClientResponse]:
        """POST ``body`` (a JSON object, or its UTF-8 JSON bytes); awaiting the result gives the
        response with headers read, body unread (caller releases). A plain function handing
        back aiohttp's awaitable, not a coroutine of its own: every resume of a leg passes
        through each coroutine frame between the event loop and aiohttp, and this one had
        nothing to do after the call (bench/RESULTS.md, "Router CPU per request")."""
        data = body if isinstance(body, bytes) else codec.dumps(body)
        key = (inst.url, path)
        url = self._urls.get(key)
        if url is None:
            url = self._urls[key] = URL(inst.url + path)
        return self.session.post(url, data=data, timeout=self._timeout(leg),
                                 headers={"Content-Type": "application/json", **headers})

    def _failed(self, inst: Instance, leg: str, exc: BaseException) -> LegError:
        inst.failures += 1
        detail = describe_exc(exc)
        if isinstance(exc, (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError,
                            ConnectionError)):
            self._mark(inst, False, detail)  # back in rotation at its next /health 200
        return bad_gateway(leg, inst.backend, detail)

    async def _json_once(self, inst: Instance, path: str, body: dict[str, Any],
                         headers: Mapping[str, str], leg: str) -> dict[str, Any]:
        inst.outstanding += 1
        try:
            try:
                resp = await self._post(inst, path, body, headers, leg)
                try:
                    raw = await resp.read()
                finally:
                    resp.release()
            except TRANSPORT_ERRORS as exc:
                raise self._failed(inst, leg, exc) from None
        finally:
            inst.outstanding -= 1
        inst.served += 1
        if 400 <= resp.status < 500:
            raise LegError(resp.status, {}, {"Content-Type": resp.headers.get("Content-Type", "application/json")},
                           raw=raw)
        if not 200 <= resp.status < 300:
            inst.failures += 1
            raise bad_gateway(leg, inst.backend, f"HTTP {resp.status}: {error_detail(raw)}")
        try:
            data = codec.loads(raw)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise bad_gateway(leg, inst.backend, "answer is not a JSON object", retryable=False)
        return data

    def _pick(self, role: str, tried: list[Any], units: Sequence[Any] | None,
              instance_of: Callable[[Any], Instance]) -> Any | None:
        pool = self.pools[role]
        among = pool.instances if units is None else units
        if tried:
            tried_inst = {id(instance_of(u)) for u in tried}
            among = [u for u in among if id(instance_of(u)) not in tried_inst]
        if not among:
            return None
        return pool.pick(among=among, instance_of=instance_of)

    async def json_leg(self, role: str, path: str,
                       build: Callable[[Any], tuple[dict[str, Any], Mapping[str, str]]], *,
                       units: Sequence[Any] | None = None,
                       instance_of: Callable[[Any], Instance] = lambda u: u) -> tuple[Any, dict[str, Any]]:
        """A non-streaming leg on pool ``role``: pick a unit (an instance, or one of
        ``units``), ``build(unit)`` -> (body, headers), POST, return (unit, JSON answer).
        A retryable failure is retried on a unit of another instance, up to ``retries``
        times. Raises LegError (the last failure)."""
        tried: list[Any] = []
        last: LegError | None = None
        for _ in range(self.retries + 1):
            unit = self._pick(role, tried, units, instance_of)
            if unit is None:
                break
            body, headers = build(unit)
            try:
                return unit, await self._json_once(instance_of(unit), path, body, headers, role)
            except LegError as err:
                if not err.retryable:
                    raise
                last = err
                tried.append(unit)
                log.warning("%s leg on %s failed (%s); %s", role, instance_of(unit).describe(), err,
                            "retrying elsewhere" if len(tried) <= self.retries else "giving up")
        if last is None:
            raise LegError(503, error_payload(503, f"no {role} instance available",
                                              err_type="service_unavailable"))
        raise last

    async def open_decode(self, path: str, body: dict[str, Any] | bytes, headers: Mapping[str, str],
                          tried: list[Instance]) -> tuple[Instance, aiohttp.ClientResponse]:
        """Send the decode leg to a decode instance not in ``tried`` (appended to) and
        return (instance, response) with D's headers read and its body unread; the
        instance's ``outstanding`` stays counted until :meth:`finish_decode`. A transport
        failure or 503 before D answered is retried on another instance (the client has
        seen nothing yet); any other answer of D is returned as it is. Raises LegError(502).
        Without a P/D split the leg goes to the ``pd`` pool (:attr:`final`), named so."""
        leg = self.final
        last: LegError | None = None
        for _ in range(self.retries + 1):
            inst = self._pick(leg, tried, None, lambda u: u)
            if inst is None:
                break
            tried.append(inst)
            inst.outstanding += 1
            try:
                resp = await self._post(inst, path, body, headers, leg)
            except TRANSPORT_ERRORS as exc:
                inst.outstanding -= 1
                last = self._failed(inst, leg, exc)
                log.warning("%s leg on %s failed (%s); retrying elsewhere", leg, inst.describe(), last)
                continue
            except BaseException:
                inst.outstanding -= 1
                raise
            if resp.status == 503 and len(tried) < len(self.pools[leg]):
                raw = await resp.read()
                resp.release()
                inst.outstanding -= 1
                last = bad_gateway(leg, inst.backend, f"HTTP 503: {error_detail(raw)}")
                continue
            return inst, resp
        if last is None:
            raise LegError(503, error_payload(503, f"no {leg} instance available",
                                              err_type="service_unavailable"))
        raise last

    @staticmethod
    def finish_decode(inst: Instance, resp: aiohttp.ClientResponse | None, *, ok: bool) -> None:
        """Account the end of a decode leg; an unfinished response is closed (the backend
        sees the connection drop and aborts the request: vLLM's disconnect handling)."""
        inst.outstanding -= 1
        if ok:
            inst.served += 1
        if resp is not None:
            if ok:
                resp.release()
            else:
                resp.close()

    # one request -----------------------------------------------------------------------
    def dispatch(self, path: str, body: dict[str, Any], auth: str | None, *, raw: bytes | None = None
                 ) -> Awaitable[tuple[LegContext, PrefillTarget | None, Instance, aiohttp.ClientResponse]]:
        """Run the pre-legs and the P/D legs of one request. ``raw``: the client's body
        bytes ``body`` was parsed from, if known (D then gets them without re-encoding,
        :func:`~.protocol.decode_request_bytes`). Awaiting the result gives (context, prefill
        target (None without a P/D split), decode instance, D's response with the body
        unread; the caller relays it and calls :meth:`finish_decode`). Raises LegError (503
        when the connector is not ready: at the call; the legs' errors: when awaited).
        Cancelling the task that awaits it (the client left) cancels every leg in flight
        and closes their connections.

        A plain function handing back the connector's leg coroutine, not a coroutine of its
        own: every resume of a leg passes through each coroutine frame above aiohttp's
        (bench/RESULTS.md, "Router CPU per request")."""
        reason = None if self.aggregated else self.strategy.not_ready_reason()
        if reason or not (self.aggregated or self.strategy.prefill_targets()):
            raise LegError(503, error_payload(503, f"router not ready: {reason or 'no prefill target'}",
                                              err_type="service_unavailable"), {"Retry-After": "1"})
        rid = request_ids()
        common = {"X-Request-Id": rid}
        if auth is not None:
            common["Authorization"] = auth
        ctx = LegContext(self, rid, path, common)
        if self.pre_legs:
            return self._after_pre_legs(ctx, body, raw)
        return self._legs(ctx, body, raw)

    def _legs(self, ctx: LegContext, body: dict[str, Any], raw: bytes | None):
        if self.aggregated:
            return self._whole(ctx, body, raw)
        return (self._concurrent if self.strategy.concurrent else self._sequential)(ctx, body, raw)

    async def _whole(self, ctx: LegContext, body: dict[str, Any], raw: bytes | None = None):
        """No P/D split (E -> PD): the body (the client's bytes when no pre-leg changed it)
        to one ``pd`` instance, retried elsewhere as :meth:`open_decode` retries; no
        ``kv_transfer_params``. Returns :meth:`dispatch`'s tuple with no prefill target."""
        inst, resp = await self.open_decode(ctx.path, decode_request_bytes(body, raw, None), ctx.headers, [])
        return ctx, None, inst, resp

    async def _after_pre_legs(self, ctx: LegContext, body: dict[str, Any], raw: bytes | None):
        original = body
        for leg in self.pre_legs:
            body = await leg.apply(ctx, body)
        return await self._legs(ctx, body, raw if body is original else None)

    async def _redo_pair(self, rid: str, target: PrefillTarget, inst: Instance,
                         resp: aiohttp.ClientResponse, attempt: int, *, same_prefill: bool = False) -> bool:
        """D answered 5xx before anything reached the client: True when the pair is to be
        run again with another prefill (the KV source may have died under D: vLLM fails
        a request whose KV cannot be read), or, with ``same_prefill`` (sequential
        connectors: P recomputes under a fresh request), with the same prefill and another
        decode (vLLM answers 500 for a request whose KV load failed,
        ``kv_load_failure_policy="fail"``: vllm/v1/core/sched/scheduler.py, 1P2D has no
        other prefill), or, when that pair is the only one, once with the same pair: D's
        NIXL handshake with P gives up when P's reply has not been read within 5 s
        (``RCVTIMEO`` in vllm/.../nixl/base_worker.py ``_nixl_handshake``), which a
        starved CPU host exceeds, and D forgets a failed handshake, so the next request
        handshakes again. D's answer is closed first. Else False (relayed as it is)."""
        if resp.status < 500 or attempt >= self.retries:
            return False
        other_p = any(t.instance is not target.instance for t in self.strategy.prefill_targets())
        other_d = same_prefill and len(self.pools["decode"]) > 1
        if not other_p and not other_d and not (same_prefill and attempt == 0):
            return False
        log.warning("rid=%s decode %s answered %d after prefill %s; running the pair again with %s",
                    rid, inst.url, resp.status, target.describe(),
                    "another prefill" if other_p else "the same prefill and another decode" if other_d
                    else "the same prefill and decode (the only pair), once")
        self.finish_decode(inst, resp, ok=False)
        return True

    async def _sequential(self, ctx: LegContext, body: dict[str, Any], raw: bytes | None = None):
        """Sequential connectors (NIXL pull): P to completion (retried on another P), then D
        with P's parameters; a 5xx of D reruns the pair with another P, or with the same P and
        another D (:meth:`_redo_pair`). Returns :meth:`dispatch`'s tuple."""
        s, rid = self.strategy, ctx.request_id
        used: list[PrefillTarget] = []
        failed_d: list[Instance] = []  # decodes that answered 5xx: a rerun goes elsewhere while one is left
        for attempt in range(self.retries + 1):
            targets = s.prefill_targets()
            if used:
                used_inst = {id(u.instance) for u in used}
                units = [t for t in targets if id(t.instance) not in used_inst] or targets
            else:
                units = targets
            target, answer = await self.json_leg(
                "prefill", ctx.path,
                lambda t: (prefill_request_body(body, s.prefill_kv_params(rid, t)),
                           {**ctx.headers, **s.prefill_headers(t)}),
                units=units, instance_of=_instance_of_target)
            kv = s.decode_kv_params(rid, target, answer)
            if kv is None:
                log.warning("rid=%s prefill %s answered without kv_transfer_params; decode computes "
                            "the prompt itself", rid, target.describe())
            avoid = failed_d[:] if len(failed_d) < len(self.pools["decode"]) else []
            inst, resp = await self.open_decode(ctx.path, decode_request_bytes(body, raw, kv), ctx.headers, avoid)
            if not await self._redo_pair(rid, target, inst, resp, attempt, same_prefill=True):
                return ctx, target, inst, resp
            used.append(target)
            failed_d.append(inst)
        raise AssertionError("unreachable: the last attempt returns")

    async def _concurrent(self, ctx: LegContext, body: dict[str, Any], raw: bytes | None = None):
        """Mooncake: P and D at once per attempt; D's response is handed back only after
        P's leg succeeded. P failing aborts D (its request would wait for KV that never
        comes) and the pair is retried on another P with a fresh ``transfer_id``; D
        failing before it answered is retried on another D with the same parameters (P
        holds the KV for that transfer_id). Returns :meth:`dispatch`'s tuple."""
        s, rid = self.strategy, ctx.request_id
        tried_p: list[PrefillTarget] = []
        last: LegError | None = None
        for attempt in range(self.retries + 1):
            target = self._pick("prefill", tried_p, s.prefill_targets(), lambda t: t.instance)
            if target is None:
                break
            tried_p.append(target)
            xid = rid if attempt == 0 else f"{rid}-{attempt}"
            p_body = prefill_request_body(body, s.prefill_kv_params(xid, target))
            d_body = decode_request_bytes(body, raw, s.decode_kv_params(xid, target, None))
            p_task = asyncio.create_task(self._json_once(
                target.instance, ctx.path, p_body, {**ctx.headers, **s.prefill_headers(target)}, "prefill"))
            d_task = asyncio.create_task(self.open_decode(ctx.path, d_body, ctx.headers, []))
            try:
                await asyncio.wait({p_task, d_task}, return_when=asyncio.FIRST_EXCEPTION)
                if p_task.done() and p_task.exception() is not None:
                    err = p_task.exception()
                    await _cancel(d_task)
                    if not isinstance(err, LegError) or not err.retryable:
                        raise err
                    last = err
                    log.warning("rid=%s prefill %s failed (%s); %s", rid, target.describe(), err,
                                "retrying the pair" if attempt < self.retries else "giving up")
                    continue
                if d_task.exception() is not None:
                    await _cancel(p_task)  # P's blocks expire on P's own timeout
                    raise d_task.exception()
                await p_task
                inst, resp = d_task.result()
                if await self._redo_pair(rid, target, inst, resp, attempt):
                    continue
                return ctx, target, inst, resp
            except BaseException:
                await _cancel(p_task)
                await _cancel(d_task)
                raise
        if last is None:
            raise LegError(503, error_payload(503, "no prefill instance available",
                                              err_type="service_unavailable"), {"Retry-After": "1"})
        raise last

    async def models(self, auth: str | None) -> tuple[int, bytes, str]:
        """``GET /v1/models`` of a decode (or ``pd``) instance (healthy first; the next one on a
        transport error). Returns (status, body, content type). Raises LegError(502)."""
        headers = {"Authorization": auth} if auth is not None else {}
        tried: list[Instance] = []
        last: LegError | None = None
        for _ in range(len(self.pools[self.final])):
            inst = self._pick(self.final, tried, None, lambda u: u)
            if inst is None:
                break
            tried.append(inst)
            t = aiohttp.ClientTimeout(total=max(self.timeouts.health, 10.0), connect=self.timeouts.connect)
            try:
                async with self.session.get(inst.url + "/v1/models", headers=headers, timeout=t) as resp:
                    return resp.status, await resp.read(), resp.headers.get("Content-Type", "application/json")
            except TRANSPORT_ERRORS as exc:
                last = self._failed(inst, self.final, exc)
        assert last is not None
        raise last


def _instance_of_target(target: PrefillTarget) -> Instance:
    return target.instance


async def _cancel(task: asyncio.Task) -> None:
    """Cancel ``task`` and wait for it; a decode response it already produced is closed."""
    if not task.done():
        task.cancel()
        try:
            await task
        except BaseException:  # noqa: BLE001 - cancelled or failed: either way gone
            pass
        return
    if not task.cancelled() and task.exception() is None:
        result = task.result()
        if isinstance(result, tuple) and len(result) == 2 and isinstance(
                result[1], aiohttp.ClientResponse):
            PDRouter.finish_decode(result[0], result[1], ok=False)
