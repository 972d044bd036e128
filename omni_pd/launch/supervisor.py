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
"""

from __future__ import annotations

import collections
import contextlib
import errno
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, TextIO

from omni_pd.io import atomic_write
from omni_pd.launch import proctree
from omni_pd.launch.preflight import bind_error
from omni_pd.launch.spec import MASK, LaunchPlan, ProcessSpec, is_secret

EXIT_OK = 0
EXIT_FAILED = 1
#: seconds: the most one health request may take (a hung server must not stall the gate)
PROBE_TIMEOUT_S = 2.0
#: seconds: how long teardown waits for SIGKILLed processes to disappear
KILL_WAIT_S = 5.0
#: secret values shorter than this are not masked (masking "0" would mangle every line)
MIN_SECRET_LEN = 4
#: an ECMA-48 escape sequence (CSI ``ESC [ ... final``, e.g. colours, and two-byte ``ESC x``)
ANSI_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|[@-Z\\-_])")
_TICK_S = 0.05
#: seconds between looks for new processes of the launch during the grace period
LOOK_S = 0.25
#: environment variable set on every child (see :data:`omni_pd.launch.proctree.LAUNCH_ENV`)
LAUNCH_ENV = proctree.LAUNCH_ENV
_LAUNCHER = "omni-pd"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)


# --- secrets ---------------------------------------------------------------------------


class SecretMasker:
    """Replaces every occurrence of the given secret values by ``***``.

    ``values``: secret strings; empty ones and those shorter than :data:`MIN_SECRET_LEN`
    are ignored. Longer values are replaced first, so a secret containing another is
    masked whole. Calling the masker on a string returns the masked string.
    """

    def __init__(self, values: Iterable[str]) -> None:
        vals = sorted({v for v in values if len(v) >= MIN_SECRET_LEN}, key=lambda v: (-len(v), v))
        self._re = re.compile("|".join(map(re.escape, vals))) if vals else None

    @classmethod
    def for_plan(cls, plan: LaunchPlan, environ: Mapping[str, str] | None = None) -> "SecretMasker":
        """A masker for the secret env values of every process in ``plan`` and of
        ``environ`` (default: ``os.environ``, which every child inherits)."""
        env = os.environ if environ is None else environ
        vals = [v for p in plan.processes for k, v in p.env.items() if is_secret(k)]
        vals += [v for k, v in env.items() if is_secret(k)]
        return cls(vals)

    def __call__(self, text: str) -> str:
        return self._re.sub(MASK, text) if self._re is not None else text

    def deep(self, obj: Any) -> Any:
        """``obj`` (JSON-like: dicts, lists, strings) with every string masked."""
        if isinstance(obj, str):
            return self(obj)
        if isinstance(obj, dict):
            return {self(str(k)): self.deep(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [self.deep(v) for v in obj]
        return obj


# --- data ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Failure:
    """Why a launch failed: ``process`` (its name, or None for the launcher itself),
    a one-line ``reason``, and the child's ``returncode`` when it exited (negative:
    killed by that signal)."""

    process: str | None
    reason: str
    returncode: int | None = None


@dataclass
class LaunchTimings:
    """Start-up timings in seconds, all from ``time.monotonic()``.

    ``started_s``: launcher start (the call of ``start_and_wait_healthy``) to each
    process start. ``ready_s``: each process's own start to healthy (as observed by
    the probe, so it includes up to one poll interval). ``all_healthy_s``: launcher
    start to every process healthy (None until then). ``critical_path_s``: the longest
    sum of ``ready_s`` along a ``depends_on`` chain, i.e. the time the slowest chain of
    engines needs by itself; ``overhead_s = all_healthy_s - critical_path_s`` is what
    the launcher added (spawning, polling, waiting for dependencies).
    """

    started_s: dict[str, float] = field(default_factory=dict)
    ready_s: dict[str, float] = field(default_factory=dict)
    all_healthy_s: float | None = None
    critical_path_s: float | None = None
    overhead_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able dict (seconds rounded to milliseconds)."""
        r = lambda x: None if x is None else round(x, 3)  # noqa: E731
        return {
            "started_s": {k: r(v) for k, v in self.started_s.items()},
            "ready_s": {k: r(v) for k, v in self.ready_s.items()},
            "all_healthy_s": r(self.all_healthy_s),
            "critical_path_s": r(self.critical_path_s),
            "overhead_s": r(self.overhead_s),
        }


