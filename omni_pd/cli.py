"""The ``omni-pd`` command line (typer). Thin: parse options, call the compiler, render.

Exit status: 0 success (warnings/infos allowed), 1 errors found, 2 unreadable input or
bad usage, 3 internal error (a bug in omni-pd; set OMNI_PD_DEBUG=1 for the traceback).
"""

# no `from __future__ import annotations` here: typer reads every command's annotations
# at start-up, and string annotations cost a compile() each (344 per run, bench figure 5)
import os
import sys
from pathlib import Path
from typing import Any, Literal, Optional

import typer

from omni_pd.diagnostics import Diagnostic, OmniPdError, Severity
# validate's run and the helpers other commands share with it live in cli_validate (no typer:
# the console entry point omni_pd/cli_entry.py runs a plain `validate FILE...` without building
# this app); imported back under their old names
from omni_pd.cli_validate import (GC_THRESHOLD_0, _cli_layer, _display_name, _emit_diags,  # noqa: F401
                                  _hidden, _line_source, _no_pydantic_plugins, _selection_layers, _status,
                                  _suppress, _validate_one, run_validate)

app = typer.Typer(
    name="omni-pd",
    help="Compile vllm-omni deploy configs into prefill/decode (PD) disaggregated topologies.",
    add_completion=True,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

# Closed-set options are typer Choices (``Literal``): an unknown value is the parser's usage
# error (exit 2, the choices listed) before any file is read, on every command alike.
# Spelt out here because importing the modules that own them costs ~0.1 s per start
# (bench/RESULTS.md figure 5); tests/test_walkthrough_cli_values.py holds them equal.
#: ``--platform`` of validate, graph and diff: omni_pd/compile/topology.py ``PLATFORMS``
_PLATFORM = Literal["cuda", "rocm", "npu", "xpu", "musa"]
#: launch's and validate's ``--platform``: omni_pd/compile/devices.py ``RUN_PLATFORMS``, one
#: per omni_pd/launch/plan.py ``DEVICE_ENV`` entry (``cpu`` selects no devices)
_LAUNCH_PLATFORM = Literal["cuda", "rocm", "npu", "xpu", "musa", "cpu"]


def _version_cb(value: bool) -> None:
    if value:
        from omni_pd.compile.versions import version_text

        sys.stdout.write(version_text())
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version_cb, is_eager=True,
                                 help="print omni-pd's version and the vLLM / vllm-omni versions it targets, then exit"),
) -> None:
    """Compile vllm-omni deploy configs into prefill/decode (PD) disaggregated topologies."""


def _devices_opt(value: Optional[str], name: str):
    if value is None:
        return None
    from omni_pd.compile.devices import parse_devices

    try:
        d = parse_devices(value)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint=name) from None
    if not isinstance(d, tuple):
        raise typer.BadParameter('give device indices like "0,1"', param_hint=name)
    return d


def _schema_ref(ref: Optional[str]) -> str:
    """The ``$schema`` of expand's header line: ``--schema-ref`` as given, else the schema's
    file name (``omni-pd-deploy.schema.json``). yaml-language-server resolves a relative
    modeline path against the YAML file itself, so the default names a file next to the
    output, the same on every machine and from every working directory (``omni-pd schema
    -o`` writes it); a path into this installation's site-packages would be neither."""
    from omni_pd.resources import SCHEMA_FILENAME

    return SCHEMA_FILENAME if ref is None else ref


@app.command()
def expand(
    input: Optional[Path] = typer.Argument(None, help="three-stage deploy YAML (default: the bundled Qwen3-Omni preset)",
                                           show_default=False),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="write here (atomically) instead of stdout"),
    connector: Optional[str] = typer.Option(None, "--connector", help="KV connector: MooncakeConnector (default), NixlConnector or NixlPushConnector (omni-pd connectors; npu: --npu-connector)"),
    vllm_version: Optional[str] = typer.Option(None, "--vllm-version",
                                               help="target vLLM major.minor (default and known range: omni-pd --version)"),
    tp: Optional[int] = typer.Option(None, "--tp", min=1, help="tensor parallel size of both prefill and decode"),
    prefill_tp: Optional[int] = typer.Option(
        None, "--prefill-tp", min=1, help="prefill's tensor parallel size (per instance); unequal to decode's only "
        "where the connector, vLLM version and runtime pair them (OPD603, OPD306)"),
    decode_tp: Optional[int] = typer.Option(None, "--decode-tp", min=1,
                                            help="decode's tensor parallel size (per instance)"),
    dp: Optional[int] = typer.Option(None, "--dp", min=1, max=64,
                                     help="data parallel size (data_parallel_size) of both prefill and decode"),
    prefill_dp: Optional[int] = typer.Option(
        None, "--prefill-dp", min=1, max=64, help="prefill's data parallel size (per instance: one engine of DP "
        "ranks on TP x DP devices)"),
    decode_dp: Optional[int] = typer.Option(None, "--decode-dp", min=1, max=64,
                                            help="decode's data parallel size (per instance)"),
    prefill_devices: Optional[str] = typer.Option(None, "--prefill-devices", help='e.g. "0,1"'),
    decode_devices: Optional[str] = typer.Option(None, "--decode-devices", help='e.g. "2,3"'),
    downstream_devices: Optional[str] = typer.Option(None, "--downstream-devices",
                                                     help="devices for every stage after the Thinker (Talker, Code2Wav)"),
    kv_host: str = typer.Option("127.0.0.1", "--kv-host", help="address prefill/decode advertise to each other"),
    kv_buffer_device: Optional[str] = typer.Option(None, "--kv-buffer-device", help="KV buffer device: NixlConnector cuda or cpu (host staging); checked per connector and vLLM version"),
    mooncake_protocol: Optional[str] = typer.Option(
        None, "--mooncake-protocol", help="MooncakeConnector's Transfer Engine protocol, rdma (vLLM's default) or "
        "tcp (no RDMA NIC: a CPU rehearsal); written to kv_connector_extra_config.mooncake_protocol"),
    port_base: Optional[int] = typer.Option(None, "--port-base", help="first connector port to try"),
    stream: Optional[bool] = typer.Option(
        None, "--stream/--no-stream", help="async_chunk of the PD output: --stream turns vllm-omni's streaming on "
        "where the input turns it off (the spoken answer in chunks while decode writes), --no-stream writes false "
        "(the answer's audio in one piece after the text); default: as the input, where the PD pair can stream"),
    prefill_replicas: Optional[int] = typer.Option(
        None, "--prefill-replicas", min=1, max=64,
        help="xPyD: prefill instances (num_replicas of the prefill stage), each with its own devices, "
             "engine id and connector ports"),
    decode_replicas: Optional[int] = typer.Option(
        None, "--decode-replicas", min=1, max=64, help="xPyD: decode instances (num_replicas of the decode stage)"),
    pipeline: Optional[str] = typer.Option(None, "--pipeline", help="pipeline name when the file does not say"),
    schema_ref: Optional[str] = typer.Option(
        None, "--schema-ref", metavar="URL|PATH",
        help="$schema of the yaml-language-server header line; a relative path is resolved against the output "
             "file (default: omni-pd-deploy.schema.json next to it, written by `omni-pd schema -o`; '' drops the line)"),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="hide info diagnostics"),
    encoder_split: Optional[str] = typer.Option(
        None, "--encoder-split", help="disaggregate the multimodal encoder: 1e1pd (encoder + one instance) or "
        "1e1p1d (encoder + prefill/decode pair), as vLLM's disagg_1e1pd/1e1p1d examples"),
    ec_connector: Optional[str] = typer.Option(None, "--ec-connector",
                                               help="EC connector (with --encoder-split; default ECExampleConnector)"),
    ec_storage_path: Optional[str] = typer.Option(None, "--ec-storage-path",
                                                  help="directory the encoder and its consumer share (ECExampleConnector; default /tmp/omni-pd-ec)"),
    encoder_devices: Optional[str] = typer.Option(None, "--encoder-devices", help='devices of the encoder instance, e.g. "4"'),
    platform: Optional[str] = typer.Option(None, "--platform", help="npu: the base stages run on Ascend NPUs "
                                           "(the platforms.npu overlay gets the Ascend pair either way)"),
    npu_connector: str = typer.Option("MooncakeConnectorV1", "--npu-connector",
                                      help="vllm-ascend connector on npu: MooncakeConnectorV1 (pull) or "
                                           "MooncakeLayerwiseConnector (layerwise push)"),
    npu_decode_tp: Optional[int] = typer.Option(None, "--npu-decode-tp", min=1,
                                                help="npu: decode TP below prefill's (prefill TP must be a multiple)"),
    inventory: Optional[Path] = typer.Option(
        None, "--inventory", help="hosts (address, count) and stage placement (YAML): devices, ports and advertised "
        "addresses per host (docs/launch.md, Two hosts)"),
    prefill_set: Optional[list[str]] = typer.Option(
        None, "--prefill-set", help="KEY=VALUE: a stage key on prefill only, e.g. max_num_seqs=16 (repeatable; "
        "VALUE read as YAML; validated like the file)"),
    decode_set: Optional[list[str]] = typer.Option(
        None, "--decode-set", help="KEY=VALUE: a stage key on decode only, e.g. max_num_seqs=64 (repeatable)"),
) -> None:
    """Split the Thinker of a deploy config into a prefill/decode pair (three stages -> four).

    With --encoder-split, run the multimodal encoder as its own instance feeding the LLM
    (1e1pd) or its prefill/decode pair (1e1p1d) through an EC connector.

    Every option value is checked first, the input must pass the schema checks, and the
    output must pass `omni-pd validate` before it is written (else exit 3: a bug).
    """
    from omni_pd import cli_options
    from omni_pd.compile.expand import expand_document
    from omni_pd.compile.passes.pd_split import ExpandOptions, side_dps, side_tps
    from omni_pd.io import atomic_write, load_file
    from omni_pd.resources import preset_path

    tgt = cli_options.vllm_version(vllm_version)
    cli_options.host(kv_host, "--kv-host")
    cli_options.port(port_base, "--port-base")
    cli_options.encoder_split(encoder_split, ec_connector=ec_connector, storage=ec_storage_path,
                              devices=encoder_devices, pd_options=(
        ("--connector", connector), ("--tp", tp), ("--prefill-tp", prefill_tp), ("--decode-tp", decode_tp),
        ("--dp", dp), ("--prefill-dp", prefill_dp), ("--decode-dp", decode_dp),
        ("--prefill-devices", prefill_devices), ("--decode-devices", decode_devices),
        ("--downstream-devices", downstream_devices), ("--kv-buffer-device", kv_buffer_device),
        ("--mooncake-protocol", mooncake_protocol), ("--port-base", port_base),
        ("--prefill-replicas", prefill_replicas), ("--decode-replicas", decode_replicas),
        ("--kv-host", kv_host if kv_host != "127.0.0.1" else None), ("--npu-decode-tp", npu_decode_tp)))
    src = input if input is not None else preset_path("qwen3_omni_moe")
    if connector is not None:  # `nixl`, `mooncake`: the spellings the router accepts too
        from omni_pd.compile import connectors

        connector = connectors.canonical(connector) or connector  # unknown: OPD804 names the choices
    opts = ExpandOptions(
        connector=connector, tp=tp, prefill_tp=prefill_tp, decode_tp=decode_tp,
        dp=dp, prefill_dp=prefill_dp, decode_dp=decode_dp,
        prefill_devices=_devices_opt(prefill_devices, "--prefill-devices"),
        decode_devices=_devices_opt(decode_devices, "--decode-devices"),
        downstream_devices=_devices_opt(downstream_devices, "--downstream-devices"),
        kv_host=kv_host, kv_buffer_device=kv_buffer_device, port_base=port_base,
        mooncake_protocol=cli_options.mooncake_protocol(mooncake_protocol, connector),
        prefill_replicas=prefill_replicas, decode_replicas=decode_replicas,
        platform=_npu_platform_opt(platform), npu_connector=_npu_connector_opt(npu_connector),
        npu_decode_tp=npu_decode_tp, stream=stream)
    side_tps(opts)  # --tp / --prefill-tp / --decode-tp / --npu-decode-tp agree (OPD006) before reading
    side_dps(opts)  # --dp / --prefill-dp / --decode-dp agree (OPD006)
    sets = {"prefill": _side_sets(prefill_set, "prefill"), "decode": _side_sets(decode_set, "decode")}
    doc = load_file(src)
    _require_deploy_config(doc, pipeline, vllm_version)
    if encoder_split is not None:
        from omni_pd.compile.expand import expand_encoder_document
        from omni_pd.compile.passes.encoder_split import DEFAULT_EC_CONNECTOR, EncoderOptions

        eres = expand_encoder_document(
            doc, EncoderOptions(encoder_split, ec_connector or DEFAULT_EC_CONNECTOR, ec_storage_path,
                                _devices_opt(encoder_devices, "--encoder-devices")), opts,
            vllm_version=vllm_version, pipeline=pipeline,
            schema_ref=_schema_ref(schema_ref))
        kv_connector = eres.plan.pd.connector if eres.plan.pd is not None else None  # 1e1pd: no PD pair
        if kv_buffer_device is not None and kv_connector is not None:
            cli_options.kv_buffer_device(kv_buffer_device, kv_connector, tgt)
        res = eres  # same text/topology/diagnostics fields as a PD expand
    else:
        inv = _inventory_opt(inventory)
        res = expand_document(doc, opts, vllm_version=vllm_version, pipeline=pipeline,
                              schema_ref=_schema_ref(schema_ref), inventory=inv)
        kv_connector = res.plan.connector
    if mooncake_protocol is not None:  # the file's own connector, now known
        cli_options.mooncake_protocol(mooncake_protocol, kv_connector)
    if kv_buffer_device is not None and encoder_split is None:
        cli_options.kv_buffer_device(kv_buffer_device, res.plan.connector, tgt,
                                     overlays=tuple(res.config.platforms or ()))
    if any(sets.values()):
        from dataclasses import replace

        res = replace(res, text=_apply_side_sets(res.text, res.topology, sets, output, vllm_version,
                                                 _placed_inventory(_inventory_opt(inventory), res.topology)))
    placed = tuple(f"{flag} {v}" for flag, v in (("--prefill-devices", prefill_devices), ("--decode-devices", decode_devices),
                                                  ("--downstream-devices", downstream_devices),
                                                  ("--encoder-devices", encoder_devices)) if v is not None)
    _self_check(res.text, doc, vllm_version, output, platform=opts.platform, pipeline=pipeline, placed=placed,
                inventory=_placed_inventory(_inventory_opt(inventory), res.topology))
    diags = [d for d in res.diagnostics if not (quiet and d.severity is Severity.INFO) and d.code not in _EXPAND_HIDE]
    _EXPAND_SEEN.update(d.code for d in res.diagnostics)
    _emit_diags(diags, {doc.name: doc})
    if output is None:
        sys.stdout.write(res.text)
    else:
        atomic_write(output, res.text, protect=[str(src)])
        if not quiet:
            sys.stderr.write(f"wrote {output} ({res.plan.target_pipeline.name}, {len(res.topology.stages)} stages)\n")
            _say_missing_schema(_schema_ref(schema_ref), output)


