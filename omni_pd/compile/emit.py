"""Write a :class:`~omni_pd.compile.passes.pd_split.PDSplitPlan` into the YAML round-trip tree.

Pure: :func:`apply_pd_split` deep-copies the input tree (:func:`omni_pd.io.copy_tree`)
and edits the copy, so the input's comments, key order and quoting survive; only what
the split changes is touched. :func:`render` adds the ``yaml-language-server`` schema header.
"""

from __future__ import annotations

from typing import Any, Callable

from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.scalarstring import DoubleQuotedScalarString

from omni_pd.io import copy_tree
from omni_pd.compile.passes.pd_split import PDSplitPlan
from omni_pd.compile.devices import Devices, format_devices, parse_devices

_CONN_PREFIX = {"input_connectors": "from_stage_", "output_connectors": "to_stage_"}


def _q(s: str) -> DoubleQuotedScalarString:
    return DoubleQuotedScalarString(s)


def _cmap(d: dict[str, Any]) -> CommentedMap:
    out = CommentedMap()
    for k, v in d.items():
        out[k] = _cmap(v) if isinstance(v, dict) else v
    return out


def _insert(cm: CommentedMap, key: str, value: Any, before: tuple[str, ...] = (), after: tuple[str, ...] = ()) -> None:
    """Set ``key``; when new, place it after the last present key of ``after`` or before
    the first present key of ``before`` (else at the end). The comment lines written above
    the key it is placed before stay above that key (:func:`_keep_comment_with_next`)."""
    if key in cm:
        cm[key] = value
        return
    keys = list(cm.keys())
    for a in reversed(after):
        if a in cm:
            _insert_at(cm, keys, keys.index(a) + 1, key, value)
            return
    for b in before:
        if b in cm:
            _insert_at(cm, keys, keys.index(b), key, value)
            return
    cm[key] = value


def _insert_at(cm: CommentedMap, keys: list, i: int, key: str, value: Any) -> None:
    if 0 < i < len(keys):
        _keep_comment_with_next(cm, keys[i - 1], keys[i])
    cm.insert(i, key, value)


def _keep_comment_with_next(cm: CommentedMap, prev: Any, nxt: Any) -> None:
    """Before a key is inserted between ``prev`` and ``nxt``: ruamel.yaml stores the
    full-line comments written between two keys as the tail of ``prev``'s end-of-line
    comment token (``ca.items[prev][2]``, ``"  # eol\n    # about nxt\n"``), so the new key
    would be written under them, parted from ``nxt`` they describe. The tail becomes
    ``nxt``'s before-key comment (``ca.items[nxt][1]``, where
    ``CommentedMap.yaml_set_comment_before_after_key`` puts one), verbatim; ``prev``'s own
    end-of-line comment stays. A ``prev`` whose value is a block mapping or sequence keeps
    such comments in that value's last item and is left as it is."""
    entry = cm.ca.items.get(prev)
    toks = take_comment_tail(entry)
    if toks:
        put_before_key(cm, nxt, toks)


def take_comment_tail(entry: Any) -> list:
    """Cut the full-line comments off the end-of-line comment token of a ``ca.items``
    ``entry`` (index 2; see :func:`_keep_comment_with_next`) and return them as
    before-key comment tokens, one per line (blank lines kept); [] when it has none. The
    end-of-line part stays on the entry (the token is dropped when there is none)."""
    from ruamel.yaml.error import CommentMark
    from ruamel.yaml.tokens import CommentToken

    tok = entry[2] if entry is not None and len(entry) > 2 else None
    if tok is None or not isinstance(getattr(tok, "value", None), str):
        return []
    eol, _, tail = tok.value.partition("\n")
    if not tail.strip():
        return []
    if eol.strip():
        tok.value = eol + "\n"
    else:
        entry[2] = None
    lines = tail.split("\n")[:-1]  # the tail ends with its last line's newline
    return [CommentToken(line.lstrip(" ") + "\n", CommentMark(len(line) - len(line.lstrip(" "))), None)
            for line in lines]  # one per line, as yaml_set_comment_before_after_key writes them


