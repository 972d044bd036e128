"""``omni-pd status`` as one call the CLI makes: find the target, scrape twice, judge,
render (once, or live with ``--watch``), and the exit status.

Exit status: 0 every pair is doing PD (or idle) and every instance answers; 1 a pair is not
doing PD (falling back, transfers failing, not measurable) or an instance is down; 2 no
instance answered, or the input does not say where a deployment is (a diagnostic, no
traceback: :class:`~omni_pd.diagnostics.OmniPdError`).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, TextIO

from omni_pd.diagnostics import Diagnostic, OmniPdError, Severity
from omni_pd.status import sources
from omni_pd.status.scrape import TIMEOUT_S, scrape_target
from omni_pd.status.verdict import MIN_SHARE, Report, Target, assess


def bad_input(message: str, help: str | None = None) -> OmniPdError:
    """An input ``status`` cannot use, as OPD006 (exit 2)."""
    return OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR, message=message,
                                  help=help or "give a launch run directory, --config (+ --inventory), or "
                                               "--url ROLE=URL (`omni-pd status --help`)"))


def resolve_target(run_dir: str | None, config: str | None, inventory: Any, urls: list[str] | None, *,
                   port: int = 8000, engine_port_base: int = 8100, platform: str = "cuda") -> Target:
    """The :class:`Target` of exactly one of ``run_dir``, ``config`` (+ ``inventory``) or
    ``urls``. Raises OmniPdError (OPD006, exit 2) for none, several, or one that does not
    say where a deployment is."""
    given = [n for n, v in (("RUN_DIR", run_dir), ("--config", config), ("--url", urls)) if v]
    if len(given) != 1:
        raise bad_input("status needs one of RUN_DIR, --config or --url" if not given else
                        f"status takes one of RUN_DIR, --config, --url; got {' and '.join(given)}")
    try:
        if run_dir:
            return sources.from_run_dir(run_dir)
        if config:
            return sources.from_config(config, inventory, port=port, engine_port_base=engine_port_base,
                                       platform=platform)
        return sources.from_urls(urls or [])
    except sources.SourceError as e:
        raise bad_input(str(e)) from None


@dataclass
class Options:
    """``window_s``: seconds between the two scrapes (0: one scrape, totals since start);
    ``min_share``: 0..1; ``timeout_s``: seconds per GET; ``fmt``: ``text`` or ``json``;
    ``watch``: refresh until interrupted; ``probe``: send one greedy request in the window
    (``model`` names it; ``entrypoint`` receives it)."""

    window_s: float = 5.0
    min_share: float = MIN_SHARE
    timeout_s: float = TIMEOUT_S
    fmt: str = "text"
    watch: bool = False
    probe: bool = False
    model: str | None = None
    entrypoint: str | None = None


def measure(target: Target, opts: Options, *, sleep: Callable[[float], None] = time.sleep,
            scrape=scrape_target, out: TextIO | None = None) -> Report:
    """Two scrapes ``opts.window_s`` apart (one when 0) and their :class:`Report`; with
    ``opts.probe`` one greedy request goes to ``opts.entrypoint`` right after the first
    scrape, and a line on ``out`` says so."""
    before = scrape(target, timeout=opts.timeout_s) if opts.window_s > 0 else None
    if opts.probe:
        _probe(target, opts, out or sys.stderr)
    if opts.window_s > 0:
        sleep(opts.window_s)
    after = scrape(target, timeout=opts.timeout_s)
    return assess(target, before, after, opts.min_share)


def _probe(target: Target, opts: Options, out: TextIO) -> None:
    """``--probe``: one greedy request through the entrypoint (omni_pd/launch/smoke.py's
    request: a completion, a text-only chat on vllm-omni)."""
    from omni_pd.launch.smoke import ServerError, SmokeTarget, smoke

    if not opts.entrypoint or not opts.model:
        out.write("status: --probe: not sent (the entrypoint or the model is not known; give --model and a "
                  "router=URL)\n")
        return
    t = SmokeTarget(opts.entrypoint, opts.model, None, chat=target.runtime == "vllm-omni")
    try:
        res = smoke(t, log_settle_s=0)
        out.write(f"status: --probe: sent one greedy request to {opts.entrypoint}: answered in {res.seconds:.2f} s\n")
    except ServerError as e:
        out.write(f"status: --probe: sent one greedy request to {opts.entrypoint}: failed: {e}\n")


def run(target: Target, opts: Options, out: TextIO | None = None) -> int:
    """Measure, print (rich table or JSON on ``out``, default stdout) and return the exit
    status; with ``opts.watch`` a live table refreshed every window (JSON: one object per
    window and line) until Ctrl-C, exit status of the last window."""
    from rich.console import Console

    from omni_pd.status.view import render, to_json

    out = out or sys.stdout
    if not opts.watch:
        rep = measure(target, opts, out=sys.stderr)
        if opts.fmt == "json":
            out.write(to_json(rep))
        else:
            tty = getattr(out, "isatty", lambda: False)()
            Console(file=out, width=None if tty else 180).print(render(rep))  # a pipe or file: no wrapping at 80
        if rep.exit_code == 2:
            sys.stderr.write(f"status: no instance answered ({target.source}); is the deployment running?\n")
        return rep.exit_code
    if opts.fmt == "json":  # one JSON object per window and line, for a script reading a pipe
        import json

        rc = 2
        try:
            while True:
                rep = measure(target, Options(**{**opts.__dict__, "probe": False, "window_s": opts.window_s or 2.0}))
                rc = rep.exit_code
                out.write(json.dumps(rep.to_json()) + "\n")
                out.flush()
        except KeyboardInterrupt:
            pass
        return rc
    from rich.live import Live
    from rich.text import Text

    console = Console(file=out)
    rc = 2
    with Live(Text(f"omni-pd status: first window of {opts.window_s:g} s ..."), console=console,
              refresh_per_second=2, transient=False) as live:
        try:
            while True:
                rep = measure(target, Options(**{**opts.__dict__, "probe": False,
                                                 "window_s": opts.window_s or 2.0}))
                rc = rep.exit_code
                live.update(render(rep))
        except KeyboardInterrupt:
            pass
    return rc
