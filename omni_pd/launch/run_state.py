"""The run state the supervisor's parts share (:mod:`omni_pd.launch.supervisor`): exit
codes, the main loop's tick, :class:`Failure`, :class:`LaunchTimings` and the per-child
state ``_Proc``. Split out of supervisor.py in issue 38.
"""

from __future__ import annotations

import collections
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omni_pd.launch.spec import ProcessSpec

EXIT_OK = 0
EXIT_FAILED = 1
_TICK_S = 0.05


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