class _Proc:
    """Mutable run state of one child (owned by the supervisor's main thread, except
    ``healthy_at``/``last_probe`` set by its health thread and ``tail`` by its reader)."""

    def __init__(self, spec: ProcessSpec, run_dir: Path, tail_lines: int) -> None:
        self.spec = spec
        self.name = spec.name
        self.state = "waiting"
        self.popen: subprocess.Popen[bytes] | None = None
        self.started_at: float | None = None
        self.healthy_at: float | None = None
        self.ended_at: float | None = None
        self.returncode: int | None = None
        self.last_probe = "no answer yet"
        self.reported_healthy = False
        self.tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self.log_path = run_dir / f"{spec.name}.log"
        self.reader: threading.Thread | None = None
        self.prober: threading.Thread | None = None
        self.restarts = 0
        self.out = False  # left out of the deployment (did not come back)
        self.monitored_ok = True  # last post-readiness probe verdict

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    @property
    def healthy(self) -> bool:
        return self.healthy_at is not None

    def elapsed(self, now: float) -> float | None:
        if self.started_at is None:
            return None
        return (self.ended_at if self.ended_at is not None else now) - self.started_at


class _Interrupted(BaseException):
    """Raised by the signal handler to leave a readiness callback."""


# --- views -----------------------------------------------------------------------------


