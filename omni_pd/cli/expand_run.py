"""``omni-pd expand``'s work without typer: option checks, the schema gate on the input,
``--prefill-set``/``--decode-set``, the self-check of the output, the write. The command
module (omni_pd/cli/commands/expand.py) parses; ``size --write`` calls :func:`run_expand`."""

import os
import sys
from pathlib import Path
from typing import Any, Optional

from omni_pd.cli.options import devices_opt, inventory_opt, npu_connector_opt, npu_platform_opt, placed_inventory
from omni_pd.cli_validate import _emit_diags
from omni_pd.diagnostics import Diagnostic, OmniPdError, Severity


def schema_ref_of(ref: Optional[str]) -> str:
    """The ``$schema`` of expand's header line: ``--schema-ref`` as given, else the schema's
    file name (``omni-pd-deploy.schema.json``). yaml-language-server resolves a relative
    modeline path against the YAML file itself, so the default names a file next to the
    output, the same on every machine and from every working directory (``omni-pd schema
    -o`` writes it); a path into this installation's site-packages would be neither."""
    from omni_pd.resources import SCHEMA_FILENAME

    return SCHEMA_FILENAME if ref is None else ref


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
    # OPD207 (a pipeline nobody registers) is validate's while choosing the pipeline: expand names
    # the same mistake as OPD802 itself, with its exit status
    errors = [d for d in res.errors if d.code not in ("OPD007", "OPD207")]
    if gate is None and not errors:
        return
    found = [d for d in res.diagnostics if d.severity is not Severity.INFO and d.code not in ("OPD007", "OPD207")]
    if gate is not None:
        found = [replace(gate, severity=Severity.ERROR, help=(
            "expand takes a vllm-omni deploy config (a `stages:` list of per-stage engine settings, "
            "like presets/qwen3_omni_moe.yaml); nothing was written"))]
    elif all(d.code == "OPD102" for d in errors):
        return  # the legacy stage_args layout: expand explains it (OPD102) itself
    _emit_diags(found, res.docs)
    raise SystemExit(2)


