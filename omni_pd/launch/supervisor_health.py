"""The supervisor's health gating (:mod:`omni_pd.launch.supervisor`): one probe thread per
process GETs its health URL until HTTP 200 (doubling pauses, at most
:data:`PROBE_TIMEOUT_S` per request), a peer on another host is only probed, the
timings once all are healthy, and after readiness the monitor thread that reports
(or with ``fail_fast`` fails on) a change. Split out of supervisor.py in issue 38.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time

from omni_pd.io_write import atomic_write
from omni_pd.launch.run_state import _Proc

#: seconds: the most one health request may take (a hung server must not stall the gate)
PROBE_TIMEOUT_S = 2.0


def _meanwhile(p: _Proc) -> str:
    """What happens to an instance that turned unhealthy after readiness: omni-pd's router
    takes a prefill or decode instance out of rotation; any other process (a vllm-omni
    server, whose 503 in vllm-omni 0.30 means one of its stages died while the others run:
    docs/launch.md) is left running and nothing routes around it."""
    if p.spec.role in ("prefill", "decode", "pd"):
        return "the router routes around it"
    return "left running, nothing routes around it (`omni-pd status RUN_DIR` says why; --fail-fast stops all)"


class _Health:
    """The supervisor's health gating (a part of :class:`~omni_pd.launch.supervisor.Supervisor`)."""

    def _await_peer(self, p: _Proc) -> bool:
        """Start probing a ``peer`` (a process of another host, :func:`omni_pd.launch.plan.
        for_host`): nothing is started; it counts as healthy once its URL answers 200, and a
        peer that does not answer within its ``timeout_s`` fails the launch like a process."""
        assert self._t0 is not None and p.spec.health is not None
        p.started_at = time.monotonic()
        p.state = "waiting for peer"
        self.timings.started_s[p.name] = p.started_at - self._t0
        self._say(f"waiting for {p.name} on {p.spec.host or 'another host'} (GET {p.spec.health.url})")
        p.prober = threading.Thread(target=self._probe, args=(p,), name=f"health-{p.name}", daemon=True)
        p.prober.start()
        return True

    def _probe(self, p: _Proc) -> None:
        """Health thread: GET the URL until 200, with doubling pauses."""
        import http.client  # lazy, like urllib: ~60 ms of import the CLI does not need elsewhere
        import urllib.error
        import urllib.request

        hc = p.spec.health
        assert hc is not None and p.started_at is not None
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        deadline = p.started_at + hc.timeout_s
        interval = hc.interval_s
        while not self._stop.is_set() and p.returncode is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                with opener.open(hc.url, timeout=min(PROBE_TIMEOUT_S, max(0.05, remaining))) as r:
                    if r.status == 200:
                        p.healthy_at = time.monotonic()
                        self._wake.set()
                        return
                    p.last_probe = f"HTTP {r.status}"
            except urllib.error.HTTPError as e:
                p.last_probe = f"HTTP {e.code}"
                e.close()
            except urllib.error.URLError as e:
                p.last_probe = str(e.reason)
            except (OSError, ValueError, http.client.HTTPException) as e:
                p.last_probe = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            if self._stop.wait(max(0.0, min(interval, deadline - time.monotonic()))):
                return
            interval = min(interval * 2, max(hc.max_interval_s, hc.interval_s))

    def _monitor_health(self) -> None:
        """Monitor thread: after readiness, probe every healthy process again every
        ``monitor_interval_s`` seconds and report changes (with ``fail_fast``: fail)."""
        import urllib.error
        import urllib.request

        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while not self._stop.wait(self.monitor_interval_s):
            for p in self._procs:
                hc = p.spec.health
                if hc is None or not p.reported_healthy or p.out or p.returncode is not None:
                    continue
                try:
                    with opener.open(hc.url, timeout=PROBE_TIMEOUT_S) as r:
                        ok, why = r.status == 200, f"HTTP {r.status}"
                except urllib.error.HTTPError as e:
                    ok, why = False, f"HTTP {e.code}"
                    e.close()
                except (urllib.error.URLError, OSError, ValueError) as e:
                    ok, why = False, str(getattr(e, "reason", e)) or type(e).__name__
                if ok == p.monitored_ok or self._stop.is_set():
                    continue
                p.monitored_ok = ok
                if ok:
                    p.state = "healthy"
                    self._say(f"{p.name} healthy again")
                elif self.fail_fast:
                    self._fail(p, f"{p.name} unhealthy after readiness (GET {hc.url}: {why}) and --fail-fast")
                    self._wake.set()
                else:
                    p.state = "unhealthy"
                    self._say(f"{p.name} unhealthy after readiness (GET {hc.url}: {why}); " + _meanwhile(p), error=True)

    def _all_healthy(self) -> None:
        assert self._t0 is not None
        t = self.timings
        t.all_healthy_s = max((p.healthy_at for p in self._procs if p.healthy_at), default=self._t0) - self._t0
        memo: dict[str, float] = {}

        def chain(name: str) -> float:
            if name not in memo:
                deps = self.plan.process(name).depends_on
                memo[name] = t.ready_s.get(name, 0.0) + max((chain(d) for d in deps), default=0.0)
            return memo[name]

        t.critical_path_s = max((chain(p.name) for p in self._procs), default=0.0)
        t.overhead_s = t.all_healthy_s - t.critical_path_s
        with contextlib.suppress(OSError):
            atomic_write(self.run_dir / "timings.json", json.dumps(t.to_json(), indent=2) + "\n")
        n = len(self._procs)
        self._say(f"all {n} process{'es' * (n != 1)} healthy after {t.all_healthy_s:.2f} s "
                  f"(slowest chain {t.critical_path_s:.2f} s, launcher overhead {t.overhead_s:.2f} s)")