def put_before_key(cm: CommentedMap, key: Any, toks: list) -> None:
    """Write comment tokens ``toks`` (:func:`take_comment_tail`) above ``key`` of ``cm``,
    before the ones already there."""
    slot = cm.ca.items.setdefault(key, [None, None, None, None])
    slot[1] = list(toks) + list(slot[1] or [])


def _rename_keys(cm: CommentedMap, fn: Callable[[Any], Any]) -> None:
    """Rename keys in place (order and per-key comments kept)."""
    pairs = [(k, fn(k), v) for k, v in cm.items()]
    if all(k == nk for k, nk, _ in pairs):
        return
    comments = {k: cm.ca.items.get(k) for k, _, _ in pairs}
    for k, _, _ in pairs:
        del cm[k]
        cm.ca.items.pop(k, None)
    for k, nk, v in pairs:
        cm[nk] = v
        if comments[k] is not None:
            cm.ca.items[nk] = comments[k]


def _remap_connector_key(kind: str, fn: Callable[[int], int]) -> Callable[[Any], Any]:
    prefix = _CONN_PREFIX[kind]

    def f(k: Any) -> Any:
        if isinstance(k, str) and k.startswith(prefix) and k[len(prefix):].isdigit():
            return f"{prefix}{fn(int(k[len(prefix):]))}"
        return k
    return f


def _remap_connectors(stage: CommentedMap, plan: PDSplitPlan) -> None:
    for holder in (stage, stage.get("engine_args")):
        if not isinstance(holder, CommentedMap):
            continue
        ic = holder.get("input_connectors")
        if isinstance(ic, CommentedMap):
            _rename_keys(ic, _remap_connector_key("input_connectors", plan.ids.as_source))
        oc = holder.get("output_connectors")
        if isinstance(oc, CommentedMap):
            _rename_keys(oc, _remap_connector_key("output_connectors", plan.ids.as_dest))


def _where(stage: CommentedMap, key: str) -> CommentedMap:
    """The mapping that holds ``key`` for vllm-omni: ``runtime`` for devices/env when the
    stage uses that layout, ``engine_args`` when it already carries the key."""
    rt = stage.get("runtime")
    if key in ("devices", "env", "num_replicas") and isinstance(rt, CommentedMap) and (key in rt or key not in stage):
        return rt
    ea = stage.get("engine_args")
    if isinstance(ea, CommentedMap) and key in ea:
        return ea
    return stage


def _current_devices(stage: CommentedMap) -> Devices:
    try:
        return parse_devices(_where(stage, "devices").get("devices"))
    except ValueError:
        return None


def _set_devices(stage: CommentedMap, dev: Devices, *, force: bool = False) -> None:
    if dev is None or (not force and _current_devices(stage) == dev):
        return
    holder = _where(stage, "devices")
    _insert(holder, "devices", _q(format_devices(dev) or ""), before=("env", "kv_transfer_config",
            "input_connectors", "output_connectors", "default_sampling_params"))


def _eol(stage: CommentedMap, text: str, *, replace: bool = False) -> None:
    """Label ``stage_id`` with an end-of-line comment.

    A user's own comment there is kept (``replace=False``) or, for the prefill/decode
    halves, folded into the label (``"<label>; <user text>"``) unless the label already
    says it; comment lines that followed it in the same ruamel token are kept below.
    """
    item = stage.ca.items.get("stage_id")
    rest = ""
    if item and len(item) > 2 and item[2] is not None:
        if not replace:
            return  # keep the user's own comment
        old = getattr(item[2], "value", "") or ""
        first, _, rest = old.partition("\n")
        user = first.strip().lstrip("#").strip()
        if user and user.lower() not in text.lower():
            text = f"{text}; {user}"
        item[2] = None
    stage.yaml_add_eol_comment(text, "stage_id")
    if rest:
        tok = stage.ca.items["stage_id"][2]
        tok.value = tok.value + "\n" + rest


