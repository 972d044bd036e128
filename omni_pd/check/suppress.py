"""Suppressing findings, as ruff and yamllint let users do: pure functions, no I/O.

Three mechanisms, applied to the findings of one input file by :func:`apply`:

* an inline directive in a YAML comment, ``# omni-pd: ignore[OPD704, pd-kv-role]``, on the
  line a finding is located at (or on the line of the key it is located at), or alone on
  the line before it (yamllint's ``# yamllint disable-line`` placement). Codes are the
  ``OPDnnn`` codes or the rule names ``omni-pd rules`` prints; text after ``]`` is free
  (a reason). Found by :func:`find_directives` in the file's text.
* selection layers (:class:`Layer`): ``select`` / ``ignore`` lists from the config file
  (``[tool.omni-pd]`` in ``pyproject.toml`` or ``.omni-pd.toml``, read by
  :mod:`omni_pd.check.settings`) and then from ``--select`` / ``--ignore``. As in ruff, a
  later layer's ``select`` replaces the set enabled so far, its ``ignore`` removes from it.
* ``per-file-ignores`` of the config file: glob (relative to the config file's directory,
  or a bare file name) -> codes.

A directive code that suppressed nothing is reported as OPD009 (a warning, like ruff's
RUF100 ``unused-noqa``): no such finding on its line, the code is not enabled there, it is
unknown, or it names a finding that cannot be suppressed. Findings that mean the file
cannot be read or omni-pd failed (:data:`UNSUPPRESSIBLE`) are never suppressed; they stop
``validate`` before any finding exists anyway (``omni_pd/io.py`` raises them).

A selector (in a layer) is a code (``OPD704``), a rule name (``talker-payload-withheld``),
a code prefix (``OPD7``: every code starting so) or ``ALL``; a directive accepts codes and
names only (ruff's ``# noqa`` accepts full codes only).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Iterable, Mapping

from omni_pd.diagnostics import Diagnostic, Location, Severity, sort_key

#: the code of an unused, unknown or malformed suppression (omni_pd/check/codes.py)
UNUSED = "OPD009"

#: findings no mechanism suppresses: omni-pd failed (OPD000) or the input cannot be read
#: as a YAML mapping (OPD001..OPD005, omni_pd/io.py load_file/parse_text)
UNSUPPRESSIBLE = frozenset({"OPD000", "OPD001", "OPD002", "OPD003", "OPD004", "OPD005"})

_CODE = re.compile(r"OPD\d{3}")
_PREFIX = re.compile(r"OPD\d{0,3}")
#: ``# omni-pd: ignore`` then optionally ``[...]``; spaces around ``:`` allowed, case kept
_DIRECTIVE = re.compile(r"#\s*omni-pd\s*:\s*ignore\b")
_SELECTOR = re.compile(r"[^,\s\]]+")


@dataclass(frozen=True)
class Selector:
    """One code or rule name written in a directive, at 1-based ``line``/``column``."""

    text: str
    line: int
    column: int


@dataclass(frozen=True)
class Directive:
    """One ``# omni-pd: ignore[...]`` comment of ``file``. ``line``/``column``: where its
    ``#`` is (1-based); ``target``: the line it applies to (its own line for a trailing
    comment, the next line with content for a comment alone on its line); ``selectors``:
    what is inside the brackets, in order; ``malformed``: no or unclosed brackets, or
    nothing inside them (then it suppresses nothing)."""

    file: str
    line: int
    column: int
    target: int
    selectors: tuple[Selector, ...] = ()
    malformed: bool = False


@dataclass(frozen=True)
class Layer:
    """``select``/``ignore`` selectors from one place (``source``: ``--select``/``--ignore``
    or a config file path); ``select`` None: keep what earlier layers enabled.
    ``per_file_ignores``: (glob, selectors) pairs, globs relative to ``root`` (a posix
    directory path; "" when the layer has no file)."""

    source: str
    select: tuple[str, ...] | None = None
    ignore: tuple[str, ...] = ()
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    root: str = ""


@dataclass(frozen=True)
class Outcome:
    """What :func:`apply` decided: ``kept`` (the findings to show in their input order, each
    OPD009 placed among them by its location), ``suppressed`` (hidden findings)."""

    kept: list[Diagnostic]
    suppressed: list[Diagnostic] = field(default_factory=list)


def _comment_columns(line: str) -> list[int]:
    """0-based columns where a ``# omni-pd: ignore`` may start a YAML comment on ``line``:
    a ``#`` at the start of the line or after a space or tab (YAML 1.2, production [75]
    c-nb-comment-text follows s-separate-in-line)."""
    return [m.start() for m in _DIRECTIVE.finditer(line)
            if m.start() == 0 or line[m.start() - 1] in " \t"]


def _scalar_spans(text: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) (0-based line, column) of every scalar of ``text``, from ruamel.yaml's
    pure-Python parser events, so a ``#`` inside a quoted or block scalar is not a comment.
    Text that does not parse (load_file refuses it before) gives the scalars before the error."""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError
    from ruamel.yaml.events import ScalarEvent

    spans = []
    try:
        for ev in YAML(typ="rt", pure=True).parse(text):
            if isinstance(ev, ScalarEvent) and ev.start_mark is not None and ev.end_mark is not None:
                spans.append(((ev.start_mark.line, ev.start_mark.column), (ev.end_mark.line, ev.end_mark.column)))
    except YAMLError:
        pass  # the scalars before the error still count
    return spans


