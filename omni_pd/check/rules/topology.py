"""Topology rules (OPD2xx): stage ids, input sources, connector references, the graph,
final outputs and the materialised stage set.

Upstream sources: vllm-omni 0.30.0 ``engine/orchestrator.py`` (forwarding uses
``next_logical = src_stage_id + 1``: a linear chain numbered 0..N-1),
``config/stage_config.py`` (``merge_pipeline_deploy``: pipeline ∪ deploy), the
pipeline registry (``config/pipeline_registry.py``).
"""

from __future__ import annotations

import re
from typing import Iterable

from omni_pd.diagnostics import Diagnostic, Severity
from omni_pd.check.rules import Context, Example, Rule, rule

_FROM = re.compile(r"^from_stage_(\d+)$")
_TO = re.compile(r"^to_stage_(\d+)$")

#: Hugging Face sub-config each stage role needs (vllm-omni ``hf_config_name``).
ROLE_SUBCONFIG = {"thinker": "thinker_config", "talker": "talker_config", "code2wav": "code2wav_config"}


@rule("OPD201", "input-source", Severity.ERROR,
      "an input source is missing or names a stage that is not an input",
      fail=("stages:\n  - stage_id: 0\n  - stage_id: 1\n    input_connectors:\n      from_stage_0: shm\n"
            "  - stage_id: 2\n    input_connectors:\n      from_stage_0: shm\n"
            "connectors:\n  shm: {name: SharedMemoryConnector}\npipeline: qwen3_omni_moe\n"),
      passing=("stages:\n  - stage_id: 0\n  - stage_id: 1\n    input_connectors:\n      from_stage_0: shm\n"
               "  - stage_id: 2\n    input_connectors:\n      from_stage_1: shm\n"
               "connectors:\n  shm: {name: SharedMemoryConnector}\npipeline: qwen3_omni_moe\n"),
      labels=("SCH-INPUT-SRC",))
