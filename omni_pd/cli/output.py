"""Printing helpers more than one command uses: plain aligned tables, the linear-chain note."""

import sys
from typing import Optional


def print_table(columns: tuple[str, ...], rows: list[tuple[str, ...]], *, header: bool = True) -> None:
    """Print ``rows`` under ``columns`` with rich's Table (as ``launch`` prints its plan and
    status), each column as wide as its widest cell. On a terminal: bold header, the last
    column folded to the terminal's width. In a pipe or file: one line per row at the
    width the longest row needs, no trailing blanks, no markup (for grep, awk, diff)."""
    import io

    from rich.console import Console
    from rich.table import Table

    tty = sys.stdout.isatty()
    t = Table(box=None, pad_edge=False, show_header=header, header_style="bold" if tty else "",
              show_edge=False)
    for i, col in enumerate(columns):
        last = i == len(columns) - 1
        t.add_column(col, no_wrap=not (tty and last), overflow="fold")
    for row in rows:
        t.add_row(*row)
    if tty:
        Console(highlight=False, markup=False).print(t)
        return
    width = sum(max(len(str(r[i])) for r in [columns, *rows]) + 2 for i in range(len(columns)))
    buf = Console(file=io.StringIO(), width=width + 1, highlight=False, color_system=None, markup=False)
    buf.print(t)
    sys.stdout.write("".join(line.rstrip() + "\n" for line in buf.file.getvalue().splitlines()))


def say_linear_chain(topo, name: str, pipeline: Optional[str], verb: str = "drawn") -> None:
    """A note on stderr when ``topo`` (of the file ``name``, ``--pipeline`` = ``pipeline``)
    was resolved against validate's linear-chain stand-in (``Pipeline.linear_chain``):
    its stage roles are unknown because the file names no pipeline and none is inferred
    (validate's OPD207), or the pipeline it names is not catalogued. Says how to name the
    pipeline. Nothing for a catalogued or inferred-PD pipeline. Shared by graph and diff
    (``verb``: what the command did with the stages)."""
    if not topo.pipeline.linear_chain:
        return
    given = pipeline or topo.config.pipeline
    if not given:
        why = f"{name} names no `pipeline:` and omni-pd cannot infer one"
    else:
        where = "--pipeline" if pipeline else f"{name}'s `pipeline:`"
        why = f"pipeline `{given}` ({where}) is not in omni-pd's catalogue"
    sys.stderr.write(f"note: {why}, so its stages are {verb} as a linear chain with unknown roles; "
                     "pass --pipeline NAME (see `omni-pd pipelines`) or add `pipeline: NAME` to the file\n")