def find_directives(text: str, file: str) -> list[Directive]:
    """Every suppression directive in the YAML ``text`` of ``file``, in line order.

    Only comments count: a ``#`` inside a quoted, plain or block scalar (``"a # omni-pd:
    ignore[OPD1]"``, a ``|`` block) is text. Cheap when no line mentions ``omni-pd``
    (the scalars are located only then)."""
    if "omni-pd" not in text:
        return []
    lines = text.splitlines()
    cands = [(i, c) for i, ln in enumerate(lines) for c in _comment_columns(ln)]
    if not cands:
        return []
    spans = _scalar_spans(text)

    def in_scalar(i: int, c: int) -> bool:
        return any(s <= (i, c) < e for s, e in spans)

    out: list[Directive] = []
    for i, c in cands:
        if in_scalar(i, c):
            continue
        line = lines[i]
        m = _DIRECTIVE.match(line, c)
        assert m is not None
        rest_at = m.end()
        own_line = not line[:c].strip()
        target = i + 1
        if own_line:  # applies to the next line that is neither blank nor only a comment
            target = next((j + 1 for j in range(i + 1, len(lines))
                           if lines[j].strip() and not lines[j].lstrip().startswith("#")), i + 1)
        sels: list[Selector] = []
        malformed = True
        if line[rest_at:rest_at + 1] == "[":
            close = line.find("]", rest_at)
            if close != -1:
                inner_at = rest_at + 1
                for s in _SELECTOR.finditer(line[inner_at:close]):
                    sels.append(Selector(s.group(0), i + 1, inner_at + s.start() + 1))
                malformed = not sels
        out.append(Directive(file, i + 1, c + 1, target, tuple(sels), malformed))
    return out


def resolve(selector: str, known: Mapping[str, str], *, prefixes: bool = True) -> frozenset[str] | None:
    """The codes ``selector`` names among ``known`` (code -> rule name): a code or a rule
    name (any case, ``_`` for ``-``), with ``prefixes`` a code prefix (``OPD7``) or ``ALL``.
    None when it names none of them."""
    s = selector.strip()
    up = s.upper()
    if _CODE.fullmatch(up):
        return frozenset({up}) if up in known else None
    by_name = {n: c for c, n in known.items()}
    name = s.lower().replace("_", "-")  # as `omni-pd explain` reads names (pd_kv_role is pd-kv-role)
    if name in by_name:
        return frozenset({by_name[name]})
    if prefixes and up == "ALL":
        return frozenset(known)
    if prefixes and _PREFIX.fullmatch(up):
        hit = frozenset(c for c in known if c.startswith(up))
        return hit or None
    return None


def bad_selectors(selectors: Iterable[str], known: Mapping[str, str]) -> list[str]:
    """The selectors of ``selectors`` that name no code of ``known`` (for usage errors)."""
    return [s for s in selectors if resolve(s, known) is None]


def _codes(selectors: Iterable[str], known: Mapping[str, str]) -> set[str]:
    out: set[str] = set()
    for s in selectors:
        out |= resolve(s, known) or set()
    return out


def _relative(file: str, root: str) -> str | None:
    """``file`` (posix) relative to ``root``, or None when it is not below it."""
    try:
        return PurePosixPath(file).relative_to(PurePosixPath(root)).as_posix() if root else None
    except ValueError:
        return None


def enabled(code: str, file: str, layers: Iterable[Layer], known: Mapping[str, str]) -> bool:
    """True when ``code`` is reported for ``file`` (an absolute posix path, or a display
    name such as ``<stdin>``) under ``layers`` (earliest first): every code starts enabled;
    a layer's ``select`` replaces the enabled set, its ``ignore`` removes from it; any
    layer's ``per-file-ignores`` whose glob matches ``file`` (relative to the layer's root,
    or its bare file name for a glob without ``/``) removes its codes last."""
    on = set(known) | {code}
    for layer in layers:
        if layer.select is not None:
            on = _codes(layer.select, known)
        on -= _codes(layer.ignore, known)
    if code not in on:
        return False
    name = PurePosixPath(file).name
    for layer in layers:
        rel = _relative(file, layer.root)
        for glob, sels in layer.per_file_ignores:
            subject = rel if "/" in glob else name
            if subject is not None and fnmatch.fnmatchcase(subject, glob) and code in _codes(sels, known):
                return False
    return True


def _lines(d: Diagnostic, key_lines: Mapping[tuple, int] | None) -> set[int]:
    loc = d.location
    if loc is None or loc.line is None:
        return set()
    out = {loc.line}
    if key_lines and loc.path in key_lines:
        out.add(key_lines[loc.path])
    return out


