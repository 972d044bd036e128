"""``omni-pd status``: is PD happening (omni_pd/status/)."""

import sys
from pathlib import Path
from typing import Literal, Optional

import typer

from omni_pd.cli.options import LAUNCH_PLATFORM, inventory_opt


def status_cmd(
    run_dir: Optional[Path] = typer.Argument(None, help="run directory of a local `omni-pd launch` (its plan.json "
                                             "and logs)"),
    config: Optional[Path] = typer.Option(None, "--config", help="compiled PD deploy YAML: addresses and ports as "
                                          "launch/render compute them (with --inventory for hosts)"),
    inventory: Optional[Path] = typer.Option(None, "--inventory", help="hosts and stage placement (YAML), with --config"),
    url: Optional[list[str]] = typer.Option(None, "--url", help="ROLE=URL of a running instance (prefill, decode, "
                                            "router; a vllm-omni stage: decode=http://H:P#stage=N; repeatable)"),
    port: int = typer.Option(8000, "--port", help="with --config: the client port launch/render used"),
    engine_port_base: int = typer.Option(8100, "--engine-port-base", help="with --config: prefill's first HTTP port "
                                         "(decode: +100)"),
    platform: LAUNCH_PLATFORM = typer.Option("cuda", "--platform", help="with --config: the platform it was planned for"),
    window: float = typer.Option(5.0, "--window", help="seconds between the two scrapes (0: one scrape, totals since "
                                 "start)"),
    min_share: float = typer.Option(0.8, "--min-share", help="decode's share of prompt tokens from prefill below "
                                    "which a pair is falling back (0..1)"),
    timeout: float = typer.Option(3.0, "--timeout", help="seconds each GET may take"),
    fmt: Literal["text", "json"] = typer.Option("text", "--format", help="a rich table, or JSON for scripts"),
    watch: bool = typer.Option(False, "--watch", help="a live table, refreshed every --window seconds, until Ctrl-C"),
    probe: bool = typer.Option(False, "--probe", help="send one greedy request through the entrypoint in the window "
                               "(never sent otherwise)"),
    model: Optional[str] = typer.Option(None, "--model", help="with --probe: the model name clients use (default: "
                                        "the plan's)"),
    emit: Optional[Literal["prometheus-rules", "grafana"]] = typer.Option(
        None, "--emit", help="print Prometheus recording rules + alerts, or a Grafana dashboard, for the same "
        "verdicts instead of measuring"),
) -> None:
    """Is PD happening? Each pair's verdict (PD working, falling back to local prefill, transfers failing,
    instance down) from the engines' own metrics over a window; exit 0 healthy, 1 not doing PD or an instance
    down, 2 nothing reachable or bad input.
    """
    from omni_pd.status.command import Options, bad_input, resolve_target, run

    if not 0 <= min_share <= 1:
        raise bad_input(f"--min-share {min_share:g} is outside 0..1")
    if window < 0 or timeout <= 0:
        raise bad_input(f"--window must be >= 0 and --timeout > 0 (got {window:g}, {timeout:g})")
    if emit is not None:
        from omni_pd.status.rules import grafana_json, prometheus_rules

        given = run_dir or config or url
        target = resolve_target(str(run_dir) if run_dir else None, str(config) if config else None,
                                inventory_opt(inventory), url, port=port, engine_port_base=engine_port_base,
                                platform=platform) if given else None
        sys.stdout.write((prometheus_rules if emit == "prometheus-rules" else grafana_json)(target, min_share))
        return
    target = resolve_target(str(run_dir) if run_dir else None, str(config) if config else None,
                            inventory_opt(inventory), url, port=port, engine_port_base=engine_port_base,
                            platform=platform)
    opts = Options(window_s=window, min_share=min_share, timeout_s=timeout, fmt=fmt, watch=watch, probe=probe,
                   model=model or target.model, entrypoint=target.entrypoint)
    raise SystemExit(run(target, opts))
