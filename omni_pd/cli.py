"""The ``omni-pd`` command line (typer). Thin: parse options, call the compiler, render.

Exit status: 0 success (warnings/infos allowed), 1 errors found, 2 unreadable input or
bad usage, 3 internal error (a bug in omni-pd; set OMNI_PD_DEBUG=1 for the traceback).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer

from .diagnostics import Diagnostic, OmniPdError, Severity

app = typer.Typer(
    name="omni-pd",
    help="Compile vllm-omni deploy configs into prefill/decode (PD) disaggregated topologies.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

_DOCS: dict[str, object] = {}


def _line_source(docs: dict):
    """Source line lookup for diagnostics: loaded documents first, else the file on disk."""
    cache: dict[str, list[str] | None] = {}

    def get(file: str, line: int):
        d = docs.get(file)
        if d is not None:
            return d.line_text(line)
        if file not in cache:
            try:
                p = Path(file)
                cache[file] = (p.read_text(encoding="utf-8", errors="replace").splitlines()
                               if p.is_file() and p.stat().st_size < 8 * 1024 * 1024 else None)
            except OSError:
                cache[file] = None
        lines = cache[file]
        return lines[line - 1] if lines and 1 <= line <= len(lines) else None
    return get


def _emit_diags(diags, docs: dict | None = None) -> None:
    from .diagnostics import render_text, sort_key

    if not diags:
        return
    sys.stderr.write(render_text(sorted(diags, key=sort_key), _line_source(docs or _DOCS)))
    sys.stderr.flush()


def _devices_opt(value: Optional[str], name: str):
    if value is None:
        return None
    from .topology import parse_devices

    try:
        d = parse_devices(value)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint=name) from None
    if not isinstance(d, tuple):
        raise typer.BadParameter('give device indices like "0,1"', param_hint=name)
    return d


def _schema_ref(out: Optional[Path]) -> str:
    from .resources import schema_path

    base = out.resolve().parent if out is not None else Path.cwd()
    sp = schema_path()
    try:
        rel = os.path.relpath(sp, base)
    except ValueError:
        return str(sp)
    return rel if not rel.startswith("..") else str(sp)


@app.command()
def expand(
    input: Optional[Path] = typer.Argument(None, help="three-stage deploy YAML (default: the bundled Qwen3-Omni preset)",
                                           show_default=False),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="write here (atomically) instead of stdout"),
    connector: Optional[str] = typer.Option(None, "--connector", help="KV connector: MooncakeConnector (default) or NixlConnector"),
    vllm_version: Optional[str] = typer.Option(None, "--vllm-version", help="target vLLM major.minor (default 0.30)"),
    tp: Optional[int] = typer.Option(None, "--tp", min=1, help="tensor parallel size of both prefill and decode"),
    prefill_devices: Optional[str] = typer.Option(None, "--prefill-devices", help='e.g. "0,1"'),
    decode_devices: Optional[str] = typer.Option(None, "--decode-devices", help='e.g. "2,3"'),
    downstream_devices: Optional[str] = typer.Option(None, "--downstream-devices",
                                                     help="devices for every stage after the Thinker (Talker, Code2Wav)"),
    kv_host: str = typer.Option("127.0.0.1", "--kv-host", help="address prefill/decode advertise to each other"),
    kv_buffer_device: Optional[str] = typer.Option(None, "--kv-buffer-device", help="cuda | cpu (NIXL host staging)"),
    port_base: Optional[int] = typer.Option(None, "--port-base", min=1, max=65535, help="first connector port to try"),
    pipeline: Optional[str] = typer.Option(None, "--pipeline", help="pipeline name when the file does not say"),
    schema_ref: Optional[str] = typer.Option(None, "--schema-ref", help="$schema value for the header"),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="hide info diagnostics"),
) -> None:
    """Split the Thinker of a deploy config into a prefill/decode pair (three stages -> four)."""
    from .compiler import expand_document
    from .io import atomic_write, load_file
    from .passes.pd_split import ExpandOptions
    from .resources import preset_path

    src = input if input is not None else preset_path("qwen3_omni_moe")
    opts = ExpandOptions(
        connector=connector, tp=tp,
        prefill_devices=_devices_opt(prefill_devices, "--prefill-devices"),
        decode_devices=_devices_opt(decode_devices, "--decode-devices"),
        downstream_devices=_devices_opt(downstream_devices, "--downstream-devices"),
        kv_host=kv_host, kv_buffer_device=kv_buffer_device, port_base=port_base)
    doc = load_file(src)
    _DOCS[doc.name] = doc
    res = expand_document(doc, opts, vllm_version=vllm_version, pipeline=pipeline,
                          schema_ref=schema_ref if schema_ref is not None else _schema_ref(output))
    diags = [d for d in res.diagnostics if not (quiet and d.severity is Severity.INFO)]
    _emit_diags(diags)
    if output is None:
        sys.stdout.write(res.text)
    else:
        atomic_write(output, res.text, protect=[str(src)])
        if not quiet:
            sys.stderr.write(f"wrote {output} ({res.plan.target_pipeline.name}, {len(res.topology.stages)} stages)\n")


@app.command()
def schema(output: Optional[Path] = typer.Option(None, "-o", "--output", help="write here instead of stdout")) -> None:
    """Print the JSON Schema of a deploy config (generated from omni-pd's pydantic model)."""
    import json

    from .io import atomic_write
    from .model import json_schema

    text = json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"
    if output is None:
        sys.stdout.write(text)
    else:
        atomic_write(output, text)


@app.command()
def pipelines() -> None:
    """List the catalogued pipelines and their stages."""
    from .pipelines import load_catalogue

    cat = load_catalogue()
    for name in cat.names():
        p = cat.get(name)
        assert p is not None
        stages = " -> ".join(f"{s.stage_id}:{s.role}{'/' + s.pd_role if s.pd_role else ''}" for s in p.stages)
        sys.stdout.write(f"{name:32} {p.runtime:9} {stages}\n")


@app.command()
def connectors() -> None:
    """List the KV connectors omni-pd can emit."""
    from . import connectors as reg

    for name in reg.names():
        c = reg.get(name)
        sys.stdout.write(f"{name:20} {c.summary}\n")  # type: ignore[union-attr]


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the app, turning every failure into a diagnostic and exit code."""
    try:
        app(args=argv, standalone_mode=False)
        return 0
    except OmniPdError as e:
        _emit_diags([e.diagnostic])
        return e.exit_code
    except typer.Exit as e:
        return e.exit_code
    except SystemExit as e:
        return int(e.code or 0) if not isinstance(e.code, str) else 2
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # click usage errors and anything unforeseen
        name = type(e).__name__
        if hasattr(e, "show") and hasattr(e, "exit_code"):  # click/typer usage errors
            e.show()
            return 2
        if name == "Abort":
            return 130
        if os.environ.get("OMNI_PD_DEBUG"):
            raise
        _emit_diags([Diagnostic(code="OPD000", severity=Severity.ERROR,
                                message=f"internal error: {type(e).__name__}: {e}",
                                help="this is a bug in omni-pd; rerun with OMNI_PD_DEBUG=1 and report the traceback")])
        return 3


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