#: codes expand leaves out when another command calls it (size --write: OPD904 is about the
#: input's npu overlay, not the GPU system sized; size says so in its own words)
_EXPAND_HIDE: set[str] = set()
#: every code the last expand call found (read by its caller)
_EXPAND_SEEN: set[str] = set()

#: stage keys expand writes for the split: --prefill-set/--decode-set name the option instead
_SIDE_OWNED = {"devices": "--{side}-devices", "tensor_parallel_size": "--{side}-tp",
               "data_parallel_size": "--{side}-dp", "num_replicas": "--{side}-replicas",
               "kv_transfer_config": "--connector (and --kv-host, --kv-buffer-device, --port-base)",
               "stage_id": None, "engine_input_source": None, "is_prefill_only": None, "is_decode_only": None}


def _side_sets(items: Optional[list[str]], side: str) -> list[tuple[str, Any, str]]:
    """``--prefill-set`` / ``--decode-set`` values as ``(key, value, "key=raw")``; VALUE
    read as YAML (``16`` an int, ``true`` a bool). OPD006 for a malformed item or a key
    expand writes for the split (the help names its option)."""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    out = []
    for item in items or ():
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR,
                                         message=f"--{side}-set {item}: expected KEY=VALUE",
                                         help=f"e.g. --{side}-set max_num_seqs=16 (VALUE is read as YAML: 16, true, \"text\")"))
        if key in _SIDE_OWNED:
            how = _SIDE_OWNED[key]
            raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR,
                                         message=f"--{side}-set {item}: expand writes `{key}` for the split",
                                         help=f"use {how.format(side=side)}" if how else
                                         "the pipeline decides it; it cannot be set per side"))
        try:
            value = YAML(typ="safe").load(raw) if raw.strip() else ""
        except YAMLError as e:
            raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR,
                                         message=f"--{side}-set {item}: VALUE is not YAML ({str(e).splitlines()[0]})",
                                         help="quote a string: KEY='\"text\"'")) from None
        out.append((key, value, f"{key}={raw}"))
    return out


def _apply_side_sets(text: str, topo, sets: dict, output: Optional[Path], vllm_version: Optional[str],
                     inventory) -> str:
    """expand's output ``text`` with the ``--prefill-set``/``--decode-set`` keys written on
    the prefill/decode stage entries of ``topo`` and a header line that lists them; validated
    like the file (``validate``'s rules): errors are printed against the result and nothing
    is written (exit 1)."""
    from omni_pd.check.validate import ValidateOptions, validate_document
    from omni_pd.diagnostics import summary
    from omni_pd.io import dump, parse_text

    doc = parse_text(text, "<expand>", own_output=True)
    for node in topo.stages:
        for key, value, _ in sets.get(node.pd_role or "", ()):
            if node.index is not None:
                doc.tree["stages"][node.index][key] = value
    said = "; ".join(f"{side} {', '.join(s for _, _, s in items)} (--{side}-set)" for side, items in sets.items() if items)
    lines = dump(doc.tree).split("\n")
    at = next((i + 1 for i, ln in enumerate(lines) if ln.startswith("# Stages:")), 0)
    new = "\n".join(lines[:at] + [f"# Per-side settings: {said}."] + lines[at:])
    name = f"{output if output is not None else '<stdout>'} (not written)"
    res = validate_document(parse_text(new, name, own_output=True),
                            ValidateOptions(vllm_version=vllm_version, all_platforms=True, inventory=inventory))
    if res.errors:
        _emit_diags(res.errors, res.docs)
        sys.stderr.write("expand: nothing written: the output with --prefill-set/--decode-set does not validate "
                         f"({summary(res.errors).split(',')[0]})\n")
        raise SystemExit(1)
    return new


def _require_deploy_config(doc, pipeline: Optional[str], vllm_version: Optional[str]) -> None:
    """expand's gate: the schema rules (OPD1xx) on the input. A file that is not a
    deploy config gets validate's OPD007 (omni_pd/check/inputs.py ``not_a_deploy_config``)
    alone, as validate reports it (exit 2); a deploy config with schema errors gets
    those (exit 2)."""
    from dataclasses import replace

    from omni_pd.check.rules import registry
    from omni_pd.check.validate import ValidateOptions, validate_document

    schema = tuple(c for c in registry() if c.startswith("OPD1"))
    named = doc.tree.get("pipeline") if isinstance(doc.tree, dict) else None
    if pipeline and named and pipeline == f"{named}_thinker_only":
        pipeline = None  # the Thinker of the file's own pipeline: expand narrows it (OPD905), no conflict
    res = validate_document(doc, ValidateOptions(rules=schema, pipeline=pipeline, vllm_version=vllm_version))
    gate = next((d for d in res.diagnostics if d.code == "OPD007"), None)
    errors = [d for d in res.errors if d.code != "OPD007"]
    if gate is None and not errors:
        return
    found = [d for d in res.diagnostics if d.severity is not Severity.INFO and d.code != "OPD007"]
    if gate is not None:
        found = [replace(gate, severity=Severity.ERROR, help=(
            "expand takes a vllm-omni deploy config (a `stages:` list of per-stage engine settings, "
            "like presets/qwen3_omni_moe.yaml); nothing was written"))]
    elif all(d.code == "OPD102" for d in errors):
        return  # the legacy stage_args layout: expand explains it (OPD102) itself
    _emit_diags(found, res.docs)
    raise SystemExit(2)


def _self_check(text: str, doc, vllm_version: Optional[str], output: Optional[Path],
                platform: Optional[str] = None, pipeline: Optional[str] = None,
                placed: tuple[str, ...] = (), inventory=None) -> None:
    """Validate what expand is about to write (``inventory``: ``--inventory``, its placement
    completed as expand placed the stages, so per-host devices and ports are judged per host). Errors the input already has (the same
    code in the input's own validation) are the input's: shown where the input sets
    them, exit 2 (bad input). Any other error is a bug in expand: OPD000, exit 3.
    Nothing is written in either case. Checked as ``validate --all-platforms`` does: the
    base and every ``platforms.<P>`` overlay (expand's npu pass writes one); with
    ``--platform npu`` the base is checked on npu and no other overlay is left.
    ``platform``: the ``--platform`` expand was given (kept for callers; the check is the same).
    ``pipeline``: expand's ``--pipeline``; the input is judged under the pipeline expand split
    it with (judged under its own, a file whose stages the pipeline lacks made expand's
    OPD202 look new, an OPD000 for a user's choice). ``placed``: the device options given
    (``"--downstream-devices 0"``); new errors that are all device findings (OPD4xx: world
    size, memory budget) then come from where the user put the stages: OPD805, exit 2,
    naming the options."""
    from dataclasses import replace

    from omni_pd.check.validate import ValidateOptions, validate_document
    from omni_pd.io import parse_text

    name = f"{output if output is not None else '<stdout>'} (not written)"
    vopts = ValidateOptions(vllm_version=vllm_version, all_platforms=True, inventory=inventory)
    out = validate_document(parse_text(text, name, own_output=True), vopts)
    if not out.errors:
        return
    before = validate_document(doc, replace(vopts, pipeline=pipeline))
    inherited = {d.code for d in before.errors}
    new = [d for d in out.errors if d.code not in inherited]
    if not new:  # show them where the user fixes them: in the input
        _emit_diags([d for d in before.errors if d.code in {e.code for e in out.errors}], before.docs)
        again = f"omni-pd validate {doc.name}" + (f" --pipeline {pipeline}" if pipeline else "")
        sys.stderr.write(f"expand: {doc.name} already has these errors (`{again}`); "
                         "fix them first, nothing was written\n")
        raise SystemExit(2)
    _emit_diags(out.errors, out.docs)
    if placed and all(d.code.startswith("OPD4") for d in new):
        raise OmniPdError(Diagnostic(
            code="OPD805", severity=Severity.ERROR,
            message=f"cannot place the stages where {', '.join(placed)} put them: the file would fail validate "
                    f"({', '.join(sorted({d.code for d in new}))})",
            help="give other devices (the findings above say which stages clash), or leave the option out "
                 "for expand's own layout; nothing was written"))
    raise OmniPdError(Diagnostic(
        code="OPD000", severity=Severity.ERROR,
        message=f"internal error: expand produced a config its own validate rejects ({', '.join(sorted({d.code for d in new}))})",
        help="this is a bug in omni-pd (nothing was written); please report it with the input and options"), exit_code=3)