def _unused(sel: Selector, file: str, why: str, help: str) -> Diagnostic:
    return Diagnostic(code=UNUSED, severity=Severity.WARNING, message=f"unused suppression `{sel.text}`: {why}",
                      location=Location(file=file, line=sel.line, column=sel.column), help=help)


def apply(findings: list[Diagnostic], directives: Mapping[str, list[Directive]], layers: tuple[Layer, ...],
          known: Mapping[str, str], key_lines: Mapping[str, Mapping[tuple, int]] | None = None,
          abs_path: Mapping[str, str] | None = None) -> Outcome:
    """Suppress ``findings`` (one validate run: diagnostics of a file and of the files it
    reads, e.g. its ``base_config``).

    ``directives``: file name (as in ``Location.file``) -> its :func:`find_directives`;
    ``layers``: :class:`Layer` s, the config file's first, then the command line's;
    ``known``: code -> rule name of every code (``omni_pd.check.codes.explainable``);
    ``key_lines``: file -> (YAML path -> line of the key at that path), so a directive on
    a key's line also covers a finding located at its value on a later line;
    ``abs_path``: file name -> absolute posix path for ``per-file-ignores`` (default: the
    name itself).

    Returns the findings left and those suppressed, plus one OPD009 per directive code
    that suppressed nothing (itself subject to the layers, never to a directive)."""
    abs_path = abs_path or {}
    resolved: dict[tuple[str, int, int], frozenset[str] | None] = {}
    for file, ds in directives.items():
        for d in ds:
            for s in d.selectors:
                resolved[(file, s.line, s.column)] = resolve(s.text, known, prefixes=False)
    used: set[tuple[str, int, int, str]] = set()
    kept: list[Diagnostic] = []
    suppressed: list[Diagnostic] = []
    for f in findings:
        if f.code in UNSUPPRESSIBLE:
            kept.append(f)
            continue
        file = f.location.file if f.location else ""
        if not enabled(f.code, abs_path.get(file, file), layers, known):
            suppressed.append(f)
            continue
        lines = _lines(f, (key_lines or {}).get(file))
        hit = False
        for d in directives.get(file, ()):
            if d.target not in lines:
                continue
            for s in d.selectors:
                if f.code in (resolved.get((file, s.line, s.column)) or ()):
                    used.add((file, s.line, s.column, f.code))
                    hit = True
        (suppressed if hit else kept).append(f)
    extra: list[Diagnostic] = []
    for file, ds in directives.items():
        path = abs_path.get(file, file)
        for d in ds:
            if d.malformed:
                extra.append(Diagnostic(
                    code=UNUSED, severity=Severity.WARNING,
                    message="suppression names no code: `# omni-pd: ignore` suppresses only the codes in its brackets",
                    location=Location(file=file, line=d.line, column=d.column),
                    help="write `# omni-pd: ignore[OPDnnn]` (codes or rule names, comma-separated; `omni-pd rules`)"))
                continue
            for s in d.selectors:
                codes = resolved[(file, s.line, s.column)]
                if codes is None:
                    extra.append(_unused(s, file, "not a code or rule name omni-pd knows",
                                         "`omni-pd rules` lists the codes and names"))
                    continue
                (code,) = codes
                if code in UNSUPPRESSIBLE:
                    extra.append(_unused(s, file, f"{code} means the file cannot be read; it cannot be suppressed",
                                         f"fix the input, and remove `{s.text}` from the comment"))
                elif (file, s.line, s.column, code) in used:
                    continue
                elif not enabled(code, path, layers, known):
                    where = ", ".join(ly.source for ly in layers
                                      if ly.select is not None or ly.ignore or ly.per_file_ignores) or "the selection"
                    extra.append(_unused(s, file, f"{code} is not enabled for this file ({where})",
                                         f"remove `{s.text}` from the comment"))
                else:
                    extra.append(_unused(s, file, f"no {code} finding on line {d.target}",
                                         f"remove `{s.text}` from the comment"))
    extra = [x for x in extra if enabled(UNUSED, path_of(x, abs_path), layers, known)]
    return Outcome(_merge(kept, extra), suppressed)


def _merge(kept: list[Diagnostic], extra: list[Diagnostic]) -> list[Diagnostic]:
    """``kept`` in its own order (validate's: by location, a finding caused by another right
    after its cause, omni_pd/check/causes.py) with each of ``extra`` inserted before the first
    kept finding located after it (:func:`omni_pd.diagnostics.sort_key`)."""
    out = list(kept)
    for x in sorted(extra, key=sort_key):
        at = next((i for i, k in enumerate(out) if k.code != UNUSED and sort_key(k) > sort_key(x)), len(out))
        out.insert(at, x)  # the OPD009s before ``at`` sort before x: inserted earlier, in order
    return out


def path_of(d: Diagnostic, abs_path: Mapping[str, str]) -> str:
    """The absolute path of ``d``'s file for :func:`enabled` (its name when unknown)."""
    file = d.location.file if d.location else ""
    return abs_path.get(file, file)


def count_note(outcome: Outcome) -> str:
    """``"; 2 suppressed"`` for a verdict line, "" when nothing was suppressed."""
    n = len(outcome.suppressed)
    return f"; {n} suppressed" if n else ""

