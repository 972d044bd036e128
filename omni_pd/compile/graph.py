"""The stage graph of a resolved :class:`~omni_pd.compile.topology.Topology`, as data and
as Mermaid / Graphviz DOT text (``omni-pd graph``). Pure functions: no I/O.

A node per stage: role (and prefill/decode side), devices, parallel sizes, replicas,
KV connector with ``kv_role`` and ``engine_id``, an encoder-cache (EC) connector with
``ec_role`` when the stage has one (EPD), what it outputs, and the ports it binds. An
edge per ``input_sources`` entry of the frozen pipeline; the prefill -> decode edge of a
PD pair is the KV transfer and is labelled with the connector. Replicas (``num_replicas``)
make a stage an xP or yD group.

Ports are passed in (``ports``): they are what validate's port rules compute per stage
(``omni_pd/check/rules/ports.py bound_ports``), so the picture and the checks agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from omni_pd.compile.devices import format_devices
from omni_pd.compile.topology import StageNode, Topology


@dataclass(frozen=True)
class PortRange:
    """``[port, port + span)`` bound by a stage (per engine); ``purpose`` says for what."""

    port: int
    span: int
    purpose: str

    def text(self) -> str:
        return (f"{self.port}" if self.span == 1 else f"{self.port}-{self.port + self.span - 1}") + f" {self.purpose}"


@dataclass(frozen=True)
class GraphStage:
    """One node. ``side``: ``prefill``/``decode`` for a PD half, else None. ``devices``:
    as written (``"0,1"``) or None. ``kv``/``ec``: ``(connector, role, engine_id)`` or None."""

    stage_id: int
    role: str
    side: str | None
    devices: str | None
    tp: int
    pp: int
    dp: int
    replicas: int
    kv: tuple[str, str | None, str | None] | None
    ec: tuple[str, str | None] | None
    output: str | None
    ports: tuple[PortRange, ...]
    encoder_only: bool = False

    @property
    def title(self) -> str:
        return (f"stage {self.stage_id}: {self.role}" + (f" {self.side}" if self.side else "")
                + (" (encoder only)" if self.encoder_only else ""))

    def facts(self) -> list[str]:
        """The node's lines after its title, in display order."""
        par = f"TP {self.tp}" + (f" PP {self.pp}" if self.pp > 1 else "") + (f" DP {self.dp}" if self.dp > 1 else "")
        lines = [f"devices {self.devices if self.devices is not None else '(default)'}, {par}"
                 + (f", {self.replicas} replicas" if self.replicas > 1 else "")]
        if self.kv is not None:
            conn, role, eid = self.kv
            lines.append(f"{conn} {role or '(no kv_role)'}" + (f", engine_id {eid}" if eid else ""))
        if self.ec is not None:
            lines.append(f"EC {self.ec[0]} {self.ec[1] or '(no ec_role)'}")
        if self.ports:
            lines.append("ports " + "; ".join(p.text() for p in self.ports))
        if self.output:
            lines.append(f"outputs {self.output}")
        return lines


@dataclass(frozen=True)
class GraphEdge:
    """``src`` -> ``dst`` (stage ids). ``via``: ``"KV MooncakeConnector"`` for the KV
    transfer of a prefill/decode pair, ``"EC ECCPUConnector"`` for an encoder-cache
    transfer (EC producer -> consumer), None when the stage's output feeds the next."""

    src: int
    dst: int
    via: str | None = None


@dataclass(frozen=True)
class StageGraph:
    """The picture of one topology: ``pipeline`` name, ``platform`` (None: the base)."""

    pipeline: str
    runtime: str
    platform: str | None
    stages: tuple[GraphStage, ...]
    edges: tuple[GraphEdge, ...]

    @property
    def title(self) -> str:
        return f"{self.pipeline} ({self.runtime} runtime, {self.platform or 'base'} platform)"


def _str(v: Any) -> str | None:
    return None if v is None else str(v)


def _stage(n: StageNode, ports: Sequence[PortRange]) -> GraphStage:
    kv = n.kv or {}
    ec = n.settings.get("ec_transfer_config")
    ec = ec if isinstance(ec, dict) else {}
    side = n.pd_role or {"kv_producer": "prefill", "kv_consumer": "decode"}.get(str(kv.get("kv_role")))
    return GraphStage(
        stage_id=n.stage_id, role=n.role, side=side,
        devices=format_devices(n.devices) if n.devices is not None else None,
        tp=n.tp, pp=n.pp, dp=n.dp, replicas=n.num_replicas if isinstance(n.num_replicas, int) else 1,
        kv=(str(kv["kv_connector"]), _str(kv.get("kv_role")), _str(kv.get("engine_id")))
        if kv.get("kv_connector") else None,
        ec=(str(ec["ec_connector"]), _str(ec.get("ec_role"))) if ec.get("ec_connector") else None,
        output=n.final_output_type if n.final_output else None,
        ports=tuple(sorted(ports, key=lambda p: (p.port, p.purpose))),
        encoder_only=n.settings.get("mm_encoder_only") is True)


