"""Legacy ``stage_args`` files -> the ``stages:`` deploy schema of a target release. Pure.

vllm-omni 0.28+ refuses the legacy schema (``vllm_omni/config/stage_config.py``
``load_deploy_config``); most PD recipes on disk (vllm-omni's own
``docs/.../pd_disaggregation.md``) are written in it. :func:`migrate_document` rewrites
the round-trip tree of such a file: one ``stages:`` entry per ``stage_args`` entry, with
``engine_args`` and ``runtime`` flattened in place (key order and end-of-line comments
kept), the topology keys checked against the catalogue's pipeline and dropped, and the
runtime keys rewritten to what the target release reads. Every change is one located
note (OPD970, info, at the legacy key); what it cannot map is an error naming the key
(OPD971), never a silent drop.

Where each legacy key goes is data: ``presets/targets/legacy_stage_args.yaml`` (each row
with its upstream source; ``docs/migrate.md`` is generated from it by :func:`doc_table`).
The release facts come from the target tables (``vllm.yaml``: KVTransferConfig fields per
vLLM release; ``mooncake_bootstrap.yaml``: which setting decides a Mooncake prefill's
bootstrap port), so adding a release is an edit there.

No printing, no files: the CLI (``omni-pd migrate``) writes and prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from omni_pd.compile.pipelines import Catalogue, Pipeline, PipelineStage
from omni_pd.compile.targets import Target, parse_version
from omni_pd.diagnostics import Diagnostic, Location, OmniPdError, Severity
from omni_pd.io import Document, Path_

NOTE = "OPD970"
ERROR = "OPD971"

#: vllm-omni's flag for each schema (``legacy_stage_args.yaml`` ``serve``)
BOOTSTRAP_ENV = "VLLM_MOONCAKE_BOOTSTRAP_PORT"


@lru_cache(maxsize=1)
def key_map() -> dict[str, Any]:
    """``presets/targets/legacy_stage_args.yaml`` as plain data (rows: ``top``, ``stage``,
    ``kv_transfer_config``; ``serve``)."""
    from omni_pd.resources import data_dir, load_data

    return load_data(data_dir("presets") / "targets" / "legacy_stage_args.yaml")


@lru_cache(maxsize=1)
def _owned_keys() -> tuple[str, frozenset[str]]:
    """(vllm-omni release, deploy fields | owned engine args) of vllm_omni_stage_keys.yaml."""
    from omni_pd.resources import data_dir, load_data

    d = load_data(data_dir("presets") / "targets" / "vllm_omni_stage_keys.yaml")
    return str(d["vllm_omni"]), frozenset(d["deploy"]) | frozenset(d["owned"])


def is_legacy(tree: Any) -> bool:
    """True for a mapping in the legacy schema (``stage_args:`` and no ``stages:``)."""
    return isinstance(tree, dict) and "stage_args" in tree and "stages" not in tree


def serve_command(path: str, target: Target, model: str = "MODEL", tree: Any = None) -> str:
    """The ``vllm serve`` line that reads ``path`` on ``target``'s vllm-omni release:
    ``--deploy-config`` from 0.20 (``--stage-configs-path`` before; data: ``serve``), plus
    ``--trust-remote-code`` when a stage of ``tree`` (the file's tree) sets
    ``trust_remote_code: true``: vllm-omni 0.30 resolves the pipeline from the model's HF
    config with the command line's value before any stage setting applies
    (``config/config_factory.py`` ``StageConfigFactory.create_from_model``:
    ``trust_remote_code=bool(trust_remote_code)``), so a model with remote code fails there
    without the flag."""
    from omni_pd.compile.targets import parse_version

    s = key_map()["serve"]
    flag = s["deploy_flag"] if target.version >= parse_version(s["deploy_flag_since"]) else s["legacy_flag"]
    trust = " --trust-remote-code" if any(_trusts_remote_code(st) for st in _stage_list(tree)) else ""
    return f"vllm serve {model} --omni{trust} {flag} {path}"


def _stage_list(tree: Any) -> list[Any]:
    if not isinstance(tree, dict):
        return []
    stages = tree.get("stages", tree.get("stage_args"))
    return [st for st in stages if isinstance(st, dict)] if isinstance(stages, list) else []


def _trusts_remote_code(stage: dict[str, Any]) -> bool:
    ea = stage.get("engine_args")
    return stage.get("trust_remote_code") is True or (isinstance(ea, dict) and ea.get("trust_remote_code") is True)


@dataclass(frozen=True)
class Migration:
    """:func:`migrate_document`'s answer.

    ``tree``: the new round-trip tree (``stages:`` schema); ``notes``: one OPD970 info per
    change, located in the legacy file; ``pipeline``: the catalogue pipeline the stages
    were matched to; ``paths``: new path -> the legacy path it came from (for keys that
    moved; :meth:`legacy_path` maps any path through its nearest mapped ancestor).
    """

    tree: Any
    notes: tuple[Diagnostic, ...]
    pipeline: Pipeline
    paths: dict[Path_, Path_] = field(default_factory=dict)

    def legacy_path(self, path: Path_) -> Path_ | None:
        """The legacy path of ``path`` (a path into :attr:`tree`), or None when nothing
        it descends from came from the legacy file."""
        path = tuple(path)
        for n in range(len(path), -1, -1):
            old = self.paths.get(path[:n])
            if old is not None:
                return tuple(old) + path[n:]
        return None


class MigrateError(OmniPdError):
    """Keys migrate cannot map (OPD971, exit 2). ``diagnostics``: every one, in file order
    (``diagnostic``: the first)."""

    def __init__(self, diagnostics: list[Diagnostic]):
        super().__init__(diagnostics[0], exit_code=2)
        self.diagnostics = diagnostics


# --- helpers ------------------------------------------------------------------------

def _move_comment(src: Any, skey: Any, dst: Any, dkey: Any) -> None:
    """Carry the end-of-line comment of ``src[skey]`` to ``dst[dkey]`` (ruamel ``ca.items``)."""
    ca = getattr(src, "ca", None)
    if ca is None or skey not in ca.items:
        return
    dst.ca.items[dkey] = ca.items[skey]


def _rows(section: str) -> dict[str, dict[str, Any]]:
    return {str(r["key"]): r for r in key_map()[section]}


def _show(v: Any) -> str:
    from omni_pd.compile.parse import to_plain

    p = to_plain(v)
    return f'"{p}"' if isinstance(p, str) else ("true" if p is True else "false" if p is False else str(p))


class _Work:
    """The state of one migration: notes, errors and the path map, located in ``doc``."""

    def __init__(self, doc: Document):
        self.doc = doc
        self.notes: list[Diagnostic] = []
        self.errors: list[Diagnostic] = []
        self.paths: dict[Path_, Path_] = {}

    def loc(self, path: Path_, value: bool = False) -> Location:
        p = tuple(path)
        while p and not self.doc.exists(p):
            p = p[:-1]
        return self.doc.loc(p, value=value and p == tuple(path))

    def note(self, path: Path_, message: str, help: str | None = None) -> None:
        self.notes.append(Diagnostic(code=NOTE, severity=Severity.INFO, message=message,
                                     location=self.loc(path), help=help))

    def error(self, path: Path_, message: str, help: str | None = None) -> None:
        self.errors.append(Diagnostic(code=ERROR, severity=Severity.ERROR, message=message,
                                      location=self.loc(path), help=help))


def _dotted(path: Path_) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


# --- choosing the pipeline --------------------------------------------------------

def _stage_facts(st: Any) -> dict[str, Any]:
    ea = st.get("engine_args") if isinstance(st.get("engine_args"), dict) else {}
    return {"model_stage": ea.get("model_stage"), "model_arch": ea.get("model_arch"),
            "prefill": bool(st.get("is_prefill_only")), "decode": bool(st.get("is_decode_only"))}


def _fits(pipe: Pipeline, stages: list[Any]) -> bool:
    if pipe.linear_chain or pipe.encoder is not None or len(pipe.stages) != len(stages):
        return False
    for st in stages:
        ps = pipe.stage(st.get("stage_id")) if isinstance(st.get("stage_id"), int) else None
        if ps is None:
            return False
        f = _stage_facts(st)
        if f["model_stage"] is not None and str(f["model_stage"]) != ps.model_stage:
            return False
        if f["model_arch"] is not None and pipe.model_arch is not None and str(f["model_arch"]) != pipe.model_arch:
            return False
        if f["prefill"] != (ps.pd_role == "prefill") or f["decode"] != (ps.pd_role == "decode"):
            return False
    return True


#: :attr:`Pipeline.name` of :func:`uncatalogued`'s stand-in
UNCATALOGUED = "(a pipeline omni-pd does not catalogue)"


def uncatalogued(stages: list[Any]) -> Pipeline:
    """The stand-in pipeline for legacy stages no catalogue pipeline fits (most files
    vllm-omni 0.18-0.24 shipped: Step-Audio 2, MammothModa2, Voxtral TTS, the diffusion
    DiTs): a ``linear_chain`` pipeline (as validate's stand-in) whose stages are the
    legacy file's own ids and ``engine_input_source``. Migrate then checks no topology
    key (each is dropped with a note saying it was not checked) and writes no
    ``pipeline:``: vllm-omni 0.30 takes the pipeline registered for the model's
    ``model_type`` (config/resolver.py ``resolve_omni_config``), as the legacy loader
    took the stage graph from the file."""
    out = []
    for st in stages:
        f = _stage_facts(st)
        src = st.get("engine_input_source")
        out.append(PipelineStage(stage_id=int(st["stage_id"]), role=str(f["model_stage"] or "stage"),
                                 model_stage=str(f["model_stage"] or ""),
                                 input_sources=tuple(int(i) for i in src if isinstance(i, int))
                                 if isinstance(src, list) else ()))
    return Pipeline(name=UNCATALOGUED, stages=tuple(out), linear_chain=True)


def choose_pipeline(stages: list[Any], catalogue: Catalogue, name: str | None, w: _Work) -> Pipeline | None:
    """The catalogue pipeline whose stages the legacy ``stages`` describe: same stage ids,
    ``engine_args.model_stage``/``model_arch`` where given, and the PD flags
    (``is_prefill_only``/``is_decode_only``) on the PD variant's prefill/decode stages.
    ``name``: ``--pipeline``. When none fits and no stage carries a PD flag (a PD file
    needs omni-pd's registered ``_pd`` pipeline), :func:`uncatalogued`'s stand-in.
    None (with an OPD971) when several fit, or none fits a PD file."""
    if name is not None:
        pipe = catalogue.get(name)
        if pipe is None:
            w.error(("stage_args",), f"unknown pipeline `{name}`", help="catalogued: " + ", ".join(catalogue.names()))
        return pipe
    fits = [p for p in catalogue.pipelines.values() if _fits(p, stages)]
    if len(fits) == 1:
        return fits[0]
    if not fits and not any(_stage_facts(s)["prefill"] or _stage_facts(s)["decode"] for s in stages) \
            and all(isinstance(s.get("stage_id"), int) for s in stages):
        return uncatalogued(stages)
    if not fits:
        w.error(("stage_args",), f"no catalogued pipeline has these {len(stages)} stages "
                "(stage ids, engine_args.model_stage / model_arch, is_prefill_only / is_decode_only)",
                help="pass --pipeline NAME (see `omni-pd pipelines`), or give each stage its "
                     "engine_args.model_stage and model_arch")
    else:
        w.error(("stage_args",), "these stages fit several pipelines: " + ", ".join(sorted(p.name for p in fits)),
                help="pass --pipeline NAME, or give the stages engine_args.model_arch")
    return None


# --- the pass ---------------------------------------------------------------------

def _expected(ps: PipelineStage, pipe: Pipeline, against: str) -> Any:
    if against == "stage_type":
        return "diffusion" if ps.execution_type == "DIFFUSION" else "llm"
    if against == "worker_type":
        return {"LLM_AR": "ar", "LLM_GENERATION": "generation"}.get(ps.execution_type)
    if against == "model_arch":
        return pipe.model_arch
    if against == "input_sources":
        return list(ps.input_sources)
    if against in ("prefill", "decode"):
        return ps.pd_role == against
    return getattr(ps, against)


def migrate_document(doc: Document, target: Target, catalogue: Catalogue,
                     pipeline: str | None = None) -> Migration:
    """Migrate the legacy ``stage_args`` file ``doc`` to the ``stages:`` schema of
    ``target`` (vLLM/vllm-omni ``major.minor``; vllm-omni X.Y runs on vLLM X.Y).

    ``doc.tree`` is not modified. ``pipeline``: the catalogue pipeline the stages are (None:
    chosen by :func:`choose_pipeline`). Raises :class:`MigrateError` (OPD971, exit 2,
    located at each key) for what cannot be mapped: a stage that is not a mapping, a key
    no row of ``legacy_stage_args.yaml`` names, a topology value that contradicts the
    pipeline, no or several fitting pipelines, a key set twice (flat and in
    ``engine_args``). Raises ValueError when ``doc`` is not legacy (:func:`is_legacy`).
    """
    from ruamel.yaml.comments import CommentedMap

    from omni_pd.io import copy_tree

    if not is_legacy(doc.tree):
        raise ValueError("not a legacy stage_args file")
    src = copy_tree(doc.tree)
    w = _Work(doc)
    legacy = src["stage_args"]
    if not isinstance(legacy, list) or not legacy or not all(isinstance(s, dict) for s in legacy):
        w.error(("stage_args",), "`stage_args` must be a non-empty list of stage mappings")
        raise MigrateError(w.errors)
    pipe = choose_pipeline(list(legacy), catalogue, pipeline, w)
    if pipe is None:
        raise MigrateError(w.errors)

    out = CommentedMap()
    src.copy_attributes(out)  # the document's comments (head and foot) and format
    out.ca.items.clear()
    top = _rows("top")
    runtime = src.get("runtime") if isinstance(src.get("runtime"), dict) else None
    for k, v in src.items():
        if k == "stage_args":
            out["stages"] = _migrate_stages(v, pipe, target, w)
            _move_comment(src, k, out, "stages")
            w.paths[("stages",)] = ("stage_args",)
        elif k == "runtime" and runtime is not None:
            _migrate_runtime(runtime, out, top, w)
        elif k in top and top[k]["action"] == "move":
            out[top[k]["to"]] = v
            _move_comment(src, k, out, top[k]["to"])
            w.paths[(top[k]["to"],)] = (k,)
        elif k in top and top[k]["action"] == "drop":
            if "unless" in top[k] and v == top[k]["unless"]:
                w.error((k,), f"`{k}: {_show(v)}` cannot be migrated: {top[k]['why']}")
            else:
                w.note((k,), f"top-level `{k}` dropped: {top[k]['why']}")
        elif k in ("connectors", "edges", "platforms", "pipeline") or k in _owned_keys()[1]:
            out[k] = v  # already a deploy-schema key (pipeline-wide engine settings)
            _move_comment(src, k, out, k)
            w.paths[(k,)] = (k,)
        else:
            w.error((k,), f"top-level `{k}`: no home in the `stages:` schema",
                    help="remove it, or move it into a stage's engine_args")
    # the legacy loader's default async_chunk (false) differs from the new one (true)
    ac = top["async_chunk"]
    if "async_chunk" not in out:
        out.insert(0, "async_chunk", ac["legacy_default"])
        w.note(("stage_args",), f"async_chunk: {_show(ac['legacy_default'])} written: the legacy loader's default; "
               f"the `stages:` schema defaults to {_show(ac['default'])}")
    if "pipeline" not in out and not pipe.linear_chain:
        out.insert(0, "pipeline", pipe.name)
        w.note(("stage_args",), f"pipeline: {pipe.name} written: " + (
            "vllm-omni turns prefill/decode on only for a pipeline whose stages carry is_prefill_only / "
            "is_decode_only (registered by omni-pd's plugin)" if pipe.is_pd else
            "the stage graph is the pipeline's now (vllm-omni would take it from the model's model_type)"))
    if w.errors:
        raise MigrateError(sorted(w.errors, key=lambda d: (d.location.line or 0, d.location.column or 0)))
    return Migration(tree=out, notes=tuple(w.notes), pipeline=pipe, paths=dict(w.paths))


def _migrate_runtime(rt: Any, out: Any, top: dict[str, dict[str, Any]], w: _Work) -> None:
    """Top-level ``runtime:`` -> ``edges`` / ``connectors`` (``runtime.defaults`` spread
    over the edges; ``runtime.enabled: true`` dropped)."""
    defaults = None
    for k, v in rt.items():
        row = top.get(f"runtime.{k}")
        path = ("runtime", k)
        if row is None:
            w.error(path, f"`runtime.{k}`: no home in the `stages:` schema", help="remove it")
        elif row["action"] == "move":
            out[row["to"]] = v
            _move_comment(rt, k, out, row["to"])
            w.paths[(row["to"],)] = path
            w.note(path, f"`runtime.{k}` -> top-level `{row['to']}`")
        elif row["action"] == "drop":
            if "unless" in row and v == row["unless"]:
                w.error(path, f"`runtime.{k}: {_show(v)}` cannot be migrated: {row['why']}")
            else:
                w.note(path, f"`runtime.{k}` dropped: {row['why']}")
        elif row["action"] == "spread":
            defaults = (path, v)
    if defaults is not None:
        path, v = defaults
        edges = out.get("edges")
        if isinstance(v, dict) and v and isinstance(edges, list):
            for e in edges:
                if isinstance(e, dict):
                    for dk, dv in v.items():
                        e.setdefault(dk, dv)
            w.note(path, "`runtime.defaults` (" + ", ".join(map(str, v)) + ") copied onto every edge")
        elif isinstance(v, dict) and v:
            w.note(path, "`runtime.defaults` (" + ", ".join(map(str, v)) + ") dropped: there are no edges to "
                   "apply it to")
        else:
            w.note(path, "`runtime.defaults` dropped: empty")


def _migrate_stages(legacy: Any, pipe: Pipeline, target: Target, w: _Work) -> Any:
    from ruamel.yaml.comments import CommentedSeq

    seq = CommentedSeq()
    legacy.copy_attributes(seq)
    for i, st in enumerate(legacy):
        seq.append(_migrate_stage(st, i, pipe, target, w))
        w.paths[("stages", i)] = ("stage_args", i)
    return seq


def _migrate_stage(st: Any, i: int, pipe: Pipeline, target: Target, w: _Work) -> Any:
    from ruamel.yaml.comments import CommentedMap

    rows = _rows("stage")
    ps = pipe.stage(st.get("stage_id"))
    assert ps is not None  # choose_pipeline matched every stage id
    new = CommentedMap()
    st.copy_attributes(new)
    new.ca.items.clear()
    base = ("stage_args", i)
    sets: list[tuple[int, str, Any]] = []  # (position, key, value) the scheduler row sets
    kv_src: tuple[Any, Path_] | None = None
    fallbacks: list[tuple[str, Any, Path_, Any, Any]] = []  # (to, value, from, holder, key): used when unset

    def put(key: str, value: Any, frm: Path_, holder: Any, hkey: Any) -> None:
        if key in new:
            w.error(base + frm, f"stage {ps.stage_id}: `{key}` is set twice (at {_dotted(w.paths[('stages', i, key)])} "
                    f"and {_dotted(base + frm)})", help="keep one")
            return
        new[key] = value
        _move_comment(holder, hkey, new, key)
        w.paths[("stages", i, key)] = base + frm

    def one(key: str, row: dict[str, Any] | None, value: Any, frm: Path_, holder: Any, hkey: Any) -> None:
        nonlocal kv_src
        where = _dotted(frm)
        if row is None:
            w.error(base + frm, f"stage {ps.stage_id}: `{where}` has no home in the `stages:` schema",
                    help="remove it, or move an engine argument under engine_args")
            return
        act = row["action"]
        if act == "move":
            to = key if row["to"] == "*" else row["to"]
            if row.get("as") == "string" and isinstance(value, int) and not isinstance(value, bool):
                from ruamel.yaml.scalarstring import DoubleQuotedScalarString

                w.note(base + frm, f"stage {ps.stage_id}: `{where}: {value}` -> `{to}: \"{value}\"` ({row['why']})")
                put(to, DoubleQuotedScalarString(str(value)), frm, holder, hkey)
                return
            put(to, value, frm, holder, hkey)
            if where != to:
                w.note(base + frm, f"stage {ps.stage_id}: `{where}` -> `{to}`")
        elif act in ("check", "pipeline") and pipe.linear_chain:
            w.note(base + frm, f"stage {ps.stage_id}: `{where}` dropped, not checked: vllm-omni takes it from the "
                   "pipeline registered for the model's model_type, which omni-pd does not catalogue")
        elif act == "check":
            want = _expected(ps, pipe, row["against"])
            if want is None and row["against"] == "model_arch":  # the pipeline names no class (llm)
                w.note(base + frm, f"stage {ps.stage_id}: `{where}` dropped: the model's config.json decides it")
                return
            got = value if not isinstance(value, list) else [int(x) for x in value if isinstance(x, int)]
            if row["against"] in ("prefill", "decode"):
                got = bool(value)
            if got != want and not (row["against"] == "final_output_type" and not want and not got):
                w.error(base + frm, f"stage {ps.stage_id}: `{where}: {_show(value)}` contradicts pipeline "
                        f"`{pipe.name}` ({_show(want)})",
                        help=f"the deploy schema cannot change the pipeline's {row['against']}; "
                             "fix the value or pass --pipeline")
            else:
                w.note(base + frm, f"stage {ps.stage_id}: `{where}` dropped: pipeline `{pipe.name}` sets it")
        elif act == "pipeline":
            w.note(base + frm, f"stage {ps.stage_id}: `{where}` dropped: the pipeline `{pipe.name}` owns it now")
        elif act == "drop":
            if "unless" in row and value == row["unless"]:
                w.error(base + frm, f"stage {ps.stage_id}: `{where}: {_show(value)}` cannot be migrated: {row['why']}")
            else:
                w.note(base + frm, f"stage {ps.stage_id}: `{where}` dropped: {row['why']}")
        elif act == "scheduler":
            vals = row["values"]
            if str(value) not in vals:
                w.error(base + frm, f"stage {ps.stage_id}: scheduler `{value}` has no equivalent in the `stages:` schema",
                        help="one of: " + ", ".join(vals))
                return
            picked = vals[str(value)]
            for sk, sv in picked.items():
                sets.append((len(new), sk, sv))  # where scheduler_cls was
            what = ", ".join(f"{k}: {_show(v)}" for k, v in picked.items()) or "nothing (the pipeline's default)"
            w.note(base + frm, f"stage {ps.stage_id}: `{where}` -> {what}")
        elif act == "kv":
            kv_src = (value, frm)
            put(row["to"], value, frm, holder, hkey)
        elif act == "fallback":
            fallbacks.append((row["to"], value, frm, holder, hkey))

    for k, v in st.items():
        if k == "engine_args" and isinstance(v, dict):
            for ek, ev in v.items():
                row = rows.get(f"engine_args.{ek}") or rows["engine_args.*"]
                one(str(ek), row, ev, ("engine_args", ek), v, ek)
        elif k == "runtime" and isinstance(v, dict):
            for rk, rv in v.items():
                one(str(rk), rows.get(f"runtime.{rk}"), rv, ("runtime", rk), v, rk)
        else:
            one(str(k), rows.get(str(k)), v, (k,), st, k)
    for to, fv, frm, holder, hkey in fallbacks:
        where = _dotted(frm)
        if to in new:
            w.note(base + frm, f"stage {ps.stage_id}: `{where}` dropped: the stage sets `{to}` "
                   f"({_show(new[to])}), which wins")
        else:
            put(to, fv, frm, holder, hkey)
            w.note(base + frm, f"stage {ps.stage_id}: `{where}` -> `{to}`")
    for pos, sk, sv in reversed(sets):
        if sk not in new:  # an explicit engine_args value wins
            new.insert(pos, sk, sv)
    if kv_src is not None and isinstance(kv_src[0], dict):
        _migrate_kv(new, kv_src[0], base + kv_src[1], ps, target, pipe, w)
    _check_owned(new, i, ps, target, w)
    return new


def _check_owned(new: Any, i: int, ps: PipelineStage, target: Target, w: _Work) -> None:
    """On the release whose stage-key list omni-pd ships (vllm-omni 0.30), a flattened
    engine argument no structured config owns would be refused at start-up
    (config/omni_config.py ``_validate_stage_engine_override_ownership``): OPD971 naming it."""
    release, known = _owned_keys()
    if target.label != release:
        return
    for k in new:
        if str(k) not in known and k not in ("kv_transfer_config",):
            w.error(w.paths.get(("stages", i, k), ("stage_args", i)),
                    f"stage {ps.stage_id}: `{k}` is no engine argument vllm-omni {release} can place",
                    help="remove it or rename it to an engine argument of vllm-omni " + release)


def _migrate_kv(new: Any, kv: Any, at: Path_, ps: PipelineStage, target: Target, pipe: Pipeline, w: _Work) -> None:
    """``kv_transfer_config`` keys the target reads differently (in place on ``new``):
    the Mooncake bootstrap port moves to the setting the target reads on the prefill side
    and is dropped on decode; fields the target removed or no connector reads are
    dropped; each with a note."""
    rows = _rows("kv_transfer_config")
    role = kv.get("kv_role")
    conn = str(kv.get("kv_connector") or "")
    sid = ps.stage_id
    fields = target.kv_fields()
    for k in list(kv):
        if k == "kv_connector_extra_config" and isinstance(kv[k], dict):
            extra = kv[k]
            if "mooncake_bootstrap_port" in extra:
                _bootstrap(new, kv, extra, at + (k, "mooncake_bootstrap_port"), role, conn, target, pipe, sid, w)
            if not extra:
                del kv[k]
                w.note(at + (k,), f"stage {sid}: `kv_connector_extra_config` dropped: nothing left in it")
            continue
        row = rows.get(str(k)) or rows["*"]
        if row["action"] == "unread" or (target.kv_field_known(str(k)) and str(k) not in fields):
            why = (f"vLLM {target.label} has no such KVTransferConfig field" if str(k) not in fields
                   else f"no vLLM {target.label} KV connector reads it")
            w.note(at + (k,), f"stage {sid}: `kv_transfer_config.{k}` dropped: {why}")
            del kv[k]


def _bootstrap(new: Any, kv: Any, extra: Any, at: Path_, role: Any, conn: str, target: Target, pipe: Pipeline,
               sid: int, w: _Work) -> None:
    """``kv_connector_extra_config.mooncake_bootstrap_port`` -> what ``target`` reads
    (``Target.mooncake_bootstrap``): on a ``kv_producer``/``kv_both`` stage the deciding
    key (``bootstrap_port`` on vllm-omni 0.30, else the env) plus the matching stage env
    ``VLLM_MOONCAKE_BOOTSTRAP_PORT``; on a ``kv_consumer`` nothing (it binds no
    bootstrap server: vLLM mooncake_connector.py starts it for kv_producer only)."""
    from ruamel.yaml.comments import CommentedMap
    from ruamel.yaml.scalarstring import DoubleQuotedScalarString

    from omni_pd.compile.versions import bootstrap_reader

    port = extra.pop("mooncake_bootstrap_port")
    facts = target.mooncake_bootstrap(pipe.runtime)
    reader = bootstrap_reader(facts.key, facts.runtime, target)  # vLLM X for the env, the runtime for a key
    if "mooncake" not in conn.lower():
        w.note(at, f"stage {sid}: `mooncake_bootstrap_port` dropped: {conn or 'this connector'} does not read it")
        return
    if role == "kv_consumer":
        w.note(at, f"stage {sid}: `mooncake_bootstrap_port` dropped: a kv_consumer binds no bootstrap server "
               f"(only the prefill side's port is read; {reader})")
        return
    said = []
    if facts.extra_key and facts.extra_key not in extra:
        extra[facts.extra_key] = port
        said.append(f"kv_connector_extra_config.{facts.extra_key}")
    env = new.get("env")
    if env is None:
        keys = list(new)
        new.insert(keys.index("devices") + 1 if "devices" in keys else 1, "env", CommentedMap())
        env = new["env"]
    if isinstance(env, dict) and BOOTSTRAP_ENV not in env:
        env[BOOTSTRAP_ENV] = DoubleQuotedScalarString(str(port))
        said.append(f"env {BOOTSTRAP_ENV}")
    w.note(at, f"stage {sid}: `mooncake_bootstrap_port: {port}` -> " + (" and ".join(said) or "already set")
           + f" (what {reader} reads for the prefill's bootstrap port)")


# --- the docs table -----------------------------------------------------------------

def doc_table() -> str:
    """docs/migrate.md: the key map as Markdown, generated from ``legacy_stage_args.yaml``."""
    km = key_map()
    words = {"move": "moves to", "check": "checked against the pipeline, then dropped",
             "pipeline": "dropped: the pipeline owns it", "drop": "dropped", "scheduler": "sets",
             "spread": "copied onto each", "kv": "moves to", "fallback": "moves to", "bootstrap": "the target's bootstrap setting",
             "unread": "dropped"}

    def home(r: dict[str, Any]) -> str:
        a = r["action"]
        if a == "fallback":
            return f"moves to `{r['to']}` unless the stage sets `{r['to']}` (then dropped: that wins)"
        if a == "spread":
            return f"copied onto each `{r['to']}` entry (dropped when there are none)"
        if a in ("move", "kv"):
            to = r.get("to", "*")
            as_string = f"; a number is written as a string ({r['why']})" if r.get("as") == "string" else ""
            return (f"{words[a]} `{to}`" if to != "*" else "moves to the same key") + as_string
        if a == "check":
            return f"{words[a]} (`{r['against']}`)"
        if a == "drop":
            return f"dropped: {r['why']}" + (f" (an error when `{_show(r['unless'])}`)" if "unless" in r else "")
        if a == "scheduler":
            return "; ".join(f"`{c.rsplit('.', 1)[-1]}` -> " + (", ".join(f"`{k}: {_show(v)}`" for k, v in s.items())
                                                                 or "nothing") for c, s in r["values"].items())
        if a == "bootstrap":
            return ("prefill (kv_producer): the target's bootstrap key (vllm-omni 0.30: "
                    "`kv_connector_extra_config.bootstrap_port`) and env `VLLM_MOONCAKE_BOOTSTRAP_PORT`; "
                    "decode: dropped")
        if a == "unread":
            return "dropped: no V1 connector reads it (removed in vLLM 0.32)"
        return words.get(a, a)

    lines = ["# Migrating legacy `stage_args` files", "",
             "<!-- generated by omni_pd.compile.migrate.doc_table from presets/targets/legacy_stage_args.yaml;"
             " do not edit: tests/test_migrate.py checks it -->", "",
             "[README](../README.md) · [expand](expand.md) · [validate](validate.md)", "",
             "vllm-omni 0.28+ refuses the legacy `stage_args` schema (`--stage-configs-path`), which is what "
             "vllm-omni's own PD recipe is written in. `omni-pd migrate` rewrites such a file into the `stages:` "
             "schema of the target release (comments and key order kept), with one located note per change and "
             "the serve line for the result; a key it cannot map is an error naming it. `validate` checks a legacy "
             "file in its migrated form (findings at the legacy lines, plus `error[OPD102]`), and `expand` migrates "
             "a three-stage legacy file first.", "",
             "```bash",
             "omni-pd migrate tests/fixtures/legacy_seed_pd_recipe.yaml -o qwen3_omni_pd_migrated.yaml   "
             "# the recipe's PD blocks (exit 1:",
             "                                                    # its Talker + Code2Wav keep vLLM's 0.9 each on GPU 2)",
             "omni-pd migrate qwen3_omni_pd_migrated.yaml --check      "
             "# CI: non-zero, with the diff, while a file is still legacy",
             "```", "",
             "`omni-pd migrate FILE -o OUT` rewrites a legacy `stage_args` file into the `stages:` deploy schema "
             "of the target vllm-omni release (`--vllm-version`, default 0.30), printing one note per change. "
             "A key below that is not in the file is not written, except `async_chunk` (the two loaders "
             "default it differently). Anything not in these tables is an error naming the key.", "",
             f"Serve: `{km['serve']['legacy_flag']}` (legacy) -> `{km['serve']['deploy_flag']}` "
             f"(vllm-omni {km['serve']['deploy_flag_since']}+); vllm-omni {km['serve']['stage_args_rejected_since']}+ "
             "refuses `stage_args`.", ""]
    for title, section, prefix in (("Top level", "top", ""), ("Per stage (`stage_args[]`)", "stage", ""),
                                   ("Inside `engine_args.kv_transfer_config`", "kv_transfer_config", "")):
        lines += [f"## {title}", "", "| legacy key | new home | upstream source |", "|---|---|---|"]
        for r in km[section]:
            extra = ""
            if "legacy_default" in r:
                extra = f" (absent: legacy {_show(r['legacy_default'])}, new {_show(r['default'])}; written explicitly)"
            lines.append(f"| `{prefix}{r['key']}` | {home(r)}{extra} | {' '.join(str(r['source']).split())} |")
        lines.append("")
    return "\n".join(lines + release_doc_lines())


def _before(removed: str) -> str:
    major, minor = parse_version(removed)
    return f"{major}.{minor - 1}" if minor else removed


def release_doc_lines() -> list[str]:
    """docs/migrate.md's "Between releases" section, generated from the release tables
    (``vllm.yaml``, ``mooncake_bootstrap.yaml``) that :func:`omni_pd.compile.migrate_release.migrate_release` reads."""
    from omni_pd.compile.targets import _bootstrap_facts, _facts

    f = _facts()
    out = ["## Between releases (`--from A --to B`)", "",
           "`omni-pd migrate FILE --from A --to B` rewrites a `stages:` file written for vLLM / vllm-omni A "
           "into B's form, from the tables below (`presets/targets/vllm.yaml`, `mooncake_bootstrap.yaml`). "
           "A field or connector B does not have is an error naming it; every change is one note; "
           "`--check` exits 1 with the diff while the file is not in B's form.", "",
           "| `kv_transfer_config` field | from vLLM | removed in | going to a release without it |",
           "|---|---|---|---|"]
    for name, fact in f["kv_transfer_config_fields"].items():
        if fact.get("removed") or fact.get("since") != f["known_versions"]["first"]:
            out.append(f"| `{name}` | {fact.get('since')} | {fact.get('removed', '-')} | "
                       + ("dropped with a note" if fact.get("removed") and fact.get("since") == f["known_versions"]["first"]
                          else "error: the setting would be lost") + " |")
    out += ["", "| KV connector | registered | under the target's name |", "|---|---|---|"]
    for name, fact in f["kv_connectors"].items():
        if fact.get("removed"):
            span = f"{fact.get('since')} to {_before(fact['removed'])}"
            out.append(f"| `{name}` | {span} | " + (f"`{fact['renamed_to']}` (both ways)" if fact.get("renamed_to")
                                                    else "none: an error") + " |")
    out += ["", "A connector first registered after the target release is an error as well."]
    out += ["", "| runtime | from | the Mooncake prefill's bootstrap port is read from |", "|---|---|---|"]
    b = _bootstrap_facts()
    for runtime, steps in b["runtimes"].items():
        for st in steps:
            key = f"env `{b['env']}`" if st["key"] == "env" else f"`{st['key']}`"
            out.append(f"| {runtime} | {st['since']} | {key} (default {st['default']}) |")
    out += ["", "The port moves to the setting the target reads; `kv_connector_extra_config` keys nothing reads "
            "on the target are dropped (OPD505 lists them).", ""]
    return out


# --- text in, text out ----------------------------------------------------------------

def migrate_text(doc: Document, target: Target, catalogue: Catalogue,
                 pipeline: str | None = None) -> tuple[str, Migration | None]:
    """The text of ``doc`` in ``target``'s ``stages:`` form and the :class:`Migration`
    (None when ``doc`` is already in that form: the text is then ``doc.text`` unchanged,
    so migrating twice changes nothing). Raises :class:`MigrateError` as
    :func:`migrate_document` does."""
    from omni_pd.io import dump

    if not is_legacy(doc.tree):
        return doc.text, None
    m = migrate_document(doc, target, catalogue, pipeline)
    text = dump(m.tree)
    return text, m


def sorted_notes(m: Migration) -> list[Diagnostic]:
    """``m.notes`` in file order (line, column)."""
    return sorted(m.notes, key=lambda d: ((d.location.line or 0) if d.location else 0,
                                          (d.location.column or 0) if d.location else 0))
