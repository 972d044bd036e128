"""``validate --fix`` / ``--diff``: apply the exact replacements findings carry (issue 36 item 11).

A finding carries an :class:`~omni_pd.diagnostics.Edit` only when its help names one certain
replacement (a misspelt key whose meant key is not set, reversed ``kv_role``s, a misspelt
connector name); everything else stays for the user. Edits are text edits at the finding's
line and column, as ruff's fixes are: the rest of the file (comments, quotes, key order,
blank lines) is left byte for byte. Pure functions; the CLI reads and writes the files.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass

from omni_pd.diagnostics import Diagnostic, Edit


@dataclass(frozen=True)
class FixResult:
    """What :func:`apply_edits` did: the new ``text``, the edits ``applied`` (in file order) and
    the ones ``skipped`` with why (the text there is not the edit's ``old``, or two edits overlap)."""

    text: str
    applied: tuple[Edit, ...]
    skipped: tuple[tuple[Edit, str], ...]


def edits_of(diagnostics: Iterable[Diagnostic]) -> list[Edit]:
    """The distinct edits the findings carry, in file order (line, column)."""
    return sorted({d.edit for d in diagnostics if d.edit is not None}, key=lambda e: (e.line, e.column, e.old))


def _span(line: str, col: int, old: str) -> tuple[int, int, str] | None:
    """``(start, end, quote)`` of the token ``old`` at 1-based ``col`` of ``line``: plain, or inside
    ``'...'``/``"..."`` (the quotes stay and ``quote`` names them); None when it is not there."""
    i = col - 1
    if line.startswith(old, i) and not (line[i + len(old):i + len(old) + 1].isalnum()
                                        or line[i + len(old):i + len(old) + 1] == "_"):
        return i, i + len(old), ""
    for q in ("'", '"'):
        if line.startswith(q + old + q, i):
            return i + 1, i + 1 + len(old), q
    return None


def apply_edits(text: str, edits: Iterable[Edit]) -> FixResult:
    """Apply ``edits`` to ``text`` (a YAML file's text, lines as the finding's locations count
    them). An edit whose ``old`` is not at its place, or that overlaps one already taken, is
    skipped with the reason. Line endings and everything outside the edited tokens are kept."""
    lines = text.splitlines(keepends=True)
    taken: dict[int, list[tuple[int, int]]] = {}
    plan: list[tuple[Edit, int, int]] = []
    skipped: list[tuple[Edit, str]] = []
    for e in sorted(set(edits), key=lambda e: (e.line, e.column, e.old)):
        if not 1 <= e.line <= len(lines):
            skipped.append((e, f"line {e.line} is not in the file"))
            continue
        span = _span(lines[e.line - 1], e.column, e.old)
        if span is None:
            skipped.append((e, f"`{e.old}` is not at {e.line}:{e.column}"))
            continue
        start, end, _q = span
        if any(start < b and a < end for a, b in taken.get(e.line, [])):
            skipped.append((e, "overlaps another fix"))
            continue
        taken.setdefault(e.line, []).append((start, end))
        plan.append((e, start, end))
    for e, start, end in sorted(plan, key=lambda p: (p[0].line, p[1]), reverse=True):
        ln = lines[e.line - 1]
        lines[e.line - 1] = ln[:start] + e.new + ln[end:]
    return FixResult("".join(lines), tuple(e for e, _s, _e in sorted(plan, key=lambda p: (p[0].line, p[1]))),
                     tuple(skipped))


def unified_diff(name: str, before: str, after: str) -> str:
    """``diff -u`` of ``before`` -> ``after`` with ``a/name`` and ``b/name`` headers (``""`` when equal)."""
    return "".join(difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                        fromfile=f"a/{name}", tofile=f"b/{name}"))
