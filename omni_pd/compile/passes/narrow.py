"""Take the Thinker alone out of a full omni deploy config (``expand --pipeline *_thinker_only``). Pure.

vllm-omni registers each full omni pipeline (Thinker -> Talker -> Code2Wav, e.g.
``qwen3_omni_moe``) next to a text-only one that runs the Thinker alone
(``qwen3_omni_moe_thinker_only``: QWEN3_OMNI_THINKER_ONLY_PIPELINE in
vllm_omni/model_executor/models/qwen3_omni/pipeline.py, vllm-omni 0.30.0); both use stage
id 0 for the Thinker. A deploy file written for the full pipeline (the bundled preset,
vllm-omni's own ``deploy/qwen3_omni_moe.yaml``) therefore holds the thinker-only
deploy as its stage 0: :func:`narrow_tree` keeps that entry and drops what only the
dropped stages read (their entries, overlay entries, ``from_stage_N``/``to_stage_N``
connector keys, ``edges`` and the named ``connectors:`` nobody refers to any more).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from omni_pd.compile.pipelines import Catalogue, Pipeline

_STAGE_KEY = re.compile(r"(?:from|to)_stage_(\d+)$")


@dataclass(frozen=True)
class Narrowing:
    """``full``: the pipeline the file's stages make up; ``kept``: the ``*_thinker_only``
    pipeline asked for; ``dropped``: ``(stage_id, role)`` of the stages left out, in id order."""

    full: Pipeline
    kept: Pipeline
    dropped: tuple[tuple[int, str], ...]


def thinker_only_narrowing(stage_ids: set[int], wanted: Pipeline, catalogue: Catalogue) -> Narrowing | None:
    """The :class:`Narrowing` that turns a file with ``stage_ids`` into ``wanted``, when
    ``wanted`` is ``<F>_thinker_only`` of a catalogued pipeline ``F`` whose stage ids are
    exactly ``stage_ids`` and which has ``wanted``'s stage ids. None otherwise (the file's
    stages then are checked against ``wanted`` as they are: validate's OPD202)."""
    full_name = wanted.name.removesuffix("_thinker_only")
    if full_name == wanted.name:
        return None
    full = catalogue.get(full_name)
    if full is None:
        return None
    full_ids = {s.stage_id for s in full.stages}
    keep = {s.stage_id for s in wanted.stages}
    if stage_ids != full_ids or not keep < full_ids:
        return None
    dropped = tuple((s.stage_id, s.role) for s in full.stages if s.stage_id not in keep)
    return Narrowing(full=full, kept=wanted, dropped=dropped)


def _stage_id(entry: Any) -> int | None:
    sid = entry.get("stage_id") if isinstance(entry, dict) else None
    return sid if isinstance(sid, int) and not isinstance(sid, bool) else None


def _filter_seq(seq: Any, keep: set[int]) -> None:
    """Remove the stage entries of ``seq`` whose ``stage_id`` is not in ``keep``, in place."""
    _keep_items(seq, lambda e: _stage_id(e) is None or _stage_id(e) in keep)


def _keep_items(seq: Any, wanted) -> None:
    """Keep the items of ``seq`` (a ruamel ``CommentedSeq`` or list) for which ``wanted``
    is true, in place, moving the kept items' recorded positions (``lc.data``, keyed by
    index) with them so diagnostics still point at the input's lines."""
    lc = getattr(seq, "lc", None)
    pos = dict(lc.data) if lc is not None and isinstance(getattr(lc, "data", None), dict) else None
    kept = [(i, e) for i, e in enumerate(seq) if wanted(e)]
    if len(kept) == len(seq):
        return
    del seq[:]
    list.extend(seq, [e for _, e in kept])
    if pos is not None:
        lc.data.clear()
        for new, (old, _) in enumerate(kept):
            if old in pos:
                lc.data[new] = pos[old]


def _filter_connector_keys(entry: Any, keep: set[int]) -> None:
    for key in ("input_connectors", "output_connectors"):
        conns = entry.get(key) if isinstance(entry, dict) else None
        if not isinstance(conns, dict):
            continue
        for k in [k for k in conns if (m := _STAGE_KEY.match(str(k))) and int(m.group(1)) not in keep]:
            del conns[k]
        if not conns:
            del entry[key]


def _referenced(entries: list[Any]) -> set[str]:
    names: set[str] = set()
    for e in entries:
        for key in ("input_connectors", "output_connectors"):
            conns = e.get(key) if isinstance(e, dict) else None
            if isinstance(conns, dict):
                names.update(v for v in conns.values() if isinstance(v, str))
    return names


def narrow_tree(tree: Any, keep: set[int]) -> None:
    """Keep only the stages ``keep`` of the deploy ``tree`` (a ruamel round-trip mapping,
    edited in place): the ``stages:`` entries and ``platforms.<p>.stages`` entries of other
    stage ids, the ``from_stage_N``/``to_stage_N`` connector keys naming them, the ``edges``
    that touch them and the ``connectors:`` entries no kept stage refers to are removed
    (a ``platforms.<p>`` overlay, ``platforms``, ``connectors`` or ``edges`` left empty
    goes too). Comments of the removed entries go with them."""
    entries: list[Any] = []
    if isinstance(tree.get("stages"), list):
        _filter_seq(tree["stages"], keep)
        entries += list(tree["stages"])
    plats = tree.get("platforms")
    if isinstance(plats, dict):
        for name in list(plats):
            ov = plats[name]
            if isinstance(ov, dict) and isinstance(ov.get("stages"), list):
                _filter_seq(ov["stages"], keep)
                entries += list(ov["stages"])
                if not ov["stages"]:
                    del ov["stages"]
                if not ov:
                    del plats[name]
        if not plats:
            del tree["platforms"]
    for e in entries:
        _filter_connector_keys(e, keep)
    edges = tree.get("edges")
    if isinstance(edges, list):
        _keep_items(edges, lambda e: not (isinstance(e, dict) and any(
            isinstance(e.get(k), int) and e.get(k) not in keep for k in ("from", "to"))))
        if not edges:
            del tree["edges"]
    conns = tree.get("connectors")
    if isinstance(conns, dict):
        used = _referenced(entries)
        for name in [n for n in conns if n not in used]:
            del conns[name]
        if not conns:
            del tree["connectors"]
