"""Process-tree facts the supervisor's teardown needs, from psutil (any platform psutil
supports; no ``/proc`` parsing of our own).

A :class:`Snapshot` is one pass over the process table: which process groups still have a
running member, and which descendants of those groups left them (``setsid``/``setpgid``:
``killpg`` misses them). Processes are kept as :class:`psutil.Process` objects, which
remember their creation time: signalling one whose pid was reused by another process
raises :class:`psutil.NoSuchProcess` instead of hitting the stranger
(psutil docs, "Process.send_signal ... PID reuse").
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from dataclasses import dataclass

import psutil

#: environment variable the supervisor sets on every child to its launch's id (descendants
#: inherit it): teardown and the orphan watchdog find the launch's processes by it, also
#: those re-parented away from their child
LAUNCH_ENV = "OMNI_PD_LAUNCH_ID"

#: what a signal to a tracked process may meet: it is gone, or is not ours to signal
GONE = (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError, PermissionError)


@dataclass(frozen=True)
class Snapshot:
    """``procs``: ``{pid: Process}`` of every running (non-zombie) process;
    ``ppid``/``pgid``: their parent pid and process group (missing where unreadable)."""

    procs: dict[int, psutil.Process]
    ppid: dict[int, int]
    pgid: dict[int, int]

    def group_alive(self, pgid: int) -> bool:
        """True while a running process belongs to group ``pgid``."""
        return any(g == pgid for g in self.pgid.values())

    def escaped(self, groups: Iterable[int]) -> list[psutil.Process]:
        """Running descendants of the members of ``groups`` that are in no group of
        ``groups`` (a double fork's end, a ``setsid`` server), sorted by pid."""
        gs = set(groups)
        children: dict[int, list[int]] = {}
        for pid, pp in self.ppid.items():
            children.setdefault(pp, []).append(pid)
        stack = [pid for pid, g in self.pgid.items() if g in gs]
        seen: set[int] = set()
        while stack:
            for c in children.get(stack.pop(), ()):
                if c not in seen:
                    seen.add(c)
                    stack.append(c)
        return [self.procs[pid] for pid in sorted(seen) if self.pgid.get(pid) not in gs]


def tagged(tag: str, value: str) -> list[psutil.Process]:
    """Running processes whose environment holds ``tag=value`` (the supervisor sets it on
    every child; descendants inherit it, also after a double fork re-parents them away).
    Processes whose environment cannot be read (another user's) are skipped."""
    out = []
    for p in psutil.process_iter():
        with contextlib.suppress(*GONE, OSError):
            if p.environ().get(tag) == value and running(p):
                out.append(p)
    return out


def snapshot() -> Snapshot:
    """One pass over the process table (zombies left out: they hold no resources and
    ignore signals)."""
    procs: dict[int, psutil.Process] = {}
    ppid: dict[int, int] = {}
    pgid: dict[int, int] = {}
    for p in psutil.process_iter(["ppid", "status"]):
        info = p.info
        if info.get("status") in (None, psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            continue
        try:
            pgid[p.pid] = os.getpgid(p.pid)
        except OSError:
            continue
        procs[p.pid] = p
        if info.get("ppid") is not None:
            ppid[p.pid] = info["ppid"]
    return Snapshot(procs, ppid, pgid)


def running(p: psutil.Process) -> bool:
    """``p`` (the same process, not a reused pid) still runs and is no zombie."""
    try:
        return p.is_running() and p.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except GONE:
        return False


def signal_each(procs: Iterable[psutil.Process], sig: int) -> None:
    """Send ``sig`` to each process that is still the one first seen (psutil checks the
    creation time before signalling); gone or foreign processes are skipped."""
    for p in procs:
        with contextlib.suppress(*GONE):
            p.send_signal(sig)
