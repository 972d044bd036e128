"""Write an :class:`~omni_pd.compile.passes.encoder_split.EncoderSplitPlan` into the YAML tree.

Pure, like :mod:`omni_pd.compile.emit` (which it reuses for the prefill/decode half): the
input tree is deep-copied; comments, key order and quoting of the input survive. The
encoder entry E is written first (stage 0), built from the LLM's own entry (model keys such
as ``dtype``, ``max_model_len``, ``enforce_eager`` apply to E too) minus what E does not run
(:data:`~omni_pd.compile.passes.encoder_split.ENCODER_DROP`); every other stage id moves up by one.
"""

from __future__ import annotations

from typing import Any

from ruamel.yaml.comments import CommentedMap, CommentedSeq

from omni_pd.compile.emit import _cmap, _eol, _insert, _q, _where, apply_pd_split, put_before_key, take_comment_tail
from omni_pd.compile.passes.encoder_split import ENCODER_DROP, EncoderSplitPlan
from omni_pd.compile.topology import format_devices
from omni_pd.io import copy_tree

_AFTER = ("devices", "env", "kv_transfer_config")
_BEFORE = ("input_connectors", "output_connectors", "default_sampling_params")
#: where the PD split puts a stage's new ``devices`` (omni_pd/compile/emit.py ``_set_devices``)
_DEVICES_BEFORE = ("env", "kv_transfer_config") + _BEFORE


def _shift_ids(seq: Any) -> None:
    if not isinstance(seq, CommentedSeq):
        return
    for s in seq:
        if isinstance(s, CommentedMap) and isinstance(s.get("stage_id"), int) and not isinstance(s["stage_id"], bool):
            s["stage_id"] = s["stage_id"] + 1
        if isinstance(s, CommentedMap):
            for holder in (s, s.get("engine_args")):
                if not isinstance(holder, CommentedMap):
                    continue
                for ck, prefix in (("input_connectors", "from_stage_"), ("output_connectors", "to_stage_")):
                    conns = holder.get(ck)
                    if isinstance(conns, CommentedMap):
                        for k in list(conns.keys()):
                            if isinstance(k, str) and k.startswith(prefix) and k[len(prefix):].isdigit():
                                conns.insert(list(conns.keys()).index(k), f"{prefix}{int(k[len(prefix):]) + 1}",
                                             conns.pop(k))


def _encoder_entry(llm: CommentedMap, plan: EncoderSplitPlan) -> CommentedMap:
    """E's deploy entry: the LLM entry's keys in their order, minus
    :data:`~omni_pd.compile.passes.encoder_split.ENCODER_DROP`; E's own ``devices``, engine
    settings, ``env`` and ``ec_transfer_config`` are placed with the PD split's helper
    (:func:`omni_pd.compile.emit._insert`, the same anchors), so ``devices`` stays where the
    LLM entry had it and the connector block follows it."""
    e = CommentedMap()
    e["stage_id"] = 0
    for k, v in llm.items():
        if k == "stage_id":
            continue
        if k == "devices" and plan.encoder_devices is not None:
            e[k] = _q(format_devices(plan.encoder_devices) or "")  # E's devices, where the LLM's were
            continue
        if k in ENCODER_DROP:
            continue
        if k == "engine_args" and isinstance(v, CommentedMap):
            sub = CommentedMap((ek, copy_tree(ev)) for ek, ev in v.items() if ek not in ENCODER_DROP)
            if sub:
                e[k] = sub
            continue
        if k == "runtime" and isinstance(v, CommentedMap):
            continue  # devices/env/num_replicas: E's own below
        e[k] = copy_tree(v)
    _copy_comments(llm, e)
    if isinstance(e.get("engine_args"), CommentedMap) and isinstance(llm.get("engine_args"), CommentedMap):
        _copy_comments(llm["engine_args"], e["engine_args"])
    if plan.encoder_devices is not None:
        _insert(e, "devices", _q(format_devices(plan.encoder_devices) or ""), before=_DEVICES_BEFORE)
    for k, v in plan.encoder_settings.items():
        _insert(e, k, v, before=("devices",) + _DEVICES_BEFORE)
    if plan.producer.env:
        _insert(e, "env", _cmap({k: _q(v) for k, v in plan.producer.env.items()}), after=("devices",), before=_BEFORE)
    _insert(e, "ec_transfer_config", _cmap(plan.producer.ec_transfer_config), after=_AFTER, before=_BEFORE)
    return e


