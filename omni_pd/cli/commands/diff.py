"""``omni-pd diff``: what expand (or a migration) changed, stage by stage (omni_pd/compile/diff.py)."""

import sys
from pathlib import Path
from typing import Literal, Optional

import typer

from omni_pd.cli.options import PLATFORM
from omni_pd.cli.output import say_linear_chain
from omni_pd.cli.shared import resolve_doc
from omni_pd.cli_validate import _emit_diags
from omni_pd.diagnostics import Diagnostic, OmniPdError, Severity


def diff_cmd(
    before: Path = typer.Argument(..., help="the deploy config given to `omni-pd expand`"),
    after: str = typer.Argument(..., help="what expand wrote (- reads stdin)"),
    pipeline: Optional[str] = typer.Option(None, "--pipeline", help="pipeline of BEFORE when the file does not say"),
    platform: Optional[PLATFORM] = typer.Option(None, "--platform", help="compare with platforms.<P> applied to both"),
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
        a_topo, a_plain = resolve_doc(a_doc, pipeline, platform)
        b_topo, b_plain = resolve_doc(b_doc, None, platform)
        if pipeline is None and a_topo.pipeline.linear_chain and not a_topo.config.pipeline \
                and b_topo.pipeline.base:
            # BEFORE says nothing about its pipeline: it is the one AFTER was split from
            a_topo, a_plain = resolve_doc(a_doc, b_topo.pipeline.base, platform)
        if _is_split(a_topo) and _is_split(b_topo):  # `diff OUT OUT`: both already split
            again = f"omni-pd diff IN {b_doc.name}" if after != "-" else "omni-pd diff IN OUT"
            raise OmniPdError(Diagnostic(
                code="OPD008", severity=Severity.ERROR,
                location=a_doc.loc(("pipeline",), value=True) if "pipeline" in a_doc.tree else a_doc.loc(()),
                message=f"{a_doc.name} is already a prefill/decode split ({a_topo.pipeline.name}): diff compares the "
                        "file expand read with what it wrote, stage by stage",
                help=f"give the three-stage file expand read first: `{again}` (two splits compare as text: "
                     f"`diff -u {a_doc.name} {b_doc.name}`)"))
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
    say_linear_chain(a_topo, a_doc.name, pipeline, verb="compared")
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