def _say_missing_schema(ref: str, output: Path) -> None:
    """A note on stderr when the header's relative ``$schema`` file is not next to ``output``
    (editors then cannot find it), with the command that writes it."""
    if not ref or "://" in ref or os.path.isabs(ref):
        return
    where = output.parent / ref
    if not where.exists():
        sys.stderr.write(f"note: the $schema header names {where}, which does not exist; "
                         f"write it with: omni-pd schema -o {where}\n")


@app.command()
def migrate(
    input: Path = typer.Argument(..., help="a legacy `stage_args` file (vllm-omni <= 0.26 `--stage-configs-path`), "
                                           "or a `stages:` file with --from"),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="write here (atomically) instead of stdout; never over the input"),
    vllm_omni_version: Optional[str] = typer.Option(None, "--vllm-omni-version", "--vllm-version", "--to",
                                                    help="target vllm-omni (= vLLM) major.minor (default 0.30)"),
    from_version: Optional[str] = typer.Option(None, "--from",
                                               help="the release a `stages:` INPUT was written for: the keys the "
                                                    "target renamed or removed are rewritten (docs/migrate.md)"),
    pipeline: Optional[str] = typer.Option(None, "--pipeline", help="the catalogue pipeline of the stages when they do not say"),
    check: bool = typer.Option(False, "--check", help="write nothing; exit 1 with the diff when the file is not in the target's form"),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="hide the per-key notes"),
) -> None:
    """Rewrite a legacy `stage_args` file into the `stages:` deploy schema of the target
    release, or (`--from A --to B`) a `stages:` file written for release A into B's form.

    One note per change on stderr (which key went where, what was dropped and why, which
    default is now written); a key with no home is an error naming it (exit 2). Prints
    the serve command line for the result; exit 1 when what it wrote does not validate
    (written all the same, with validate's errors listed).
    """
    from omni_pd import cli_options
    from omni_pd.compile.migrate import is_legacy, migrate_text, serve_command, sorted_notes
    from omni_pd.compile.pipelines import load_catalogue
    from omni_pd.io import atomic_write, load_file, parse_text

    tgt = cli_options.vllm_version(vllm_omni_version, "--vllm-omni-version")
    src = cli_options.vllm_version(from_version, "--from") if from_version is not None else None
    doc = load_file(input)
    release = src is not None and not is_legacy(doc.tree)
    try:
        if release:
            from omni_pd.compile.migrate_release import release_text

            text, rm = release_text(doc, src, tgt, _file_runtime(doc, pipeline))
            notes, changed = list(rm.notes), rm.changed
            form, what = f"vLLM {tgt.label}'s form", f"written for vLLM {src.label}"
            wrote = ""
        else:
            text, m = migrate_text(doc, tgt, load_catalogue(), pipeline)
            notes, changed = (sorted_notes(m) if m is not None else []), m is not None
            form, what = "the `stages:` form", "legacy `stage_args` file"
            wrote = f" ({m.pipeline.name}, {len(m.tree['stages'])} stages)" if m is not None else ""
    except OmniPdError as e:
        _emit_diags(getattr(e, "diagnostics", [e.diagnostic]), {doc.name: doc})
        raise SystemExit(e.exit_code) from None
    # it reads back (and its stages decide the serve line's flags)
    written = parse_text(text, f"{output or '<stdout>'} (migrated)", own_output=True) if changed else doc
    if check:
        if not changed:
            sys.stderr.write(f"{doc.name}: already in {form}\n")
            return
        import difflib

        sys.stdout.writelines(difflib.unified_diff(doc.text.splitlines(True), text.splitlines(True),
                                                   doc.name, f"{doc.name} (migrated, vllm-omni {tgt.label})"))
        again = f" --from {src.label} --to {tgt.label}" if release else ""
        sys.stderr.write(f"{doc.name}: {what}; `omni-pd migrate {doc.name}{again} -o OUT` rewrites it\n")
        raise SystemExit(1)
    if changed and not quiet:
        _emit_diags(notes, {doc.name: doc})
    if not changed:
        sys.stderr.write(f"{doc.name}: already in {form}; nothing to migrate\n")
    if output is None:
        sys.stdout.write(text)
    else:
        atomic_write(output, text, protect=[str(input)])
        if not quiet:
            sys.stderr.write(f"wrote {output}{wrote}\n")
    line = serve_command(str(output or 'FILE.yaml'), tgt, tree=written.tree)
    found = _migrated_findings(written, tgt) if changed else []
    if found:  # migrate kept the file's settings: what was wrong in it is wrong in its rewrite
        errors = sum(d.severity is Severity.ERROR for d in found)
        warnings = len(found) - errors
        counts = ", ".join(f"{n} {w}{'s' if n != 1 else ''}" for n, w in ((errors, "error"), (warnings, "warning")) if n)
        sys.stderr.write(f"{output or 'the migrated file'}: validate finds {counts} (settings the input had):\n")
        for d in found:
            loc = d.location
            where = f"{output}:{loc.line}:{loc.column}" if output and loc and loc.line else str(output or "<stdout>")
            sys.stderr.write(f"  {d.severity.value}[{d.code}] {where}: {d.message}\n")
        sys.stderr.write(f"fix them (`omni-pd validate {output or 'FILE.yaml'}` explains each), then serve with: "
                         f"{line}\n" if errors else f"serve with: {line}\n")
        if errors:  # written, but not servable as it is: exit 1 as validate would (a script notices)
            raise SystemExit(1)
        return
    sys.stderr.write(f"serve with: {line}\n")


def _migrated_findings(doc, tgt) -> list:
    """Validate's errors and warnings on the migrated ``doc`` (for the target release)."""
    from omni_pd.check.validate import ValidateOptions, validate_document

    res = validate_document(doc, ValidateOptions(vllm_version=tgt.label))
    return [d for d in res.diagnostics if d.severity in (Severity.ERROR, Severity.WARNING)]


def _file_runtime(doc, pipeline: Optional[str]) -> str:
    """The runtime whose facts a `stages:` file follows: its pipeline's (``--pipeline``, else
    its ``pipeline:`` key), else ``vllm-omni`` (a deploy file is vllm-omni's)."""
    from omni_pd.compile.pipelines import load_catalogue

    name = pipeline or (doc.tree.get("pipeline") if isinstance(doc.tree, dict) else None)
    pipe = load_catalogue().get(str(name)) if name else None
    return pipe.runtime if pipe is not None else "vllm-omni"


@app.command()
def schema(output: Optional[Path] = typer.Option(
        None, "-o", "--output",
        help="write here (atomically) instead of stdout; a directory gets omni-pd-deploy.schema.json"),
        vllm_version: Optional[str] = typer.Option(
            None, "--vllm-version",
            help="target vLLM major.minor: its KV connectors and kv_transfer_config keys (default: omni-pd --version)"),
) -> None:
    """Print the JSON Schema of a deploy config (generated from omni-pd's pydantic model and
    the target's facts: kv_role/kv_connector/ec_role/platform enums, port and size ranges,
    unknown top-level and kv_transfer_config keys refused; omni_pd/compile/editor_schema.py).

    expand's header line (`# yaml-language-server: $schema=omni-pd-deploy.schema.json`)
    names this file next to its output: `omni-pd schema -o DIR` puts it there."""
    import json

    from omni_pd import cli_options
    from omni_pd.io import atomic_write
    from omni_pd.compile.model import json_schema
    from omni_pd.resources import SCHEMA_FILENAME

    tgt = cli_options.vllm_version(vllm_version)
    text = json.dumps(json_schema(tgt.label), indent=2, sort_keys=True) + "\n"
    if output is None:
        sys.stdout.write(text)
    else:
        target = output / SCHEMA_FILENAME if output.is_dir() else output
        atomic_write(target, text)  # OPD005 names the path it could not write
        sys.stderr.write(f"wrote {target}\n")


@app.command()
def pipelines() -> None:
    """List the catalogued pipelines and their stages.

    ``runtime``: whose pipeline it is (vllm-omni's registry, or plain vLLM); ``launch``:
    how ``omni-pd launch`` serves it (the header of ``launch --dry-run`` says the same),
    ``-`` for one launch does not start (expand it first).
    """
    from omni_pd.compile.pipelines import load_catalogue

    cat = load_catalogue()
    rows = []
    for name in cat.names():
        p = cat.get(name)
        assert p is not None
        rows.append((name, p.runtime, p.launch_form or "-",
                     " -> ".join(f"{s.stage_id}:{s.role}{'/' + s.pd_role if s.pd_role else ''}" for s in p.stages)))
    print_table(("pipeline", "runtime", "launch", "stages"), rows)


def _size_error(msg: str, help: str | None = None) -> OmniPdError:
    return OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR, message=f"size: {msg}", help=help))


