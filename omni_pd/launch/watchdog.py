"""Orphan watchdog of ``omni-pd launch``: tears the engines down when the launcher dies.

    python -m omni_pd.launch.watchdog PIDS_FILE GRACE_S [LAUNCH_ID]   (stdin: a pipe from the launcher)

The supervisor starts one watchdog per launch, in a session of its own, with the read
end of a pipe as stdin and keeps the write end (close-on-exec, so no child holds it).
The read returns at EOF, i.e. when the launcher exits in any way, SIGKILL included: the
kernel closes its descriptors. A launcher that tore its processes down itself writes
``clean`` first and the watchdog exits without touching anything; otherwise it sends
SIGTERM to every process group in ``PIDS_FILE`` (``<pid> <name>`` lines, each pid a
group leader: the supervisor starts every child with ``start_new_session``), waits up
to ``GRACE_S`` seconds, then SIGKILLs what is left. With ``LAUNCH_ID`` it treats the
processes outside those groups that carry ``OMNI_PD_LAUNCH_ID=LAUNCH_ID`` (setsid
children, double-forked daemons; :func:`omni_pd.launch.proctree.tagged`) the same way. Why a watchdog rather than
``PR_SET_PDEATHSIG`` alone: the parent-death signal reaches only the direct child, and
``vllm serve``'s engine-core processes are its children, in its process group.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

CLEAN = b"clean"


def groups(pids_file: Path) -> list[int]:
    """Process-group ids listed in ``pids_file`` (missing or unreadable file: none)."""
    try:
        text = pids_file.read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        word = line.split(maxsplit=1)[0] if line.strip() else ""
        if word.isdigit() and int(word) > 1:
            out.append(int(word))
    return out


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _tagged(launch_id: str | None) -> list:
    if not launch_id:
        return []
    from omni_pd.launch import proctree

    return proctree.tagged(proctree.LAUNCH_ENV, launch_id)


def kill_groups(pgids: list[int], grace_s: float, launch_id: str | None = None) -> None:
    """SIGTERM every group (and the processes tagged with ``launch_id``), wait up to
    ``grace_s`` seconds, SIGKILL what is left."""
    for g in pgids:
        try:
            os.killpg(g, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    tagged = _tagged(launch_id)
    if tagged:
        from omni_pd.launch import proctree

        proctree.signal_each(tagged, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and (any(_alive(g) for g in pgids) or _tagged(launch_id)):
        time.sleep(0.05)
    for g in pgids:
        try:
            os.killpg(g, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if launch_id:
        from omni_pd.launch import proctree

        proctree.signal_each(_tagged(launch_id), signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    pids_file, grace_s = Path(args[0]), float(args[1])
    launch_id = args[2] if len(args) > 2 else None
    for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)  # only the launcher's end of the pipe decides
    data = b""
    while True:
        chunk = os.read(0, 4096)
        if not chunk:
            break
        data += chunk
    if data.endswith(CLEAN):
        return 0
    kill_groups(groups(pids_file), grace_s, launch_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
