"""The supervisor's output (:mod:`omni_pd.launch.supervisor`): each child's log stream
(reader thread: ``<run_dir>/<name>.log`` and ``[name] line``, terminal escapes dropped,
secrets masked by :class:`SecretMasker`), the plain and rich live views, the readiness
callback's report stream and the failure report. Split out of supervisor.py in issue 38.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import threading
import time
from typing import Any, Callable, Iterable, Mapping, TextIO

from omni_pd.launch.spec import MASK, LaunchPlan, is_secret
from omni_pd.launch.run_state import _Proc

#: secret values shorter than this are not masked (masking "0" would mangle every line)
MIN_SECRET_LEN = 4
#: an ECMA-48 escape sequence (CSI ``ESC [ ... final``, e.g. colours, and two-byte ``ESC x``)
ANSI_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|[@-Z\\-_])")
_LAUNCHER = "omni-pd"


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

# --- views -----------------------------------------------------------------------------


class _PlainView:
    """Line output: ``[name] line`` for child output, ``[omni-pd] message`` for events."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._lock = threading.Lock()

    def start(self, sup: "_Output") -> None:
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

    def start(self, sup: "_Output") -> None:
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


class _Output:
    """The supervisor's log streaming and messages (a part of :class:`~omni_pd.launch.supervisor.Supervisor`)."""

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


def _isatty(out: TextIO) -> bool:
    try:
        return bool(out.isatty())
    except (AttributeError, ValueError, OSError):
        return False
