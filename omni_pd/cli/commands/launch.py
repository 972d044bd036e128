"""``omni-pd launch``: validate, plan, preflight, start and supervise (omni_pd/launch/); the
dry-run printer.
"""

import os
import sys
from pathlib import Path
from typing import Literal, Optional

import typer

from omni_pd.cli.options import IGNORE_HELP, LAUNCH_PLATFORM, SELECT_HELP, inventory_opt, pairs, served_model_facts
from omni_pd.cli.shared import plan_suppression
from omni_pd.cli_validate import _hidden, _line_source
from omni_pd.diagnostics import Diagnostic, OmniPdError, Severity


def launch(
    config: Path = typer.Argument(..., help="compiled PD deploy YAML (the output of `omni-pd expand`)"),
    model: str = typer.Option(..., "--model", help="model id or path every engine serves"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the launch plan and start nothing"),
    fmt: Literal["text", "json"] = typer.Option("text", "--format", help="plan output with --dry-run: text or JSON"),
    vllm: str = typer.Option("vllm", "--vllm", help="the `vllm` executable (path or name on PATH)"),
    python: Optional[str] = typer.Option(None, "--python", help="python of the vLLM environment (default: next to --vllm)"),
    host: Optional[str] = typer.Option(
        None, "--host", help="address every server binds and advertises (default 127.0.0.1); with --inventory: the "
        "inventory host (name or address) whose processes this launch starts"),
    inventory: Optional[Path] = typer.Option(
        None, "--inventory", help="hosts and stage placement (YAML, as given to expand): each host runs its own "
        "`launch --host NAME`; --dry-run prints every host's commands"),
    port: int = typer.Option(8000, "--port", help="client port: the PD router, or the vllm-omni server"),
    engine_port_base: int = typer.Option(8100, "--engine-port-base", help="prefill HTTP port (decode: +100)"),
    platform: LAUNCH_PLATFORM = typer.Option("cuda", "--platform", help="the accelerator the engines run on"),
    served_model_name: Optional[str] = typer.Option(None, "--served-model-name", help="name clients use (default: --model)"),
    ready_timeout: float = typer.Option(1200.0, "--ready-timeout", help="seconds each engine may take to become healthy"),
    grace: float = typer.Option(10.0, "--grace", help="seconds between SIGTERM and SIGKILL at shutdown"),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="logs, pids, plan.json, timings.json, smoke.json (default: omni-pd-runs/<time>)"),
    extra_arg: Optional[list[str]] = typer.Option(None, "--engine-arg", help="extra `vllm serve` argument for every engine (repeatable)"),
    prefill_arg: Optional[list[str]] = typer.Option(None, "--prefill-engine-arg", help="extra `vllm serve` argument for "
                                                    "the prefill engines only (repeatable; the vllm runtime)"),
    decode_arg: Optional[list[str]] = typer.Option(None, "--decode-engine-arg", help="extra `vllm serve` argument for "
                                                   "the decode engines only (repeatable; the vllm runtime)"),
    env: Optional[list[str]] = typer.Option(None, "--env", help="KEY=VALUE for every process (repeatable; secrets masked)"),
    smoke: bool = typer.Option(False, "--smoke", help="after readiness, one request through the entrypoint must move KV"),
    once: bool = typer.Option(False, "--once", help="stop after readiness (and --smoke) instead of serving"),
    fail_fast: bool = typer.Option(
        False, "--fail-fast", help="tear everything down when any process exits or turns unhealthy after "
        "readiness (default: an xPyD instance is restarted while another of its role serves)"),
    no_preflight: bool = typer.Option(False, "--no-preflight", help="skip the port/device/module checks"),
    router_workers: Optional[int] = typer.Option(
        None, "--router-workers", help="PD router processes (1..64; default: a quarter of this host's CPUs, "
        "at least 1, at most 8; bench/RESULTS.md \"Router under load\")"),
    select: Optional[list[str]] = typer.Option(None, "--select", help=SELECT_HELP + "; as validate"),
    ignore: Optional[list[str]] = typer.Option(None, "--ignore", help=IGNORE_HELP + "; as validate"),
) -> None:
    """Validate, plan, preflight, start and supervise the engines of a compiled PD config.

    Validate's findings come first, suppressed as validate suppresses them (``# omni-pd:
    ignore[CODE]`` comments, --select/--ignore, [tool.omni-pd]): a suppressed error does
    not stop the launch.
    """
    import time

    from omni_pd import cli_options
    from omni_pd.diagnostics import render_text, summary
    from omni_pd.io import load_file
    from omni_pd.launch.plan import LaunchOptions, launcher_visibility, plan_document

    inv = inventory_opt(inventory)
    on_host = _launch_host(inv, host, dry_run) if inv is not None and inv.hosts else None
    if on_host is None:
        host = host or "127.0.0.1"
        cli_options.host(host, "--host")
    else:
        host = (inv.hosts[on_host].address if on_host != "*" else None) or "127.0.0.1"
    cli_options.port(port, "--port")
    cli_options.port(engine_port_base, "--engine-port-base")
    if router_workers is not None and not 1 <= router_workers <= 64:
        raise typer.BadParameter(f"{router_workers} is outside 1..64", param_hint="--router-workers")
    kept, hidden = plan_suppression(config, select, ignore)  # before the config is read, as validate
    doc = load_file(config)
    opts = LaunchOptions(model=model, vllm=vllm, host=host, port=port, engine_port_base=engine_port_base,
                         platform=platform, served_model_name=served_model_name, ready_timeout_s=ready_timeout,
                         extra_args=tuple(extra_arg or ()), env=pairs(env, "--env"), python=python,
                         role_args=tuple(("prefill", a) for a in prefill_arg or ()) + tuple(("decode", a) for a in decode_arg or ()),
                         router_workers=router_workers, launcher_env=launcher_visibility(os.environ),
                         local_host=on_host if on_host not in (None, "*") else None)
    # validate's findings first, rendered and counted as `omni-pd validate` does, before
    # anything is planned (issue 24 item 3); stderr under --dry-run, so stdout is the plan alone
    # (JSON, or shell a user can save and run: the second-hour walkthrough)
    found_out = sys.stderr if dry_run else sys.stdout  # a refused dry run keeps them on stdout (no plan follows)
    planned = plan_document(doc, str(config.resolve()), opts, inventory=inv, suppress=kept,
                            model=served_model_facts(model), on_validated=lambda r: _say_launch_findings(r, doc.name, found_out, hidden[0]))
    res, topo, plan = planned.validation, planned.topology, planned.plan
    shown = list(res.diagnostics)  # every finding this run printed: the "not launched" counts
    if plan is None or topo is None:
        sys.stdout.write(f"{doc.name}: not launched ({summary(shown)}{_hidden(hidden[0])})\n")
        raise SystemExit(1)
    if dry_run:
        from omni_pd.launch.preflight import plan_checks  # the preflight checks needing no system state

        clashes = plan_checks(plan)
        if clashes:
            sys.stdout.write(render_text(clashes, _line_source(res.docs)) + "\n")
            sys.stdout.write(f"{doc.name}: not launched ({summary(shown + clashes)}{_hidden(hidden[0])})\n")
            raise SystemExit(1)
        _print_dry_run(plan, on_host, fmt, topo.pipeline)
        return
    if on_host is not None:
        plan = _host_plan(plan, on_host, smoke)
    if not no_preflight:
        from omni_pd.launch.plan import without_peers
        from omni_pd.launch.preflight import preflight

        found = preflight(without_peers(plan), platform)  # this host's processes; peers are probed
        bad = [d for d in found if d.severity is Severity.ERROR]
        if found:
            sys.stdout.write(render_text(found, _line_source(res.docs)) + "\n")
        if bad:
            sys.stdout.write(f"preflight: not launched ({summary(shown + found)}{_hidden(hidden[0])})\n")
            raise SystemExit(1)
    from omni_pd.launch.supervisor import run

    rd = run_dir or Path("omni-pd-runs") / time.strftime("%Y%m%d-%H%M%S")
    on_ready = None
    if smoke:
        from omni_pd.launch.smoke import smoke_check, smoke_target

        pair = topo.pd_pair
        target = smoke_target(plan, served_model_name or model, pair[1].stage_id if pair else None, str(rd))
        # through the supervisor's view (the live table would draw over a plain write),
        # and kept in the run directory
        on_ready = lambda out: smoke_check(target, out, report=Path(rd) / "smoke.json",  # noqa: E731
                                           runtime=plan.runtime)
    n = len(plan.processes)
    sys.stdout.write(f"omni-pd launch: {plan.runtime} runtime, {n} process{'es' if n != 1 else ''}, "
                     f"entrypoint {plan.entrypoint}, run dir {rd}\n")
    sys.stdout.flush()
    raise SystemExit(run(plan, rd, on_ready=on_ready, stay=not once, grace_s=grace, fail_fast=fail_fast))


