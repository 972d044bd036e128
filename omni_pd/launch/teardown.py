"""The supervisor's teardown (:mod:`omni_pd.launch.supervisor`): SIGTERM to every process
group and to the launch's processes outside them (:mod:`omni_pd.launch.proctree`),
``grace_s`` seconds, then SIGKILL; the orphan watchdog (:mod:`omni_pd.launch.watchdog`)
started with the launch and told when the teardown was done here. Split out of
supervisor.py in issue 38.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
import time
from typing import Any, Iterable

from omni_pd.launch import proctree
from omni_pd.launch.preflight import bind_error
from omni_pd.launch.run_state import _TICK_S, _Proc, _signame

#: seconds: how long teardown waits for SIGKILLed processes to disappear
KILL_WAIT_S = 5.0
#: seconds between looks for new processes of the launch during the grace period
LOOK_S = 0.25
#: environment variable set on every child (see :data:`omni_pd.launch.proctree.LAUNCH_ENV`)
LAUNCH_ENV = proctree.LAUNCH_ENV


class _Teardown:
    """The supervisor's teardown (a part of :class:`~omni_pd.launch.supervisor.Supervisor`)."""

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


def _port_in_use(host: str, port: int) -> bool:
    """True when something still listens on ``host:port`` (preflight's try-bind; a host
    that is not local is not checked)."""
    e = bind_error(host, port)
    return e is not None and e.errno == errno.EADDRINUSE
