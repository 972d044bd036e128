"""What ``omni-pd explain CODE`` prints, for a rule or a catalogued code (pure text).

Doc paragraphs come from docstrings: they are dedented (:func:`inspect.cleandoc`) and
their reStructuredText double-backtick literals are rendered as Markdown backticks in
plain text, or as highlighted code with rich markup for a terminal.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from omni_pd.check.codes import CodeDoc

_LITERAL = re.compile(r"``(.+?)``", re.S)


def plain_literals(text: str) -> str:
    """``text`` with every ``\\`\\`x\\`\\``` literal written as ```x``` (Markdown)."""
    return _LITERAL.sub(lambda m: f"`{m.group(1)}`", text)


def rich_literals(text: str) -> str:
    """``text`` as rich console markup: brackets escaped, literals highlighted."""
    from rich.markup import escape

    out, last = [], 0
    for m in _LITERAL.finditer(text):
        out.append(escape(text[last:m.start()]))
        out.append(f"[bold cyan]{escape(m.group(1))}[/]")
        last = m.end()
    out.append(escape(text[last:]))
    return "".join(out)


def _norm_name(word: str) -> str:
    return word.strip().lower().replace("_", "-")


def resolve(word: str, entries: dict[str, Any]) -> tuple[Any | None, str | None]:
    """The entry ``word`` names in ``entries`` (code -> Rule/CodeDoc, as
    :func:`omni_pd.check.codes.explainable` returns), and otherwise a suggestion.

    ``word`` is a code (``OPD302``, any case) or a rule name as ``omni-pd rules`` prints it
    (``pd-kv-role``; ``pd_kv_role`` too). Returns ``(entry, None)`` when it names one, else
    ``(None, near)``: ``near`` is ``"OPD302 (pd-kv-role)"`` only for a near miss: a code with
    a letter for a digit (``OPD3O2``), two adjacent characters swapped (``OPD320``), or the
    one code a single edit away; a name at least 80 % alike (difflib); None when nothing
    is near (no guess for ``OPD999``, ``OPD30`` (nine codes are one digit away) or ``hello``)."""
    from difflib import SequenceMatcher, get_close_matches

    code = word.strip().upper()
    if code in entries:
        return entries[code], None
    by_name = {_norm_name(e.name): c for c, e in entries.items()}
    name = _norm_name(word)
    if name in by_name:
        return entries[by_name[name]], None

    def show(c: str) -> str:
        return f"{c} ({entries[c].name})"

    if re.fullmatch(r"OPD\w{1,4}", code):
        alike = "OPD" + code[3:].translate(_LOOKALIKE)
        if alike in entries:
            return None, show(alike)
        for near in ([c for c in entries if _swapped(code, c)], [c for c in entries if _one_edit(code, c)]):
            if len(near) == 1:
                return None, show(near[0])
        return None, None
    close = get_close_matches(name, list(by_name), n=1, cutoff=0.8)
    if close and SequenceMatcher(None, name, close[0]).ratio() >= 0.8:
        return None, show(by_name[close[0]])
    return None, None


#: letters typed for the digits they look like (OPD3O2, OPD1l0)
_LOOKALIKE = str.maketrans({"O": "0", "I": "1", "L": "1", "S": "5", "B": "8"})


def _swapped(a: str, b: str) -> bool:
    """True when ``b`` is ``a`` with two adjacent characters swapped (OPD320 -> OPD302)."""
    return len(a) == len(b) and any(a[:i] + a[i + 1] + a[i] + a[i + 2:] == b for i in range(len(a) - 1))


def _one_edit(a: str, b: str) -> bool:
    """True when ``a`` becomes ``b`` by one substitution, insertion or deletion."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b)) == 1
    short, long_ = (a, b) if len(a) < len(b) else (b, a)
    return any(long_[:i] + long_[i + 1:] == short for i in range(len(long_)))


def _indent(s: str) -> str:
    return "\n".join("    " + line if line else "" for line in s.splitlines())


def _ctx(ctx: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in ctx.items()) or "none"


#: the heading of a rule's further examples, one ``fires|passes: name`` a line
EXAMPLES = "More examples (each is a test)"


def sections(entry: Any) -> list[tuple[str, str, bool]]:
    """The parts of an explanation as ``(heading, body, is_yaml)``; heading "" for the
    title, summary and doc. ``entry`` is a :class:`~omni_pd.check.rules.Rule` or a
    :class:`~omni_pd.check.codes.CodeDoc`."""
    title = f"{entry.code} {entry.name} ({entry.severity.value}, {entry.family})"
    out = [("", title, False), ("", entry.summary, False)]
    if getattr(entry, "runtime_scope", None):
        out.append(("Runtime", entry.runtime_scope, False))
    out.append(("", inspect.cleandoc(entry.doc), False))
    if isinstance(entry, CodeDoc):
        out.append(("Emitted by", entry.emitted_by, False))
        if entry.exit is not None:
            out.append(("Exit status", str(entry.exit), False))
        return out
    out += [("Fails", entry.fail.strip(), True), ("Passes", entry.passing.strip(), True)]
    if entry.example_context:
        out.append(("Context of the failing example", _ctx(entry.example_context), False))
    if entry.pass_context is not None:
        out.append(("Context of the passing example", _ctx(entry.pass_context), False))
    if entry.examples:
        out.append((EXAMPLES, "\n".join(
            f"{'fires' if e.fires else 'passes'}: {e.name}" for e in entry.examples), False))
    return out


def explain_text(entry: Any) -> str:
    """Plain text (pipes, files, tests): headings end with ':', examples indented 4."""
    lines: list[str] = []
    for head, body, yaml in sections(entry):
        if not head:
            lines += [plain_literals(body), ""]
        elif yaml:
            lines += [f"{head}:", "", _indent(body), ""]
        elif head == EXAMPLES:
            lines += [f"{head}:"] + [f"  {plain_literals(x)}" for x in body.splitlines()] + [""]
        else:
            lines += [f"{head}: {plain_literals(body)}", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def print_rich(entry: Any, console: Any) -> None:
    """Print the explanation on a rich ``console`` (a terminal): bold title,
    highlighted literals, YAML examples syntax-highlighted."""
    from rich.syntax import Syntax

    for i, (head, body, yaml) in enumerate(sections(entry)):
        if i == 0:
            console.print(f"[bold]{rich_literals(body)}[/]")
        elif not head:
            console.print(rich_literals(body))
        elif yaml:
            console.print(f"[bold]{head}:[/]")
            console.print(Syntax(body, "yaml", theme="ansi_dark", background_color="default", padding=(0, 4)))
        elif head == EXAMPLES:
            console.print(f"[bold]{head}:[/]\n" + "\n".join(f"  {rich_literals(x)}" for x in body.splitlines()))
        else:
            console.print(f"[bold]{head}:[/] {rich_literals(body)}")
        console.print()