@app.command()
def size(
    input: Optional[Path] = typer.Argument(None, help="three-stage deploy YAML (default: the bundled Qwen3-Omni preset)",
                                           show_default=False),
    model_info: Path = typer.Option(..., "--model-info", help="the model's config.json (Qwen3-Omni: the Thinker's "
                                    "text_config is what PD splits; talker/code2wav sub-configs size the rest)"),
    system: str = typer.Option(..., "--system", help="AIConfigurator GPU system, e.g. h200_sxm, h100_sxm, b200_sxm"),
    total_devices: Optional[int] = typer.Option(None, "--total-devices", min=1,
                                                help="devices for the whole pipeline (or --request-rate)"),
    request_rate: Optional[float] = typer.Option(
        None, "--request-rate", help="target requests/s instead of --total-devices: instances per side from "
        "AIConfigurator's per-instance throughput (docs/sizing.md)"),
    backend: str = typer.Option("vllm", "--backend", help="AIConfigurator backend database (vllm, sglang, trtllm)"),
    text_tokens: int = typer.Option(..., "--text-tokens", min=0, help="prompt text tokens per request"),
    audio_seconds: Optional[list[float]] = typer.Option(None, "--audio-seconds", help="one audio clip (seconds), repeatable"),
    image: Optional[list[str]] = typer.Option(None, "--image", help="one image WIDTHxHEIGHT (pixels), repeatable"),
    output_tokens: int = typer.Option(..., "--output-tokens", min=1, help="Thinker output tokens per request"),
    ttft: float = typer.Option(..., "--ttft", help="TTFT target (ms)"),
    tpot: float = typer.Option(..., "--tpot", help="TPOT target (ms)"),
    fmt: Literal["text", "json"] = typer.Option("text", "--format"),
    write: Optional[Path] = typer.Option(None, "--write", help="write the sized deploy config (through expand) here"),
    pick: int = typer.Option(0, "--pick", min=0, help="use AIConfigurator's disagg row N (0 = its top) instead"),
    from_result: Optional[Path] = typer.Option(None, "--from-result", help="a result recorded with --record: no AIConfigurator run"),
    record: Optional[Path] = typer.Option(None, "--record", help="also save AIConfigurator's result (JSON) here"),
) -> None:
    """Size the Thinker's prefill/decode split with NVIDIA AIConfigurator for a traffic shape and
    TTFT/TPOT targets, place the Talker and Code2Wav on the devices left, print why (extra: omni-pd[sizing])."""
    import json

    from omni_pd.compile.parse import parse_config
    from omni_pd.io import atomic_write, load_file
    from omni_pd.resources import preset_path
    from omni_pd.sizing import aic, model_map, plan, rate, report, traffic

    if (total_devices is None) == (request_rate is None):
        raise _size_error("give --total-devices N or --request-rate R" if total_devices is None else
                          "give --total-devices or --request-rate, not both",
                          help="--request-rate derives the device count; --total-devices sizes for a fixed count")
    if request_rate is not None and not (request_rate > 0 and request_rate != float("inf")):
        raise _size_error(f"--request-rate must be a positive number of requests per second, not {request_rate:g}")
    try:
        cfg = json.loads(model_info.read_text(encoding="utf-8"))
        imgs = tuple(tuple(int(x) for x in s.lower().split("x", 1)) for s in (image or ()))
        shape = traffic.Traffic(text_tokens, output_tokens, tuple(audio_seconds or ()), imgs)  # type: ignore[arg-type]
        isl = shape.isl()
    except (OSError, json.JSONDecodeError) as e:
        raise _size_error(f"--model-info {model_info}: {e}") from None
    except ValueError as e:
        raise _size_error(str(e), help="--image takes WIDTHxHEIGHT, e.g. 1280x720") from None
    src = input if input is not None else preset_path("qwen3_omni_moe")
    doc = load_file(src)
    stages = parse_config(doc).stages
    names = ("thinker", "talker", "code2wav")

    def say_phase(text: str) -> None:
        """What size is doing, one line on stderr per phase (AIConfigurator's sweep takes one
        to two minutes of silence otherwise)."""
        sys.stderr.write(f"size: {text}\n")
        sys.stderr.flush()

    utils = {names[i]: float(s.gpu_memory_utilization or 0.9) for i, s in enumerate(stages[1:3], start=1)}
    text_cfg, where = model_map.thinker_text_config(cfg)
    thinker_shape = model_map.shape(text_cfg)
    if all(v is None for k, v in thinker_shape.items() if k != "head_dim"):
        raise _size_error(f"--model-info {model_info} has no Thinker text config (none of "
                          f"{', '.join(model_map.SHAPE_KEYS)} at {where})",
                          help="pass the model's config.json (the file next to the weights)")
    if from_result is not None:
        recorded = json.loads(from_result.read_text(encoding="utf-8"))
        device_bytes = int(recorded["gpu_memory_bytes"])
        got = {k: recorded["request"][k] for k in ("system", "backend", "isl", "osl", "ttft_ms", "tpot_ms")}
        want = {"system": system, "backend": backend, "isl": isl, "osl": output_tokens, "ttft_ms": ttft, "tpot_ms": tpot}
        if got != want:
            raise _size_error(f"--from-result {from_result} was recorded for {got}, not {want}")
        match = model_map.Match(recorded["request"]["model"], True, {})
        was = recorded.get("thinker_shape")
        if isinstance(was, dict):
            differs = {k: (thinker_shape.get(k), was.get(k)) for k in model_map.SHAPE_KEYS
                       if thinker_shape.get(k) != was.get(k)}
            if differs:
                raise _size_error(f"--from-result {from_result} was recorded for another Thinker ({match.model}): "
                                  + ", ".join(f"{k} {a} vs {b}" for k, (a, b) in differs.items()),
                                  help="re-run without --from-result for this model")
    else:
        say_phase(f"matching the Thinker ({where}) with AIConfigurator's models")
        try:
            match = model_map.nearest(text_cfg, aic.shipped_configs())
            device_bytes = aic.gpu_memory_bytes(system)
        except aic.AicMissing:
            raise _size_error("AIConfigurator is not installed", help="pip install aiconfigurator==0.12.0 (the sizing extra of omni-pd)") from None
        except aic.AicUnsupported as e:
            raise _size_error(str(e)) from None
        if not match.exact:
            raise _size_error(f"AIConfigurator does not model the Thinker LLM ({where} of {model_info}); the nearest "
                              f"it ships is {match.model}, which differs in "
                              + ", ".join(f"{k} {a} vs {b}" for k, (a, b) in match.differs.items()))
    down = plan.downstream_stages(cfg, utils)
    lacking = [n for n in utils if n not in {d.name for d in down}]
    if lacking:  # else they would be placed on a device past the budget (expand's default)
        raise _size_error(f"--model-info {model_info} has no {', '.join(f'{n}_config' for n in lacking)}: the "
                          f"{' and '.join(lacking)} stage{'s' if len(lacking) > 1 else ''} of {src.name} cannot be "
                          "sized or placed", help="pass the model's full config.json (the file next to the weights)")
    need = len(plan.place_downstream(down, len(down), device_bytes)) if down else 0
    if total_devices is not None and total_devices - need < 2:
        raise _size_error(f"{total_devices} device(s) leave {total_devices - need} for the Thinker; PD needs 2")
    if from_result is not None and total_devices is not None and recorded["request"]["total_gpus"] != total_devices - need:
        raise _size_error(f"--from-result {from_result} was recorded for {recorded['request']['total_gpus']} Thinker "
                          f"GPUs; --total-devices {total_devices} leaves {total_devices - need} (after {need} for the "
                          "stages downstream)", help="re-run without --from-result, or give the recorded count")
    if from_result is None:
        try:
            budget = total_devices - need if total_devices is not None else aic.gpus_per_node(system)
            req = aic.AicRequest(match.model, system, backend, budget, isl, output_tokens, ttft, tpot)
            say_phase(f"AIConfigurator sweeps {match.model} on {budget} {system} GPUs ({backend}; usually 1-2 minutes)")
            import time

            t0 = time.monotonic()
            recorded = aic.run(req)
            say_phase(f"AIConfigurator done in {time.monotonic() - t0:.0f} s")
        except aic.AicMissing:
            raise _size_error("AIConfigurator is not installed", help="pip install aiconfigurator==0.12.0 (the sizing extra of omni-pd)") from None
        except aic.AicUnsupported as e:
            raise _size_error(str(e)) from None
        recorded["thinker_shape"] = thinker_shape  # what --from-result compares the next --model-info with
        if record is not None:
            atomic_write(record, json.dumps(recorded, indent=1, sort_keys=True) + "\n", protect=[str(src)])
    rows = plan.choices(recorded) if recorded["best_configs"].get("disagg") else []
    if not rows:
        raise _size_error(f"no disaggregated configuration meets TTFT {ttft:g} ms / TPOT {tpot:g} ms")
    if pick >= len(rows):
        raise _size_error(f"--pick {pick}: AIConfigurator returned {len(rows)} disagg rows")
    rows = [rows[pick]] + [r for i, r in enumerate(rows) if i != pick]
    top = rows[0]
    fit = None
    if request_rate is not None:  # the picked row's instances scaled to the rate; the devices follow
        raw = recorded["best_configs"]["disagg"][pick]
        try:
            fit = rate.fit(raw, request_rate)
        except ValueError as e:
            raise _size_error(str(e)) from None
        top = rows[0] = rate.scaled(top, raw, fit, output_tokens)
        total_devices = top.devices + need
    try:
        placed = plan.place_downstream(down, total_devices - top.devices, device_bytes) if down else []
    except plan.NoFit as e:
        raise _size_error(str(e)) from None
    try:
        devs = plan.device_lists(top, len(placed), total_devices)
    except plan.NoFit as e:
        raise _size_error(str(e)) from None
    if from_result is None:
        note = f"same shape as {where} of {model_info.name}"
    elif isinstance(recorded.get("thinker_shape"), dict):
        note = f"same shape as the Thinker recorded in {from_result.name} ({where} of {model_info.name})"
    else:
        note = (f"recorded in {from_result.name}; not compared with {where} of {model_info.name} "
                "(the result records no Thinker shape: re-record it with --record)")
    s = report.summary(recorded, rows, {"model": match.model, "note": note},
                       {"isl": isl, "breakdown": shape.breakdown()}, placed, devs, fit)
    if fmt == "json":
        sys.stdout.write(json.dumps(s, indent=1) + "\n")
    else:
        from rich.console import Console

        report.render(s, Console(highlight=False, width=max(120, Console().width)))
    if write is not None:
        if top.prefill.pp > 1 or top.decode.pp > 1:
            raise _size_error(f"row {pick} uses PP >1 (prefill pp{top.prefill.pp}, decode pp{top.decode.pp}); "
                              "expand has no pipeline-parallel option, nothing written",
                              help="choose a PP1 runner-up with --pick N")
        import inspect

        kw = {n: getattr(p.default, "default", p.default) for n, p in inspect.signature(expand).parameters.items()}
        # a side's DP (attention data parallel, DP ranks of one engine) through --prefill-dp/--decode-dp;
        # DP 1 is written only where the input's Thinker runs another data_parallel_size
        thinker_dp = _thinker_dp(doc)
        kw.update(input=input, output=write, prefill_replicas=top.prefill.replicas, decode_replicas=top.decode.replicas,
                  prefill_tp=top.prefill.tp, decode_tp=top.decode.tp, quiet=True,
                  prefill_dp=top.prefill.dp if top.prefill.dp != thinker_dp else None,
                  decode_dp=top.decode.dp if top.decode.dp != thinker_dp else None,
                  prefill_devices=",".join(map(str, devs["prefill"])), decode_devices=",".join(map(str, devs["decode"])))
        if devs["downstream"]:
            kw["downstream_devices"] = ",".join(map(str, devs["downstream"]))
        _EXPAND_HIDE.add("OPD904")
        _EXPAND_SEEN.clear()
        try:
            expand(**kw)
        finally:
            _EXPAND_HIDE.discard("OPD904")
        if "OPD904" in _EXPAND_SEEN:
            sys.stderr.write(f"note: the input's platforms.npu overlay is kept as expand writes it (one replica per "
                             f"side on npu, OPD904); this sizing is for {system}\n")
        sys.stderr.write(f"wrote {write} (through expand, validated)\n")