def _eol_flow(seq: CommentedSeq, index: int, text: str, *, replace: bool = False, carry: str = "",
              pass_on: bool = False) -> str:
    """Label the flow-style stage ``seq[index]`` with an end-of-line comment after its
    closing brace (ruamel keeps it on the sequence item), two spaces before ``#``. A
    user's comment there is kept or folded in as :func:`_eol` does. Comment lines that
    followed the item are returned instead of kept when ``pass_on`` (the prefill half:
    they go after the decode half, ``carry`` of the next call)."""
    item = seq.ca.items.get(index)
    rest = ""
    if item and item[0] is not None:
        if not replace:
            return carry
        first, _, rest = (getattr(item[0], "value", "") or "").partition("\n")
        user = first.strip().lstrip("#").strip()
        if user and user.lower() not in text.lower():
            text = f"{text}; {user}"
        item[0] = None
    rest = carry + rest
    seq.yaml_add_eol_comment(text, index, column=0)
    tok = seq.ca.items[index][0]
    tok.value = " " + tok.value + ("\n" + rest if rest and not pass_on else "")
    return rest if pass_on else ""


def _last_comment(node: Any) -> tuple[Any, Any] | None:
    """(container, key) of the comment slot that follows the last scalar of ``node``
    (where ruamel keeps the blank lines after a block)."""
    while True:
        if isinstance(node, CommentedMap) and node:
            k = list(node.keys())[-1]
            if isinstance(node[k], (CommentedMap, CommentedSeq)) and node[k] and not node[k].fa.flow_style():
                node = node[k]
                continue
            return node, k
        if isinstance(node, CommentedSeq) and node:
            i = len(node) - 1
            if isinstance(node[i], (CommentedMap, CommentedSeq)) and node[i] and not node[i].fa.flow_style():
                node = node[i]
                continue
            return node, i
        return None


def _drop_trailing_blank(node: Any) -> None:
    """Remove blank lines after ``node`` (keep a real end-of-line comment)."""
    loc = _last_comment(node)
    if loc is None:
        return
    cont, key = loc
    item = cont.ca.items.get(key)
    if not item:
        return
    for slot in range(len(item)):
        tok = item[slot]
        if tok is None or not hasattr(tok, "value") or not isinstance(tok.value, str):
            continue
        text = tok.value
        if text.strip() == "":
            item[slot] = None
        elif text.endswith("\n\n"):
            tok.value = text.rstrip("\n") + "\n"


