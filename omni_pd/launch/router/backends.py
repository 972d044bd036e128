"""Backends of the PD router: parsed URLs, per-instance state and instance picking (pure).

Nothing here does I/O; the router's event loop is the only caller, so no locks: every
method runs to completion between two awaits.
"""

from __future__ import annotations

import ipaddress
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence
from urllib.parse import urlsplit

#: load-balancing policies of :class:`Pool`
BALANCE_POLICIES = ("least_outstanding", "round_robin")


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
            raise ValueError(f"prefill {self.url} has no bootstrap port")
        return f"http://{_host_for_url(self.host)}:{self.bootstrap_port}"


def parse_port(value: str, *, what: str, text: str) -> int:
    """``value`` as a TCP port 1..65535; ValueError naming ``what`` and ``text`` otherwise."""
    try:
        port = int(value)
    except ValueError:
        raise ValueError(f"{text!r}: {what} must be a number, found {value!r}") from None
    if not 1 <= port <= 65535:
        raise ValueError(f"{text!r}: {what} {port} is outside 1..65535")
    return port


def parse_backend(text: str, *, bootstrap_port: int | None = None) -> Backend:
    """Parse ``http://host:port`` (or ``host:port``, http assumed) into a :class:`Backend`.

    ``URL,PORT`` sets the bootstrap port (overrides ``bootstrap_port``). A missing port
    means 80/443. Raises ValueError naming the bad text.
    """
    raw = text.strip()
    if "," in raw:
        raw, _, bp = raw.rpartition(",")
        bootstrap_port = parse_port(bp, what="bootstrap port", text=text)
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


@dataclass(eq=False)
class Instance:
    """One backend instance and its live state. Two instances with the same URL (listed
    twice on the command line) are two objects with separate state: identity, not URL,
    is the key everywhere.

    ``role``: the pool's role (``prefill``, ``decode``, or a pre-leg's, e.g. ``encode``).
    ``index``: position in its pool (stable; names it in ``/health``). ``healthy``: the
    last verdict of the health poller or of a failed leg (a transport failure marks it
    down at once; only a ``/health`` 200 marks it up). ``outstanding``: legs in flight.
    ``served``: legs completed with an HTTP answer. ``generation``: bumped on every
    down -> up transition (Mooncake re-reads the engine ids then).
    """

    backend: Backend
    role: str
    index: int
    healthy: bool = True
    outstanding: int = 0
    served: int = 0
    failures: int = 0
    generation: int = 0
    last_error: str | None = None
    last_change: float = field(default_factory=time.monotonic)

    @property
    def url(self) -> str:
        return self.backend.url

    def describe(self) -> str:
        return f"{self.role}[{self.index}] {self.url}"

    def mark(self, healthy: bool, error: str | None = None) -> bool:
        """Record a health verdict; True when it changed (up -> down or down -> up)."""
        self.last_error = None if healthy else error
        if healthy == self.healthy:
            return False
        self.healthy = healthy
        self.last_change = time.monotonic()
        if healthy:
            self.generation += 1
        return True

    def state(self) -> dict[str, Any]:
        """JSON-able state for ``/health`` (no secrets)."""
        return {"role": self.role, "index": self.index, "url": self.url, "healthy": self.healthy,
                "outstanding": self.outstanding, "served": self.served, "failures": self.failures,
                "error": self.last_error}


class Pool:
    """The instances of one role and the policy that picks among them.

    ``least_outstanding`` (default): the healthy instance with the fewest legs in flight;
    ties go to the instance after the last one picked (so a sequential client cycles
    through them like round robin). ``round_robin``: the next healthy instance in order.
    Instances marked down are skipped; when every instance is down the pick falls back to
    all of them (a request then fails with a 502 naming the backend, instead of a 503 that
    hides which one). Each pool keeps its own cursor: prefill and decode are picked
    independently (xPyD with x != y, or one side retried, never shifts the other).
    """

    def __init__(self, role: str, backends: Sequence[Backend], policy: str = "least_outstanding"):
        if policy not in BALANCE_POLICIES:
            raise ValueError(f"unknown balance policy {policy!r}; choose {', '.join(BALANCE_POLICIES)}")
        self.role, self.policy = role, policy
        self.instances = [Instance(b, role, i) for i, b in enumerate(backends)]
        self._cursor = 0  # picks made: where the next rotation starts

    def __len__(self) -> int:
        return len(self.instances)

    def __iter__(self):
        return iter(self.instances)

    def healthy(self) -> list[Instance]:
        return [i for i in self.instances if i.healthy]

    def pick(self, exclude: Iterable[Any] = (), *, among: Sequence[Any] | None = None,
             instance_of: Callable[[Any], Instance] = lambda x: x) -> Any | None:
        """The next unit to use, or None when every unit is excluded.

        ``among``: the units to choose from (default: the instances; Mooncake passes its
        (instance, dp rank) targets with ``instance_of`` mapping a unit to its instance).
        ``exclude``: units already tried by this request (a retry goes elsewhere).

        One pass over the units in rotation order (from the cursor, which advances once per
        pick that finds a unit): round robin takes the first healthy unit, least outstanding
        the healthy unit with the fewest legs in flight (the earliest in that order on a tie);
        with no healthy candidate, the same among the unhealthy ones. No list is built or
        sorted per pick (bench/RESULTS.md, "Router CPU per request").
        """
        units = self.instances if among is None else among
        ex = list(exclude) if exclude else ()
        size = len(units)
        if size == 1:  # the one unit, not excluded (healthy or not: it is all there is)
            unit = units[0]
            if ex and any(unit is e or unit == e for e in ex):
                return None
            self._cursor += 1
            return unit
        least = self.policy == "least_outstanding"
        best_up = best_down = None
        up_load = down_load = 0
        start = self._cursor % size if size else 0
        for k in range(size):
            unit = units[(start + k) % size]
            if ex and any(unit is e or unit == e for e in ex):
                continue
            inst = instance_of(unit)
            if inst.healthy:
                if best_up is None or inst.outstanding < up_load:
                    best_up, up_load = unit, inst.outstanding
                    if not least:
                        break
            elif best_down is None or (least and inst.outstanding < down_load):
                best_down, down_load = unit, inst.outstanding
        best = best_up if best_up is not None else best_down
        if best is not None:
            self._cursor += 1
        return best