def self_check(text: str, doc, vllm_version: Optional[str], output: Optional[Path],
                platform: Optional[str] = None, pipeline: Optional[str] = None,
                placed: tuple[str, ...] = (), inventory=None, chosen: Optional[str] = None) -> None:
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
    OPD202 look new, an OPD000 for a user's choice); ``chosen``: the pipeline expand split the
    input with when ``pipeline`` is None (a file without ``pipeline:``), judged the same way, and
    named in the "validate" hint only when validate alone would not find the errors. ``placed``: the device options given
    (``"--downstream-devices 0"``); new errors that are all device findings (OPD4xx: world
    size, memory budget) then come from where the user put the stages: OPD805, exit 2,
    naming the options. New errors that are all the inventory's router against the pair
    (OPD705-OPD707: a router that cannot relay the connector expand chose) are the user's
    choice too: OPD805, exit 2, naming --connector and the `router:` block; both kinds at once
    are one OPD805 naming both (before, that mix was called an expand bug, OPD000)."""
    from dataclasses import replace

    from omni_pd.check.validate import ValidateOptions, validate_document
    from omni_pd.io import parse_text

    name = f"{output if output is not None else '<stdout>'} (not written)"
    vopts = ValidateOptions(vllm_version=vllm_version, all_platforms=True, inventory=inventory)
    out = validate_document(parse_text(text, name, own_output=True), vopts)
    if not out.errors:
        return
    judge = pipeline or chosen
    before = validate_document(doc, replace(vopts, pipeline=judge))
    inherited = {d.code for d in before.errors}
    new = [d for d in out.errors if d.code not in inherited]
    if not new:  # show them where the user fixes them: in the input
        codes = {e.code for e in out.errors}
        _emit_diags([d for d in before.errors if d.code in codes], before.docs)
        alone = before if judge == pipeline else validate_document(doc, vopts)
        hint = pipeline or (judge if not codes <= {d.code for d in alone.errors} else None)
        again = f"omni-pd validate {doc.name}" + (f" --pipeline {hint}" if hint else "")
        sys.stderr.write(f"expand: {doc.name} already has these errors (`{again}`); "
                         "fix them first, nothing was written\n")
        raise SystemExit(2)
    _emit_diags(out.errors, out.docs)
    router = {"OPD705", "OPD706", "OPD707"}  # the inventory's router against the pair expand wrote
    by_devices = {d.code for d in new if placed and d.code.startswith("OPD4")}
    by_router = {d.code for d in new if inventory is not None and d.code in router}
    if new and all(d.code in by_devices | by_router for d in new):  # the user's choices, one or both
        why, fix = [], []
        if by_devices:
            why.append(f"cannot place the stages where {', '.join(placed)} put them: the file would fail validate "
                       f"({', '.join(sorted(by_devices))})")
            fix.append("give other devices (the findings above say which stages clash), or leave the option out "
                       "for expand's own layout")
        if by_router:
            why.append(f"the inventory's router cannot serve the PD pair expand wrote "
                       f"({', '.join(sorted(by_router))}, above)")
            fix.append("pick a KV connector that router speaks (e.g. --connector NixlConnector), or change the "
                       "inventory's `router:` block")
        raise OmniPdError(Diagnostic(code="OPD805", severity=Severity.ERROR, message="; and ".join(why),
                                     help="; ".join(fix) + "; nothing was written"))
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


def run_expand(*, input: Optional[Path] = None, output: Optional[Path] = None, connector: Optional[str] = None, vllm_version: Optional[str] = None, tp: Optional[int] = None, prefill_tp: Optional[int] = None, decode_tp: Optional[int] = None, dp: Optional[int] = None, prefill_dp: Optional[int] = None, decode_dp: Optional[int] = None, prefill_devices: Optional[str] = None, decode_devices: Optional[str] = None, downstream_devices: Optional[str] = None, kv_host: str = '127.0.0.1', kv_buffer_device: Optional[str] = None, mooncake_protocol: Optional[str] = None, port_base: Optional[int] = None, stream: Optional[bool] = None, prefill_replicas: Optional[int] = None, decode_replicas: Optional[int] = None, pipeline: Optional[str] = None, schema_ref: Optional[str] = None, quiet: bool = False, encoder_split: Optional[str] = None, ec_connector: Optional[str] = None, ec_storage_path: Optional[str] = None, encoder_devices: Optional[str] = None, platform: Optional[str] = None, npu_connector: str = 'MooncakeConnectorV1', npu_decode_tp: Optional[int] = None, inventory: Optional[Path] = None, prefill_set: Optional[list[str]] = None, decode_set: Optional[list[str]] = None,
               hide: frozenset[str] = frozenset()) -> set[str]:
    """``omni-pd expand``'s work, callable from Python (``size --write`` calls it): the
    arguments are the command's options under their parameter names, with the command's
    defaults (tests/test_cli_package.py holds the two equal). ``hide``: codes left out of
    what is printed (``size`` hides OPD904 and says it in its own words). Returns every code
    expand found, hidden or not. Raises OmniPdError (OPD006 for an option value, the
    located finding for an input that is not a deploy config) before anything is written."""
    from omni_pd import cli_options
    from omni_pd.compile.expand import expand_document
    from omni_pd.compile.passes.pd_split import ExpandOptions, side_dps, side_tps
    from omni_pd.io import load_file
    from omni_pd.io_write import atomic_write
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
        prefill_devices=devices_opt(prefill_devices, "--prefill-devices"),
        decode_devices=devices_opt(decode_devices, "--decode-devices"),
        downstream_devices=devices_opt(downstream_devices, "--downstream-devices"),
        kv_host=kv_host, kv_buffer_device=kv_buffer_device, port_base=port_base,
        mooncake_protocol=cli_options.mooncake_protocol(mooncake_protocol, connector),
        prefill_replicas=prefill_replicas, decode_replicas=decode_replicas,
        platform=npu_platform_opt(platform), npu_connector=npu_connector_opt(npu_connector),
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
                                devices_opt(encoder_devices, "--encoder-devices")), opts,
            vllm_version=vllm_version, pipeline=pipeline,
            schema_ref=schema_ref_of(schema_ref))
        kv_connector = eres.plan.pd.connector if eres.plan.pd is not None else None  # 1e1pd: no PD pair
        if kv_buffer_device is not None and kv_connector is not None:
            cli_options.kv_buffer_device(kv_buffer_device, kv_connector, tgt)
        res = eres  # same text/topology/diagnostics fields as a PD expand
    else:
        inv = inventory_opt(inventory)
        res = expand_document(doc, opts, vllm_version=vllm_version, pipeline=pipeline,
                              schema_ref=schema_ref_of(schema_ref), inventory=inv)
        kv_connector = res.plan.connector
    if mooncake_protocol is not None:  # the file's own connector, now known
        cli_options.mooncake_protocol(mooncake_protocol, kv_connector)
    if kv_buffer_device is not None and encoder_split is None:
        cli_options.kv_buffer_device(kv_buffer_device, res.plan.connector, tgt,
                                     overlays=tuple(res.config.platforms or ()))
    if any(sets.values()):
        from dataclasses import replace

        res = replace(res, text=_apply_side_sets(res.text, res.topology, sets, output, vllm_version,
                                                 placed_inventory(inventory_opt(inventory), res.topology)))
    placed = tuple(f"{flag} {v}" for flag, v in (("--prefill-devices", prefill_devices), ("--decode-devices", decode_devices),
                                                  ("--downstream-devices", downstream_devices),
                                                  ("--encoder-devices", encoder_devices)) if v is not None)
    # the input is judged under the pipeline expand split it with, also when expand chose it (a file
    # without `pipeline:`): a stage key that becomes a `vllm serve` flag of the chosen plain-vLLM
    # pipeline is then the input's finding (exit 2), not an expand bug (OPD000)
    source = getattr(getattr(res, "plan", None), "source", None)
    self_check(res.text, doc, vllm_version, output, platform=opts.platform, pipeline=pipeline,
               chosen=getattr(source, "name", None), placed=placed,
                inventory=placed_inventory(inventory_opt(inventory), res.topology))
    diags = [d for d in res.diagnostics if not (quiet and d.severity is Severity.INFO) and d.code not in hide]
    _emit_diags(diags, {doc.name: doc})
    if output is None:
        sys.stdout.write(res.text)
    else:
        atomic_write(output, res.text, protect=[str(src)])
        if not quiet:
            sys.stderr.write(f"wrote {output} ({res.plan.target_pipeline.name}, {len(res.topology.stages)} stages)\n")
            _say_missing_schema(schema_ref_of(schema_ref), output)
    return {d.code for d in res.diagnostics}