def _pd_side(stage: CommentedMap, plan: PDSplitPlan, side: str) -> None:
    cfg = plan.prefill if side == "prefill" else plan.decode
    if side == "prefill":
        _insert(_where(stage, "async_scheduling"), "async_scheduling", False,
                before=("devices", "env", "input_connectors", "output_connectors", "default_sampling_params"))
        for holder in (stage, stage.get("engine_args")):
            if isinstance(holder, CommentedMap):
                holder.pop("output_connectors", None)
    else:
        for holder in (stage, stage.get("engine_args")):
            if isinstance(holder, CommentedMap):
                holder.pop("input_connectors", None)
    side_tp = plan.prefill_tp if side == "prefill" else plan.decode_tp
    if side_tp is not None:
        _insert(_where(stage, "tensor_parallel_size"), "tensor_parallel_size", side_tp,
                before=("devices", "env", "input_connectors", "output_connectors", "default_sampling_params"))
    side_dp = plan.prefill_dp if side == "prefill" else plan.decode_dp
    if side_dp is not None:
        # a stage key vllm-omni 0.30 reads into the stage's engine args over the top-level
        # (pipeline-wide) data_parallel_size (config/stage_config.py _build_engine_args)
        _insert(_where(stage, "data_parallel_size"), "data_parallel_size", side_dp, after=("tensor_parallel_size",),
                before=("devices", "env", "input_connectors", "output_connectors", "default_sampling_params"))
    side_nodes = plan.prefill_nnodes if side == "prefill" else plan.decode_nnodes
    if side_nodes is not None:
        # vLLM's multi-node launch of one instance (vllm/engine/arg_utils.py nnodes): launch and
        # render add --node-rank and --master-addr/--master-port per host
        _insert(_where(stage, "nnodes"), "nnodes", side_nodes,
                after=("tensor_parallel_size", "data_parallel_size"),
                before=("devices", "env", "input_connectors", "output_connectors", "default_sampling_params"))
    env_holder = _where(stage, "env")
    env = env_holder.get("env")
    if isinstance(env, CommentedMap):
        for k in cfg.env_remove:
            env.pop(k, None)
    if not isinstance(env, CommentedMap) and cfg.env:
        env = CommentedMap()
        _insert(env_holder, "env", env, after=("devices",),
                before=("input_connectors", "output_connectors", "default_sampling_params"))
    for k, v in cfg.env.items():
        env[k] = _q(str(v))
    kv_holder = _where(stage, "kv_transfer_config")
    _insert(kv_holder, "kv_transfer_config", _kv_map(cfg.kv_transfer_config), after=("devices", "env"),
            before=("input_connectors", "output_connectors", "default_sampling_params"))
    reps = plan.prefill_replicas if side == "prefill" else plan.decode_replicas
    if reps is not None and (reps > 1 or "num_replicas" in _where(stage, "num_replicas")):
        # xPyD: the number of instances of this side (each with its own devices and ports)
        _insert(_where(stage, "num_replicas"), "num_replicas", reps, after=("devices",),
                before=("env", "kv_transfer_config", "input_connectors", "output_connectors"))


def _kv_map(kv: dict[str, Any]) -> CommentedMap:
    out = _cmap(kv)
    for k in ("kv_ip",):
        if isinstance(out.get(k), str):
            out[k] = _q(out[k])
    return out


def _split_list(seq: CommentedSeq, plan: PDSplitPlan, *, base: bool, platform_devices: dict[int, Devices] | None,
                labels: dict[int, str] | None) -> None:
    """Rewrite a ``stages`` list (base or overlay) in place."""
    t = plan.ids.t
    for s in seq:  # ids the model accepted in lax form ('1', 1.0) are the ids it planned with
        if isinstance(s, CommentedMap) and "stage_id" in s:
            s["stage_id"] = _lax_int(s["stage_id"])
    thinker_pos = next((i for i, s in enumerate(seq) if isinstance(s, CommentedMap) and s.get("stage_id") == t), None)
    for s in seq:
        if not isinstance(s, CommentedMap) or not isinstance(s.get("stage_id"), int):
            continue
        if s.get("stage_id") != t:
            s["stage_id"] = plan.ids.shift(s["stage_id"])
        _remap_connectors(s, plan)
    if thinker_pos is None and base:
        p = CommentedMap([("stage_id", t)])
        pos = next((i for i, s in enumerate(seq) if isinstance(s, CommentedMap)
                    and isinstance(s.get("stage_id"), int) and s["stage_id"] > t), len(seq))
        seq.insert(pos, p)
        thinker_pos = pos
    if thinker_pos is not None:
        p = seq[thinker_pos]
        d = copy_tree(p)
        d["stage_id"] = plan.ids.decode
        if thinker_pos == len(seq) - 1:
            _drop_trailing_blank(p)  # the blank line that ended the block now follows D
        seq.insert(thinker_pos + 1, d)
        if base:
            _pd_side(p, plan, "prefill")
            _pd_side(d, plan, "decode")
        else:
            if "async_scheduling" in p:
                p["async_scheduling"] = False
            p.pop("output_connectors", None)
            d.pop("input_connectors", None)
    devmap = plan.base_devices if base else (platform_devices or {})
    present = {s.get("stage_id"): s for s in seq if isinstance(s, CommentedMap)}
    for new_id, dev in sorted(devmap.items()):
        st = present.get(new_id)
        if st is None:
            if base:
                continue
            st = CommentedMap([("stage_id", new_id)])
            if _all_flow(seq):
                st.fa.set_flow_style()
            pos = next((i for i, s in enumerate(seq) if isinstance(s, CommentedMap)
                        and isinstance(s.get("stage_id"), int) and s["stage_id"] > new_id), len(seq))
            seq.insert(pos, st)
            present[new_id] = st
        _set_devices(st, dev, force=not base or new_id in (plan.ids.prefill, plan.ids.decode))
    if labels:
        carry = ""  # comment lines that followed a flow-style Thinker: they belong after its decode half
        for i, s in enumerate(seq):
            if isinstance(s, CommentedMap) and s.get("stage_id") in labels:
                replace = s["stage_id"] in (plan.ids.prefill, plan.ids.decode)
                if s.fa.flow_style():  # `- {stage_id: 0, ...}  # label`: after the mapping, not inside it
                    nxt = seq[i + 1] if i + 1 < len(seq) else None
                    pass_on = (s["stage_id"] == plan.ids.prefill and isinstance(nxt, CommentedMap)
                               and nxt.get("stage_id") == plan.ids.decode)
                    carry = _eol_flow(seq, i, labels[s["stage_id"]], replace=replace, carry=carry, pass_on=pass_on)
                else:
                    _eol(s, labels[s["stage_id"]], replace=replace)


