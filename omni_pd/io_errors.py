"""YAML syntax errors as omni-pd diagnostics (OPD002), not ruamel.yaml's parser text.

ruamel.yaml reports where its parser gave up (``expected ',' or '}', but got '-'``,
``expected <block end>, but found '?'``, ``mapping values are not allowed here``), which is
often lines after the mistake. Its error carries two marks (ruamel.yaml error.py
``MarkedYAMLError``): ``context_mark``, where the construct being parsed began (the ``{`` or
``[`` of a flow collection, the opening quote of a string, the first entry of a block), and
``problem_mark``, where parsing stopped. :func:`syntax_diagnostic` reads both against the
source text and says what is wrong in the user's terms:

- an unclosed ``{``/``[``/quote is located at the line that opened it, with where the
  parser stopped as a note and the line to close it on as help;
- a closing bracket of the other kind (``{a: 1]``) is located at that bracket;
- a key indented deeper than its siblings (read as more of the previous value: "mapping
  values are not allowed here"), a block entry that lines up with no sibling ("expected
  <block end>"), a second ``: `` in a plain value, and a tab used as indentation each get
  their own headline and help;
- anything else keeps ruamel's words, with both marks.

Every message starts with ``invalid YAML:``. Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

from omni_pd.diagnostics import Diagnostic, Location, Severity

_CLOSER = {"{": "}", "[": "]"}
_KIND = {"{": "mapping", "[": "list"}


def _lines(text: str) -> list[str]:
    return text.split("\n")


def _at(lines: list[str], line0: int, col0: int) -> str:
    """The character at 0-based (line, column), '' past the end."""
    if 0 <= line0 < len(lines) and 0 <= col0 < len(lines[line0]):
        return lines[line0][col0]
    return ""


def _word(lines: list[str], line0: int, col0: int) -> str:
    """The key or scalar starting at (line, column): up to ``:``, ``,``, a bracket or a blank."""
    s = lines[line0][col0:] if 0 <= line0 < len(lines) else ""
    out = ""
    for ch in s:
        if ch in ":,{}[]#" or ch.isspace():
            break
        out += ch
    return out or s[:1]


def _content(line: str) -> bool:
    s = line.strip()
    return bool(s) and not s.startswith("#")


def _key_column(line: str) -> int:
    """0-based column of the first key on a block line (after any ``- `` item markers)."""
    i = len(line) - len(line.lstrip(" "))
    while line[i:i + 2] == "- " or line[i:] == "-":
        i += 1
        while i < len(line) and line[i] == " ":
            i += 1
    return i


def _found(lines: list[str], mark: Any) -> str:
    """What the parser met at ``mark``, in words: ``end of file``, ``a list item `- ` `` or
    the text there in backticks."""
    ch = _at(lines, mark.line, mark.column)
    if not ch and (mark.line >= len(lines) - 1 or not any(_content(x) for x in lines[mark.line:])):
        return "the end of the file"
    if ch == "-" and _at(lines, mark.line, mark.column + 1) in (" ", ""):
        return "a list item `- `"
    if ch == ":" and mark.line < len(lines):  # a key: the plain value before it ran on to it
        kc = _key_column(lines[mark.line])
        if kc < mark.column:
            return f"the key `{lines[mark.line][kc:mark.column].strip()}`"
    return f"`{_word(lines, mark.line, mark.column)}`"


def _last_content_line(lines: list[str], before0: int) -> int | None:
    """1-based number of the last non-blank, non-comment line before 0-based ``before0``."""
    for i in range(min(before0, len(lines)) - 1, -1, -1):
        if _content(lines[i]):
            return i + 1
    return None


def syntax_diagnostic(e: Any, text: str, name: str) -> Diagnostic:
    """The OPD002 diagnostic for ruamel.yaml's ``MarkedYAMLError`` ``e`` raised on ``text``
    (the file ``name``). Lines and columns are 1-based. Never raises."""
    lines = _lines(text)
    cm, pm = e.context_mark, e.problem_mark
    context, problem = (e.context or "").strip(), (e.problem or "").strip()

    def loc(mark: Any, label: str | None = None) -> Location:
        return Location(file=name, line=mark.line + 1, column=mark.column + 1, label=label)

    def diag(message: str, where: Any, *, help: str, label: str | None = None,
             related: list[Location] | None = None) -> Diagnostic:
        return Diagnostic(code="OPD002", severity=Severity.ERROR, message=f"invalid YAML: {message}",
                          location=loc(where) if where is not None else Location(file=name),
                          help=help, label=label, related=list(related or []))

    opener = _at(lines, cm.line, cm.column) if cm is not None else ""
    if context.startswith("while parsing a flow") and opener in _CLOSER and pm is not None:
        closer, kind = _CLOSER[opener], _KIND[opener]
        got = _at(lines, pm.line, pm.column)
        where = f"line {cm.line + 1}, column {cm.column + 1}"
        if got in ("}", "]") and got != closer:
            return diag(f"`{got}` cannot close the `{opener}` opened at {where}", pm,
                        label=f"expected `,` or `{closer}`",
                        related=[loc(cm, f"the flow {kind} opened here")],
                        help=f"write `{closer}` to close the {kind}, or `{'[' if got == ']' else '{'}` where this one should open")
        if pm.line == cm.line:
            return diag(f"expected `,` or `{closer}` in the flow {kind} opened at column {cm.column + 1}, "
                        f"found {_found(lines, pm)}", pm, label=f"expected `,` or `{closer}` before this",
                        related=[loc(cm, f"the flow {kind} opened here")],
                        help=f"separate the entries with `, ` and close the {kind} with `{closer}`")
        end = _last_content_line(lines, pm.line) or cm.line + 1
        return diag(f"unclosed `{opener}`: the flow {kind} opened here is not closed before "
                    f"{_found(lines, pm)} at line {pm.line + 1}", cm, label=f"this `{opener}` is never closed",
                    related=[loc(pm, f"expected `,` or `{closer}` before this")],
                    help=f"close it with `{closer}` at the end of line {end}, or write the {kind} in block style")
    if context == "while scanning a quoted scalar" and cm is not None and opener in ("'", '"'):
        return diag(f"unclosed `{opener}`: the quoted string opened here is never closed", cm,
                    label="this quote is never closed",
                    related=[loc(pm, "the end of the file is reached inside the string")] if pm is not None else [],
                    help=f"add the closing `{opener}` on line {cm.line + 1}")
    if problem.startswith("expected <block end>") and pm is not None and cm is not None:
        word = _word(lines, pm.line, pm.column)
        first = lines[cm.line] if cm.line < len(lines) else ""
        if _at(lines, cm.line, cm.column) == "-":  # a block list
            item_col = _key_column(first) + 1
            return diag(f"bad indentation: `{word}` (column {pm.column + 1}) is inside the list that starts at "
                        f"line {cm.line + 1} but is not an item of it", pm, label="neither a `- ` item nor a key of one",
                        related=[loc(cm, "the list starts here")],
                        help=f"indent it to column {item_col} to make it a key of the item above, or start a new item with `- `")
        return diag(f"bad indentation: `{word}` (column {pm.column + 1}) does not line up with the keys of the "
                    f"mapping at line {cm.line + 1} (column {cm.column + 1})", pm, label="here",
                    related=[loc(cm, "the mapping's first key")],
                    help=f"indent it to column {cm.column + 1} like its sibling keys, or under the key it belongs to")
    if problem == "mapping values are not allowed here" and pm is not None:
        line = lines[pm.line] if pm.line < len(lines) else ""
        kc = _key_column(line)
        head = line[kc:pm.column]
        if ": " in head or head.endswith(":"):  # a second `: ` on one line
            key, _, rest = line[kc:].partition(":")
            value = rest.strip()
            return diag("a plain value cannot contain `: `", pm, label="second `: ` on this line",
                        help=f"quote the value: `{key}: \"{value}\"`" if '"' not in value else "quote the value")
        prev = _last_content_line(lines, pm.line)
        if prev is not None and head.strip() and " " not in head.strip():
            pline = lines[prev - 1]
            pk = _key_column(pline)
            pword = _word(lines, prev - 1, pk)
            prev2 = _last_content_line(lines, prev - 1)
            if kc > pk and prev2 is not None and _key_column(lines[prev2 - 1]) == kc:
                # the key above is the odd one out: dedented between keys at column kc (a
                # `kv_role` moved out of `kv_transfer_config:`); lining the next key up
                # with it would move the rest of the block out too
                owner = next((i for i in range(prev2 - 1, -1, -1)
                              if _content(lines[i]) and _key_column(lines[i]) < kc), None)
                oword = _word(lines, owner, _key_column(lines[owner])) if owner is not None else None
                ends = (f"so YAML ends the mapping of `{oword}` (line {owner + 1}) before it" if oword
                        else "so YAML ends the mapping above before it")
                back = f", back under `{oword}` (line {owner + 1})" if oword else ""
                return diag(f"bad indentation: `{pword}` (line {prev}, column {pk + 1}) is less indented than the "
                            f"keys around it (column {kc + 1}), {ends}", _Mark(prev - 1, pk),
                            label="dedented",
                            related=[Location(file=name, line=pm.line + 1, column=kc + 1,
                                              label=f"`{head.strip()}` is read as more of its value")],
                            help=f"indent `{pword}` to column {kc + 1}{back} like the keys around it")
            if kc > pk:
                return diag(f"bad indentation: `{head.strip()}` (column {kc + 1}) is deeper than `{pword}` "
                            f"(line {prev}, column {pk + 1}), so YAML reads it as more of line {prev}'s value",
                            _Mark(pm.line, kc),
                            label="indented too far",
                            related=[Location(file=name, line=prev, column=pk + 1, label=f"`{pword}` is here")],
                            help=f"line `{head.strip()}` up with `{pword}` at column {pk + 1}")
        return diag("`: ` is not allowed here (a plain value cannot contain it)", pm,
                    help="quote the value, or put the key on a line of its own")
    if "'\\t'" in problem and pm is not None:
        return diag("a tab character: YAML indents with spaces only", pm, label="tab",
                    help="replace the tab with spaces")
    related = [loc(cm, context or "context")] if cm is not None and pm is not None and cm is not pm else []
    return diag(problem or context or "cannot parse", pm or cm, related=related,
                help="fix the YAML syntax at this position")


class _Mark:
    """A 0-based (line, column) position, shaped like ruamel.yaml's marks."""

    def __init__(self, line: int, column: int):
        self.line, self.column = line, column
