"""How many router processes (``--workers``) a host gets by default (pure).

Measured (bench/RESULTS.md, "Router under load"; 2 cores shared with the fake engines
and the client): one worker costs the same CPU per request as two and holds the same
throughput, while a second worker only adds a process that polls health and balances on
its own counts; so a host with up to 7 cores gets one. Beyond that nothing was measured:
the rule gives the router a quarter of the cores (the engines' API servers, tokenizers
and detokenizers need the rest), at most :data:`MAX_DEFAULT`.
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