class _PlainView:
    """Line output: ``[name] line`` for child output, ``[omni-pd] message`` for events."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._lock = threading.Lock()

    def start(self, sup: "Supervisor") -> None:
        pass

    def stop(self) -> None:
        pass

    def log(self, name: str, line: str) -> None:
        self._write(f"[{name}] {line}\n")

    def say(self, msg: str, *, error: bool = False) -> None:
        self._write("".join(f"[{_LAUNCHER}] {ln}\n" for ln in msg.splitlines() or [""]))

    def _write(self, text: str) -> None:
        with self._lock:
            try:
                self._out.write(text)
                self._out.flush()
            except UnicodeEncodeError:
                enc = getattr(self._out, "encoding", None) or "ascii"
                with contextlib.suppress(Exception):
                    self._out.write(text.encode(enc, "replace").decode(enc))
                    self._out.flush()
            except (OSError, ValueError):  # closed or broken pipe: the log files still have it
                pass


class _LiveView:
    """A rich live status table with child output scrolling above it (terminals)."""

    def __init__(self, out: TextIO) -> None:
        from rich.console import Console  # lazy: rich costs ~100 ms of CLI cold start

        self._console = Console(file=out, highlight=False, soft_wrap=True)
        self._live: Any = None

    def start(self, sup: "Supervisor") -> None:
        from rich.live import Live

        self._live = Live(
            get_renderable=sup._render_table,
            console=self._console,
            refresh_per_second=4,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._live.start()

    def stop(self) -> None:
        if self._live is not None:
            with contextlib.suppress(Exception):
                self._live.stop()
            self._live = None

    def log(self, name: str, line: str) -> None:
        from rich.text import Text

        t = Text(f"[{name}] ", style="cyan")
        t.append_text(Text.from_ansi(line))  # keep the child's colours, drop other escapes
        with contextlib.suppress(Exception):
            self._console.print(t)

    def say(self, msg: str, *, error: bool = False) -> None:
        from rich.text import Text

        with contextlib.suppress(Exception):
            self._console.print(Text(msg, style="bold red" if error else "bold"))


class _ReportStream(io.TextIOBase):
    """:meth:`Supervisor.report_stream`: ``write`` splits on newlines and hands each whole
    line to ``say``."""

    def __init__(self, say: Callable[[str], None]) -> None:
        super().__init__()
        self._say_line, self._buf = say, ""

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        *lines, self._buf = (self._buf + s).split("\n")
        for line in lines:
            self._say_line(line)
        return len(s)

    def flush(self) -> None:
        if self._buf:
            line, self._buf = self._buf, ""
            self._say_line(line)


_STATE_STYLE = {"waiting": "dim", "starting": "yellow", "healthy": "green", "stopping": "yellow"}


# --- the supervisor --------------------------------------------------------------------


class Supervisor:
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

    def shutdown(self) -> None:
        """Stop every process group: SIGTERM, up to ``grace_s`` seconds, then SIGKILL
        (at once after a second signal); wait for the readers, close the view, and print
        the failure report if a process failed. Idempotent; never raises for processes
        that are already gone."""
        with self._shut_lock:
            if self._shut:
                return
            self._shut = True
        self._stop.set()
        if self.stopped_by is not None:
            self._say(f"received {_signame(self.stopped_by)}: stopping"
                      + (" (killed at once: a second signal)" if self._force else " (send it again to kill at once)"))
        self._reap(report=False)
        started = [p for p in self._procs if p.popen is not None]
        groups = [p.popen.pid for p in reversed(started) if p.popen is not None]
        snap = proctree.snapshot()
        escaped = self._find_escaped(groups, snap)
        self._escaped = escaped  # a second signal kills these too
        alive = [p for p in started if snap.group_alive(p.popen.pid)]  # type: ignore[union-attr]
        killed: list[str] = []
        if alive or escaped:
            n = len(alive)
            self._say(f"stopping {n} process group{'s' * (n != 1)} (SIGTERM, grace {self.grace_s:g} s)")
            for p in alive:
                if p.state != "failed":
                    p.state = "stopping"
            self._signal_all(signal.SIGTERM, escaped)
            deadline = time.monotonic() + self.grace_s
            look_at = time.monotonic() + LOOK_S
            while not self._force and time.monotonic() < deadline:
                if time.monotonic() >= look_at:  # processes started during the grace period
                    new = [e for e in self._find_escaped(groups) if e not in escaped]
                    proctree.signal_each(new, signal.SIGTERM)
                    escaped += new
                    look_at = time.monotonic() + LOOK_S
                if not self._anything_alive(groups, escaped):
                    break
                if self._late_signal is not None:
                    self._say(f"received {_signame(self._late_signal)} while stopping: waiting up to "
                              f"{self.grace_s:g} s (send it again to kill at once)")
                    self._late_signal = None
                time.sleep(_TICK_S)
            snap = proctree.snapshot()
            escaped += [e for e in self._find_escaped(groups, snap) if e not in escaped]
            if self._force or self._anything_alive(groups, escaped, snap):
                killed = [p.name for p in started if snap.group_alive(p.popen.pid)]  # type: ignore[union-attr]
                why = "a second signal" if self._force else f"still running after {self.grace_s:g} s"
                who = ", ".join(killed) or ("every process group" if self._force else "leftover descendants")
                self._say(f"SIGKILL to {who} ({why})", error=True)
                self._signal_all(signal.SIGKILL, escaped)
                deadline = time.monotonic() + KILL_WAIT_S
                while self._anything_alive(groups, escaped) and time.monotonic() < deadline:
                    time.sleep(_TICK_S)
                if self._anything_alive(groups, escaped):
                    self._say(f"could not kill every process (pids in {self.run_dir / 'pids'})", error=True)
        self._reap(report=False)
        for p in started:
            if p.state == "stopping":
                p.state = "killed" if p.name in killed else "stopped"
        join_deadline = time.monotonic() + 2.0
        for p in started:
            if p.reader is not None:
                p.reader.join(max(0.0, join_deadline - time.monotonic()))
        busy = self._ports_in_use(started)
        if self._view is not None:
            self._view.stop()
        if busy:
            self._say(f"warning: still in use after teardown: {', '.join(busy)}", error=True)
        self._stop_watchdog()
        if self.failure is not None:
            self._say(self._failure_report(), error=True)
        elif started:
            self._say(f"stopped {len(started)} process{'es' * (len(started) != 1)}")

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
                    self._say(f"{p.name} unhealthy after readiness (GET {hc.url}: {why}); "
                              "the router routes around it", error=True)

    def _start_watchdog(self) -> None:
        """Start the orphan watchdog (see :mod:`omni_pd.launch.watchdog`)."""
        r, w = os.pipe()  # both close-on-exec: no child inherits the write end
        try:
            self._watchdog = subprocess.Popen(
                [sys.executable, "-m", "omni_pd.launch.watchdog", str(self.run_dir / "pids"), str(self.grace_s),
                 self._launch_id],
                stdin=r, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                close_fds=True)
        except OSError as e:
            os.close(w)
            self._say(f"warning: no orphan watchdog ({e}): a SIGKILLed launcher would leave its engines",
                      error=True)
            return
        finally:
            os.close(r)
        self._watchdog_fd = w

    def _stop_watchdog(self) -> None:
        """Tell the watchdog the teardown was done here, and let it exit."""
        if self._watchdog_fd is None:
            return
        with contextlib.suppress(OSError):
            os.write(self._watchdog_fd, b"clean")
        with contextlib.suppress(OSError):
            os.close(self._watchdog_fd)
        self._watchdog_fd = None
        if self._watchdog is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._watchdog.wait(5)

    def _fail(self, p: _Proc | None, reason: str) -> None:
        if self.failure is None:
            self.failure = Failure(p.name if p else None, reason, p.returncode if p else None)
            if p is not None and p.returncode is None:
                p.state = "failed"
            self._say(f"error: {reason}; stopping all", error=True)

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

    # -- threads ------------------------------------------------------------------------

    def _read(self, p: _Proc, popen: subprocess.Popen[bytes], log: TextIO) -> None:
        """Reader thread: drain the child's merged output to its log and the view. It
        never stops before EOF (a full pipe would block the child)."""
        assert popen.stdout is not None
        try:
            for raw in iter(popen.stdout.readline, b""):
                line = self.mask(ANSI_ESCAPE.sub("", raw.decode("utf-8", "replace").rstrip("\r\n")))
                p.tail.append(line)
                with contextlib.suppress(OSError, ValueError):
                    log.write(line + "\n")
                if self._view is not None:
                    with contextlib.suppress(Exception):
                        self._view.log(p.name, line)
        finally:
            with contextlib.suppress(OSError):
                log.close()
            with contextlib.suppress(OSError):
                popen.stdout.close()
            self._wake.set()

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

    # -- teardown helpers ---------------------------------------------------------------

    def _signal_all(self, sig: int, escaped: Iterable[int] = ()) -> None:
        """``sig`` to every started process group, and to ``escaped`` pids. A group whose
        leader was reaped is signalled only while a member of it still runs: once the
        group is empty its pid may belong to another process."""
        snap: proctree.Snapshot | None = None
        for p in reversed(self._procs):
            if p.popen is None:
                continue
            if p.popen.returncode is not None:  # leader reaped (poll/wait)
                snap = snap or proctree.snapshot()
                if not snap.group_alive(p.popen.pid):
                    continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.popen.pid, sig)
        proctree.signal_each(escaped, sig)

    def _find_escaped(self, groups: list[int], snap: "proctree.Snapshot | None" = None) -> list[Any]:
        """Processes of this launch outside the ``groups`` killpg reaches: descendants that
        left their group, and any process carrying this launch's :data:`LAUNCH_ENV` (a
        double-forked daemon re-parented away, a child started during the grace period)."""
        snap = snap or proctree.snapshot()
        gs = set(groups)
        found = snap.escaped(groups)
        for q in proctree.tagged(LAUNCH_ENV, self._launch_id):
            if snap.pgid.get(q.pid) not in gs and q not in found and q.pid != os.getpid():
                found.append(q)
        return found

    def _anything_alive(self, groups: list[int], escaped: list[Any], snap: Any = None) -> bool:
        self._reap(report=False)  # a zombie leader keeps its group "alive" for killpg(0)
        snap = snap or proctree.snapshot()
        if any(snap.group_alive(g) for g in groups):
            return True
        return any(proctree.running(e) for e in escaped)

    def _ports_in_use(self, started: list[_Proc]) -> list[str]:
        busy = []
        for p in started:
            for u in p.spec.ports:
                if _port_in_use(u.host, u.port):
                    busy.append(f"{p.name} port {u.port} ({u.purpose})")
        return busy

    # -- output -------------------------------------------------------------------------

    def _say(self, msg: str, *, error: bool = False) -> None:
        if self._view is None:
            self._view = _PlainView(self._out)
        self._view.say(msg, error=error)

    def _failure_report(self) -> str:
        f = self.failure
        assert f is not None
        lines = [f"launch failed: {f.reason}"]
        p = self._by_name.get(f.process) if f.process else None
        if p is not None:
            if p.returncode is not None:
                lines.append(f"{p.name} exit code: {p.returncode}")
            if p.popen is not None:
                tail = list(p.tail)
                lines.append(f"last {len(tail)} log line{'s' * (len(tail) != 1)} of {p.name} ({p.log_path}):")
                lines += [f"  | {ln}" for ln in tail] or ["  | (no output)"]
        return "\n".join(lines)

    def _render_table(self) -> Any:
        from rich.table import Table

        now = time.monotonic()
        table = Table(box=None, pad_edge=False, header_style="bold")
        for col in ("process", "role", "state", "pid", "ports", "elapsed", "ready"):
            table.add_column(col, justify="right" if col in ("pid", "elapsed", "ready") else "left")
        for p in self._procs:
            el = p.elapsed(now)
            ready = self.timings.ready_s.get(p.name)
            style = _STATE_STYLE.get(p.state, "red" if p.state.startswith(("exited", "failed", "killed")) else "")
            table.add_row(
                p.name,
                p.spec.role,
                f"[{style}]{p.state}[/]" if style else p.state,
                str(p.pid or "-"),
                ",".join(str(u.port) for u in p.spec.ports) or "-",
                "-" if el is None else f"{el:.1f} s",
                "-" if ready is None else f"{ready:.1f} s",
            )
        return table


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


def _isatty(out: TextIO) -> bool:
    try:
        return bool(out.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _describe_rc(rc: int) -> str:
    if rc < 0:
        try:
            return f"signal {signal.Signals(-rc).name} (exit code {rc})"
        except ValueError:
            return f"signal {-rc} (exit code {rc})"
    return f"exit code {rc}"


def _port_in_use(host: str, port: int) -> bool:
    """True when something still listens on ``host:port`` (preflight's try-bind; a host
    that is not local is not checked)."""
    e = bind_error(host, port)
    return e is not None and e.errno == errno.EADDRINUSE