def stage_graph(topo: Topology, ports: Mapping[int, Sequence[PortRange]] | None = None) -> StageGraph:
    """The :class:`StageGraph` of ``topo``; ``ports``: stage id -> the ranges it binds."""
    ports = ports or {}
    stages = tuple(_stage(n, ports.get(n.stage_id, ())) for n in sorted(topo.stages, key=lambda s: s.stage_id))
    by_id = {s.stage_id: s for s in stages}
    pair = topo.pd_pair
    kv_edge = (pair[0].stage_id, pair[1].stage_id) if pair else None
    kv_via = f"KV {(pair[0].kv or {}).get('kv_connector') or 'connector'}" if pair else None

    def via(src: int, dst: int) -> str | None:
        if (src, dst) == kv_edge:
            return kv_via
        a, b = by_id.get(src), by_id.get(dst)
        if a and b and a.ec and b.ec and a.ec[1] in ("ec_producer", "ec_both") and b.ec[1] in ("ec_consumer", "ec_both"):
            return f"EC {a.ec[0]}"
        return None

    edges: list[GraphEdge] = []
    for n in stages:
        node = topo.node(n.stage_id)
        for src in (node.input_sources if node else ()):
            edges.append(GraphEdge(src, n.stage_id, via(src, n.stage_id)))
    if kv_edge and not any((e.src, e.dst) == kv_edge for e in edges):
        edges.append(GraphEdge(*kv_edge, kv_via))
    return StageGraph(pipeline=topo.pipeline.name, runtime=topo.pipeline.runtime, platform=topo.platform,
                      stages=stages, edges=tuple(sorted(edges, key=lambda e: (e.src, e.dst))))


# --- text renderers ----------------------------------------------------------------------

def _mermaid_text(s: str) -> str:
    return s.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")


def to_mermaid(g: StageGraph) -> str:
    """A Mermaid ``flowchart LR``: one box per stage (facts on ``<br/>`` lines), ``-->``
    for data edges, a thick ``==>`` labelled with the connector for a KV or EC transfer."""
    out = [f"%% {g.title}", "flowchart LR"]
    for s in g.stages:
        label = "<br/>".join(_mermaid_text(x) for x in [s.title, *s.facts()])
        out.append(f'  s{s.stage_id}["{label}"]')
    for e in g.edges:
        out.append(f'  s{e.src} == "{_mermaid_text(e.via)}" ==> s{e.dst}' if e.via else f"  s{e.src} --> s{e.dst}")
    return "\n".join(out) + "\n"


def _dot_text(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"')


def to_dot(g: StageGraph) -> str:
    """Graphviz DOT: a ``digraph`` left to right, box nodes, KV/EC transfer edges bold and labelled."""
    out = [f'digraph "{_dot_text(g.pipeline)}" {{',
           f'  label="{_dot_text(g.title)}";',
           "  rankdir=LR;",
           '  node [shape=box, fontname="monospace"];']
    for s in g.stages:
        label = "\\n".join(_dot_text(x) for x in [s.title, *s.facts()])
        out.append(f'  s{s.stage_id} [label="{label}"];')
    for e in g.edges:
        out.append(f'  s{e.src} -> s{e.dst} [label="{_dot_text(e.via)}", style=bold];' if e.via
                   else f"  s{e.src} -> s{e.dst};")
    out.append("}")
    return "\n".join(out) + "\n"


def to_tree_lines(g: StageGraph) -> list[tuple[int, str]]:
    """The tree as ``(depth, text)`` rows (depth 0: the title), for a rich Tree or plain text:
    each stage with its facts, then what it feeds."""
    rows: list[tuple[int, str]] = [(0, g.title)]
    for s in g.stages:
        rows.append((1, s.title))
        rows += [(2, f) for f in s.facts()]
        for e in g.edges:
            if e.src == s.stage_id:
                rows.append((2, f"=> stage {e.dst} ({e.via} transfer)" if e.via else f"-> stage {e.dst}"))
    return rows


def to_tree_text(g: StageGraph) -> str:
    """The tree of :func:`to_tree_lines` drawn with box characters (what a rich Tree
    shows on a terminal), for pipes, files and goldens."""
    rows = to_tree_lines(g)
    out = [rows[0][1]]
    for i, (depth, text) in enumerate(rows[1:], start=1):
        guides = []
        for d in range(1, depth + 1):
            # is there a later row at depth d before the tree returns above d?
            later = next((r[0] for r in rows[i + 1:] if r[0] <= d), 0) == d
            if d == depth:
                guides.append("├── " if later else "└── ")
            else:
                guides.append("│   " if later else "    ")
        out.append("".join(guides) + text)
    return "\n".join(out) + "\n"
