"""One probe for the rule branch tests (tests/test_rule_branches_<module>.py): what validate
reports under one code, as plain tuples a test compares whole."""

from __future__ import annotations

from omni_pd.check.validate import ValidateOptions, options_from_example, validate_text


def found(text: str, code: str, ctx: dict | None = None, opts: ValidateOptions | None = None, *,
          notes: bool = False) -> list[tuple]:
    """(severity, message, (line, column), help, [(line, column, label) of related]) of each
    ``code`` diagnostic, in validate's order, with ``list(notes)`` appended when ``notes``;
    also checks that no rule crashed (OPD000). ``ctx``: a rule example's context
    (``options_from_example``); ``opts``: options given directly instead."""
    res = validate_text(text, "t.yaml", opts if opts is not None else options_from_example(ctx or {}))
    assert [d.message for d in res.diagnostics if d.code == "OPD000"] == []
    return [(d.severity.value, d.message, (d.location.line, d.location.column) if d.location else None, d.help,
             [(r.line, r.column, r.label) for r in d.related], *([list(d.notes)] if notes else []))
            for d in res.diagnostics if d.code == code]


def found_with_notes(text: str, code: str, ctx: dict | None = None, opts: ValidateOptions | None = None) -> list[tuple]:
    """:func:`found` with each diagnostic's notes as a sixth element."""
    return found(text, code, ctx, opts, notes=True)


def col(text: str, needle: str, nth: int = 0) -> tuple[int, int]:
    """1-based (line, column) of the ``nth`` ``needle`` in ``text``: an oracle for locations
    independent of validate's locator. Raises ValueError when ``text`` has fewer."""
    at = -1
    for _ in range(nth + 1):
        at = text.index(needle, at + 1)
    before = text[:at]
    return before.count("\n") + 1, len(before) - before.rfind("\n")


def cli_in(cwd, capsys, *args: str) -> tuple[int, str, str]:
    """``omni-pd ARGS`` run in-process with ``cwd`` as the working directory (so
    diagnostics print paths relative to it): (exit status, stdout, stderr)."""
    import os

    from omni_pd.cli import main

    old = os.getcwd()
    os.chdir(cwd)
    try:
        rc = main(list(args))
    finally:
        os.chdir(old)
    out = capsys.readouterr()
    return rc, out.out, out.err


def validate_cli(tmp_path, capsys, name: str, text: str, *args: str) -> tuple[int, str]:
    """``omni-pd validate [args] NAME`` run in-process from ``tmp_path`` on ``text`` written
    there as ``NAME`` (so diagnostics print the bare name): (exit status, stdout)."""
    (tmp_path / name).write_text(text)
    rc, out, _ = cli_in(tmp_path, capsys, "validate", *args, name)
    return rc, out
