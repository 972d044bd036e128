"""Write cross-host omni connectors into an expanded deploy tree (``expand --inventory``).

The decision is :func:`omni_pd.compile.stage_edges.cross_host_plan` (pure); this module
only edits the round-trip tree: one ``connectors.<name>`` entry per rewritten edge and
``input_connectors.from_stage_<src>: <name>`` on the receiving stage (the form
vllm_omni/distributed/omni_connectors/utils/initialization.py ``load_omni_transfer_config``
reads). Top-level ``connectors:`` entries no stage names any more are removed, so the
file says which transport each edge really uses.
"""

from __future__ import annotations

from typing import Any, Sequence

from ruamel.yaml.comments import CommentedMap

from omni_pd.compile.stage_edges import CROSS_HOST_CONNECTOR, EdgeRewrite


def _cmap(d: Any) -> Any:
    if isinstance(d, dict):
        out = CommentedMap()
        for k, v in d.items():
            out[k] = _cmap(v)
        return out
    return d


def _named_refs(tree: CommentedMap) -> set[str]:
    refs: set[str] = set()
    for entry in tree.get("stages") or ():
        if not isinstance(entry, dict):
            continue
        for holder in (entry, entry.get("runtime"), entry.get("engine_args")):
            if not isinstance(holder, dict):
                continue
            for key in ("input_connectors", "output_connectors"):
                block = holder.get(key)
                if isinstance(block, dict):
                    refs.update(v for v in block.values() if isinstance(v, str))
    return refs


def apply_edges(tree: CommentedMap, rewrites: Sequence[EdgeRewrite]) -> CommentedMap:
    """``tree`` (changed in place and returned) with each of ``rewrites`` written: the
    receiving stage's ``input_connectors`` entry for the edge (its ``output_connectors``
    entry for the same edge on the sender is removed, so one reference remains), the
    ``connectors:`` entry it names, and unreferenced ``connectors:`` entries dropped.
    Nothing changes for ``rewrites == []``."""
    if not rewrites:
        return tree
    conns = tree.get("connectors")
    if not isinstance(conns, CommentedMap):
        conns = CommentedMap()
        keys = list(tree.keys())
        tree.insert(keys.index("stages") if "stages" in keys else len(keys), "connectors", conns)
    by_id = {e.get("stage_id"): e for e in tree.get("stages") or () if isinstance(e, dict)}
    for rw in rewrites:
        conns[rw.name] = _cmap({"name": CROSS_HOST_CONNECTOR, "extra": dict(rw.extra)})
        src, dst = by_id.get(rw.src), by_id.get(rw.dst)
        if isinstance(src, dict) and isinstance(src.get("output_connectors"), dict):
            src["output_connectors"].pop(f"to_stage_{rw.dst}", None)
            if not src["output_connectors"]:
                src.pop("output_connectors")
        if isinstance(dst, dict):
            ic = dst.get("input_connectors")
            if not isinstance(ic, dict):
                ic = CommentedMap()
                keys = list(dst.keys())
                at = keys.index("default_sampling_params") if "default_sampling_params" in keys else len(keys)
                dst.insert(at, "input_connectors", ic)
            ic[f"from_stage_{rw.src}"] = rw.name
    used = _named_refs(tree)
    for k in [k for k in conns if k not in used]:
        del conns[k]
    return tree