def _thinker_dp(doc) -> int:
    """The ``data_parallel_size`` the Thinker (the split stage) of deploy config ``doc`` runs
    with (its own, else the pipeline-wide top-level key, else 1); 1 when the file has no
    Thinker (expand then refuses it with OPD801)."""
    from omni_pd.compile.parse import parse_config
    from omni_pd.compile.pipelines import load_catalogue
    from omni_pd.compile.topology import resolve, select_pipeline

    cfg = parse_config(doc)
    topo = resolve(cfg, select_pipeline(cfg, load_catalogue(), doc, None), None, doc)
    split = topo.pipeline.split_stage
    node = topo.node(split.stage_id) if split is not None else None
    return node.dp if node is not None else 1


def print_table(columns: tuple[str, ...], rows: list[tuple[str, ...]], *, header: bool = True) -> None:
    """Print ``rows`` under ``columns`` with rich's Table (as ``launch`` prints its plan and
    status), each column as wide as its widest cell. On a terminal: bold header, the last
    column folded to the terminal's width. In a pipe or file: one line per row at the
    width the longest row needs, no trailing blanks, no markup (for grep, awk, diff)."""
    import io

    from rich.console import Console
    from rich.table import Table

    tty = sys.stdout.isatty()
    t = Table(box=None, pad_edge=False, show_header=header, header_style="bold" if tty else "",
              show_edge=False)
    for i, col in enumerate(columns):
        last = i == len(columns) - 1
        t.add_column(col, no_wrap=not (tty and last), overflow="fold")
    for row in rows:
        t.add_row(*row)
    if tty:
        Console(highlight=False, markup=False).print(t)
        return
    width = sum(max(len(str(r[i])) for r in [columns, *rows]) + 2 for i in range(len(columns)))
    buf = Console(file=io.StringIO(), width=width + 1, highlight=False, color_system=None, markup=False)
    buf.print(t)
    sys.stdout.write("".join(line.rstrip() + "\n" for line in buf.file.getvalue().splitlines()))


def _npu_platform_opt(value: Optional[str]) -> Optional[str]:
    """``--platform``: only ``npu`` changes what expand writes (exit 2 otherwise)."""
    if value is None or value == "npu":
        return value
    raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR,
                                 message=f"--platform {value!r}: expand knows only npu here",
                                 help="leave --platform out for the CUDA base (overlays are rewritten as they are)"))


def _npu_connector_opt(value: str) -> str:
    from omni_pd.compile import ascend

    if not ascend.emits(value):
        raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR,
                                     message=f"--npu-connector {value!r} is not a vllm-ascend PD connector",
                                     help=f"use {ascend.PULL} (pull) or {ascend.PUSH} (layerwise push)"))
    return value


#: connectors the CPU end-to-end runs move KV with (docs/status.md): MooncakeConnector in
#: the vllm-omni pipeline (the README's CPU rehearsal), NixlConnector for a single LLM
_CPU_RUN_CONNECTORS = ("MooncakeConnector", "NixlConnector")


@app.command()
def connectors() -> None:
    """List the KV connectors omni-pd can emit, with the platforms they run on (a
    vllm-ascend connector: npu only, at the vllm-ascend releases of presets/targets/vllm_ascend.yaml)."""
    from omni_pd.compile import ascend
    from omni_pd.compile import connectors as reg

    rows = []
    for name in reg.names():
        c = reg.get(name)
        if ascend.is_ascend(name):
            where = "npu (vllm-ascend " + ", ".join(f"{r}/vLLM {v}" for r, v in ascend.releases().items()) + ")"
        else:
            where = "cuda, rocm, xpu, cpu (vLLM)" if name in _CPU_RUN_CONNECTORS else "cuda, rocm, xpu (vLLM)"
        rows.append((name, where, c.summary))  # type: ignore[union-attr]
    print_table(("connector", "platforms", "what it does"), rows)


#: what each option file is, for the help of a diagnostic about it
_OPTION_FILE_HELP = {
    "--inventory": "--inventory takes a YAML file of hosts and stage placement "
                   "(docs/validate.md, Inventory and model facts)",
    "--model-info": "--model-info takes the model's Hugging Face config.json (the file next to the weights, "
                    "e.g. <model dir>/config.json; docs/validate.md, Inventory and model facts)",
}


def _load_yaml_option(path: Path, option: str):
    """Read a small YAML/JSON option file (``--inventory``, ``--model-info``) as plain data.
    A file that cannot be read or parsed is OPD001..OPD004 naming ``option`` with that
    option's help (exit 2)."""
    from dataclasses import replace

    from omni_pd.compile.parse import to_plain
    from omni_pd.io import load_file

    try:
        doc = load_file(path)
    except OmniPdError as e:
        d = e.diagnostic
        raise OmniPdError(replace(d, message=f"{option} {path}: {d.message}",
                                  help=_OPTION_FILE_HELP.get(option, d.help)), e.exit_code) from None
    return to_plain(doc.tree)


def _inventory_opt(path: Optional[Path]):
    """The :class:`~omni_pd.check.context.Inventory` of ``--inventory PATH`` (None without
    one); a malformed file is OPD006 (exit 2) naming the bad key."""
    if path is None:
        return None
    from omni_pd.check.context import Inventory

    try:
        return Inventory.from_dict(_load_yaml_option(path, "--inventory"))
    except ValueError as e:
        raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR, message=f"--inventory {path}: {e}",
                                     help="see `omni-pd explain OPD402` for the inventory format")) from None


def _served_model_facts(model: str):
    """The :class:`~omni_pd.check.context.ModelInfo` of ``--model`` when it is a local
    checkpoint directory (its ``config.json``), else None: launch and render judge the
    model-dependent rules as ``validate --model-info`` does."""
    from omni_pd.check.context import ModelInfo

    return ModelInfo.from_model_dir(model)


def _placed_inventory(inv, topo):
    """``inv`` with every stage of ``topo`` placed (:func:`omni_pd.compile.placement.
    resolve_placement`: the inventory's placement, else omni-pd's proposal), so validate and
    launch read the placement expand compiled for; None stays None."""
    from omni_pd.check.validate import placed_inventory

    return placed_inventory(inv, topo.pipeline if topo is not None else None)


def _pairs(items: Optional[list[str]], name: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for it in items or []:
        k, sep, v = it.partition("=")
        if not sep or not k.strip():
            raise typer.BadParameter(f"expected KEY=VALUE, got {it!r}", param_hint=name)
        out[k.strip()] = v.strip()
    return out


#: ``--select`` / ``--ignore`` of validate and launch (one meaning: omni_pd/check/suppress.py)
_SELECT_HELP = ("report only these codes, code prefixes or rule names (comma-separated, repeatable; replaces the "
                "config file's select)")
_IGNORE_HELP = "do not report these codes, code prefixes or rule names (comma-separated, repeatable; on top of [tool.omni-pd])"


@app.command()
def validate(
    inputs: Optional[list[str]] = typer.Argument(
        None, help="deploy YAML files or directories (walked for *.yaml/*.yml); - reads stdin "
                   "(default: the bundled Qwen3-Omni preset)", show_default=False),
    platform: Optional[_LAUNCH_PLATFORM] = typer.Option(
        None, "--platform", help="apply platforms.<P> first; cpu: the base stages, judged for a CPU run as launch does"),
    all_platforms: bool = typer.Option(False, "--all-platforms", help="check the base config and every platform overlay"),
    inventory: Optional[Path] = typer.Option(None, "--inventory", help="hosts (accelerator, count, memory_gib) and stage placement (YAML)"),
    model_info: Optional[Path] = typer.Option(None, "--model-info", help="the model's config.json (KV heads, MLA, hybrid, sub-configs)"),
    vllm_version: Optional[str] = typer.Option(None, "--vllm-version",
                                               help="target vLLM major.minor (default and known range: omni-pd --version)"),
    pipeline: Optional[str] = typer.Option(None, "--pipeline", help="pipeline name when the file does not say"),
    fmt: Literal["text", "json", "sarif", "concise", "github"] = typer.Option(
        "text", "--format", help="diagnostics as text, JSON, SARIF, concise (one line each: file:line:col: "
        "severity[CODE] message) or github (GitHub Actions annotations)"),
    env: Optional[list[str]] = typer.Option(None, "--env", help="launcher environment KEY=VALUE (repeatable), e.g. CUDA_VISIBLE_DEVICES=4,5"),
    serve_arg: Optional[list[str]] = typer.Option(None, "--serve-arg", help="global `vllm serve` flag KEY=VALUE the launch will pass "
                                                  "(broadcast to every stage), e.g. tensor_parallel_size=4"),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="hide info diagnostics"),
    against_vllm_omni: bool = typer.Option(False, "--against-vllm-omni",
                                           help="also load the file with the real vllm-omni (its resolver and PD checks)"),
    vllm_omni_python: Optional[str] = typer.Option(None, "--vllm-omni-python",
                                                   help="python of an environment with vllm-omni and omni-pd installed"),
    model: Optional[str] = typer.Option(None, "--model", help="with --against-vllm-omni: the model vllm serve gets"),
    select: Optional[list[str]] = typer.Option(None, "--select", help=_SELECT_HELP),
    ignore: Optional[list[str]] = typer.Option(None, "--ignore", help=_IGNORE_HELP),
) -> None:
    """Check deploy configs for every PD invariant; exit 0 clean, 1 errors, 2 unreadable input.

    Findings are suppressed by ``# omni-pd: ignore[CODE]`` comments, --select/--ignore and
    the [tool.omni-pd] table of pyproject.toml or .omni-pd.toml (omni-pd explain OPD009).

    Many files and directories are checked in one process; the exit status is the worst
    of all files (0 < 1 < 2 < 3).
    """
    with _no_pydantic_plugins():  # builds the deploy model's pydantic classes
        from omni_pd.check.context import Inventory, ModelInfo
        from omni_pd.check.validate import ValidateOptions

    from omni_pd import cli_options

    cli_options.vllm_version(vllm_version)
    known: dict = {}  # code -> rule name, read when a selector or a file needs it (_suppress)
    cli_layer = _cli_layer(select, ignore, known)
    if platform is not None and all_platforms:
        raise typer.BadParameter("give either --platform or --all-platforms", param_hint="--platform")
    inv = None
    if inventory is not None:
        try:
            inv = Inventory.from_dict(_load_yaml_option(inventory, "--inventory"))
        except ValueError as e:
            raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR, message=f"bad inventory: {e}",
                                         help="see `omni-pd explain OPD402` for the inventory format")) from None
    model_facts = None
    if model_info is not None:
        data = _load_yaml_option(model_info, "--model-info")
        try:
            if not isinstance(data, dict):
                raise ValueError("not a mapping")
            model_facts = ModelInfo.from_config_json(data)
        except (ValueError, TypeError) as e:
            raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR,
                                         message=f"--model-info {model_info}: not a usable config.json ({e})",
                                         help=_OPTION_FILE_HELP["--model-info"])) from None
    opts = ValidateOptions(platform=platform, all_platforms=all_platforms, inventory=inv, model=model_facts,
                           vllm_version=vllm_version, env=_pairs(env, "--env"), pipeline=pipeline,
                           cli={k.replace("-", "_").lstrip("_"): v for k, v in _pairs(serve_arg, "--serve-arg").items()})
    return run_validate(inputs, opts, cli_layer=cli_layer, known=known, fmt=fmt, quiet=quiet,
                        against=against_vllm_omni, python=vllm_omni_python, model=model)


