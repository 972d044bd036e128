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


def _indent(s: str) -> str:
    return "\n".join("    " + line if line else "" for line in s.splitlines())


def _ctx(ctx: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in ctx.items()) or "none"


def sections(entry: Any) -> list[tuple[str, str, bool]]:
    """The parts of an explanation as ``(heading, body, is_yaml)``; heading "" for the
    title, summary and doc. ``entry`` is a :class:`~omni_pd.check.rules.Rule` or a
    :class:`~omni_pd.check.codes.CodeDoc`."""
    title = f"{entry.code} {entry.name} ({entry.severity.value}, {entry.family})"
    out = [("", title, False), ("", entry.summary, False), ("", inspect.cleandoc(entry.doc), False)]
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
    return out


def explain_text(entry: Any) -> str:
    """Plain text (pipes, files, tests): headings end with ':', examples indented 4."""
    lines: list[str] = []
    for head, body, yaml in sections(entry):
        if not head:
            lines += [plain_literals(body), ""]
        elif yaml:
            lines += [f"{head}:", "", _indent(body), ""]
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
        else:
            console.print(f"[bold]{head}:[/] {rich_literals(body)}")
        console.print()
