"""Diagnostics: what the compiler says, where, and what to write instead.

A :class:`Diagnostic` carries a stable rule code (``OPDnnn``), a severity, a one-line
headline, the location of the offending key (file:line:col, 1-based), related
locations (the other side of a prefill/decode pair) and a ``help`` line. Renderers
turn a list of diagnostics into rustc-style text or JSON; they never decide anything.

Exit status convention (shared by every command): 0 no errors (warnings and infos
allowed), 1 errors found, 2 input unreadable or bad usage.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable


class Severity(str, enum.Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        return {"error": 0, "warning": 1, "info": 2}[self.value]


@dataclass(frozen=True)
class Location:
    """A place in an input file. ``line``/``column`` are 1-based; either may be None."""

    file: str
    line: int | None = None
    column: int | None = None
    path: tuple[Any, ...] = ()
    label: str | None = None

    def __str__(self) -> str:
        s = self.file
        if self.line is not None:
            s += f":{self.line}"
            if self.column is not None:
                s += f":{self.column}"
        return s

    def dotted(self) -> str:
        """The YAML path as ``stages[0].kv_transfer_config.kv_role``."""
        out = ""
        for p in self.path:
            out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
        return out


@dataclass(frozen=True)
class Edit:
    """The exact replacement a finding carries (``validate --fix``/``--diff`` apply it): the text
    ``old`` at ``line``:``column`` (1-based, where the finding points; a quoted scalar may stand
    there with its quotes) becomes ``new``. Only findings whose help names one certain
    replacement carry one (a key typo, reversed ``kv_role``s, a misspelt connector name)."""

    line: int
    column: int
    old: str
    new: str

    def describe(self) -> str:
        """``line:col: `old` -> `new` ``, for the list ``--fix`` prints."""
        return f"{self.line}:{self.column}: `{self.old}` -> `{self.new}`"


@dataclass(frozen=True)
class Diagnostic:
    """One finding. ``code`` is stable (see ``omni-pd rules``); ``message`` is one line."""

    code: str
    severity: Severity
    message: str
    location: Location | None = None
    help: str | None = None
    related: list[Location] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    label: str | None = None  # text under the caret
    #: key paths (``("stages", 1, "tensor_parallel_size")``, stage index as the rules see it)
    #: whose values this finding judged, set or defaulted; and the paths this finding leaves at
    #: their default (a misspelt key: the key meant). check/causes.py orders by them.
    reads: tuple[tuple[Any, ...], ...] = field(default=(), compare=False)
    shadows: tuple[tuple[Any, ...], ...] = field(default=(), compare=False)
    #: the replacement that fixes this finding, when exactly one does (:class:`Edit`)
    edit: Edit | None = field(default=None, compare=False)

    def to_dict(self) -> dict[str, Any]:
        def loc(l: Location | None) -> dict[str, Any] | None:
            if l is None:
                return None
            return {"file": l.file, "line": l.line, "column": l.column,
                    "path": l.dotted() or None, "label": l.label}

        return {
            "code": self.code,
            "severity": self.severity.value,
            "message": self.message,
            "location": loc(self.location),
            "label": self.label,
            "help": self.help,
            "notes": list(self.notes),
            "related": [loc(r) for r in self.related],
        }


class OmniPdError(Exception):
    """A fatal, located problem with the input or the invocation.

    Carries the :class:`Diagnostic` to show and the process exit code (2 for
    unreadable input or bad usage). The CLI renders it; it never becomes a traceback.
    """

    def __init__(self, diagnostic: Diagnostic, exit_code: int = 2):
        super().__init__(diagnostic.message)
        self.diagnostic = diagnostic
        self.exit_code = exit_code



def located_error(code: str, name: str, message: str, line: int | None = None,
                  col: int | None = None, help: str | None = None,
                  related: list | None = None) -> OmniPdError:
    """An :class:`OmniPdError` (exit code 2) carrying one ERROR :class:`Diagnostic` with
    ``code`` at ``name`` (the file as the user named it), 1-based ``line``/``col`` when
    known, ``help`` and ``related`` locations: unreadable input (omni_pd/io.py) or output
    that cannot be written (omni_pd/io_write.py)."""
    return OmniPdError(
        Diagnostic(code=code, severity=Severity.ERROR, message=message,
                   location=Location(file=name, line=line, column=col),
                   help=help, related=related or []),
        exit_code=2,
    )


def sort_key(d: Diagnostic) -> tuple:
    loc = d.location
    return (loc.file if loc else "", loc.line or 0 if loc else 0,
            loc.column or 0 if loc else 0, d.severity.rank, d.code)


def render_text(diags: Iterable[Diagnostic], line_source: Callable[[str, int], str | None] | None = None) -> str:
    """rustc-style text::

        error[OPD304]: prefill and decode use different (or no) KV connectors
          --> pd.yaml:41:21
           |
        41 |       kv_connector: NixlConnector
           |                     ^^^^^^^^^^^^^ decode uses NixlConnector
           = note: prefill (stage 0) uses MooncakeConnector at pd.yaml:18:21
           = help: use the same kv_connector on both stages of the PD pair

    ``line_source(file, line)`` returns the text of a source line, or None. Text that
    comes from the input (keys, values, source lines) is shown with control and
    separator characters escaped (:func:`printable`).
    """
    out: list[str] = []
    for d in diags:
        out.append(f"{d.severity.value}[{d.code}]: {printable(d.message)}")
        loc = d.location
        gutter = 1
        if loc is not None:
            src = line_source(loc.file, loc.line) if (line_source and loc.line) else None
            gutter = len(str(loc.line)) if loc.line else 1
            pad = " " * gutter
            out.append(f"{pad}--> {printable(str(loc))}")
            if src is not None:
                col = (loc.column or 1) - 1
                before, rest = printable(src[:col]), src[col:]
                width = len(printable(rest[:_token_width(rest, flow=_in_flow(src[:col]))]))
                out.append(f"{pad} |")
                out.append(f"{loc.line} | {before}{printable(rest)}")
                caret = " " * len(before) + "^" * max(width, 1)
                out.append(f"{pad} | {caret}" + (f" {printable(d.label)}" if d.label else ""))
        pad = " " * gutter
        for r in d.related:
            what = r.label or "related"
            out.append(f"{pad} = note: {printable(f'{what}: {r}')}")
        for n in d.notes:
            out.append(f"{pad} = note: {printable(n)}")
        if d.help:
            out.append(f"{pad} = help: {printable(d.help)}")
        out.append("")
    return "\n".join(out)


def printable(text: str) -> str:
    """``text`` with every non-printable character (controls such as ESC or NUL, line
    and paragraph separators, bidi overrides, tabs) written as a Python escape, so a key
    or value from the input can neither break a diagnostic across lines nor send
    terminal escape sequences. Printable text is returned unchanged."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _token_width(rest: str, flow: bool = True) -> int:
    """Width of the key or scalar starting a source fragment (at least 1).

    A quoted scalar spans its quotes (``"2,3,4,5"`` is 9 wide: a ``,`` or space inside
    quotes does not end it; ``\\"`` in double and ``''`` in single quotes are escapes),
    to the end of the line when it continues on the next. A plain scalar ends at ``:``,
    ``#``, a bracket or a space; at ``,`` only inside a flow collection (``flow``), since
    ``devices: 2,3`` in block context is the one scalar ``2,3`` (YAML 1.2, 7.3.3)."""
    if not rest:
        return 1
    if rest[0] in "\"'":
        q, i = rest[0], 1
        while i < len(rest):
            if q == '"' and rest[i] == "\\":
                i += 2
                continue
            if rest[i] == q:
                if q == "'" and rest[i + 1:i + 2] == "'":
                    i += 2
                    continue
                return i + 1
            i += 1
        return len(rest.rstrip())
    stop = len(rest)
    stops = ":#,{}[]" if flow else ":#{}[]"
    for i, ch in enumerate(rest):
        if ch in stops or (ch == " " and i > 0 and rest[i - 1] != "-"):
            stop = i
            break
    return max(1, len(rest[:stop].rstrip()))


