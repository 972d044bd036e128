"""Start, health-gate, supervise and tear down the processes of a :class:`LaunchPlan`.

The supervisor is the side-effecting end of ``omni-pd launch``::

    plan (spec.py) ──preflight──▶ Supervisor.start_and_wait_healthy() ──▶ on_ready(out)
                                  ──▶ Supervisor.wait() ──▶ Supervisor.shutdown()

* **Processes.** Each child is started with ``subprocess.Popen(list(spec.argv),
  env=os.environ | {"PYTHONUNBUFFERED": "1"} | spec.env, cwd=spec.cwd)`` (never a shell)
  in a session and process group of its own, so the terminal's Ctrl-C reaches only the
  launcher and teardown can signal a child together with everything it spawned.
* **Order.** Every process without ``depends_on`` starts at once; a dependent process
  starts as soon as all of its dependencies are healthy. A process without a health
  check is healthy once started.
* **Health.** One thread per process GETs ``spec.health.url`` (stdlib ``urllib``,
  proxies bypassed, at most :data:`PROBE_TIMEOUT_S` per request) until HTTP 200; the
  pause between probes starts at ``interval_s`` and doubles up to ``max_interval_s``.
  No 200 within ``timeout_s`` of the process start is a failure.
* **Logs.** One reader thread per child (stdout and stderr merged) writes every line to
  ``<run_dir>/<name>.log`` (the raw line less terminal escape sequences: colours a child
  prints for a terminal, e.g. a library that forces them, do not reach a log file or the
  plain view) and streams it as ``[name] line``. Secret
  values (env values whose name :func:`~omni_pd.launch.spec.is_secret`, from the plan
  and from the launcher's own environment, 4 characters or longer) are replaced by
  ``***`` in both, and in ``<run_dir>/plan.json``.
* **View.** On a terminal a rich live table (state, pid, ports, elapsed, time to
  healthy); otherwise plain lines (CI). rich is imported only when the table is used.
* **After readiness.** Every process with a health check is probed again every
  ``monitor_interval_s`` seconds; a change (unhealthy, healthy again) is reported. A
  prefill or decode instance (xPyD) that exits after readiness while another instance of
  its role is running is restarted (at most ``max_restarts`` times; its log is appended
  to): the router's own health poller takes it out of rotation and back, so the
  deployment keeps serving. With ``fail_fast`` (``omni-pd launch --fail-fast``) any
  exit or unhealthy probe after readiness stops everything instead.
* **Orphans.** A watchdog process (:mod:`omni_pd.launch.watchdog`) holds a pipe to the
  launcher; when the launcher dies without tearing down (SIGKILL, a crash), the watchdog
  sees EOF and stops every process group in ``<run_dir>/pids``.
* **Teardown.** A child exiting while supervised (with any code, before or after it
  became healthy; after it only as described above), a health timeout, or
  SIGINT/SIGTERM/SIGHUP to the launcher stops everything: SIGTERM to every process group (and to
  the launch's processes outside them: descendants that left their group with ``setsid``,
  double-forked daemons and processes started during the grace period, found with psutil by
  the ``OMNI_PD_LAUNCH_ID`` every child inherits; :mod:`omni_pd.launch.proctree`),
  ``grace_s`` seconds, then SIGKILL. A second signal sends SIGKILL at once (the first one
  never does, also after a failure or during teardown). A failure report names the process, its exit code and its
  last log lines.

Files in ``run_dir``: ``plan.json`` (the plan, secrets masked), ``pids`` (``<pid>
<name>`` per started process; each pid is also its process-group id),
``<name>.log`` per process, ``timings.json`` (written once all are healthy).

Exit codes (:attr:`Supervisor.exit_code`, :func:`run`): ``0`` success (``stay=False``
and the readiness callback passed); ``1`` a process failed (exited, could not start,
or never became healthy); ``128 + signal`` when the launcher was stopped by a signal
(``130`` SIGINT, ``143`` SIGTERM, ``129`` SIGHUP), also after a clean teardown, so
that scripts can tell an interrupted launch from a completed one; the readiness
callback's own non-zero result is returned as is.

The parts (issue 38): this module runs the processes (start in dependency order, reap,
restart an xPyD instance, the exit code); :mod:`omni_pd.launch.supervisor_health` gates
on health and monitors after readiness; :mod:`omni_pd.launch.supervisor_output` streams
the logs and holds the views and :class:`SecretMasker`; :mod:`omni_pd.launch.teardown`
stops everything and runs the orphan watchdog; :mod:`omni_pd.launch.run_state` holds the
state they share.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TextIO

from omni_pd.io_write import atomic_write
from omni_pd.launch.spec import LaunchPlan
from omni_pd.launch.run_state import EXIT_FAILED, EXIT_OK, _TICK_S, Failure, LaunchTimings, _describe_rc, _Interrupted, _Proc
from omni_pd.launch.supervisor_health import _Health
from omni_pd.launch.supervisor_output import SecretMasker, _isatty, _LiveView, _Output, _PlainView, _ReportStream
from omni_pd.launch.teardown import LAUNCH_ENV, _Teardown

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)


# --- the supervisor --------------------------------------------------------------------


class Supervisor(_Output, _Health, _Teardown):
    """Starts the processes of ``plan``, gates on their health, supervises them and
    tears them down; usable as a context manager (``__exit__`` calls :meth:`shutdown`).

    ``run_dir``: created if missing; receives ``plan.json``, ``pids``, one
    ``<name>.log`` per process and ``timings.json``. ``grace_s``: seconds between
    SIGTERM and SIGKILL at teardown. ``out``: where log lines and messages go (default
    ``sys.stdout``). ``live``: rich status table (True), plain lines (False), or None
    for a table exactly when ``out`` is a terminal. ``tail_lines``: log lines shown for
    a failed process.

    Raises ValueError for a plan it cannot run: duplicate or unsafe process names
    (names become file names), ``depends_on`` naming an unknown process or forming a
    cycle, an empty ``argv``, or a health URL that is not http(s).
    """

    def __init__(
        self,
        plan: LaunchPlan,
        run_dir: Path | str,
        *,
        grace_s: float = 10.0,
        out: TextIO | None = None,
        live: bool | None = None,
        tail_lines: int = 20,
        fail_fast: bool = False,
        monitor_interval_s: float = 2.0,
        max_restarts: int = 3,
        watchdog: bool = True,
    ) -> None:
        _check_plan(plan)
        self.fail_fast, self.monitor_interval_s = bool(fail_fast), float(monitor_interval_s)
        self.max_restarts = int(max_restarts)
        self._watchdog_on = bool(watchdog)
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._watchdog_fd: int | None = None
        self._monitor: threading.Thread | None = None
        self.plan = plan
        self.run_dir = Path(run_dir)
        self.grace_s = float(grace_s)
        self._out = sys.stdout if out is None else out
        if live is None:
            live = _isatty(self._out)
        self.live = bool(live)
        self.mask = SecretMasker.for_plan(plan)
        self.timings = LaunchTimings()
        self.failure: Failure | None = None
        #: the signal that stopped the launcher (None: none)
        self.stopped_by: int | None = None
        self._procs = [_Proc(p, self.run_dir, tail_lines) for p in plan.processes]
        self._by_name = {p.name: p for p in self._procs}
        self._view: _PlainView | _LiveView | None = None
        self._t0: float | None = None
        self._stop = threading.Event()  # tells health threads to finish
        self._wake = threading.Event()  # threads -> main loop: something happened
        self._force = False  # a second signal: SIGKILL now
        self._requests = 0  # stop requests (signals to the launcher) so far
        self._late_signal: int | None = None  # a first signal that arrived during teardown
        self._launch_id = f"{os.getpid()}-{id(self):x}-{time.time_ns()}"  # LAUNCH_ENV of every child
        self._escaped: list[Any] = []  # processes outside the groups, found at teardown
        self._in_callback = False
        self._started = False
        self._shut = False
        self._shut_lock = threading.Lock()

    # -- public API ---------------------------------------------------------------------

    def __enter__(self) -> "Supervisor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @property
    def exit_code(self) -> int:
        """``1`` after a failure, ``128 + signal`` after a signal, else ``0``."""
        if self.failure is not None:
            return EXIT_FAILED
        if self.stopped_by is not None:
            return 128 + self.stopped_by
        return EXIT_OK

    def pids(self) -> dict[str, int]:
        """``{name: pid}`` of every process started so far (pid = its process group)."""
        return {p.name: p.pid for p in self._procs if p.pid is not None}

    def start_and_wait_healthy(self) -> bool:
        """Start the processes in dependency order and wait until all are healthy.

        Returns True when every process is healthy (then :attr:`timings` is complete and
        ``timings.json`` written); False when a process failed (see :attr:`failure`) or a
        signal arrived (:attr:`stopped_by`). Nothing is torn down here: call
        :meth:`shutdown` (or leave the ``with`` block). Raises RuntimeError when called
        twice, OSError when ``run_dir`` cannot be written.
        """
        if self._started:
            raise RuntimeError("start_and_wait_healthy() may be called once")
        self._started = True
        self._t0 = time.monotonic()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        plan_json = self.mask.deep(self.plan.to_json())
        atomic_write(self.run_dir / "plan.json", json.dumps(plan_json, indent=2) + "\n")
        atomic_write(self.run_dir / "pids", "")
        if self._watchdog_on:
            self._start_watchdog()
        self._view = _LiveView(self._out) if self.live else _PlainView(self._out)
        self._view.start(self)
        while True:
            self._tick(starting=True)
            if self._stopping():
                return False
            if all(p.healthy for p in self._procs):
                self._all_healthy()
                self._monitor = threading.Thread(target=self._monitor_health, name="health-monitor", daemon=True)
                self._monitor.start()
                return True
            self._wake.wait(_TICK_S)
            self._wake.clear()

    def wait(self) -> int:
        """Supervise: block until a child exits or a signal arrives; return the exit
        code (``1`` for a child exit, whatever its code; ``128 + signal``). Does not tear
        down. Raises RuntimeError before :meth:`start_and_wait_healthy`."""
        if not self._started:
            raise RuntimeError("wait() before start_and_wait_healthy()")
        while not self._stopping():
            self._tick(starting=False)
            if self._stopping():
                break
            self._wake.wait(_TICK_S)
            self._wake.clear()
        return self.exit_code

    def request_stop(self, signum: int = signal.SIGTERM) -> None:
        """Ask the supervisor to stop as if the launcher had received ``signum``; a
        second request escalates to SIGKILL of every process group that still has a
        running member. The first request is never the second: after a child failed or
        once teardown began, it lets the SIGTERM + ``grace_s`` teardown run (the exit
        code stays 1 after a failure). Safe to call from a signal handler (it only sets
        flags and sends signals)."""
        self._requests += 1
        if self._requests > 1:
            self._force = True
            self._signal_all(signal.SIGKILL, self._escaped)
            return
        if self.stopped_by is None:
            self.stopped_by = int(signum)
        if self._shut:
            self._late_signal = int(signum)  # teardown reports it from its grace loop
        elif self._in_callback and self.failure is None:
            raise _Interrupted()

    def call_ready(self, fn: Callable[[TextIO], int]) -> int | None:
        """Run the readiness callback ``fn`` (e.g. a smoke request) with :meth:`report_stream`
        as its output; a signal arriving meanwhile interrupts it (returns None,
        :attr:`stopped_by` set). Exceptions of ``fn`` propagate."""
        out = self.report_stream()
        try:
            try:
                self._in_callback = True
                if self.stopped_by is not None:
                    return None
                return fn(out)
            finally:
                self._in_callback = False
                with contextlib.suppress(Exception):
                    out.flush()
        except _Interrupted:
            return None

    def report_stream(self) -> TextIO:
        """A text stream whose lines go through the launcher's view, as its own messages
        do: on a terminal they are printed by the live table's console above the table
        (a plain ``sys.stdout`` write there is drawn over by the next refresh), otherwise
        as ``[omni-pd] line``. A partial line waits for its newline or ``flush()``."""
        return _ReportStream(self._say)

    @contextlib.contextmanager
    def signal_handlers(self) -> Iterator[None]:
        """While active, SIGINT/SIGTERM/SIGHUP call :meth:`request_stop` (the first
        one stops cleanly, the next kills); the previous handlers are restored on exit.
        A no-op outside the main thread (Python delivers signals only there)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        old = {s: signal.signal(s, lambda n, _f: self.request_stop(n)) for s in _SIGNALS}
        try:
            yield
        finally:
            for s, h in old.items():
                signal.signal(s, h)

    # -- main loop ----------------------------------------------------------------------

    def _stopping(self) -> bool:
        return self.failure is not None or self.stopped_by is not None

    def _tick(self, *, starting: bool) -> None:
        if self.stopped_by is not None:
            return
        if self._reap(report=True):
            return
        now = time.monotonic()
        for p in self._procs:
            if p.started_at is None or p.reported_healthy:
                continue
            if p.healthy_at is not None:
                p.reported_healthy = True
                p.state = "healthy"
                self.timings.ready_s[p.name] = p.healthy_at - p.started_at
                if p.spec.health is not None:
                    self._say(f"{p.name} healthy after {p.healthy_at - p.started_at:.2f} s")
            elif p.spec.health is not None and now - p.started_at > p.spec.health.timeout_s:
                url = p.spec.health.url
                if p.restarts and not self.fail_fast and self._others_serving(p):
                    self._say(f"{p.name} did not become healthy again within {p.spec.health.timeout_s:g} s "
                              f"(GET {url}: {p.last_probe}); left out", error=True)
                    p.reported_healthy, p.state, p.out = True, "left out", True
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(p.popen.pid, signal.SIGKILL)  # type: ignore[union-attr]
                    continue
                self._fail(p, f"{p.name} did not become healthy within {p.spec.health.timeout_s:g} s: "
                              f"GET {url} (last: {p.last_probe})")
                return
        if not starting:
            return
        for p in self._procs:
            if p.popen is None and p.state == "waiting" and all(
                self._by_name[d].reported_healthy for d in p.spec.depends_on
            ):
                if not self._spawn(p):
                    return

    def _spawn(self, p: _Proc) -> bool:
        spec = p.spec
        if spec.role == "peer":  # on another host (launch --host): only its health check gates here
            return self._await_peer(p)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **spec.env, LAUNCH_ENV: self._launch_id}
        try:
            log = open(p.log_path, "a" if p.restarts else "w", encoding="utf-8", errors="replace", buffering=1)
        except OSError as e:
            self._fail(p, f"cannot write {p.log_path}: {e}")
            return False
        try:
            popen = subprocess.Popen(
                restart_argv(spec.argv, p.restarts),
                env=env,
                cwd=spec.cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        except (OSError, ValueError, TypeError) as e:
            log.close()
            self._fail(p, f"{p.name} could not start: {e}")
            return False
        p.popen = popen
        p.started_at = time.monotonic()
        p.state = "starting"
        assert self._t0 is not None
        self.timings.started_s[p.name] = p.started_at - self._t0
        with contextlib.suppress(OSError):
            atomic_write(self.run_dir / "pids", "".join(f"{pid} {name}\n" for name, pid in self.pids().items()))
        p.reader = threading.Thread(target=self._read, args=(p, popen, log), name=f"log-{p.name}", daemon=True)
        p.reader.start()
        ports = ", ".join(str(u.port) for u in spec.ports)
        self._say(f"started {p.name} (pid {popen.pid}{', ports ' + ports if ports else ''})")
        if spec.health is None:
            p.healthy_at = p.started_at
        else:
            p.prober = threading.Thread(target=self._probe, args=(p,), name=f"health-{p.name}", daemon=True)
            p.prober.start()
        self._wake.set()
        return True

    def _reap(self, *, report: bool) -> bool:
        """Poll every child; with ``report``, a child that exited is a failure (True)."""
        for p in self._procs:
            if p.popen is None or p.returncode is not None:
                continue
            rc = p.popen.poll()
            if rc is None:
                continue
            p.returncode = rc
            p.ended_at = time.monotonic()
            if report and not self._stopping():
                p.state = f"exited {rc}"
                if p.healthy and self._keep_serving(p, rc):
                    continue
                when = "after it became healthy" if p.healthy else "before it became healthy"
                self._fail(p, f"{p.name} exited with {_describe_rc(rc)} {when} "
                              f"({p.ended_at - (p.started_at or p.ended_at):.2f} s after start)")
                return True
            if p.state not in ("stopping",):
                p.state = f"exited {rc}"
        return False

    def _others_serving(self, p: _Proc) -> bool:
        """Another instance of ``p``'s role (prefill, decode, or E -> PD's ``pd`` instances,
        which the router's pool routes around as it does decode's) is running and healthy."""
        return p.spec.role in ("prefill", "decode", "pd") and any(
            q is not p and q.spec.role == p.spec.role and q.returncode is None and q.healthy and not q.out
            for q in self._procs)

    def _keep_serving(self, p: _Proc, rc: int) -> bool:
        """After readiness, an xPyD instance exited: restart it (True) while another
        instance of its role serves and restarts remain; else False (a failure)."""
        if self.fail_fast or not self._others_serving(p):
            return False
        if p.restarts >= self.max_restarts:
            self._say(f"{p.name} exited with {_describe_rc(rc)} after {p.restarts} restart(s); left out "
                      f"(the router routes around it)", error=True)
            p.out, p.state = True, "left out"
            return True
        p.restarts += 1
        self._say(f"{p.name} exited with {_describe_rc(rc)} after it became healthy; out of rotation, "
                  f"restarting ({p.restarts}/{self.max_restarts})", error=True)
        if p.reader is not None:
            p.reader.join(2.0)
        p.popen, p.returncode, p.healthy_at, p.reported_healthy = None, None, None, False
        p.started_at = p.ended_at = None
        p.last_probe, p.monitored_ok = "no answer yet", True
        return self._spawn(p) or True

    def _fail(self, p: _Proc | None, reason: str) -> None:
        if self.failure is None:
            self.failure = Failure(p.name if p else None, reason, p.returncode if p else None)
            if p is not None and p.returncode is None:
                p.state = "failed"
            self._say(f"error: {reason}; stopping all", error=True)


def run(
    plan: LaunchPlan,
    run_dir: Path | str,
    *,
    on_ready: Callable[[TextIO], int] | None = None,
    stay: bool = True,
    grace_s: float = 10.0,
    out: TextIO | None = None,
    live: bool | None = None,
    handle_signals: bool = True,
    fail_fast: bool = False,
) -> int:
    """Launch ``plan`` and return an exit code (see the module docstring).

    Starts the processes, waits until all are healthy, then calls ``on_ready(out)`` (e.g.
    a smoke request; ``out`` is :meth:`Supervisor.report_stream`, so what it prints stays
    on screen above the live table; a non-zero result tears everything down and is
    returned); with
    ``stay`` it then supervises until a child exits or a signal arrives; finally it tears
    everything down (``grace_s`` seconds between SIGTERM and SIGKILL). ``out``/``live``
    as for :class:`Supervisor`. ``handle_signals``: install SIGINT/SIGTERM/SIGHUP
    handlers for the duration (main thread only). ``fail_fast``: any exit or unhealthy
    probe after readiness tears everything down (default: xPyD instances are restarted
    while another instance of their role serves). Timings are written to
    ``<run_dir>/timings.json``. Raises ValueError for a plan it cannot run, OSError when
    ``run_dir`` cannot be written; exceptions of ``on_ready`` propagate after teardown.
    """
    sup = Supervisor(plan, run_dir, grace_s=grace_s, out=out, live=live, fail_fast=fail_fast)
    handlers = sup.signal_handlers() if handle_signals else contextlib.nullcontext()
    rc: int | None = None
    with handlers:
        try:
            if sup.start_and_wait_healthy():
                if on_ready is not None:
                    rc = sup.call_ready(on_ready)
                    if rc:
                        sup._say(f"readiness check returned {rc}: stopping", error=True)
                if not rc and stay and sup.stopped_by is None:
                    rc = sup.wait()
        finally:
            sup.shutdown()  # signal handlers stay installed: a second Ctrl-C kills
    if sup.failure is not None or sup.stopped_by is not None:
        return sup.exit_code
    return rc or EXIT_OK


# --- helpers ---------------------------------------------------------------------------


def restart_argv(argv: Iterable[str], restarts: int) -> list[str]:
    """The argv of a child's ``restarts``-th restart (0: ``argv`` unchanged): a KV
    connector ``engine_id`` in ``--kv-transfer-config JSON`` (or ``--kv-transfer-config=JSON``)
    becomes ``<engine_id>-restart<restarts>``; everything else is kept.

    Why: a restarted prefill is a new NIXL agent, but vLLM's decode caches a remote
    engine's agents by ``engine_id`` and never handshakes again for an id it knows
    (vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py:1146
    ``_ensure_handshake``; stale entries go only after ``engine_ttl`` = 3600 s idle,
    base_worker.py:715, 3288-3295). With the old id every request routed to the restarted
    prefill failed on decode (``NIXL_ERR_REMOTE_DISCONNECT``, then vLLM's 500), seen in the
    CPU 2P1D e2e. P reports its id in ``kv_transfer_params`` (``remote_engine_id``), so D
    handshakes anew under the fresh one; Mooncake ids are rediscovered by the router. A
    value that is not a JSON object with a string ``engine_id`` is left as it is."""
    out = list(argv)
    if restarts <= 0:
        return out
    flag = "--kv-transfer-config"
    for i, arg in enumerate(out):
        if arg == flag and i + 1 < len(out):
            at, prefix, text = i + 1, "", out[i + 1]
        elif arg.startswith(flag + "="):
            at, prefix, text = i, flag + "=", arg[len(flag) + 1:]
        else:
            continue
        try:
            cfg = json.loads(text)
        except ValueError:
            continue
        if isinstance(cfg, dict) and isinstance(cfg.get("engine_id"), str):
            cfg["engine_id"] = f"{cfg['engine_id']}-restart{restarts}"
            out[at] = prefix + json.dumps(cfg, separators=(",", ":"))
    return out


def _check_plan(plan: LaunchPlan) -> None:
    names: set[str] = set()
    for p in plan.processes:
        if not _NAME.fullmatch(p.name):
            raise ValueError(f"process name {p.name!r}: use letters, digits, '.', '_', '-' (it names the log file)")
        if p.name in names:
            raise ValueError(f"two processes are called {p.name!r}")
        names.add(p.name)
        if not p.argv and p.role != "peer":
            raise ValueError(f"{p.name}: empty argv")
        if p.role == "peer" and p.health is None:
            raise ValueError(f"{p.name}: a peer (a process on another host) needs a health check")
        if p.health is not None and not p.health.url.startswith(("http://", "https://")):
            raise ValueError(f"{p.name}: health URL {p.health.url!r} is not http(s)")
    deps = {p.name: p.depends_on for p in plan.processes}
    for p in plan.processes:
        for d in p.depends_on:
            if d not in names:
                raise ValueError(f"{p.name} depends on {d!r}, which is not in the plan")
    state: dict[str, int] = {}

    def visit(n: str, path: tuple[str, ...]) -> None:
        if state.get(n) == 2:
            return
        if state.get(n) == 1:
            raise ValueError("depends_on cycle: " + " -> ".join(path[path.index(n):] + (n,)))
        state[n] = 1
        for d in deps[n]:
            visit(d, path + (n,))
        state[n] = 2

    for n in deps:
        visit(n, ())