def _launch_host(inv, host: Optional[str], dry_run: bool) -> str:
    """The inventory host ``launch --host`` names (a host name, or a host's address), or
    ``"*"`` for every host (``--dry-run`` without ``--host``). A real launch without
    ``--host``, or a name the inventory lacks, is OPD006 (exit 2) listing the hosts."""
    names = list(inv.hosts)
    if host is None:
        if dry_run:
            return "*"
        raise OmniPdError(Diagnostic(
            code="OPD006", severity=Severity.ERROR,
            message="launch --inventory starts one host's processes: --host names which",
            help=f"run `omni-pd launch ... --inventory FILE --host NAME` on each host ({', '.join(names)}); "
                 "--dry-run prints them all"))
    if host in inv.hosts:
        return host
    by_addr = [n for n, h in inv.hosts.items() if h.address == host]
    if by_addr:
        return by_addr[0]
    raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR,
                                 message=f"--host {host}: the inventory has no such host (name or address)",
                                 help=f"one of {', '.join(names)}"))


def _host_plan(plan, on_host: str, smoke: bool):
    """The part of ``plan`` host ``on_host`` starts (:func:`omni_pd.launch.plan.for_host`).
    OPD006 (exit 2) when no process is placed there, or ``--smoke`` on a host without the
    entrypoint (the router runs on decode's host)."""
    from omni_pd.launch.plan import for_host, hosts_of

    try:
        mine = for_host(plan, on_host)
    except KeyError:
        raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR,
                                     message=f"--host {on_host}: no process of this config is placed there",
                                     help=f"hosts with processes: {', '.join(hosts_of(plan))}")) from None
    if smoke and not any(p.role in ("router", "omni") and p.host == on_host for p in mine.processes):
        front = next((p.host for p in plan.processes if p.role in ("router", "omni")), None)
        raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR,
                                     message=f"--smoke on {on_host}: the entrypoint runs on {front}",
                                     help=f"pass --smoke to the launch on {front}"))
    return mine