def _in_flow(before: str) -> bool:
    """True when a line's text before a column leaves a ``{`` or ``[`` open (the column
    is inside a flow collection; a quoted ``{`` does not count). One line only: the
    continuation lines of a multi-line flow collection read as block context."""
    depth, quote = 0, ""
    for ch in before:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth = max(0, depth - 1)
    return depth > 0


def render_json(diags: Iterable[Diagnostic]) -> str:
    """A JSON array of :meth:`Diagnostic.to_dict` objects, sorted by location."""
    return json.dumps([d.to_dict() for d in diags], indent=2, sort_keys=False)


def render_concise(diags: Iterable[Diagnostic]) -> str:
    """One line per finding, ``file:line:col: severity[CODE] message`` (as ruff's concise
    output and yamllint's parsable format), for editors, grep and CI logs; "" for none."""
    out = []
    for d in diags:
        loc = d.location
        where = str(loc) if loc is not None else "-"
        out.append(f"{where}: {d.severity.value}[{d.code}] {d.message}\n")
    return "".join(out)


def _gh_escape(text: str, prop: bool = False) -> str:
    """GitHub Actions workflow-command escaping (actions/toolkit ``escapeData`` /
    ``escapeProperty``)."""
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if prop else text


def render_github(diags: Iterable[Diagnostic]) -> str:
    """One GitHub Actions workflow command per finding (``::error file=F,line=L,col=C,
    title=CODE::message``; warning ``::warning``, info ``::notice``), which annotate the
    file in a pull request; the help follows the message on a line of its own."""
    level = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}
    out = []
    for d in diags:
        props = []
        loc = d.location
        if loc is not None and loc.file:
            props.append(f"file={_gh_escape(loc.file, True)}")
            if loc.line is not None:
                props.append(f"line={loc.line}")
                if loc.column is not None:
                    props.append(f"col={loc.column}")
        props.append(f"title={_gh_escape(d.code, True)}")
        msg = d.message + (f"\nhelp: {d.help}" if d.help else "")
        out.append(f"::{level[d.severity]} {','.join(props)}::{_gh_escape(msg)}\n")
    return "".join(out)


def summary(diags: list[Diagnostic]) -> str:
    e = sum(d.severity is Severity.ERROR for d in diags)
    w = sum(d.severity is Severity.WARNING for d in diags)
    i = sum(d.severity is Severity.INFO for d in diags)
    return f"{e} error{'s' if e != 1 else ''}, {w} warning{'s' if w != 1 else ''}, {i} info"


def exit_code(diags: Iterable[Diagnostic]) -> int:
    """0 when no diagnostic is an error, else 1."""
    return 1 if any(d.severity is Severity.ERROR for d in diags) else 0
