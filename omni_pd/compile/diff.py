"""What ``expand`` changed, stage by stage (``omni-pd diff IN OUT``). Pure functions.

Both configs are compared as resolved topologies, so a key moved between the flat,
``engine_args`` and ``runtime`` layouts is no change; nested mappings
(``kv_transfer_config``, ``env``, connectors) are compared key by key with dotted
names. Each output stage is matched to the input stage it came from through the PD
split's id map: the split stage ``t`` gave prefill ``t`` and decode ``t + 1``, later
stages moved up by one (:class:`~omni_pd.compile.pipelines.IdMap`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from omni_pd.compile.topology import StageNode, Topology

#: effective-stage keys that are bookkeeping, not settings
_SKIP = frozenset({"stage_id"})


@dataclass(frozen=True)
class Change:
    """One key: ``kind`` ``+`` added, ``-`` removed, ``~`` changed; ``before``/``after``
    the values (None where absent)."""

    kind: str
    key: str
    before: Any = None
    after: Any = None

    def text(self) -> str:
        if self.kind == "+":
            return f"+ {self.key}: {_show(self.after)}"
        if self.kind == "-":
            return f"- {self.key}: {_show(self.before)}"
        return f"~ {self.key}: {_show(self.before)} -> {_show(self.after)}"


@dataclass(frozen=True)
class StageDiff:
    """An output stage, the input stage it came from (None: new), and what changed."""

    stage_id: int
    title: str
    source: int | None
    source_title: str | None
    changes: tuple[Change, ...]


@dataclass(frozen=True)
class ConfigDiff:
    """Top-level changes (``pipeline``, ``async_chunk``, ``edges`` ...) and per-stage diffs."""

    top: tuple[Change, ...]
    stages: tuple[StageDiff, ...]


def _show(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}, "c": [1]}`` -> ``{"a.b": 1, "c": [1]}`` (lists stay values;
    an empty mapping stays a value so that adding ``{}`` shows)."""
    if not isinstance(d, dict) or (prefix and not d):
        return {prefix: d} if prefix else {}
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        out.update(flatten(v, key) if isinstance(v, dict) else {key: v})
    return out


def changes(before: dict[str, Any], after: dict[str, Any]) -> tuple[Change, ...]:
    """Key-by-key changes between two flat mappings, in ``after``'s key order then
    removed keys in ``before``'s order. ``None`` values count as absent."""
    b = {k: v for k, v in before.items() if v is not None}
    a = {k: v for k, v in after.items() if v is not None}
    out = [Change("+", k, None, v) if k not in b else Change("~", k, b[k], v)
           for k, v in a.items() if k not in b or b[k] != v]
    out += [Change("-", k, v, None) for k, v in b.items() if k not in a]
    return tuple(out)


def _title(n: StageNode) -> str:
    return f"stage {n.stage_id} {n.role}" + (f" {n.pd_role}" if n.pd_role else "")


def _settings(n: StageNode) -> dict[str, Any]:
    return {k: v for k, v in flatten(n.settings).items() if k.split(".", 1)[0] not in _SKIP}


def split_stage(after: Topology) -> int:
    """The input stage id the PD pair of ``after`` was split from (its prefill id).

    Raises ValueError when ``after`` has no prefill/decode pair with consecutive ids."""
    pair = after.pd_pair
    if pair is None or pair[1].stage_id != pair[0].stage_id + 1:
        raise ValueError("it has no prefill/decode pair with consecutive stage ids (not `omni-pd expand` output)")
    return pair[0].stage_id


def config_diff(before: Topology, after: Topology, before_top: dict[str, Any],
                after_top: dict[str, Any]) -> ConfigDiff:
    """The diff of ``after`` (a PD split) against ``before``. ``*_top``: the plain
    top-level mappings of the two files (``stages``/``platforms`` are left to the
    stage diffs). Raises ValueError when ``after`` is not a PD split (:func:`split_stage`)."""
    t = split_stage(after)
    skip_top = {"stages", "platforms"}
    top = changes({k: v for k, v in before_top.items() if k not in skip_top},
                  {k: v for k, v in after_top.items() if k not in skip_top})
    if before.pipeline.name != after.pipeline.name and not any(c.key == "pipeline" for c in top):
        top = (Change("~", "pipeline (resolved)", before.pipeline.name, after.pipeline.name),) + top
    out: list[StageDiff] = []
    for n in sorted(after.stages, key=lambda s: s.stage_id):
        src_id = t if n.stage_id in (t, t + 1) else (n.stage_id if n.stage_id < t else n.stage_id - 1)
        src = before.node(src_id)
        before_settings = _settings(src) if src is not None else {}
        out.append(StageDiff(n.stage_id, _title(n), src.stage_id if src else None,
                             _title(src) if src else None, changes(before_settings, _settings(n))))
    return ConfigDiff(top, tuple(out))