def input_source(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """Every stage's inputs must exist and be real edges. In a legacy ``stage_args``
    file every stage needs an explicit ``engine_input_source`` (entry stages ``[]``):
    the default was removed upstream and the orchestrator dies at startup
    (vllm-omni#5434, dynamo#12709). In the ``stages:`` schema the inputs come from the
    pipeline, and each ``input_connectors`` key ``from_stage_N`` must name one of the
    stage's pipeline inputs: after a PD split the Talker reads from decode, not from
    stage 0. Sources: https://github.com/vllm-project/vllm-omni/issues/5434,
    https://github.com/ai-dynamo/dynamo/pull/12709."""
    if ctx.legacy:
        stages = [s for s in (ctx.raw.get("stage_args") or []) if isinstance(s, dict)]
        ids = {s.get("stage_id") for s in stages}
        for i, st in enumerate(ctx.raw.get("stage_args") or []):
            if not isinstance(st, dict):
                continue
            src = st.get("engine_input_source", (st.get("engine_args") or {}).get("engine_input_source"))
            if src is None:
                yield r.diag(f"stage {st.get('stage_id')}: `engine_input_source` missing; a legacy stage_args file gets no default",
                             ctx.loc(("stage_args", i)),
                             help="add `engine_input_source: []` to an entry stage, `[<upstream id>]` to the others")
            elif isinstance(src, list):
                for j, s in enumerate(src):
                    if s not in ids:
                        yield r.diag(f"stage {st.get('stage_id')}: engine_input_source names stage {s}, which does not exist",
                                     ctx.loc(("stage_args", i, "engine_input_source", j), value=True),
                                     help="use one of the stage ids: " + ", ".join(map(str, sorted(i for i in ids if i is not None))))
        return
    # every platform: an overlay may set its own input_connectors (validate merges a finding
    # the base platform already made into the base one)
    if ctx.topology is None:
        return
    topo = ctx.topology
    for node in topo.stages:
        for key in (node.settings.get("input_connectors") or {}):
            m = _FROM.match(str(key))
            if not m:
                continue
            src = int(m.group(1))
            if src in node.input_sources:
                continue
            want = ", ".join(f"from_stage_{s}" for s in node.input_sources) or "none (entry stage)"
            exists = topo.node(src) is not None
            yield r.diag(
                f"stage {node.stage_id} ({node.role}) reads `{key}`, but "
                + (f"stage {src} is not one of its inputs" if exists else f"stage {src} does not exist")
                + f" in pipeline {topo.pipeline.name}",
                ctx.sloc(node, "input_connectors", key),
                related=[ctx.sloc(topo.node(s), label=f"stage {s} is its input")  # type: ignore[arg-type]
                         for s in node.input_sources if topo.node(s) is not None and topo.node(s).index is not None],
                help=f"name its input here: {want}")


@rule("OPD202", "stage-ids", Severity.ERROR,
      "stage ids are not the pipeline's 0..n-1 (duplicate, gap or unknown id)",
      fail="pipeline: qwen3_omni_moe\nstages:\n  - stage_id: 0\n  - stage_id: 0\n",
      passing="pipeline: qwen3_omni_moe\nstages:\n  - stage_id: 0\n  - stage_id: 1\n")
def stage_ids(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """Stage ids must be unique and name stages of the pipeline, numbered 0..n-1 in the
    order the orchestrator routes: it forwards a finished stage's output to
    ``src_stage_id + 1``, so a gap or an id the pipeline lacks is a stage nothing feeds.
    vllm-omni's merge keys deploy entries by stage_id; a duplicate silently shadows the
    first. Source: vllm-omni 0.30.0 engine/orchestrator.py, config/stage_config.py."""
    if ctx.topology is None or ctx.config is None or not ctx.platform_first:
        return
    seen: dict[int, int] = {}
    for i, st in enumerate(ctx.config.stages):
        if st.stage_id in seen:
            yield r.diag(f"stage_id {st.stage_id} appears twice", ctx.loc(("stages", i, "stage_id"), value=True),
                         related=[ctx.loc(("stages", seen[st.stage_id], "stage_id"), value=True, label="first defined here")],
                         help="give each stage its own id; vllm-omni keeps only one entry per id")
        else:
            seen[st.stage_id] = i
    known = sorted(s.stage_id for s in ctx.topology.pipeline.stages)
    for sid in ctx.topology.orphan_ids:
        i = seen[sid]
        yield r.diag(f"stage_id {sid} is not a stage of pipeline {ctx.topology.pipeline.name} (stages {', '.join(map(str, known))})",
                     ctx.loc(("stages", i, "stage_id"), value=True),
                     help="use one of the pipeline's stage ids, or select the pipeline that has this stage (`pipeline:`)")
    if known != list(range(len(known))):
        yield r.diag(f"pipeline {ctx.topology.pipeline.name} numbers its stages {known}, not 0..{len(known) - 1}",
                     ctx.loc(("stages",)), help="number the stages 0..n-1 in routing order")


@rule("OPD203", "connector-ref", Severity.ERROR,
      "an input/output connector names a connector that is not defined",
      fail=("pipeline: qwen3_omni_moe\nstages:\n  - stage_id: 0\n  - stage_id: 1\n    input_connectors:\n"
            "      from_stage_0: shared_mem\nconnectors:\n  shm: {name: SharedMemoryConnector}\n"),
      passing=("pipeline: qwen3_omni_moe\nstages:\n  - stage_id: 0\n  - stage_id: 1\n    input_connectors:\n"
               "      from_stage_0: shm\nconnectors:\n  shm: {name: SharedMemoryConnector}\n"))
def connector_ref(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """A string value under ``input_connectors``/``output_connectors`` refers to an
    entry of the top-level ``connectors:`` mapping; vllm-omni looks it up by name at
    start and fails when it is missing. Source: vllm-omni 0.30.0
    config/stage_config.py (connector resolution)."""
    from difflib import get_close_matches

    # every platform: an overlay may set its own connector references (see OPD201)
    if ctx.topology is None:
        return
    conns = ctx.raw.get("connectors")
    defined = sorted(str(k) for k in conns) if isinstance(conns, dict) else []  # else OPD101 reported it
    for node in ctx.topology.stages:
        for field in ("input_connectors", "output_connectors"):
            for key, ref in (node.settings.get(field) or {}).items():
                if isinstance(ref, str) and ref not in defined:
                    close = get_close_matches(ref, defined, n=1)
                    yield r.diag(f"stage {node.stage_id}: {field}.{key} names connector `{ref}`, which `connectors:` does not define",
                                 ctx.sloc(node, field, key, value=True),
                                 help=(f"did you mean `{close[0]}`?" if close else
                                       f"define `connectors: {{{ref}: {{name: SharedMemoryConnector}}}}`"))
                m = _TO.match(str(key))  # a to_stage_N key, under either field
                if m and ctx.topology.node(int(m.group(1))) is None:
                    yield r.diag(f"stage {node.stage_id}: output connector `{key}` targets a stage that does not exist",
                                 ctx.sloc(node, field, key), help="name an existing downstream stage")


@rule("OPD204", "graph-shape", Severity.ERROR,
      "`edges:` do not form the linear chain the orchestrator routes",
      fail="pipeline: qwen3_omni_moe\nstages:\n  - stage_id: 0\nedges:\n  - {from: 0, to: 1}\n  - {from: 1, to: 0}\n",
      passing="pipeline: qwen3_omni_moe\nstages:\n  - stage_id: 0\nedges:\n  - {from: 0, to: 1}\n  - {from: 1, to: 2}\n")
def graph_shape(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """Explicit ``edges:`` must name existing stages, be acyclic, and (for the current
    orchestrator, which forwards to ``src + 1``) form the chain 0 -> 1 -> ... -> n-1.
    Source: vllm-omni 0.30.0 engine/orchestrator.py (``next_logical = src_stage_id + 1``)."""
    if ctx.topology is None or ctx.config is None or not ctx.config.edges or not ctx.platform_first:
        return
    ids = {s.stage_id for s in ctx.topology.stages}
    adj: dict[int, list[int]] = {}
    for i, e in enumerate(ctx.config.edges):
        for end, key in ((e.from_, "from"), (e.to, "to")):
            if end not in ids:
                yield r.diag(f"edge {e.from_} -> {e.to} names stage {end}, which does not exist",
                             ctx.loc(("edges", i, key), value=True), help="use existing stage ids")
        adj.setdefault(e.from_, []).append(e.to)
        if e.to != e.from_ + 1:
            yield r.diag(f"edge {e.from_} -> {e.to} is not a chain step; the orchestrator forwards stage N to N+1 only",
                         ctx.loc(("edges", i)), help=f"write `{{from: {e.from_}, to: {e.from_ + 1}}}` or renumber the stages")
    if _has_cycle(adj):
        yield r.diag("`edges:` contain a cycle", ctx.loc(("edges",)), help="the stage graph must be a DAG (a chain today)")


def _has_cycle(adj: dict[int, list[int]]) -> bool:
    """True when the directed graph ``adj`` has a cycle (Kahn's algorithm: a DAG empties
    when nodes without incoming edges are removed one by one). Iterative, so a
    1000-stage chain cannot hit Python's recursion limit (bench/RESULTS.md, figure 3)."""
    indeg: dict[int, int] = {}
    for n, outs in adj.items():
        indeg.setdefault(n, 0)
        for m in outs:
            indeg[m] = indeg.get(m, 0) + 1
    ready = [n for n, d in indeg.items() if d == 0]
    removed = 0
    while ready:
        n = ready.pop()
        removed += 1
        for m in adj.get(n, []):
            indeg[m] -= 1
            if indeg[m] == 0:
                ready.append(m)
    return removed < len(indeg)


@rule("OPD205", "final-output", Severity.ERROR,
      "final outputs are lost (no final stage, or the prefill stage marked final)",
      fail=("pipeline: qwen3_omni_moe_pd\nasync_chunk: false\nstages:\n  - stage_id: 0\n    final_output: true\n"),
      passing=("pipeline: qwen3_omni_moe_pd\nasync_chunk: false\nstages:\n  - stage_id: 0\n  - stage_id: 1\n"))
def final_output(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """The pipeline decides final outputs; a PD split must keep them: decode carries
    the Thinker's text, Code2Wav the audio, and prefill none (it generates one token).
    A deploy entry that sets ``final_output`` against that loses an output or returns
    the prefill token to the client. Source: vllm-omni ``docs/features/pd_disaggregation.md``
    ("Text remains a final output of the decode stage")."""
    # every platform: an overlay may set final_output (see OPD201)
    if ctx.topology is None:
        return
    topo = ctx.topology
    if not any(s.final_output for s in topo.stages):
        yield r.diag(f"pipeline {topo.pipeline.name} has no final output stage", ctx.loc(()),
                     help="select a catalogued pipeline (`pipeline:`)")
    for node in topo.stages:
        v = node.settings.get("final_output")
        if v is None:
            continue
        if node.pd_role == "prefill" and v:
            yield r.diag(f"stage {node.stage_id} is the prefill stage; it must not be a final output",
                         ctx.sloc(node, "final_output", value=True),
                         help="remove `final_output` here; decode returns the text")
        elif bool(v) != node.final_output and ctx.catalogued:
            yield r.diag(f"stage {node.stage_id} sets final_output: {str(bool(v)).lower()}, but pipeline "
                         f"{topo.pipeline.name} has it {'on' if node.final_output else 'off'}",
                         ctx.sloc(node, "final_output", value=True),
                         help="remove `final_output`; the pipeline decides the final outputs")


@rule("OPD206", "stage-set", Severity.ERROR,
      "the pipeline materialises a stage the checkpoint has no sub-config for",
      fail="pipeline: qwen3_omni_moe\nstages:\n  - {stage_id: 0, devices: \"0\"}\n",
      passing="pipeline: qwen3_omni_moe_thinker_only\nstages:\n  - {stage_id: 0, devices: \"0\"}\n",
      example_context={"model": {"model_type": "qwen3_omni_moe", "subconfigs": ["thinker_config"]}},
      labels=("XS-STAGESET",))
def stage_set(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """The effective stage set is pipeline ∪ deploy: a deploy file cannot delete a
    stage. A thinker-only checkpoint (Qwen3-Omni-30B-A3B-Thinking has only
    ``thinker_config``) under the three-stage pipeline still builds a Talker and
    Code2Wav, which crash. Needs ``--model-info``. Source:
    https://github.com/vllm-project/vllm-omni/issues/4223."""
    m = ctx.model
    if ctx.topology is None or m is None or m.subconfigs is None or not ctx.platform_first:
        return
    missing = [(s, ROLE_SUBCONFIG[s.role]) for s in ctx.topology.stages
               if s.role in ROLE_SUBCONFIG and ROLE_SUBCONFIG[s.role] not in m.subconfigs]
    if not missing:
        return
    from omni_pd.compile.pipelines import load_catalogue

    pipe = ctx.topology.pipeline
    # a split file (qwen3_omni_moe_pd) keeps its split: the thinker-only pipeline with the same suffix
    split = pipe.name[len(pipe.base):] if pipe.base and pipe.name.startswith(pipe.base) else ""
    cand = load_catalogue().get((pipe.base or pipe.name) + "_thinker_only" + split)
    if cand is None:
        alt = "select a pipeline whose stages the checkpoint provides"
    elif split:
        alt = (f"use `pipeline: {cand.name}` (the same split of the Thinker alone: "
               + " + ".join(s.pd_role or s.role for s in cand.stages) + ")")
    else:
        alt = f"use `pipeline: {cand.name}` (its PD split then yields exactly prefill and decode)"
    desc = ", ".join(f"stage {s.stage_id} ({s.role}, needs {c})" for s, c in missing)
    yield r.diag(f"pipeline {pipe.name} also materialises {desc}; the checkpoint has none of these",
                 ctx.loc(("pipeline",), value=True) if ctx.exists(("pipeline",)) else ctx.loc(("stages",)),
                 help=alt, notes=[f"checkpoint sub-configs: {', '.join(sorted(m.subconfigs)) or 'none'}"])


@rule("OPD207", "pipeline-inferred", Severity.INFO,
      "no pipeline could be named; the stages are checked as a linear chain",
      fail="stages:\n  - stage_id: 0\n  - stage_id: 1\n",
      passing="pipeline: qwen3_omni_moe\nstages:\n  - stage_id: 0\n  - stage_id: 1\n",
      examples=(Example("a pipeline name vllm-omni does not register (a typo): an error",
                        "pipeline: qwen3_omni_pd\nstages:\n  - stage_id: 0\n  - stage_id: 1\n", fires=True,
                        severity=Severity.ERROR, contains="registered neither"),
                Example("a pipeline vllm-omni registers that omni-pd does not catalogue: info",
                        "pipeline: bagel\nstages:\n  - stage_id: 0\n  - stage_id: 1\n", fires=True,
                        severity=Severity.INFO)))
def pipeline_inferred(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """Without ``pipeline:`` (or a vllm-omni default file name, or ``--model-info``
    naming a catalogued ``model_type``) validate infers PD from a kv_producer/kv_consumer
    pair, treats a single stage as ``llm``, and otherwise checks the stages as a linear
    chain; role-dependent checks are then weaker. A ``pipeline:`` that omni-pd does not
    catalogue is an info while vllm-omni registers it, and an error when vllm-omni does not
    either (``vllm serve`` refuses the file: ``KeyError ... not registered to OMNI_PIPELINES``),
    with the nearest registered name, and the rest of the file is judged as that pipeline when
    omni-pd catalogues it, so a typo does not hide the PD-pair checks (vLLM/vllm-omni 0.30+; the names are read from vllm-omni
    0.30.0 with omni-pd's plugin loaded, presets/targets/vllm_omni_stage_fields.yaml). Emitted
    while choosing the pipeline (omni_pd/check/validate.py). Source: vllm-omni 0.30.0
    config/pipeline_registry.py, config/stage_config.py ``_get_deploy_override_pipe_config``."""
    return []
