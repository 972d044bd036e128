"""How many router processes (``--workers``) a host gets by default (pure).

Measured (bench/RESULTS.md, "Router under load"; 2 cores shared with the fake engines
and the client): one worker needs ~0.3 ms of CPU per JSON request (~3,000 requests/s per
core); in an earlier run a second one gave 5-20 % more throughput at 256 and 1024 clients,
with mixed p99 and more CPU per request below 256, and it is one more process polling health and
balancing on its own counts. On a real PD host the engines' API servers (tokenizing,
detokenizing, scheduling) need those cores, so a host with up to 7 CPUs gets one worker.
Beyond that nothing was measured: the rule gives the router a quarter of the CPUs, at
most :data:`MAX_DEFAULT`.
"""

from __future__ import annotations

import os

#: most workers the default rule gives (each worker keeps its own backend connections and poller)
MAX_DEFAULT = 8


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def default_workers(cpus: int | None = None) -> int:
    """Router worker processes for a host with ``cpus`` CPUs (default: :func:`usable_cpus`):
    ``max(1, min(MAX_DEFAULT, cpus // 4))``: 1 up to 7 CPUs, 2 at 8, 4 at 16, 8 from 32."""
    n = usable_cpus() if cpus is None else cpus
    return max(1, min(MAX_DEFAULT, n // 4))