def _plan_suppression(config: Path, select: Optional[list[str]], ignore: Optional[list[str]]):
    """validate's suppressions for the compiled config ``config`` of ``launch`` and ``render``:
    ``(kept, hidden)``, ``kept(result)`` the findings of a validation result that count after
    ``# omni-pd: ignore[...]`` comments, ``--select``/``--ignore`` and the [tool.omni-pd]
    table (:func:`_selection_layers`, :func:`_suppress`: validate's own), the callable
    :func:`omni_pd.launch.plan.plan_document` takes as ``suppress``; ``hidden[0]``: how many
    it hid, for the verdict line (read after ``plan_document``). Raises OPD006 (exit 2) for
    a selector that names no code or a bad settings file, before anything is read."""
    known: dict = {}
    layers = _selection_layers(str(config), _cli_layer(select, ignore, known), known, {})
    hidden = [0]

    def kept(r) -> list:
        out, hidden[0] = _suppress(list(r.diagnostics), r.docs, layers, known)
        return out

    return kept, hidden


@app.command()
def graph(
    input: Optional[Path] = typer.Argument(None, help="deploy YAML (default: the bundled Qwen3-Omni preset)",
                                           show_default=False),
    fmt: Literal["tree", "mermaid", "dot"] = typer.Option("tree", "--format", help="tree (rich), Mermaid or DOT"),
    platform: Optional[_PLATFORM] = typer.Option(None, "--platform", help="apply platforms.<P> first"),
    pipeline: Optional[str] = typer.Option(None, "--pipeline", help="pipeline name when the file does not say"),
    vllm_version: Optional[str] = typer.Option(None, "--vllm-version",
                                               help="target vLLM major.minor (decides the ports shown)"),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="write the text here (atomically) instead of stdout"),
) -> None:
    """Draw the stage graph: roles, devices, KV connectors with kv_role, ports (tree, Mermaid or DOT)."""
    from omni_pd import cli_options
    from omni_pd.compile.graph import stage_graph, to_dot, to_mermaid, to_tree_lines, to_tree_text
    from omni_pd.io import atomic_write, load_file
    from omni_pd.resources import preset_path

    tgt = cli_options.vllm_version(vllm_version)
    src = input if input is not None else preset_path("qwen3_omni_moe")
    doc = load_file(src)
    topo, ports = _graph_inputs(doc, pipeline, platform, tgt)
    g = stage_graph(topo, ports)
    _say_linear_chain(topo, doc.name, pipeline)
    if fmt == "tree" and output is None and sys.stdout.isatty():
        from rich.console import Console
        from rich.markup import escape
        from rich.tree import Tree

        rows = to_tree_lines(g)
        root = Tree(f"[bold]{escape(rows[0][1])}[/]")
        parents = {0: root}
        for depth, text in rows[1:]:
            style = "bold" if depth == 1 else ("magenta" if text.startswith(("->", "=>")) else "")
            parents[depth] = parents[depth - 1].add(f"[{style}]{escape(text)}[/]" if style else escape(text))
        Console(highlight=False).print(root)
        return
    text = {"mermaid": to_mermaid, "dot": to_dot, "tree": to_tree_text}[fmt](g)
    if output is None:
        sys.stdout.write(text)
    else:
        atomic_write(output, text, protect=[str(src)])
        sys.stderr.write(f"wrote {output}\n")


def _say_linear_chain(topo, name: str, pipeline: Optional[str], verb: str = "drawn") -> None:
    """A note on stderr when ``topo`` (of the file ``name``, ``--pipeline`` = ``pipeline``)
    was resolved against validate's linear-chain stand-in (``Pipeline.linear_chain``):
    its stage roles are unknown because the file names no pipeline and none is inferred
    (validate's OPD207), or the pipeline it names is not catalogued. Says how to name the
    pipeline. Nothing for a catalogued or inferred-PD pipeline. Shared by graph and diff
    (``verb``: what the command did with the stages)."""
    if not topo.pipeline.linear_chain:
        return
    given = pipeline or topo.config.pipeline
    if not given:
        why = f"{name} names no `pipeline:` and omni-pd cannot infer one"
    else:
        where = "--pipeline" if pipeline else f"{name}'s `pipeline:`"
        why = f"pipeline `{given}` ({where}) is not in omni-pd's catalogue"
    sys.stderr.write(f"note: {why}, so its stages are {verb} as a linear chain with unknown roles; "
                     "pass --pipeline NAME (see `omni-pd pipelines`) or add `pipeline: NAME` to the file\n")


def _resolve(doc, pipeline: Optional[str], platform: Optional[str]):
    """``doc`` resolved against the pipeline validate would check it with (catalogued,
    an inferred PD pair, or a linear chain). Raises OmniPdError for unparsable input."""
    from omni_pd.check.validate import Locator, ValidateOptions, choose_pipeline
    from omni_pd.compile.parse import parse_config, to_plain
    from omni_pd.compile.pipelines import load_catalogue
    from omni_pd.compile.topology import resolve

    cfg = parse_config(doc)
    plain = to_plain(doc.tree)
    pipe, _ = choose_pipeline(cfg, Locator(doc), load_catalogue(), ValidateOptions(pipeline=pipeline),
                              base_name=plain.get("base_config"))
    return resolve(cfg, pipe, platform, doc), plain


def _graph_inputs(doc, pipeline: Optional[str], platform: Optional[str], tgt):
    """The resolved topology of ``doc`` and each stage's bound ports (validate's own
    port facts: ``omni_pd/check/rules/ports.py bound_ports``)."""
    from omni_pd.check.rules import Context
    from omni_pd.check.rules.ports import bound_ports
    from omni_pd.check.validate import Locator
    from omni_pd.compile.graph import PortRange

    topo, plain = _resolve(doc, pipeline, platform)
    ctx = Context(doc=Locator(doc), config=topo.config, topology=topo, target=tgt, platform=platform, raw=plain)
    ports = {n.stage_id: [PortRange(b.port, b.span, b.purpose + (f" (replica {b.replica})" if b.replica else ""))
                          for b in bound_ports(ctx, n)] for n in topo.stages}
    return topo, ports


@app.command("diff")
def diff_cmd(
    before: Path = typer.Argument(..., help="the deploy config given to `omni-pd expand`"),
    after: str = typer.Argument(..., help="what expand wrote (- reads stdin)"),
    pipeline: Optional[str] = typer.Option(None, "--pipeline", help="pipeline of BEFORE when the file does not say"),
    platform: Optional[_PLATFORM] = typer.Option(None, "--platform", help="compare with platforms.<P> applied to both"),
    fmt: Literal["text", "json"] = typer.Option("text", "--format", help="the changes as text or JSON"),
    vllm_omni_version: Optional[str] = typer.Option(
        None, "--vllm-omni-version", "--vllm-version",
        help="for a legacy `stage_args` BEFORE: the release `omni-pd migrate` targets (default 0.30)"),
) -> None:
    """Show what expand changed, stage by stage (each output stage against the input stage it came from).

    With a legacy `stage_args` BEFORE and its `stages:` rewrite AFTER, show the migration:
    each stage against the legacy stage of the same id (engine_args/runtime flattened), and
    whether AFTER holds what `omni-pd migrate BEFORE` writes."""
    import json

    from omni_pd.compile.diff import config_diff, diff_json, diff_text
    from omni_pd.compile.migrate import is_legacy
    from omni_pd.io import load_file, load_stream

    a_doc = load_file(before)
    b_doc = load_stream(sys.stdin.buffer, "<stdin>") if after == "-" else load_file(after)
    if is_legacy(b_doc.tree) and not is_legacy(a_doc.tree):  # `diff MIGRATED LEGACY`
        _emit_diags([Diagnostic(
            code="OPD008", severity=Severity.ERROR, location=b_doc.loc(()),
            message=f"the arguments are swapped: {b_doc.name} is a legacy `stage_args` file and {a_doc.name} is not",
            help=f"give the legacy file first and its rewrite second: `omni-pd diff {b_doc.name} {a_doc.name}`")],
            {a_doc.name: a_doc, b_doc.name: b_doc})
        raise SystemExit(2)
    if is_legacy(a_doc.tree):
        _diff_migration(a_doc, b_doc, pipeline, fmt, vllm_omni_version)
        return
    try:  # errors are shown with these two documents' lines (stdin has no file to read back)
        a_topo, a_plain = _resolve(a_doc, pipeline, platform)
        b_topo, b_plain = _resolve(b_doc, None, platform)
        if pipeline is None and a_topo.pipeline.linear_chain and not a_topo.config.pipeline \
                and b_topo.pipeline.base:
            # BEFORE says nothing about its pipeline: it is the one AFTER was split from
            a_topo, a_plain = _resolve(a_doc, b_topo.pipeline.base, platform)
        try:
            d = config_diff(a_topo, b_topo, a_plain, b_plain)
        except ValueError as e:
            if _is_split(a_topo) and not _is_split(b_topo):  # `diff OUT IN`: the split given first
                again = f"omni-pd diff {b_doc.name} {a_doc.name}" if after != "-" else "omni-pd diff IN OUT"
                raise OmniPdError(Diagnostic(
                    code="OPD008", severity=Severity.ERROR, location=a_doc.loc(()),
                    message=f"the arguments are swapped: {a_doc.name} is a prefill/decode split "
                            f"({a_topo.pipeline.name}) and {b_doc.name} is not",
                    help=f"give the file expand read first and what it wrote second: `{again}`")) from None
            raise OmniPdError(Diagnostic(
                code="OPD008", severity=Severity.ERROR, location=b_doc.loc(()),
                message=f"{b_doc.name} is not a prefill/decode split: {e}",
                help=f"give the output of `omni-pd expand {a_doc.name}` as the second file")) from None
    except OmniPdError as e:
        _emit_diags([e.diagnostic], {a_doc.name: a_doc, b_doc.name: b_doc})
        raise SystemExit(e.exit_code) from None
    _say_linear_chain(a_topo, a_doc.name, pipeline, verb="compared")
    sys.stdout.write(json.dumps(diff_json(d), indent=2) + "\n" if fmt == "json" else diff_text(d, a_doc.name, b_doc.name))