def _copy_comments(src: CommentedMap, dst: CommentedMap) -> None:
    """The comments of the keys of ``src`` that ``dst`` (built key by key from it) kept,
    copied (ruamel ``ca.items``, deep); the full-line comments a key ``dst`` left out
    (or ``stage_id``, whose end-of-line comment is E's own label) carried above the next
    key go above the next key ``dst`` has."""
    import copy

    pending: list = []
    for k in src:
        entry = copy.deepcopy(src.ca.items.get(k))
        if k == "stage_id" or k not in dst:
            pending += take_comment_tail(entry)
            continue
        if entry is not None:
            dst.ca.items[k] = entry
        if pending:
            put_before_key(dst, k, pending)
            pending = []


def stage_labels(plan: EncoderSplitPlan) -> dict[int, str]:
    """End-of-line comment per output stage id (``encoder (E, ec_producer)``, ...)."""
    out: dict[int, str] = {}
    for s in plan.target_pipeline.stages:
        if s.role == "encoder":
            out[s.stage_id] = f"encoder only (E, ec_producer {plan.ec_connector})"
        elif s.pd_role == "prefill":
            out[s.stage_id] = f"{s.role} prefill (KV producer, ec_consumer), split from stage 0"
        elif s.pd_role == "decode":
            out[s.stage_id] = f"{s.role} decode (KV consumer), split from stage 0"
        else:
            out[s.stage_id] = f"{s.role} prefill+decode (ec_consumer), was stage 0"
    return out


def apply_encoder_split(tree: CommentedMap, plan: EncoderSplitPlan) -> CommentedMap:
    """A new tree: ``tree`` with the encoder split (and for ``1e1p1d`` the PD split) applied.
    ``tree`` is not modified."""
    out = apply_pd_split(tree, plan.pd) if plan.pd is not None else copy_tree(tree)
    if "pipeline" in out:
        out["pipeline"] = plan.target_pipeline.name
    else:
        out.insert(0, "pipeline", plan.target_pipeline.name)
    if not isinstance(out.get("stages"), CommentedSeq):
        out["stages"] = CommentedSeq()
    seq = out["stages"]
    _shift_ids(seq)
    plats = out.get("platforms")
    if isinstance(plats, CommentedMap):
        for pov in plats.values():
            if isinstance(pov, CommentedMap):
                _shift_ids(pov.get("stages"))
    cons = next((s for s in seq if isinstance(s, CommentedMap) and s.get("stage_id") == plan.consumer_id), None)
    if cons is None:
        cons = CommentedMap([("stage_id", plan.consumer_id)])
        seq.append(cons)
    seq.insert(0, _encoder_entry(cons, plan))
    holder = _where(cons, "kv_transfer_config")
    _insert(holder, "ec_transfer_config", _cmap(plan.consumer.ec_transfer_config), after=_AFTER, before=_BEFORE)
    edges = CommentedSeq()
    for s in plan.target_pipeline.stages:
        for src in s.input_sources:
            e = CommentedMap([("from", src), ("to", s.stage_id)])
            e.fa.set_flow_style()
            edges.append(e)
    if "edges" in out:
        out["edges"] = edges
    elif "platforms" in out:
        out.insert(list(out.keys()).index("platforms"), "edges", edges)
    else:
        out["edges"] = edges
    labels = stage_labels(plan)
    old = _pd_labels(plan)
    for s in seq:
        if isinstance(s, CommentedMap) and s.get("stage_id") in labels and not s.fa.flow_style():
            _drop_label(s, old.get(s["stage_id"]))
            _eol(s, labels[s["stage_id"]], replace=True)
    return out


def _pd_labels(plan: EncoderSplitPlan) -> dict[int, str]:
    """The labels the PD emit wrote (keyed by the shifted id), to be replaced, not folded in."""
    if plan.pd is None:
        return {}
    from omni_pd.compile.emit import stage_labels as pd_labels

    return {k + 1: v for k, v in pd_labels(plan.pd).items()}


def _drop_label(stage: CommentedMap, label: str | None) -> None:
    """Remove ``label`` from the start of ``stage_id``'s end-of-line comment (a user's
    text folded after it with ``; `` stays)."""
    item = stage.ca.items.get("stage_id")
    if not label or not item or len(item) < 3 or item[2] is None:
        return
    val = getattr(item[2], "value", "") or ""
    first, nl, rest = val.partition("\n")
    text = first.strip().lstrip("#").strip()
    if text.startswith(label):
        user = text[len(label):].lstrip("; ").strip()
        item[2].value = (f"# {user}" if user else "#") + nl + rest
        if not user:
            item[2] = None if not rest else item[2]