def _lax_int(v: Any) -> Any:
    """``'1'`` / ``1.0`` -> ``1`` (what pydantic's lax int gives the model); anything else unchanged."""
    if isinstance(v, bool):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            return v
    return v


def _all_flow(seq: CommentedSeq) -> bool:
    return bool(seq) and all(isinstance(s, CommentedMap) and s.fa.flow_style() for s in seq)


def _edges(tree: CommentedMap, plan: PDSplitPlan) -> None:
    ids = plan.ids
    if isinstance(tree.get("edges"), CommentedSeq) and tree["edges"]:
        seq = tree["edges"]
        for e in seq:
            if isinstance(e, CommentedMap):
                if isinstance(e.get("from"), int):
                    e["from"] = ids.as_source(e["from"])
                if isinstance(e.get("to"), int):
                    e["to"] = ids.as_dest(e["to"])
        if plan.stream:  # streaming PD: no stage edge into decode (omni_pd/compile/stream_pd.py)
            _say_no_decode_edge(tree, ids)
            return
        pos = next((i for i, e in enumerate(seq) if isinstance(e, CommentedMap) and e.get("from") == ids.decode), len(seq))
        new = CommentedMap([("from", ids.prefill), ("to", ids.decode)])
        tmpl = seq[pos] if pos < len(seq) else (seq[-1] if seq else None)
        if isinstance(tmpl, CommentedMap):
            for k in ("window_size", "max_inflight"):
                if k in tmpl:
                    new[k] = tmpl[k]
            if tmpl.fa.flow_style():
                new.fa.set_flow_style()
        seq.insert(pos, new)
        return
    seq = CommentedSeq()
    for s in plan.target_pipeline.stages:
        for src in s.input_sources:
            if plan.stream and (src, s.stage_id) == (ids.prefill, ids.decode):
                continue
            e = CommentedMap([("from", src), ("to", s.stage_id)])
            e.fa.set_flow_style()
            seq.append(e)
    if not seq:
        return
    keys = list(tree.keys())
    if "edges" in tree:
        tree["edges"] = seq
    elif "platforms" in tree:
        tree.insert(keys.index("platforms"), "edges", seq)
    else:
        tree["edges"] = seq
    if plan.stream:
        _say_no_decode_edge(tree, ids)


