"""``omni-pd status``'s renderings of a :class:`~omni_pd.status.verdict.Report`: a rich
table (one row per pair: its verdict and evidence; one per instance: its numbers) and the
JSON for scripts (the same numbers, unrounded). Pure apart from building rich objects."""

from __future__ import annotations

import json
from typing import Any

from omni_pd.status.verdict import (FAILURES, IDLE, INSTANCE_DOWN, LOCAL_PREFILL, NOT_MEASURABLE, PD_WORKING,
                                    TRANSFERS_FAILING, InstanceStats, Report)

#: rich style of each verdict
STYLE = {PD_WORKING: "bold green", IDLE: "green", LOCAL_PREFILL: "bold red", TRANSFERS_FAILING: "bold red",
         INSTANCE_DOWN: "bold red", NOT_MEASURABLE: "yellow"}


def _num(x: float | None, fmt: str = "{:g}") -> str:
    return "-" if x is None else fmt.format(x)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{1000 * x:.0f} ms"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def verdict_line(p) -> str:
    """``<pair>: <verdict> [(share)]``: the one line of a pair."""
    share = f" ({_pct(p.share)} of decode's prompt tokens from prefill)" if p.share is not None and \
        p.verdict in (PD_WORKING, LOCAL_PREFILL) else ""
    return f"{p.pair}: {p.verdict}{share}"


def instance_row(i: InstanceStats) -> tuple[str, ...]:
    """The table cells of one instance: name, role, health, requests, prompt tokens
    external/local, KV cache usage, running/waiting, preemptions, TTFT and ITL (mean /
    p90), KV connector (NIXL or Mooncake) transfers/failures, lease lines."""
    if i.role == "router":
        rot = ", ".join(f"{b['role']}:{'in' if b['healthy'] else 'OUT'}" for b in i.backends) or "-"
        return (i.name, i.role, "up" if i.up else "DOWN", "-", "-", "-", "-", "-", "-", "-", rot)
    health = ("up, /health 503" if i.note else "up") if i.up else "DOWN"
    pt = i.prompt_tokens
    tokens = (f"{pt.get('external_kv_transfer', 0):g}/{pt.get('local_compute', 0):g}" if pt else "-")
    xfer = "-"
    if i.connector:
        fails = sum(i.connector.get(k, 0) for k in FAILURES)
        xfer = f"{i.connector.get('transfers', 0):g} ok, {fails:g} failed"
    if i.lease_lines:
        xfer += f", {i.lease_lines} lease lines"
    return (i.name, i.role, health, _num(i.requests), tokens, _pct(i.kv_usage),
            f"{_num(i.running)}/{_num(i.waiting)}", _num(i.preemptions),
            f"{_ms(i.ttft_mean_s)} / {_ms(i.ttft_p90_s)}", f"{_ms(i.itl_mean_s)} / {_ms(i.itl_p90_s)}", xfer)


COLUMNS = ("instance", "role", "health", "requests", "tokens ext/local", "KV cache", "run/wait", "preempt",
           "TTFT mean/p90", "ITL mean/p90", "KV transfers / router view")


def render(report: Report):
    """A rich renderable of ``report``: the pairs' verdicts with their evidence, then the
    instances' numbers, titled with the source and the window."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    basis = {i.basis for i in report.instances if i.role != "router" and i.up}
    window = f"window {report.seconds:.1f} s" if basis == {"window"} else \
        (f"window {report.seconds:.1f} s, no traffic: totals since start" if report.seconds else "totals since start")
    pairs = Table(title=f"omni-pd status: {report.target.runtime} runtime, {report.target.source} ({window})",
                  title_justify="left", show_lines=False)
    pairs.add_column("pair")
    pairs.add_column("verdict")
    pairs.add_column("evidence")
    for p in report.pairs:
        pairs.add_row(p.pair, Text(verdict_line(p).split(": ", 1)[1], style=STYLE.get(p.verdict, "")),
                      "\n".join(p.evidence))
    inst = Table(show_lines=False)
    for c in COLUMNS:
        inst.add_column(c, no_wrap=c in ("instance", "health"))
    for i in report.instances:
        cells = instance_row(i)
        inst.add_row(*cells[:2], Text(cells[2], style="green" if i.up else "bold red"), *cells[3:])
    return Group(pairs, inst)


def to_json(report: Report) -> str:
    """``report`` as indented JSON (the table's numbers unrounded: seconds, fractions,
    counts)."""
    return json.dumps(report.to_json(), indent=2, default=_default) + "\n"


def _default(o: Any) -> Any:
    if isinstance(o, tuple):
        return list(o)
    raise TypeError(type(o).__name__)