def _say_launch_findings(res, name: str, out, hidden: int = 0) -> None:
    """``launch``: the validation findings of its config (``res``, a
    :class:`~omni_pd.check.validate.ValidateResult`, suppressed ones already left out)
    rendered as ``omni-pd validate`` renders them, then, when there are errors, nothing
    more (the caller says "not launched"), else validate's verdict line ``NAME: ok (0
    errors, 1 warning, 0 info; 2 suppressed)`` (``hidden``: the suppressed count). Silent
    for a config without findings, shown or suppressed."""
    from omni_pd.diagnostics import render_text, summary

    diags = list(res.diagnostics)
    if not diags and not hidden:
        return
    if out is sys.stderr and any(d.severity is Severity.ERROR for d in diags):
        out = sys.stdout  # refused: no plan follows, so the findings and the verdict stay together on stdout
    text = render_text(diags, _line_source(res.docs)) if diags else ""
    if text:
        out.write(text + ("" if text.endswith("\n") else "\n"))
    if not any(d.severity is Severity.ERROR for d in diags):
        out.write(f"{name}: ok ({summary(diags)}{_hidden(hidden)})\n")
    out.flush()


def _print_dry_run(plan, on_host: Optional[str], fmt: str, pipeline=None) -> None:
    """``launch --dry-run``: the plan (one host's with ``--host``; every host's, grouped by
    host, with ``--inventory`` alone) as copy-pasteable shell blocks under a summary
    (omni_pd/launch/shell.py ``dry_run_text``), or as JSON (``{"hosts": {NAME: plan}}`` for
    every host), each process with its ``shell`` command. ``pipeline``: the plan's
    :class:`~omni_pd.compile.pipelines.Pipeline` (its ``launch_form`` heads the text, as
    ``omni-pd pipelines`` lists it)."""
    import json

    from omni_pd.compile.pipelines import LAUNCH_FORMS
    from omni_pd.launch.plan import for_host, hosts_of
    from omni_pd.launch.shell import dry_run_text, plan_json

    if on_host not in (None, "*"):
        plan = _host_plan(plan, on_host, False)
    if fmt == "json":
        every = on_host == "*" and hosts_of(plan)
        doc = {"hosts": {h: plan_json(for_host(plan, h)) for h in hosts_of(plan)}} if every else plan_json(plan)
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    form = (pipeline.launch_form if pipeline is not None else None) or LAUNCH_FORMS[plan.runtime]
    sys.stdout.write(dry_run_text(plan, launch_form=form, pipeline=pipeline.name if pipeline is not None else None,
                                  host=on_host if on_host != "*" else None))