def diff_text(d: ConfigDiff, before_name: str, after_name: str) -> str:
    """The diff as text: a header, top-level changes, then one block per output stage."""
    lines = [f"--- {before_name}", f"+++ {after_name}"]
    lines += [c.text() for c in d.top]
    for s in d.stages:
        src = f"from input {s.source_title}" if s.source_title else "new"
        lines.append(f"{s.title} ({src})" + ("" if s.changes else ": unchanged"))
        lines += [f"  {c.text()}" for c in s.changes]
    return "\n".join(lines) + "\n"


def diff_json(d: ConfigDiff) -> list[dict[str, Any]]:
    """The diff as JSON-ready data: one record per output stage (``stage_id``, ``from``,
    ``changes`` with kind/key/before/after) after a ``top`` record."""
    def ch(c: Change) -> dict[str, Any]:
        return {"kind": c.kind, "key": c.key, "before": c.before, "after": c.after}

    return [{"top": [ch(c) for c in d.top]}] + [
        {"stage_id": s.stage_id, "title": s.title, "from": s.source, "changes": [ch(c) for c in s.changes]}
        for s in d.stages]


# --- a migration (``omni-pd diff LEGACY MIGRATED``) -------------------------------------

#: stage sub-mappings whose keys are stage keys in the ``stages:`` schema (the legacy layout)
_LAYOUT = ("engine_args", "runtime")


def layout_settings(stage: Any) -> dict[str, Any]:
    """A stage mapping (legacy ``stage_args`` entry or ``stages:`` entry, plain data) as
    flat settings: ``engine_args.*`` and ``runtime.*`` at stage level (where ``omni-pd
    migrate`` moves them), nested mappings dotted (:func:`flatten`), ``stage_id`` left
    out. ``{}`` for a non-mapping."""
    if not isinstance(stage, dict):
        return {}
    flat: dict[str, Any] = {}
    for k, v in stage.items():
        if k in _LAYOUT and isinstance(v, dict):
            flat.update(v)
        elif k not in _SKIP:
            flat[k] = v
    return flatten(flat)


def _top_settings(tree: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in tree.items() if k not in ("stage_args", "stages", "runtime", "platforms")}
    rt = tree.get("runtime")
    if isinstance(rt, dict):
        out.update({k: v for k, v in rt.items() if k in ("edges", "connectors")})
        out.update({f"runtime.{k}": v for k, v in rt.items() if k not in ("edges", "connectors")})
    return out


def migration_diff(legacy: dict[str, Any], after: dict[str, Any], titles: dict[int, str]) -> ConfigDiff:
    """The diff of the ``stages:`` file ``after`` against the legacy ``stage_args`` file
    ``legacy`` (both plain data): top-level keys (``runtime.edges`` compared as ``edges``),
    then each ``after`` stage against the legacy stage of the same ``stage_id`` with the
    layout flattened (:func:`layout_settings`), so what shows is what the migration
    changed: dropped topology keys, rewritten runtime keys, written defaults. ``titles``:
    stage id -> title (from the pipeline the stages were matched to)."""
    top = changes(_top_settings(legacy), _top_settings(after))
    by_id = {s.get("stage_id"): s for s in legacy.get("stage_args") or [] if isinstance(s, dict)}
    out: list[StageDiff] = []
    for st in after.get("stages") or []:
        if not isinstance(st, dict):
            continue
        sid = st.get("stage_id")
        src = by_id.get(sid)
        title = titles.get(sid, f"stage {sid}")
        out.append(StageDiff(sid, title, sid if src is not None else None, title if src is not None else None,
                             changes(layout_settings(src), layout_settings(st))))
    return ConfigDiff(top, tuple(out))