def _diff_migration(a_doc, b_doc, pipeline: Optional[str], fmt: str, version: Optional[str]) -> None:
    """``omni-pd diff LEGACY MIGRATED``: the migration's changes per stage, then the keys
    where MIGRATED differs from what ``omni-pd migrate LEGACY`` writes (exit 1 when it
    does: a hand migration that lost or changed a setting)."""
    import json

    from omni_pd import cli_options
    from omni_pd.compile.diff import changes, diff_json, diff_text, layout_settings, migration_diff
    from omni_pd.compile.migrate import is_legacy, migrate_document
    from omni_pd.compile.parse import to_plain
    from omni_pd.compile.pipelines import load_catalogue

    tgt = cli_options.vllm_version(version, "--vllm-omni-version")
    try:
        if is_legacy(b_doc.tree) or not isinstance(b_doc.tree.get("stages"), list):
            raise OmniPdError(Diagnostic(
                code="OPD008", severity=Severity.ERROR, location=b_doc.loc(()),
                message=f"{a_doc.name} is a legacy `stage_args` file and {b_doc.name} has no `stages:` list",
                help=f"give its `stages:` rewrite second: `omni-pd migrate {a_doc.name} -o new.yaml`, "
                     f"then `omni-pd diff {a_doc.name} new.yaml`"))
        m = migrate_document(a_doc, tgt, load_catalogue(), pipeline)
    except OmniPdError as e:
        _emit_diags(getattr(e, "diagnostics", [e.diagnostic]), {a_doc.name: a_doc, b_doc.name: b_doc})
        raise SystemExit(e.exit_code) from None
    titles = {ps.stage_id: f"stage {ps.stage_id} {ps.role}" + (f" {ps.pd_role}" if ps.pd_role else "")
              for ps in m.pipeline.stages}
    after = to_plain(b_doc.tree)
    d = migration_diff(to_plain(a_doc.tree), after, titles)
    want = {s.get("stage_id"): layout_settings(s) for s in to_plain(m.tree)["stages"]}
    off = [(s.get("stage_id"), c) for s in after["stages"] if isinstance(s, dict)
           for c in changes(want.get(s.get("stage_id"), {}), layout_settings(s))]
    if fmt == "json":
        out = diff_json(d) + [{"not_as_migrate_writes": [
            {"stage_id": sid, "kind": c.kind, "key": c.key, "migrate": c.before, "after": c.after} for sid, c in off]}]
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
    else:
        sys.stdout.write(diff_text(d, f"{a_doc.name} (legacy stage_args)", b_doc.name))
        if off:
            sys.stdout.write(f"not what `omni-pd migrate {a_doc.name}` writes (vllm-omni {tgt.label}):\n")
            sys.stdout.writelines(f"  stage {sid}: {c.text()}\n" for sid, c in off)
        else:
            sys.stdout.write(f"= what `omni-pd migrate {a_doc.name}` writes (vllm-omni {tgt.label}), key for key\n")
    if off:
        raise SystemExit(1)


def _is_split(topo) -> bool:
    """True when ``topo``'s pipeline has a prefill/decode pair (a catalogued ``*_pd``
    pipeline, or validate's inferred PD chain): what ``omni-pd expand`` writes."""
    return any(s.pd_role for s in topo.pipeline.stages)


@app.command("rules")
def rules_cmd() -> None:
    """List every diagnostic code: the validate rules, then the codes of input, usage, expand, launch."""
    from omni_pd.check.codes import CODES
    from omni_pd.check.rules import registry

    # no header: one code per line, first field the code (grep OPD3, awk '{print $1}')
    print_table(("code", "severity", "name", "summary"),
                [(e.code, e.severity.value, e.name, e.summary) for e in (*registry().values(), *CODES)], header=False)


@app.command()
def explain(code: str = typer.Argument(..., help="a diagnostic code or rule name, e.g. OPD302 or pd-kv-role "
                                                "(see `omni-pd rules`)")) -> None:
    """Print one code's documentation (a rule: with its failing and passing examples)."""
    from omni_pd.check.codes import explainable
    from omni_pd.check.explain import resolve

    entry, near = resolve(code, explainable())  # a code or a rule name `omni-pd rules` prints
    if entry is None:
        raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR,
                                     message=f"unknown code or rule name `{code}`",
                                     help=(f"did you mean {near}? " if near else "") + "`omni-pd rules` lists them"))
    if sys.stdout.isatty():
        from rich.console import Console

        from omni_pd.check.explain import print_rich

        print_rich(entry, Console())
    else:
        from omni_pd.check.explain import explain_text

        sys.stdout.write(explain_text(entry))


@app.command()
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
    platform: _LAUNCH_PLATFORM = typer.Option("cuda", "--platform", help="the accelerator the engines run on"),
    served_model_name: Optional[str] = typer.Option(None, "--served-model-name", help="name clients use (default: --model)"),
    ready_timeout: float = typer.Option(1200.0, "--ready-timeout", help="seconds each engine may take to become healthy"),
    grace: float = typer.Option(10.0, "--grace", help="seconds between SIGTERM and SIGKILL at shutdown"),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="logs, pids, plan.json, timings.json, smoke.json (default: omni-pd-runs/<time>)"),
    extra_arg: Optional[list[str]] = typer.Option(None, "--engine-arg", help="extra `vllm serve` argument for every engine (repeatable)"),
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
    select: Optional[list[str]] = typer.Option(None, "--select", help=_SELECT_HELP + "; as validate"),
    ignore: Optional[list[str]] = typer.Option(None, "--ignore", help=_IGNORE_HELP + "; as validate"),
) -> None:
    """Validate, plan, preflight, start and supervise the engines of a compiled PD config.

    Validate's findings come first, suppressed as validate suppresses them (``# omni-pd:
    ignore[CODE]`` comments, --select/--ignore, [tool.omni-pd]): a suppressed error does
    not stop the launch.
    """
    import time

    from omni_pd.diagnostics import render_text, summary
    from omni_pd.io import load_file
    from omni_pd.launch.plan import LaunchOptions, launcher_visibility, plan_document

    from omni_pd import cli_options

    inv = _inventory_opt(inventory)
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
    kept, hidden = _plan_suppression(config, select, ignore)  # before the config is read, as validate
    doc = load_file(config)
    opts = LaunchOptions(model=model, vllm=vllm, host=host, port=port, engine_port_base=engine_port_base,
                         platform=platform, served_model_name=served_model_name, ready_timeout_s=ready_timeout,
                         extra_args=tuple(extra_arg or ()), env=_pairs(env, "--env"), python=python,
                         router_workers=router_workers, launcher_env=launcher_visibility(os.environ),
                         local_host=on_host if on_host not in (None, "*") else None)
    # validate's findings first, rendered and counted as `omni-pd validate` does, before
    # anything is planned (issue 24 item 3); stderr under --format json (stdout is the plan)
    found_out = sys.stderr if (dry_run and fmt == "json") else sys.stdout
    planned = plan_document(doc, str(config.resolve()), opts, inventory=inv, suppress=kept,
                            model=_served_model_facts(model), on_validated=lambda r: _say_launch_findings(r, doc.name, found_out, hidden[0]))
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
        from omni_pd.launch.preflight import preflight

        from omni_pd.launch.plan import without_peers

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


@app.command()
def render(
    config: Path = typer.Argument(..., help="compiled PD deploy YAML (the output of `omni-pd expand`)"),
    to: Path = typer.Option(..., "--to", help="directory to write (new or empty; never an input's); "
                            "- writes the Kubernetes manifests to stdout as one multi-document YAML"),
    model: str = typer.Option(..., "--model", help="model id or path every engine serves"),
    inventory: Optional[Path] = typer.Option(None, "--inventory", help="hosts and stage placement (YAML): one "
                                             "script per host"),
    target: Literal["scripts", "kubernetes"] = typer.Option(
        "scripts", "--target", help="what to render: scripts (one bash script per host) or kubernetes (llm-d-shaped "
        "manifests and a Kustomization: plain-vLLM NIXL pairs, vllm-omni pipelines one pod per host)"),
    image: Optional[str] = typer.Option(None, "--image", help="kubernetes: the engines' container image (default "
                                        "vllm/vllm-openai:v0.30.0; a vllm-omni pipeline needs one with vllm-omni "
                                        "and omni-pd)"),
    router_image: str = typer.Option("omni-pd:latest", "--router-image",
                                     help="kubernetes: an image with omni-pd installed (the PD router)"),
    name: str = typer.Option("omni-pd", "--name", help="kubernetes: name prefix of every object"),
    secret: str = typer.Option("omni-pd-secrets", "--secret",
                               help="kubernetes: the Secret that holds secret env values (HF_TOKEN, API keys)"),
    gpus_per_node: Optional[int] = typer.Option(None, "--gpus-per-node", min=1,
                                                help="kubernetes: devices one node offers; an instance with more "
                                                     "becomes a LeaderWorkerSet across nodes (default: each fits one)"),
    disaggregated_set: bool = typer.Option(False, "--disaggregated-set",
                                           help="kubernetes: both roles in one LWS DisaggregatedSet (lws v0.9.0 or "
                                                "later) instead of a workload per role"),
    vllm: str = typer.Option("vllm", "--vllm", help="the `vllm` executable on the hosts"),
    python: str = typer.Option("python3", "--python", help="the Python with omni-pd installed on the hosts: runs "
                               "the PD router (default: python3 from the host's PATH)"),
    port: int = typer.Option(8000, "--port", help="client port: the PD router, or the vllm-omni server"),
    engine_port_base: int = typer.Option(8100, "--engine-port-base", help="prefill HTTP port (decode: +100)"),
    platform: _LAUNCH_PLATFORM = typer.Option("cuda", "--platform", help="the accelerator the engines run on"),
    served_model_name: Optional[str] = typer.Option(None, "--served-model-name", help="name clients use (default: --model)"),
    ready_timeout: float = typer.Option(1200.0, "--ready-timeout", help="seconds each engine may take to become healthy"),
    extra_arg: Optional[list[str]] = typer.Option(None, "--engine-arg", help="extra `vllm serve` argument for every engine (repeatable)"),
    env: Optional[list[str]] = typer.Option(None, "--env", help="KEY=VALUE for every process (repeatable; a secret's "
                                            "value is read from the host's environment, never written)"),
    router_workers: Optional[int] = typer.Option(None, "--router-workers", help="PD router processes (1..64; default: "
                                                 "sized by the router for the CPUs of the host it runs on)"),
    select: Optional[list[str]] = typer.Option(None, "--select", help=_SELECT_HELP + "; as validate"),
    ignore: Optional[list[str]] = typer.Option(None, "--ignore", help=_IGNORE_HELP + "; as validate"),
    force: bool = typer.Option(False, "--force", help="write into an existing directory, over the files render "
                               "writes there (others are left alone)"),
    namespace: Optional[str] = typer.Option(None, "--namespace", "-n",
                                            help="kubernetes: the namespace of every object (and the Kustomization)"),
    monitoring: bool = typer.Option(True, "--monitoring/--no-monitoring", help="kubernetes: monitoring.yaml (PodMonitor, "
                                    "PrometheusRule, Grafana dashboard ConfigMap; needs the Prometheus Operator's CRDs)"),
) -> None:
    """Write what runs the deployment: one script per host, the config and the placement.

    Validate's errors refuse the render, suppressed as validate and launch suppress them
    (``# omni-pd: ignore[CODE]`` comments, --select/--ignore, [tool.omni-pd]).
    """
    from omni_pd import cli_options
    from omni_pd.diagnostics import render_text, summary
    from omni_pd.io import atomic_write, load_file
    from omni_pd.launch.plan import LaunchOptions, plan_document
    from omni_pd.launch.preflight import plan_checks
    from omni_pd.render.scripts import DEPLOY, executable, render_scripts

    cli_options.port(port, "--port")
    cli_options.port(engine_port_base, "--engine-port-base")
    if router_workers is not None and not 1 <= router_workers <= 64:
        raise typer.BadParameter(f"{router_workers} is outside 1..64", param_hint="--router-workers")
    inputs = [str(config)] + ([str(inventory)] if inventory is not None else [])
    to_stdout = str(to) == "-"
    if to_stdout and target != "kubernetes":
        raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR,
                                     message="--to - writes Kubernetes manifests to stdout; scripts are one file per host",
                                     help="add --target kubernetes, or give --to a directory"))
    if not to_stdout and to.exists() and not to.is_dir():
        raise OmniPdError(Diagnostic(code="OPD005", severity=Severity.ERROR,
                                     message=f"--to {to}: exists and is not a directory",
                                     help="pass a directory (new, empty, or existing with --force)"))
    if not to_stdout and not force and to.exists() and any(to.iterdir()):
        raise OmniPdError(Diagnostic(code="OPD005", severity=Severity.ERROR,
                                     message=f"--to {to}: exists and is not an empty directory",
                                     help="pass a new directory, or --force to write over the files render writes there"))
    if target != "kubernetes" and (gpus_per_node is not None or disaggregated_set):
        raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR,
                                     message="--gpus-per-node and --disaggregated-set shape Kubernetes workloads",
                                     help="add --target kubernetes, or drop them for scripts"))
    if target != "kubernetes" and namespace is not None:
        raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR,
                                     message="--namespace places Kubernetes objects; scripts have none",
                                     help="add --target kubernetes, or drop --namespace"))
    if namespace is not None:
        import re

        from omni_pd.render.kubernetes import NAMESPACE_RE

        if not re.fullmatch(NAMESPACE_RE, namespace):
            raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR,
                                         message=f"--namespace {namespace}: not a Kubernetes namespace name "
                                                 "(lowercase letters, digits and '-', at most 63)",
                                         help="e.g. --namespace team-a"))
    inv = _inventory_opt(inventory)
    kept, hidden = _plan_suppression(config, select, ignore)  # before the config is read, as launch
    doc = load_file(config)
    if inv is None:
        _require_header_inventory(doc)
    opts = LaunchOptions(model=model, vllm=vllm, port=port, engine_port_base=engine_port_base, platform=platform,
                         served_model_name=served_model_name, ready_timeout_s=ready_timeout,
                         extra_args=tuple(extra_arg or ()), env=_pairs(env, "--env"), router_workers=router_workers,
                         router_python=python)
    planned = plan_document(doc, DEPLOY, opts, inventory=inv, suppress=kept, model=_served_model_facts(model))
    res, plan = planned.validation, planned.plan
    problems = [d for d in res.diagnostics if d.severity is Severity.ERROR] if plan is None else plan_checks(plan)
    if problems:
        sys.stdout.write(render_text(problems, _line_source(res.docs)) + "\n")
        sys.stdout.write(f"{doc.name}: not rendered ({summary(problems)}{_hidden(hidden[0])})\n")
        raise SystemExit(1)
    from omni_pd.launch.plan import hosts_of

    if target == "kubernetes":
        where = _plan_placement(plan, inv, doc)
        files = _kubernetes_files(plan, planned.topology, doc, image, router_image, name, platform, secret,
                                  gpus_per_node, disaggregated_set,
                                  tuple(where.addresses.values()) if where is not None else (), namespace, monitoring)
        if to_stdout:
            from omni_pd.render.kubernetes import as_stream

            sys.stdout.write(as_stream(files))
            sys.stdout.flush()
            return
    else:
        files = render_scripts(plan, doc.text, _plan_placement(plan, inv, doc), source=config.name, platform=platform,
                               stages=_role_stages(planned.topology))
        _check_scripts(files)
    to.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        atomic_write(to / name, text, protect=inputs)
    for name in executable(files):
        (to / name).chmod(0o755)
    hosts = hosts_of(plan)
    said = ([f"hosts {', '.join(hosts)}"] if hosts else []) + ([f"{hidden[0]} suppressed"] if hidden[0] else [])
    sys.stderr.write(f"wrote {to}: {', '.join(files)}" + (f" ({'; '.join(said)})" if said else "") + "\n")


