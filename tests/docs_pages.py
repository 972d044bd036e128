"""The user-facing pages: README.md and docs/*.md (docs/upstream/ holds upstream issue drafts).

Tests that check what a page says read it through here, each pinned to the page its text
lives on (:func:`page`); :func:`pages_with` finds a phrase when a test needs to say where it is.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def page_names() -> list[str]:
    """README.md, then every docs/*.md, as paths relative to the repository root."""
    return ["README.md", *sorted(f"docs/{p.name}" for p in DOCS.glob("*.md"))]


@lru_cache(maxsize=None)
def page(name: str) -> str:
    """The text of page ``name`` (``"README.md"``, ``"docs/launch.md"``)."""
    return (ROOT / name).read_text(encoding="utf-8")


def pages_with(phrase: str) -> list[str]:
    """The pages (of :func:`page_names`) whose text contains ``phrase``."""
    return [n for n in page_names() if phrase in page(n)]


def fenced_blocks(text: str, lang: str) -> list[str]:
    """The bodies of the fenced code blocks of language ``lang`` in ``text``, in order.

    Fences are found line by line, as Markdown does: a block opens at a line that is
    ```` ```lang ```` and closes at the next line that starts with ```` ``` ````, so a
    ```` ```mermaid ```` inside a comment of a bash line does not end the block."""
    out: list[str] = []
    body: list[str] | None = None
    kind = None
    for line in text.splitlines():
        if body is None:
            m = re.match(r"```(\w*)\s*$", line)
            if m:
                body, kind = [], m.group(1)
        elif line.startswith("```"):
            if kind == lang:
                out.append("\n".join(body) + "\n")
            body = None
        else:
            body.append(line)
    return out


def section(text: str, heading: str) -> str:
    """The part of ``text`` under the heading line ``heading`` (e.g. ``"## Two hosts"``), up
    to the next heading of the same or a higher level. Raises KeyError when there is none."""
    level = len(heading) - len(heading.lstrip("#"))
    lines = text.splitlines()
    fence = False
    start = None
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fence = not fence
        if fence:
            continue
        if start is None:
            if line.rstrip() == heading:
                start = i + 1
        elif re.match(r"#{1,%d} " % level, line):
            return "\n".join(lines[start:i]) + "\n"
    if start is None:
        raise KeyError(heading)
    return "\n".join(lines[start:]) + "\n"
