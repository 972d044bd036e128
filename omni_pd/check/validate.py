"""``omni-pd validate``: orchestration only (the caller has loaded the document).

parse (every pydantic error becomes an OPD101, not just the first) -> follow
``base_config`` -> choose the pipeline -> resolve one Topology per platform
(``--platform P``; ``--all-platforms`` = the base plus each overlay) -> run every rule
-> dedupe -> sort. Nothing here prints; the CLI renders the result.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omni_pd.check.context import Inventory, ModelInfo
from omni_pd.check.serve_flags import check_serve_args
from omni_pd.diagnostics import Diagnostic, Edit, Location, OmniPdError, Severity, sort_key
from omni_pd.io import Document, get_path
from omni_pd.compile.pipelines import Catalogue, Pipeline, PipelineStage, load_catalogue
from omni_pd.compile.devices import RUN_PLATFORMS
from omni_pd.compile.topology import PLATFORMS

if TYPE_CHECKING:  # the validate path never imports pydantic: model_lite parses (issue 38)
    from omni_pd.compile.model import DeployConfig


@dataclass
class ValidateOptions:
    """What the user told validate. ``env``: launcher environment; ``cli``: global
    engine flags (vllm-omni broadcasts them to every stage). ``port``/``engine_port_base``:
    the ports ``launch``/``render`` derive the processes' ports from (``--port``,
    ``--engine-port-base``; their defaults), for the port plan OPD510 judges
    (:func:`omni_pd.compile.port_plan.plan_ports`)."""

    platform: str | None = None
    all_platforms: bool = False
    inventory: Inventory | None = None
    model: ModelInfo | None = None
    vllm_version: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    cli: dict[str, Any] = field(default_factory=dict)
    pipeline: str | None = None
    rules: tuple[str, ...] | None = None  # only these codes (None = all)
    port: int = 8000
    engine_port_base: int = 8100


@dataclass
class ValidateResult:
    """``diagnostics`` sorted by file/line; ``docs``: every file read (name -> Document);
    ``pipeline_name``: the catalogue pipeline the stages were checked against (None when
    none was chosen).

    What the rules judged, for a caller that goes on from it (``launch``/``render``:
    :func:`omni_pd.launch.plan.plan_document` plans from these and resolves nothing again):
    ``topology``: the :class:`~omni_pd.compile.topology.Topology` resolved for the one
    platform checked (None with ``--all-platforms``, or when parsing or resolving failed);
    ``placement``: the :class:`~omni_pd.compile.placement.Placement` of the inventory the
    caller passed (``ValidateOptions.inventory`` with hosts; None without one, also when
    the inventory was read from the file's header); ``target``: the vLLM
    :class:`~omni_pd.compile.targets.Target` judged."""

    diagnostics: list[Diagnostic]
    docs: dict[str, Document]
    pipeline_name: str | None = None
    topology: Any = None
    placement: Any = None
    target: Any = None

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity is Severity.ERROR]

    def codes(self, severity: Severity | None = None) -> set[str]:
        return {d.code for d in self.diagnostics if severity is None or d.severity is severity}


# --- locating keys across a base_config merge ------------------------------------------

class Locator:
    """``loc``/``exists`` over one document, or over a child merged onto its base_config.

    Merged stage ``i`` maps to the child's and the base's own list positions, so a
    diagnostic points into the file that actually sets the key.
    """

    def __init__(self, doc: Document, base: "Locator | None" = None,
                 stage_map: dict[int, tuple[int | None, int | None]] | None = None):
        self.doc = doc
        self.base = base
        self.stage_map = stage_map or {}
        self.name = doc.name

    def _split(self, path: tuple) -> list[tuple["Locator | Document", tuple]]:
        if self.base is None:
            return [(self.doc, path)]
        if len(path) >= 2 and path[0] == "stages" and isinstance(path[1], int) and path[1] in self.stage_map:
            ci, bi = self.stage_map[path[1]]
            out: list = []
            if ci is not None:
                out.append((self.doc, ("stages", ci) + path[2:]))
            if bi is not None:
                out.append((self.base, ("stages", bi) + path[2:]))
            return out
        return [(self.doc, path), (self.base, path)]

    def exists(self, path: tuple) -> bool:
        for d, p in self._split(path):
            if d.exists(p):
                return True
        return False

    def loc(self, path: tuple, *, value: bool = False) -> Location:
        cands = self._split(path)
        for d, p in cands:
            if d.exists(p):
                return d.loc(p, value=value)
        d, p = cands[0]
        return d.loc(p, value=value)

    def docs(self) -> dict[str, Document]:
        out = {self.doc.name: self.doc}
        if self.base is not None:
            out.update(self.base.docs())
        return out


def _merge_base(child: Document, plain: dict, chain: tuple[Path, ...] = ()) -> tuple[dict, Locator, list[Diagnostic]]:
    """Follow ``base_config`` (relative to the file, then the bundled presets), at any
    depth, as vllm-omni 0.30 does (config/stage_config.py ``resolve_deploy_yaml``
    recurses without a limit). ``chain``: the files already followed (resolved paths).

    Stages merge by ``stage_id`` (child keys win), top-level mappings merge key by key
    (child wins), other top-level values of the child replace the base's. A base that
    cannot be found, or a chain that comes back to a file already in it (vllm-omni then
    recurses until ``RecursionError``), is OPD108 at that ``base_config`` value.
    """
    from omni_pd.io import load_file
    from omni_pd.compile.parse import to_plain
    from omni_pd.resources import data_dir

    name = plain.get("base_config")
    if not name:
        return plain, Locator(child), []
    if not chain:
        chain = (Path(child.name).resolve(),)
    cands = [Path(child.name).parent / str(name), data_dir("presets") / str(name),
             data_dir("presets") / os.path.basename(str(name))]
    path = next((c for c in cands if c.is_file()), None)
    if path is None:
        return plain, Locator(child), [Diagnostic(
            code="OPD108", severity=Severity.ERROR,
            message=f"base_config `{name}` not found next to this file nor among the bundled presets",
            location=child.loc(("base_config",), value=True),
            help="give a path relative to this file, or a bundled preset name such as qwen3_omni_moe.yaml")]
    if path.resolve() in chain:
        loop = " -> ".join(p.name for p in (*chain, path.resolve()))
        return plain, Locator(child), [Diagnostic(
            code="OPD108", severity=Severity.ERROR,
            message=f"base_config chain loops: {loop} (vllm-omni follows it until RecursionError)",
            location=child.loc(("base_config",), value=True),
            help=f"remove `base_config` from {path.name}, or point it at a file outside the chain")]
    try:
        bdoc = load_file(path, comments=False)
    except OmniPdError as e:
        return plain, Locator(child), [e.diagnostic]
    bplain, bloc, diags = _merge_base(bdoc, to_plain(bdoc.tree), (*chain, path.resolve()))
    from omni_pd.compile.topology import _merge as deep_merge

    merged = dict(bplain)
    for k, v in plain.items():
        if k not in ("stages", "base_config"):
            # mappings (connectors, platforms) merge key by key: vllm-omni 0.30's shipped
            # qwen3_tts_high_concurrency_mrv2.yaml overrides only connectors.<name>.extra
            merged[k] = deep_merge(merged[k], v) if isinstance(v, dict) and isinstance(merged.get(k), dict) else v
    merged.pop("base_config", None)
    bst = list(bplain.get("stages") or [])
    cst = list(plain.get("stages") or [])
    out_stages: list = []
    stage_map: dict[int, tuple[int | None, int | None]] = {}
    used: set[int] = set()
    for bi, b in enumerate(bst):
        ci = next((i for i, c in enumerate(cst) if isinstance(c, dict) and isinstance(b, dict)
                   and c.get("stage_id") == b.get("stage_id")), None)
        if ci is not None:
            used.add(ci)
            out_stages.append({**b, **cst[ci]})
        else:
            out_stages.append(b)
        stage_map[len(out_stages) - 1] = (ci, bi)
    for ci, c in enumerate(cst):
        if ci not in used:
            out_stages.append(c)
            stage_map[len(out_stages) - 1] = (ci, None)
    merged["stages"] = out_stages
    return merged, Locator(child, bloc, stage_map), diags


# --- parsing with every error collected -----------------------------------------------

def _drop(plain: Any, path: tuple) -> bool:
    """Delete the mapping key at ``path`` (so parsing can go on); False if absent."""
    node = get_path(plain, path[:-1])
    if isinstance(node, dict) and path and path[-1] in node:
        del node[path[-1]]
        return True
    return False


def parse_all(plain: dict, loc: Locator) -> tuple["DeployConfig | None", list[Diagnostic]]:
    """Validate ``plain``; every pydantic error is an OPD101 located at its key.

    Parsed by the deploy model's compiled projection (:mod:`omni_pd.compile.model_lite`:
    pydantic's errors and attribute access without importing pydantic; tests/test_model_lite.py
    holds it to the pydantic model), so the returned config is a ``model_lite`` object.

    Offending keys are dropped and validation repeated, so the rules still run on the
    rest. Returns (None, diags) when the config cannot be repaired that way (e.g. a
    stage without ``stage_id``).
    """
    import copy

    from omni_pd.compile.model_lite import ValidationError, model
    from omni_pd.compile.parse import _TYPE_WORDS, _show, type_help

    deploy = model("DeployConfig")

    work = copy.deepcopy(plain)
    diags: list[Diagnostic] = []
    seen: set = set()
    dropped: set = set()  # paths removed for their wrong value: their "missing" is the same cause
    _check_nested_kv(work, loc, diags, seen)
    for _ in range(20):
        try:
            return deploy.model_validate(work), diags
        except ValidationError as e:
            progress = False
            for err in e.errors():
                raw_loc = tuple("from" if p == "from_" else p for p in err.get("loc", ()))
                # pydantic adds union-member names (str, ConnectorSpec) to the location
                path = tuple(p for p in raw_loc if isinstance(p, int) or p in _keys_along(work, raw_loc))
                key = path[-1] if path else ""
                typ = err.get("type", "")
                want = _TYPE_WORDS.get(typ)
                if typ == "missing":
                    msg = f"missing required key `{raw_loc[-1]}`"
                    help_ = f"add `{raw_loc[-1]}:` here"
                elif want:
                    msg = f"`{key}` must be {want}, found {_show(err.get('input'))}"
                    help_ = type_help(want, key, err.get("input"))
                else:
                    msg = f"invalid value for `{key}`: {err.get('msg')}"
                    help_ = None
                sig = (path, msg)
                if typ == "missing" and raw_loc in dropped:
                    continue
                if sig not in seen:
                    seen.add(sig)
                    diags.append(Diagnostic(code="OPD101", severity=Severity.ERROR, message=msg,
                                            location=loc.loc(path, value=typ != "missing"), help=help_))
                if typ != "missing" and _drop(work, path):
                    dropped.add(path)
                    progress = True
            if not progress:
                return None, diags
    return None, diags


def _check_nested_kv(work: dict, loc: Locator, diags: list[Diagnostic], seen: set) -> None:
    """Type ``engine_args.kv_transfer_config`` like a stage's own ``kv_transfer_config``, in
    every stage entry and every ``platforms.<p>.stages`` overlay entry (vllm-omni applies the
    overlay's keys to the stage, so its ``engine_args`` reach the engine the same way).

    The deploy model keeps ``engine_args`` an open mapping, but vllm-omni flattens it into
    the engine arguments, so its ``kv_transfer_config`` reaches vLLM's ``KVTransferConfig``
    (vllm/config/kv_transfer.py) the same way. Each wrong-typed key is an OPD101 located at
    it and dropped from ``work`` (mutated in place), so no rule meets it; e.g. a list
    ``kv_connector_extra_config`` (vLLM types it ``dict[str, Any]``).
    """
    from omni_pd.compile.model_lite import ValidationError, model
    from omni_pd.compile.parse import _TYPE_WORDS, _show, type_help

    entries: list[tuple[tuple, Any]] = []  # every stage entry: stages[i] and platforms.<p>.stages[j]
    stages = work.get("stages")
    entries += [(("stages", i), st) for i, st in enumerate(stages if isinstance(stages, list) else [])]
    plats = work.get("platforms")
    for p, ov in (plats.items() if isinstance(plats, dict) else ()):
        sts = ov.get("stages") if isinstance(ov, dict) else None
        entries += [(("platforms", p, "stages", j), st) for j, st in enumerate(sts if isinstance(sts, list) else [])]
    for at, st in entries:
        ea = st.get("engine_args") if isinstance(st, dict) else None
        kv = ea.get("kv_transfer_config") if isinstance(ea, dict) else None
        if not isinstance(kv, dict):
            continue
        base = at + ("engine_args", "kv_transfer_config")
        try:
            model("KVTransferConfig").model_validate(kv)
        except ValidationError as e:
            for err in e.errors():
                sub = tuple(p for p in err.get("loc", ()) if isinstance(p, int) or p in _keys_along(kv, err.get("loc", ())))
                if not sub:
                    continue
                key, typ = sub[-1], err.get("type", "")
                want = _TYPE_WORDS.get(typ)
                msg = (f"`{key}` must be {want}, found {_show(err.get('input'))}" if want
                       else f"invalid value for `{key}`: {err.get('msg')}")
                if (base + sub, msg) not in seen:
                    seen.add((base + sub, msg))
                    diags.append(Diagnostic(code="OPD101", severity=Severity.ERROR, message=msg,
                                            location=loc.loc(base + sub, value=True),
                                            help=type_help(want, key, err.get("input")) if want else None))
                _drop(work, base + sub)


def _keys_along(tree: Any, loc: tuple) -> set:
    keys: set = set()
    node = tree
    for p in loc:
        if isinstance(node, dict) and p in node:
            keys.add(p)
            node = node[p]
        elif isinstance(node, list) and isinstance(p, int) and 0 <= p < len(node):
            node = node[p]
    return keys


# --- choosing the pipeline -------------------------------------------------------------

def _kv_role(stage: dict) -> str | None:
    from omni_pd.compile.topology import effective_stage

    kv = effective_stage(stage).get("kv_transfer_config")
    return kv.get("kv_role") if isinstance(kv, dict) else None


def _chain(name: str, ids: list[int], pd: tuple[int, int] | None) -> Pipeline:
    """A linear chain over ``ids``; ``pd`` marks a (prefill, decode) pair. Without one
    the stage roles are unknown (``Pipeline.linear_chain``)."""
    stages = []
    for k, sid in enumerate(ids):
        pd_role = None
        if pd and sid == pd[0]:
            pd_role = "prefill"
        elif pd and sid == pd[1]:
            pd_role = "decode"
        last = k == len(ids) - 1
        stages.append(PipelineStage(
            stage_id=sid, role="llm" if pd_role else "stage", model_stage="stage",
            execution_type="LLM_AR" if pd_role else "unknown",
            input_sources=(ids[k - 1],) if k else (), final_output=last or pd_role == "decode",
            final_output_type="text" if (last or pd_role == "decode") else None, pd_role=pd_role))
    return Pipeline(name=name, stages=tuple(stages), runtime="vllm-omni", linear_chain=pd is None)


def _registered_pipelines(vllm_version: str | None) -> frozenset[str] | None:
    """The pipeline names vllm-omni registers for the target release (with omni-pd's plugin), or
    None for a release before 0.30 (not read). Source: presets/targets/vllm_omni_stage_fields.yaml."""
    from omni_pd.check.rules.stage_values import FIRST_TYPED, table

    if vllm_version:
        try:
            major, minor = (int(p) for p in vllm_version.split(".")[:2])
        except ValueError:
            return None
        if (major, minor) < FIRST_TYPED:
            return None
    return frozenset(table()["pipelines"])


def choose_pipeline(cfg: DeployConfig, loc: Locator, cat: Catalogue, opts: ValidateOptions,
                    base_name: str | None = None, judge_typo: bool = False) -> tuple[Pipeline, list[Diagnostic]]:
    """``--pipeline``, ``pipeline:``, the deploy file name, the model's ``model_type``,
    a kv_producer/kv_consumer pair (PD), one stage (``llm``), else a linear chain.
    With ``judge_typo`` (validate's own call), a name nobody registers that is a typo of a
    catalogued pipeline returns that pipeline, so the rules still judge the file (OPD207 is
    reported either way); ``graph`` and ``status`` draw what the file names.
    Raises OPD006 (exit 2) when ``--pipeline`` and ``pipeline:`` name different pipelines
    (:func:`omni_pd.compile.topology.pipeline_conflict`)."""
    from difflib import get_close_matches

    from omni_pd.compile.topology import pipeline_conflict

    clash = pipeline_conflict(opts.pipeline, cfg.pipeline, loc.loc(("pipeline",), value=True))
    if clash is not None:
        raise clash
    diags: list[Diagnostic] = []
    name = opts.pipeline or cfg.pipeline
    if name:
        p = cat.get(name)
        if p is not None:
            return p, diags
        close = get_close_matches(name, cat.names(), n=1, cutoff=0.85)
        registered = _registered_pipelines(opts.vllm_version)
        if registered is not None and name not in registered:
            near = get_close_matches(name, sorted(set(registered) | set(cat.names())), n=1, cutoff=0.6)
            at = loc.loc(("pipeline",), value=True) if not opts.pipeline else None
            diags.append(Diagnostic(
                code="OPD207", severity=Severity.ERROR,
                message=f"pipeline `{name}` is registered neither in vllm-omni nor in omni-pd's catalogue: "
                        "`vllm serve --omni` refuses the file (\"not registered to OMNI_PIPELINES\")",
                location=at,
                notes=["vllm-omni's registered pipelines are read from vllm-omni 0.30.0 with omni-pd's plugin "
                       "loaded (presets/targets/vllm_omni_stage_fields.yaml); assumed for later releases"],
                help=(f"did you mean `{near[0]}`? " if near else "") + "`omni-pd pipelines` lists omni-pd's",
                edit=Edit(at.line, at.column, name, near[0]) if (near and at and at.line and at.column) else None))
            if judge_typo and near and cat.get(near[0]) is not None:  # a typo of a catalogued pipeline: judge the rest as that one
                return cat.get(near[0]), diags  # type: ignore[return-value]
            return _chain(f"<{name}: linear chain>", sorted({int(s.stage_id) for s in cfg.stages}), None), diags
        diags.append(Diagnostic(
            code="OPD207", severity=Severity.INFO,
            message=f"pipeline `{name}` is not in omni-pd's catalogue; its stages are checked as a linear chain",
            location=loc.loc(("pipeline",), value=True) if not opts.pipeline else None,
            help=(f"did you mean `{close[0]}`? " if close else "") + "catalogued: " + ", ".join(cat.names())))
    else:
        for fname in (os.path.basename(loc.name), os.path.basename(str(base_name or ""))):
            p = cat.for_deploy_file(fname) if fname else None
            if p is not None:
                return p, diags
        if opts.model is not None and opts.model.model_type and cat.get(opts.model.model_type):
            return cat.get(opts.model.model_type), diags  # type: ignore[return-value]
    raw = [s.model_dump(by_alias=True, exclude_unset=True) for s in cfg.stages]
    ids = sorted({int(s["stage_id"]) for s in raw})
    prod = [int(s["stage_id"]) for s in raw if _kv_role(s) in ("kv_producer", "kv_both")]
    cons = [int(s["stage_id"]) for s in raw if _kv_role(s) in ("kv_consumer",)]
    pair = None
    if prod and cons:
        pair = (prod[0], next((c for c in cons if c > prod[0]), cons[0]))
    elif prod and len(prod) >= 2 and all(_kv_role(s) == "kv_both" for s in raw if int(s["stage_id"]) in prod[:2]):
        pair = (prod[0], prod[1])
    if pair and not name:  # a named (uncatalogued) pipeline decides its own KV edges
        fits = [p.name for p in cat.pipelines.values()
                if p.is_pd and p.pd_pair == pair and sorted(s.stage_id for s in p.stages) == ids]
        diags.append(Diagnostic(
            code="OPD208", severity=Severity.ERROR,
            message=f"stages {pair[0]} and {pair[1]} are a KV producer/consumer pair but the file names no `pipeline:`",
            location=loc.loc(("stages",)),
            notes=["vllm-omni 0.30 then takes the pipeline from the model's `model_type`, which is never a PD "
                   "pipeline: it merges these stages into the three-stage pipeline, silently drops the last "
                   "stage and applies the decode entry to the next stage (StageConfigFactory.get_pipeline_config)"],
            help="add " + " or ".join(f"`pipeline: {f}`" for f in fits) + " (the one for your model)" if fits else "add `pipeline: <name>_pd` (see `omni-pd pipelines`)",
            reads=(("pipeline",),)))
        return _chain("<inferred PD chain>", ids, pair), diags
    if len(ids) <= 1 and not name:
        return cat.get("llm"), diags  # type: ignore[return-value]
    if not name:
        diags.append(Diagnostic(
            code="OPD207", severity=Severity.INFO,
            message=f"no `pipeline:` key and none can be inferred; checked as a linear chain of stages {', '.join(map(str, ids))}",
            location=loc.loc(()),
            help="add `pipeline: <name>` (see `omni-pd pipelines`) for the checks that need the stage roles",
            reads=(("pipeline",),)))
    return _chain(f"<{name}: linear chain>" if name else "<linear chain>", ids, None), diags


# --- the entry points -----------------------------------------------------------------

def validate_document(doc: Document, opts: ValidateOptions | None = None) -> ValidateResult:
    """Check ``doc`` with every rule. A file that is not a deploy config (a CI workflow,
    a pipeline definition, ``stages: []``) gets the OPD007 diagnostic expand refuses it
    with (:func:`omni_pd.check.inputs.not_a_deploy_config`) and nothing else: as a
    compiler stops at "not a source file", no rule judges keys written for another
    schema (a pipeline definition's ``role``, a workflow's ``jobs``). ``--serve-arg``
    values (``opts.cli``) are typed first (:func:`check_serve_args`, OPD101).
    Raises :class:`OmniPdError` (exit 2) only for bad usage (an unknown
    ``--vllm-version`` or ``--platform``)."""
    from omni_pd.compile.parse import to_plain
    from omni_pd.check.inputs import not_a_deploy_config
    from omni_pd.check.rules import Context, registry, run_rules
    from omni_pd.check.rules.schema import LEGACY_REMOVED_IN
    from omni_pd.compile.targets import target as make_target
    from omni_pd.compile.topology import resolve

    opts = opts or ValidateOptions()
    try:
        tgt = make_target(opts.vllm_version)
    except ValueError as e:
        raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR, message=str(e),
                                     help="pass --vllm-version MAJOR.MINOR, e.g. 0.30")) from None
    if opts.platform is not None and opts.platform not in RUN_PLATFORMS:
        raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR,
                                     message=f"unknown platform `{opts.platform}`",
                                     help="one of: " + ", ".join(RUN_PLATFORMS)))
    # the overlay --platform applies: cpu has none (the base stages, as launch --platform cpu reads them)
    overlay = opts.platform if opts.platform in PLATFORMS else None
    plain = to_plain(doc.tree)
    gate = not_a_deploy_config(doc, plain)
    if gate is not None:
        # not a deploy config (OPD007): every other finding would judge keys written for
        # another schema (16 for a pipeline definition, OPD103 per key of a CI workflow)
        return ValidateResult([gate], {doc.name: doc})
    rules = [r for c, r in registry().items() if opts.rules is None or c in opts.rules]
    cli, cli_diags = check_serve_args(opts.cli)
    legacy = "stage_args" in plain and "stages" not in plain
    diags: list[Diagnostic] = []
    given = opts.inventory  # the caller's, not one read from the header
    if opts.inventory is None:
        from_header = _inventory_from_header(doc)
        if from_header is not None:
            opts = replace(opts, inventory=from_header[0])
            diags.append(from_header[1])
    if legacy:
        ctx = Context(vllm_version_given=opts.vllm_version is not None, doc=Locator(doc), config=None, topology=None, target=tgt, platform=overlay,
                      inventory=opts.inventory, model=opts.model, env=dict(opts.env), cli=dict(cli),
                      raw=plain, legacy=True, parse_diagnostics=cli_diags)
        migrated = _migrate_legacy(doc, tgt, opts)
        if isinstance(migrated, list):  # cannot migrate: the legacy checks, and why no more ran
            return ValidateResult(_finish(_legacy_why(run_rules(ctx, rules), migrated)), {doc.name: doc})
        # every rule over the migrated form, located at the legacy keys; plus OPD102 itself and,
        # where --stage-configs-path still loads the file as written (no defaults applied),
        # OPD201's check of the legacy engine_input_source lists
        on_legacy = {"OPD102"} | ({"OPD201"} if tgt.version < LEGACY_REMOVED_IN else set())
        diags += run_rules(ctx, [r for r in rules if r.code in on_legacy])
        rules = [r for r in rules if r.code != "OPD102"]
        merged, locator, base_diags = to_plain(migrated.doc.tree), migrated, []
    else:
        merged, locator, base_diags = _merge_base(doc, plain)
    diags += base_diags
    cfg, parse_diags = parse_all(merged, locator)
    parse_diags = cli_diags + parse_diags  # both OPD101 (rule wrong-type reports them)
    cat = load_catalogue()
    if cfg is None:
        ctx = Context(vllm_version_given=opts.vllm_version is not None, doc=locator, config=None, topology=None, target=tgt, platform=overlay,
                      inventory=opts.inventory, model=opts.model, env=dict(opts.env), cli=dict(cli),
                      raw=merged, parse_diagnostics=parse_diags)
        return ValidateResult(_finish(diags + run_rules(ctx, rules)), locator.docs())
    pipe, pdiags = choose_pipeline(cfg, locator, cat, opts, base_name=plain.get("base_config"),
                                   judge_typo=True)
    diags += pdiags
    placement = _placement(opts.inventory, pipe)
    inventory = (replace(opts.inventory, placement=dict(placement.stage_host))  # type: ignore[type-var]
                 if placement is not None else opts.inventory)
    platforms: list[str | None]
    if opts.all_platforms:
        base = _base_platform(cfg, pipe)
        platforms = [base] + [p for p in (cfg.platforms or {}) if p != base]
    else:
        platforms = [overlay]
    first = True
    kept_topo = None
    for plat in platforms:
        try:
            topo = resolve(cfg, pipe, plat, locator)
        except OmniPdError as e:
            diags.append(e.diagnostic)
            continue
        ctx = Context(vllm_version_given=opts.vllm_version is not None, doc=locator, config=cfg, topology=topo, target=tgt, platform=plat,
                      inventory=inventory, model=opts.model, env=dict(opts.env), cli=dict(cli),
                      raw=merged, parse_diagnostics=parse_diags if first else [], platform_first=first,
                      pipeline_given=opts.pipeline is not None, placement=placement,
                      launch_ports=(opts.port, opts.engine_port_base), launch_platform=opts.platform)
        kept_topo = topo if not opts.all_platforms else None
        found = run_rules(ctx, rules)
        if opts.platform is not None and opts.platform != overlay:
            found += _run_platform_findings(ctx, opts.platform, rules)
        if plat is not None and opts.all_platforms:
            found = [_tag(d, plat) for d in found]
        diags += found
        first = False
    return ValidateResult(_finish(diags), locator.docs(), pipe.name if cat.get(pipe.name) else None,
                          topology=kept_topo, placement=placement if given is not None else None, target=tgt)


#: the header line ``expand --inventory`` writes (omni_pd/compile/expand.py)
_PLACEMENT_HEADER = "# Placement (--inventory): "


def header_placement(text: str) -> tuple[int, str, dict[int, Any]] | None:
    """The placement a file's header records, when ``expand --inventory`` wrote it:
    ``(line, "stage 0 -> A, stage 1 -> B", {0: "A", 1: "B"})`` (a stage spanning hosts:
    ``{0: ["A", "B"]}``, as an inventory's ``placement`` writes it). Only the leading
    comment block is read; None when it has no such line or the line does not parse."""
    import re

    for i, line in enumerate(text.splitlines(), start=1):
        if not line.startswith("#"):
            return None
        if not line.startswith(_PLACEMENT_HEADER):
            continue
        desc = line[len(_PLACEMENT_HEADER):].split(";", 1)[0].strip()
        placement: dict[int, Any] = {}
        for part in desc.split(", "):
            m = re.fullmatch(r"stage (\d+) -> (\S+(?: \+ \S+)*)", part.strip())
            if m is None:
                return None
            hosts = m.group(2).split(" + ")
            placement[int(m.group(1))] = hosts if len(hosts) > 1 else hosts[0]
        return (i, desc, placement) if placement else None
    return None


def _inventory_from_header(doc: Document) -> tuple[Inventory, Diagnostic] | None:
    """For a file validated without ``--inventory`` whose header records the placement
    ``expand --inventory`` compiled it for (:func:`header_placement`): an inventory of
    those hosts (no device counts or addresses) and the OPD010 warning that says so.
    Judged as one host, such a file gets OPD404/OPD403/OPD501 whose help would break a
    correct two-host layout."""
    found = header_placement(doc.text or "")
    if found is None:
        return None
    line, desc, placement = found
    hosts: dict[str, dict] = {}
    for h in placement.values():
        for name in (h if isinstance(h, list) else [h]):
            hosts.setdefault(name, {})
    try:
        inv = Inventory.from_dict({"hosts": hosts, "placement": placement})
    except ValueError:
        return None
    diag = Diagnostic(code="OPD010", severity=Severity.WARNING,
                      message=f"this file was compiled for an inventory ({desc}): validated with the placement its "
                              "header records, without the hosts' device counts and addresses",
                      location=Location(file=doc.name, line=line, column=1),
                      help=f"pass the inventory it was compiled with: omni-pd validate {doc.name} --inventory HOSTS.yaml")
    return inv, diag


def _placement(inventory: Inventory | None, pipeline: Any) -> Any:
    """The :class:`~omni_pd.compile.placement.Placement` of every stage of ``pipeline``
    under ``inventory`` (:func:`omni_pd.compile.placement.resolve_placement`, as expand and
    launch place them); None where :func:`placed_inventory` returns the inventory unchanged."""
    if inventory is None or not inventory.hosts or not getattr(pipeline, "stages", None):
        return None
    from omni_pd.compile.placement import resolve_placement

    return resolve_placement(pipeline.stages, inventory)


def placed_inventory(inventory: Inventory | None, pipeline: Any) -> Inventory | None:
    """``inventory`` with every stage of ``pipeline`` (a :class:`~omni_pd.compile.pipelines.
    Pipeline`) placed as ``expand --inventory`` and ``launch`` place it
    (:func:`omni_pd.compile.placement.resolve_placement`: the inventory's ``placement``, then
    ``all``, then omni-pd's proposal: prefill on the first host, every other stage on the
    second), so validate judges the placement expand compiled for. Without it a stage the
    inventory leaves unplaced was on ``localhost`` here only (OPD508 "from B to localhost" on
    a config expand wrote for SharedMemoryConnector edges on B). None, an inventory without
    hosts, or a pipeline without stages: returned unchanged. Pure."""
    if inventory is None or not inventory.hosts or not getattr(pipeline, "stages", None):
        return inventory
    from dataclasses import replace

    from omni_pd.compile.placement import resolve_placement

    return replace(inventory, placement=dict(resolve_placement(pipeline.stages, inventory).stage_host))


class MigratedLocator(Locator):
    """``loc``/``exists`` over a legacy ``stage_args`` file checked in its migrated form:
    ``exists`` asks the migrated tree (the rules' paths are ``stages[i]...``), ``loc``
    answers at the legacy key the value came from (``Migration.legacy_path``, walked up to
    the nearest key the legacy file has), so every finding points into the user's file."""

    def __init__(self, legacy: Document, migrated: Document, migration: Any):
        super().__init__(migrated)
        self.legacy, self.migration = legacy, migration
        self.name = legacy.name

    def loc(self, path: tuple, *, value: bool = False) -> Location:
        old = self.migration.legacy_path(tuple(path))
        p = tuple(old) if old is not None else ("stage_args",)
        while p and not self.legacy.exists(p):
            p = p[:-1]
        return self.legacy.loc(p, value=value and old is not None and p == tuple(old))

    def docs(self) -> dict[str, Document]:
        return {self.legacy.name: self.legacy}


def _migrate_legacy(doc: Document, tgt: Any, opts: "ValidateOptions") -> "MigratedLocator | list[Diagnostic]":
    """``doc`` (legacy) migrated for ``tgt`` (omni_pd/compile/migrate.py) as a
    :class:`MigratedLocator`, or the OPD971 errors that stopped the migration."""
    from omni_pd.compile.migrate import MigrateError, migrate_document
    from omni_pd.io import dump, parse_text

    try:
        m = migrate_document(doc, tgt, load_catalogue(), opts.pipeline)
    except MigrateError as e:
        return list(e.diagnostics)
    mdoc = parse_text(dump(m.tree), doc.name + " (migrated)", own_output=True, comments=False)
    return MigratedLocator(doc, mdoc, m)


def _legacy_why(found: list[Diagnostic], errors: list[Diagnostic]) -> list[Diagnostic]:
    """``found`` with the reasons migration failed added to OPD102 as notes (the rules that
    need the stage roles did not run)."""
    from dataclasses import replace

    why = [f"not checked in its migrated form: {e.message} ({e.location})" for e in errors[:3]]
    return [replace(d, notes=list(d.notes) + why) if d.code == "OPD102" else d for d in found]


def _run_platform_findings(ctx: Any, platform: str, rules: list) -> list[Diagnostic]:
    """What ``--platform platform`` adds where the platform has no overlay (``cpu``): the
    NIXL KV lease the run needs (OPD623, when selected), judged as ``launch --platform``
    judges it (:func:`omni_pd.check.rules.nixl_lease.launch_findings`, over the
    pipeline's runtime), so validate and launch give the same finding; [] without a PD
    pair."""
    from omni_pd.check.rules.nixl_lease import launch_findings

    if ctx.topology is None or ctx.topology.pd_pair is None or not any(r.code == "OPD623" for r in rules):
        return []
    return launch_findings(ctx, platform, ctx.topology.pipeline.launcher)


def _base_platform(cfg: Any, pipe: Any) -> str | None:
    """The platform ``--all-platforms`` checks the base stages on: ``npu`` when every KV
    connector the base stages load is a vllm-ascend one (``identify``: also vLLM's name from a
    vllm-ascend ``kv_connector_module_path``; ``expand --platform npu`` output,
    which runs nowhere else; its ``platforms.npu`` overlay, if any, applies there), else
    None (a platform without its own overlay: the rules assume cuda unless the inventory
    says otherwise). Another overlay over such a base is still checked on its platform."""
    from omni_pd.compile import ascend
    from omni_pd.compile.connectors.identity import identify
    from omni_pd.compile.topology import resolve

    try:
        topo = resolve(cfg, pipe, None, None)
    except OmniPdError:
        return None
    # the loaded classes: MooncakeConnector from vllm-ascend's module path is vllm-ascend's
    # MooncakeConnectorV1; an out-of-tree class under a vllm-ascend name is not vllm-ascend's
    idents = [identify(n.kv) for n in topo.stages if n.kv and n.kv.get("kv_connector")]
    return "npu" if idents and all(i is not None and ascend.is_ascend(i.name) for i in idents) else None


def _tag(d: Diagnostic, platform: str) -> Diagnostic:
    """Name the platform overlay a diagnostic was found under (for --all-platforms)."""
    from dataclasses import replace

    note = f"found with the `platforms.{platform}` overlay applied"
    return replace(d, notes=list(d.notes) + [note]) if note not in d.notes else d


def _finish(diags: list[Diagnostic]) -> list[Diagnostic]:
    """Dedupe (same code, message and location; platform notes merged), sort by location,
    then list each finding that follows from another right after it
    (:func:`omni_pd.check.causes.order_by_cause`: a misspelt key before what its default causes)."""
    from omni_pd.check.causes import order_by_cause

    out: dict[tuple, Diagnostic] = {}
    for d in diags:
        loc = d.location
        k = (d.code, d.severity, d.message, (loc.file, loc.line, loc.column) if loc else None)
        if k in out:
            prev = out[k]
            if not prev.notes or not d.notes or not any(n.startswith("found with") for n in d.notes):
                # the base (no overlay) finding wins: it is true on every platform
                if not any(n.startswith("found with") for n in d.notes):
                    out[k] = d
            continue
        out[k] = d
    return order_by_cause(sorted(out.values(), key=sort_key))


def validate_text(text: str, name: str = "<string>", opts: ValidateOptions | None = None) -> ValidateResult:
    """Parse ``text`` (as ``omni-pd validate`` reads files: ``comments=False``) and
    validate it (convenience for tests and rule examples)."""
    from omni_pd.io import parse_text

    return validate_document(parse_text(text, name, comments=False), opts)


def options_from_example(ctx: dict[str, Any]) -> ValidateOptions:
    """ValidateOptions from a rule's ``example_context`` mapping."""
    return ValidateOptions(
        platform=ctx.get("platform"),
        inventory=Inventory.from_dict(ctx["inventory"]) if ctx.get("inventory") else None,
        model=ModelInfo(**ctx["model"]) if ctx.get("model") else None,
        vllm_version=ctx.get("vllm_version"), env=dict(ctx.get("env") or {}),
        cli=dict(ctx.get("cli") or {}))