def _require_header_inventory(doc) -> None:
    """For ``render`` without ``--inventory``: a file compiled with ``expand --inventory``
    (its header records the placement, :func:`omni_pd.check.validate.header_placement`) is
    planned per host, with the hosts' addresses and devices: rendered as one host, its two
    sides collided on one port (OPD960). OPD006 asks for the inventory instead."""
    from omni_pd.check.validate import header_placement

    found = header_placement(doc.text or "")
    if found is not None:
        raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR,
                                     message=f"{doc.name} was compiled for an inventory ({found[1]}); pass --inventory",
                                     help=f"pass the inventory it was compiled with: omni-pd render {doc.name} "
                                          "--inventory HOSTS.yaml ..."))


def _kubernetes_files(plan, topo, doc, image: Optional[str], router_image: str, name: str, platform: str,
                      secret: str, gpus_per_node: Optional[int] = None, disaggregated_set: bool = False,
                      addresses: tuple = (), namespace: Optional[str] = None, monitoring: bool = True) -> dict:
    """``render --target kubernetes``: the manifests (:mod:`omni_pd.render.kubernetes`),
    validated before anything is written: every core object with the kubernetes-validate
    package's schemas (strict), LeaderWorkerSet and DisaggregatedSet with their bundled CRD
    schemas (:mod:`omni_pd.render.crd_schema`), and ``kubectl kustomize`` where kubectl is installed. A
    plan without a Kubernetes rendering is OPD006 (exit 2); an object that does not
    validate is a bug (OPD000, exit 3)."""
    import shutil
    import subprocess
    import tempfile

    from omni_pd.render.kubernetes import RenderError, render_kubernetes, validate_manifests

    try:
        files = render_kubernetes(plan, doc.text, name=name, image=image, router_image=router_image,
                                  platform=platform, secret=secret, stages=_role_stages(topo),
                                  gpus_per_node=gpus_per_node, disaggregated_set=disaggregated_set,
                                  stage_devices={s.stage_id: s.devices for s in topo.stages} if topo else {},
                                  addresses=addresses, namespace=namespace, monitoring=monitoring)
    except RenderError as e:
        raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR, message=f"render --target kubernetes: {e}",
                                     help=e.help)) from None
    except ValueError as e:  # a manifest would carry a secret value
        raise OmniPdError(Diagnostic(code="OPD000", severity=Severity.ERROR, message=f"internal error: {e}",
                                     help="this is a bug in omni-pd (nothing was written); please report it"),
                          exit_code=3) from None
    try:
        problems = validate_manifests(files)
    except ImportError:
        raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR,
                                     message="render --target kubernetes validates every manifest offline with the "
                                             "kubernetes-validate package, which is not installed",
                                     help="pip install kubernetes-validate (nothing was written)")) from None
    kubectl = shutil.which("kubectl")
    if not problems and kubectl is not None:
        with tempfile.TemporaryDirectory() as tmp:
            for fname, text in files.items():
                Path(tmp, fname).write_text(text)
            r = subprocess.run([kubectl, "kustomize", tmp], capture_output=True, text=True, timeout=60)
            if r.returncode != 0:
                problems.append(f"kubectl kustomize: {r.stderr.strip()}")
    if problems:
        raise OmniPdError(Diagnostic(code="OPD000", severity=Severity.ERROR,
                                     message="internal error: rendered manifests do not validate: " + "; ".join(problems),
                                     help="this is a bug in omni-pd (nothing was written); please report it"),
                          exit_code=3)
    return files


def _role_stages(topo) -> dict:
    """Process role -> the compiled stage id it runs (``prefill``, ``decode``, ``encoder``;
    an E -> PD instance: ``pd``), for the messages and labels of ``render``; {} without a
    topology."""
    if topo is None:
        return {}
    pair, pipe = topo.pd_pair, topo.pipeline
    out = {"prefill": pair[0].stage_id, "decode": pair[1].stage_id} if pair is not None else {}
    if pipe.encoder is not None:
        out["encoder"] = pipe.encoder.stage_id
        if pair is None and pipe.ec_consumer is not None:
            out["pd"] = pipe.ec_consumer.stage_id  # the one stage that runs prefill and decode
    return out


def _plan_placement(plan, inv, doc):
    """The :class:`~omni_pd.compile.placement.Placement` ``plan`` was built with (the
    inventory's, completed for the config's pipeline), None without an inventory."""
    if inv is None or not inv.hosts:
        return None
    from omni_pd.compile.pipelines import load_catalogue
    from omni_pd.compile.placement import resolve_placement

    pipe = load_catalogue().get(str(doc.tree.get("pipeline")))
    return resolve_placement(pipe.stages, inv) if pipe is not None else None


def _check_scripts(files: dict) -> None:
    """``bash -n`` on every rendered script before anything is written: a script bash
    cannot parse is a bug in omni-pd (OPD000, exit 3)."""
    import shutil
    import subprocess

    bash = shutil.which("bash")
    if bash is None:
        return
    for name, text in files.items():
        if not name.endswith(".sh"):
            continue
        r = subprocess.run([bash, "-n"], input=text, capture_output=True, text=True)
        if r.returncode != 0:
            raise OmniPdError(Diagnostic(code="OPD000", severity=Severity.ERROR,
                                         message=f"internal error: rendered {name} does not parse: {r.stderr.strip()}",
                                         help="this is a bug in omni-pd (nothing was written); please report it"),
                              exit_code=3)


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


@app.command("status")
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
    platform: _LAUNCH_PLATFORM = typer.Option("cuda", "--platform", help="with --config: the platform it was planned for"),
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
                                _inventory_opt(inventory), url, port=port, engine_port_base=engine_port_base,
                                platform=platform) if given else None
        sys.stdout.write((prometheus_rules if emit == "prometheus-rules" else grafana_json)(target, min_share))
        return
    target = resolve_target(str(run_dir) if run_dir else None, str(config) if config else None,
                            _inventory_opt(inventory), url, port=port, engine_port_base=engine_port_base,
                            platform=platform)
    opts = Options(window_s=window, min_share=min_share, timeout_s=timeout, fmt=fmt, watch=watch, probe=probe,
                   model=model or target.model, entrypoint=target.entrypoint)
    raise SystemExit(run(target, opts))


def _full_summaries() -> None:
    """Give every command its whole first docstring paragraph as ``--help`` summary
    (click cuts a derived summary at 45 characters with "...")."""
    for info in app.registered_commands:
        if info.short_help is None and info.callback is not None and info.callback.__doc__:
            first = info.callback.__doc__.strip().split("\n\n")[0]
            info.short_help = " ".join(first.split())


_full_summaries()


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the app, turning every failure into a diagnostic and exit code.
    The collector's thresholds are raised (:data:`GC_THRESHOLD_0`) for the run and
    restored on return."""
    import gc

    thresholds = gc.get_threshold()
    gc.set_threshold(max(GC_THRESHOLD_0, thresholds[0]), *thresholds[1:])
    try:
        return _run(argv)
    finally:
        gc.set_threshold(*thresholds)


def _run(argv: list[str] | None) -> int:
    try:
        app(args=argv, prog_name="omni-pd", standalone_mode=False)
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
