"""``omni-pd graph``: the stage graph as a tree, Mermaid or DOT (omni_pd/compile/graph.py)."""

import sys
from pathlib import Path
from typing import Literal, Optional

import typer

from omni_pd.cli.options import PLATFORM
from omni_pd.cli.output import say_linear_chain
from omni_pd.cli.shared import resolve_doc


def graph(
    input: Optional[Path] = typer.Argument(None, help="deploy YAML (default: the bundled Qwen3-Omni preset)",
                                           show_default=False),
    fmt: Literal["tree", "mermaid", "dot"] = typer.Option("tree", "--format", help="tree (rich), Mermaid or DOT"),
    platform: Optional[PLATFORM] = typer.Option(None, "--platform", help="apply platforms.<P> first"),
    pipeline: Optional[str] = typer.Option(None, "--pipeline", help="pipeline name when the file does not say"),
    vllm_version: Optional[str] = typer.Option(None, "--vllm-version",
                                               help="target vLLM major.minor (decides the ports shown)"),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="write the text here (atomically) instead of stdout"),
) -> None:
    """Draw the stage graph: roles, devices, KV connectors with kv_role, ports (tree, Mermaid or DOT)."""
    from omni_pd import cli_options
    from omni_pd.compile.graph import stage_graph, to_dot, to_mermaid, to_tree_lines, to_tree_text
    from omni_pd.io import load_file
    from omni_pd.io_write import atomic_write
    from omni_pd.resources import preset_path

    tgt = cli_options.vllm_version(vllm_version)
    src = input if input is not None else preset_path("qwen3_omni_moe")
    doc = load_file(src)
    topo, ports = _graph_inputs(doc, pipeline, platform, tgt)
    g = stage_graph(topo, ports)
    say_linear_chain(topo, doc.name, pipeline)
    if fmt == "tree" and output is None and sys.stdout.isatty():
        from rich.console import Console
        from rich.markup import escape
        from rich.tree import Tree

        rows = to_tree_lines(g)
        root = Tree(f"[bold]{escape(rows[0][1])}[/]")
        parents = {0: root}
        for depth, text in rows[1:]:
            style = "bold" if depth == 1 else ("magenta" if text.startswith(("->", "=>")) else "")
            parents[depth] = parents[depth - 1].add(f"[{style}]{escape(text)}[/]" if style else escape(text))
        Console(highlight=False).print(root)
        return
    text = {"mermaid": to_mermaid, "dot": to_dot, "tree": to_tree_text}[fmt](g)
    if output is None:
        sys.stdout.write(text)
    else:
        atomic_write(output, text, protect=[str(src)])
        sys.stderr.write(f"wrote {output}\n")


def _graph_inputs(doc, pipeline: Optional[str], platform: Optional[str], tgt):
    """The resolved topology of ``doc`` and each stage's bound ports (validate's own
    port facts: ``omni_pd/check/rules/ports.py bound_ports``)."""
    from omni_pd.check.rules import Context
    from omni_pd.check.rules.ports import bound_ports
    from omni_pd.check.validate import Locator
    from omni_pd.compile.graph import PortRange

    topo, plain = resolve_doc(doc, pipeline, platform)
    ctx = Context(doc=Locator(doc), config=topo.config, topology=topo, target=tgt, platform=platform, raw=plain)
    ports = {n.stage_id: [PortRange(b.port, b.span, b.purpose + (f" (replica {b.replica})" if b.replica else ""))
                          for b in bound_ports(ctx, n)] for n in topo.stages}
    return topo, ports