def _say_no_decode_edge(tree: CommentedMap, ids: Any) -> None:
    """A comment at the top of ``edges:`` saying why streaming PD has no prefill -> decode entry."""
    seq = tree.get("edges")
    if isinstance(seq, CommentedSeq):
        seq.yaml_set_start_comment(
            f"no {ids.prefill} -> {ids.decode}: the KV connector carries that hop and the orchestrator submits decode "
            f"after prefill;\na stage edge there would make decode a chunk receiver, prewarmed with a placeholder "
            f"prompt under async_chunk", indent=2)


def stage_labels(plan: PDSplitPlan) -> dict[int, str]:
    """End-of-line comment for each new stage id, e.g. ``thinker prefill (KV producer)``."""
    out: dict[int, str] = {}
    t = plan.ids.t
    for s in plan.target_pipeline.stages:
        if s.pd_role == "prefill":
            out[s.stage_id] = f"{s.role} prefill (KV producer), split from stage {t}"
        elif s.pd_role == "decode":
            out[s.stage_id] = f"{s.role} decode (KV consumer), split from stage {t}"
        else:
            old = s.stage_id if s.stage_id < t else s.stage_id - 1
            out[s.stage_id] = s.role + (f" (was stage {old})" if old != s.stage_id else "")
    return out


def apply_pd_split(tree: CommentedMap, plan: PDSplitPlan) -> CommentedMap:
    """A new tree: ``tree`` with the PD split of ``plan`` applied. ``tree`` is not modified."""
    out = copy_tree(tree)
    if "pipeline" in out:
        out["pipeline"] = plan.target_pipeline.name
    else:
        out.insert(0, "pipeline", plan.target_pipeline.name)
    if "async_chunk" in out:
        out["async_chunk"] = plan.stream
    else:
        out.insert(list(out.keys()).index("pipeline") + 1, "async_chunk", plan.stream)
    if not isinstance(out.get("stages"), CommentedSeq):
        out["stages"] = CommentedSeq()
    _split_list(out["stages"], plan, base=True, platform_devices=None, labels=stage_labels(plan))
    _edges(out, plan)
    plats = out.get("platforms")
    if isinstance(plats, CommentedMap):
        for pname, pov in plats.items():
            if isinstance(pov, CommentedMap) and isinstance(pov.get("stages"), CommentedSeq):
                _split_list(pov["stages"], plan, base=False,
                            platform_devices=plan.overlay_devices.get(pname), labels=None)
    return out


#: the header line that introduces the input's own top comment in expand's output
INPUT_NOTES = "Notes from the input follow, written for it before the split; the stage ids and devices in the keys are current."


def render(tree: CommentedMap, *, schema_ref: str | None, header: list[str]) -> str:
    """YAML text with the schema modeline and ``header`` comment lines on top.

    Any ``# yaml-language-server:`` line already at the top of the document is replaced.
    """
    from omni_pd.io import dump

    body = dump(tree)
    lines = body.splitlines(keepends=True)
    while lines and lines[0].startswith("# yaml-language-server:"):
        lines.pop(0)
    top = []
    if schema_ref:
        top.append(f"# yaml-language-server: $schema={schema_ref}\n")
    top += [f"# {h}\n" if h else "#\n" for h in header]
    if header and lines and lines[0].startswith("#"):
        # the input's own top comment follows; it was written for the layout before the
        # split (stage ids, devices), so say so rather than let it read as current
        top.append(f"# {INPUT_NOTES}\n")
    return "".join(top + _blank_around(lines, "edges:"))


def _blank_around(lines: list[str], key: str) -> list[str]:
    """Separate the top-level ``key`` block from its neighbours with one blank line."""
    out: list[str] = []
    inside = False
    for ln in lines:
        top = bool(ln.strip()) and not ln[0].isspace() and not ln.startswith(("#", "-"))
        if top and ln.startswith(key):
            if out and out[-1].strip():
                out.append("\n")
            inside = True
        elif top and inside:
            if out and out[-1].strip():
                out.append("\n")
            inside = False
        out.append(ln)
    return out
