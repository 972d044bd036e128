"""``omni-pd migrate``: a legacy ``stage_args`` file (or a ``stages:`` file of another release)
into the target release's ``stages:`` form (omni_pd/compile/migrate.py, docs/migrate.md).
"""

import sys
from pathlib import Path
from typing import Optional

import typer

from omni_pd.cli_validate import _emit_diags
from omni_pd.diagnostics import OmniPdError, Severity


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
    from omni_pd.io import load_file, parse_text
    from omni_pd.io_write import atomic_write

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
