"""Schema rules (OPD1xx): types, legacy files, unknown keys, env names, CLI scope.

Upstream sources: vllm-omni 0.30.0 ``vllm_omni/config/stage_config.py``
(``DeployConfig``, ``load_deploy_config``), docs ``configuration/stage_configs.md``
(CLI precedence), and the case reports named in each rule.
"""

from __future__ import annotations

from functools import lru_cache

from difflib import get_close_matches
from typing import Any, Iterable

from omni_pd.diagnostics import Diagnostic, Location, Severity
from omni_pd.check.rules import Context, Example, Rule, rule
from omni_pd.compile.devices import VISIBILITY_VARS

#: every platform's visibility variables (omni_pd/compile/devices.py VISIBILITY_VARS, the one
#: table) and the other variables launchers and vLLM read
KNOWN_ENV = frozenset(VISIBILITY_VARS) | {
    "ROCR_VISIBLE_DEVICES", "ASCEND_VISIBLE_DEVICES", "VLLM_NIXL_SIDE_CHANNEL_HOST",
    "VLLM_NIXL_SIDE_CHANNEL_PORT", "VLLM_MOONCAKE_BOOTSTRAP_PORT", "VLLM_HOST_IP",
    "HCCL_IF_BASE_PORT", "VLLM_KV_CACHE_LAYOUT", "VLLM_NIXL_ABORT_REQUEST_TIMEOUT",
    "VLLM_WORKER_MULTIPROC_METHOD", "VLLM_USE_V1", "VLLM_ATTENTION_BACKEND", "VLLM_LOGGING_LEVEL",
    "PYTORCH_CUDA_ALLOC_CONF", "NCCL_DEBUG", "UCX_TLS", "UCX_NET_DEVICES", "MOONCAKE_CONFIG_PATH",
    "VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT", "LMCACHE_CONFIG_FILE", "PYTHONHASHSEED",
}
#: Engine flags that are per stage in a multi-stage pipeline (stage_configs.md).
STAGE_SCOPED_FLAGS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
                      "max_model_len", "dtype", "gpu_memory_utilization", "quantization",
                      "max_num_seqs", "kv_cache_dtype", "block_size")


@rule("OPD101", "wrong-type", Severity.ERROR, "a key has a value of the wrong type",
      fail="stages:\n  - stage_id: 0\n    tensor_parallel_size: two\n",
      passing="stages:\n  - stage_id: 0\n    tensor_parallel_size: 2\n")
def wrong_type(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """Every key the deploy schema types (vllm-omni ``StageDeployConfig``, vLLM
    ``KVTransferConfig``) must hold a value of that type; the message names the expected
    type. validate reports every such error, not just the first. Source: vllm-omni
    0.30.0 config/stage_config.py; vLLM config/kv_transfer.py."""
    return list(ctx.parse_diagnostics)


#: the first vllm-omni release whose deploy loader refuses ``stage_args:`` (config/stage_config.py)
LEGACY_REMOVED_IN = (0, 28)


@rule("OPD102", "legacy-stage-args", Severity.ERROR,
      "legacy `stage_args` file: no schema defaults are applied",
      fail="stage_args:\n  - stage_id: 0\n    engine_input_source: []\n",
      passing="stages:\n  - stage_id: 0\n", labels=("SCH-LEGACY",))
def legacy_stage_args(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """A file with ``stage_args:`` uses the legacy schema: vllm-omni 0.30's deploy loader
    (``load_deploy_config``) rejects it, ``--stage-configs-path`` still reads it but
    applies no defaults (an omitted ``engine_input_source`` crashes the orchestrator,
    vllm-omni#5434). An error: vllm-omni 0.28+ refuses the file. validate checks it in its
    migrated form (omni_pd/compile/migrate.py, every finding at the legacy key) and
    ``omni-pd migrate`` rewrites it. For a target before 0.28 (``--vllm-version 0.26``), whose
    ``--stage-configs-path`` still loads the file, it is a warning (checked in the 0.26.0 and
    0.28.0 wheels: 0.28's ``load_deploy_config`` raises "uses the removed `stage_args`
    schema"). Source: vllm-omni config/stage_config.py;
    https://github.com/vllm-project/vllm-omni/issues/5434."""
    if ctx.legacy and ctx.target.version < LEGACY_REMOVED_IN:
        from omni_pd.compile.versions import runtime_release

        yield r.diag(f"legacy `stage_args` file: no schema defaults are applied on {runtime_release('vllm-omni', ctx.target)} "
                     "(an omitted key is missing, not defaulted); vllm-omni 0.28 and later refuse the schema",
                     ctx.loc(("stage_args",)), severity=Severity.WARNING,
                     help="run `omni-pd migrate FILE -o OUT.yaml` (the `stages:` schema; serve it with --deploy-config)")
    elif ctx.legacy:
        yield r.diag("legacy `stage_args` file: no schema defaults are applied; vllm-omni 0.30's deploy loader only reads `stages:`",
                     ctx.loc(("stage_args",)),
                     help="run `omni-pd migrate FILE -o OUT.yaml` (the `stages:` schema; serve it with --deploy-config)")


def stage_entries(ctx: Context) -> list[tuple[tuple, dict]]:
    """Every mapping a stage can be written in: ``stages[i]`` (base_config chains already
    merged, located in the file that sets each key) and every ``platforms.<p>.stages[j]``
    overlay entry, as (path, mapping)."""
    out: list[tuple[tuple, dict]] = []
    sts = ctx.raw.get("stages")
    for i, st in enumerate(sts if isinstance(sts, list) else []):  # `stages: 1` is OPD101's, not a crash
        if isinstance(st, dict):
            out.append((("stages", i), st))
    plats = ctx.raw.get("platforms")
    for p, ov in (plats.items() if isinstance(plats, dict) else ()):
        sts = ov.get("stages") if isinstance(ov, dict) else None
        for j, st in enumerate(sts if isinstance(sts, list) else []):
            if isinstance(st, dict):
                out.append((("platforms", p, "stages", j), st))
    return out


def _stage_fields() -> frozenset[str]:
    from omni_pd.compile.model_lite import model  # the model's projection: no pydantic on the validate path

    return frozenset(model("StageDeploy").model_fields) | frozenset(model("KVTransferConfig").model_fields)


@rule("OPD103", "unknown-key", Severity.ERROR,
      "a key is one edit from a known key (a typo: the setting is lost), or not a deploy-schema field",
      fail="pipelne: qwen3_omni_moe\nstages:\n  - stage_id: 0\n",
      passing="pipeline: qwen3_omni_moe\nstages:\n  - stage_id: 0\n", labels=("SCH-UNKNOWN-KEY",),
      examples=(
          Example("stage key typo", "stages:\n  - {stage_id: 0, tensor_paralel_size: 2}\n", True,
                  contains="tensor_paralel_size"),
          Example("typo in a platform overlay", "stages:\n  - {stage_id: 0}\nplatforms:\n  npu:\n    stages:\n"
                  "      - {stage_id: 0, gpu_memory_utilisation: 0.5}\n", True, contains="platforms.npu"),
          Example("typo inside engine_args", "stages:\n  - stage_id: 0\n    engine_args: {max_num_seq: 8}\n", True,
                  contains="max_num_seq"),
          Example("typo in a parallel_config key", "stages:\n  - {stage_id: 0, parallel_config: {tensor_parallel: 2}}\n",
                  True, contains="tensor_parallel"),
          Example("base_config chain: the child's stage key typo", "base_config: qwen3_omni_moe.yaml\nstages:\n"
                  "  - {stage_id: 0, max_num_seqz: 8}\n", True, contains="max_num_seqz"),
          Example("unknown platform name", "stages:\n  - {stage_id: 0}\nplatforms:\n  cuda2: {}\n", True,
                  contains="cuda2"),
          Example("stage key typo on a plain vllm serve pipeline: one error, here", "pipeline: llm\nstages:\n"
                  "  - {stage_id: 0, devices: \"0\", max_num_seqz: 8}\n", True, contains="which vLLM rejects"),
          Example("a top-level key far from every field: a warning", "my_notes: hi\nstages:\n  - stage_id: 0\n",
                  True, severity=Severity.WARNING, contains="my_notes"),
          Example("a stage key far from every known key: OPD111/OPD107 report it", "pipeline: qwen3_omni_moe\n"
                  "stages:\n  - {stage_id: 0, seq_budget: 8}\n", False),
      ))
def unknown_key(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """A key one edit from a known one is a typo, and its setting never takes effect:
    an error, with the key meant, reported once (OPD111 and OPD107 leave it to this rule)
    and the same on every pipeline. What the runtime does with it: vllm-omni 0.30 reads
    only its own top-level fields and the platform it runs on (a misspelt top-level key
    or platform name is dropped silently), and refuses to start on an LLM stage key no
    structured config owns ("no structured config owner"; on a diffusion stage "Unknown
    diffusion config field"); a pipeline launched as plain
    ``vllm serve`` engines passes every stage key as a flag, which vLLM rejects
    ("unrecognized arguments"). Known keys: omni-pd's stage model, vllm-omni 0.30's
    deploy fields and owned engine arguments (presets/targets/vllm_omni_stage_keys.yaml);
    a key the pipeline's ``vllm serve`` accepts is not a typo. A top-level key or platform
    far from every known name is a warning (dropped, but not a typo of a setting); a
    ``parallel_config`` key vllm-omni's parallel configs do not own is an error (it
    refuses it). Checked everywhere a stage can be written: ``stages``, ``engine_args``,
    every ``platforms.<p>.stages`` overlay entry and each file of a ``base_config`` chain.
    Sources: vllm-omni 0.30.0 ``vllm_omni/config/stage_config.py`` (``load_deploy_config``,
    ``_apply_platform_overrides``), ``vllm_omni/config/omni_config.py``
    (``_validate_stage_engine_override_ownership``, ``extract_diffusion_stage_config_kwargs``)."""
    from omni_pd.compile.model_lite import top_level_keys

    TOP_LEVEL_KEYS = top_level_keys()
    from omni_pd.compile.topology import PLATFORMS

    if ctx.legacy or ctx.platform_first is False:
        return
    for k in ctx.raw:
        if isinstance(k, str) and k not in TOP_LEVEL_KEYS and not k.startswith("x-"):
            close = get_close_matches(k, sorted(TOP_LEVEL_KEYS), n=1, cutoff=0.75)
            if k in _known_stage_key_set():  # tensor_parallel_size: not a typo of data_parallel_size
                yield r.diag(f"`{k}` is a stage setting, not a top-level one: vllm-omni reads only its own top-level "
                             "fields and drops it, so no stage gets it", ctx.loc((k,)),
                             help=f"set `{k}` in each stage entry that needs it")
            elif close:
                yield r.diag(f"unknown top-level key `{k}`: vllm-omni reads only its own fields and drops it, "
                             f"so `{close[0]}` is not set", ctx.loc((k,)), help=f"did you mean `{close[0]}`?",
                             shadows=((close[0],),), replace=None if close[0] in ctx.raw else (k, close[0]))
            else:
                yield r.diag(f"unknown top-level key `{k}` (vllm-omni drops it)", ctx.loc((k,)),
                             severity=Severity.WARNING,
                             help="top-level keys: " + ", ".join(sorted(TOP_LEVEL_KEYS)))
    plats = ctx.raw.get("platforms")
    for p in (plats if isinstance(plats, dict) else {}):  # not a mapping: OPD101
        if p not in PLATFORMS:
            close = get_close_matches(str(p), PLATFORMS, n=1, cutoff=0.6)
            yield r.diag(f"unknown platform `{p}` under `platforms:`: vllm-omni applies the overlay of the platform "
                         "it runs on only, so this one never applies", ctx.loc(("platforms", p)),
                         severity=None if close else Severity.WARNING,
                         help=(f"did you mean `{close[0]}`? " if close else "") + "platforms: " + ", ".join(PLATFORMS))
    for base, st in stage_entries(ctx):
        where = "" if base[0] == "stages" else f" in the `platforms.{base[1]}` overlay"
        inner = st.get("engine_args") if isinstance(st.get("engine_args"), dict) else {}
        for path, k, owner in [(base + (k,), k, st) for k in st] + [(base + ("engine_args", k), k, inner)
                                                                    for k in inner]:
            meant = stage_key_typo(ctx, k)
            if meant:
                yield r.diag(f"unknown stage key `{k}`{where}: {_typo_effect(ctx, k, st)}", ctx.loc(path),
                             help=f"did you mean `{meant}`?", shadows=(path[:-1] + (meant,),),
                             replace=None if meant in owner else (k, meant))
        for pc_path, pc in ((base + ("parallel_config",), st.get("parallel_config")),
                            (base + ("engine_args", "parallel_config"), inner.get("parallel_config"))):
            for k in (pc if isinstance(pc, dict) else {}):
                if isinstance(k, str) and k not in PARALLEL_CONFIG_KEYS:
                    close = get_close_matches(k, sorted(PARALLEL_CONFIG_KEYS), n=1, cutoff=0.6)
                    yield r.diag(f"`{k}` is not a parallel_config key{where}", ctx.loc(pc_path + (k,)),
                                 help=(f"did you mean `{close[0]}`? " if close else "") +
                                 "vllm-omni refuses it (\"no structured config owner\")")


@lru_cache(maxsize=1)
def _known_stage_keys() -> tuple[str, ...]:
    """Every key a stage entry may carry that some part of omni-pd or vllm-omni 0.30 knows:
    omni-pd's stage model plus vllm-omni's deploy fields and owned engine arguments."""
    _, deploy, owned = stage_keys()
    return tuple(sorted(_stage_fields() | deploy | owned | {"engine_args", "runtime"}))


@lru_cache(maxsize=1)
def _known_stage_key_set() -> frozenset[str]:
    """:func:`_known_stage_keys` as a set (membership is the common case)."""
    return frozenset(_known_stage_keys())


@lru_cache(maxsize=8)
def _by_length(known: tuple[str, ...]) -> dict[int, tuple[str, ...]]:
    """``known`` grouped by length, each group in ``known``'s order."""
    out: dict[int, list[str]] = {}
    for w in known:
        out.setdefault(len(w), []).append(w)
    return {n: tuple(ws) for n, ws in out.items()}


@lru_cache(maxsize=4096)
def close_match(word: str, known: tuple[str, ...], cutoff: float) -> str | None:
    """``difflib.get_close_matches(word, known, n=1, cutoff=cutoff)[0]`` or None, the same
    answer for less work: only candidates whose length allows a ratio >= ``cutoff`` reach
    difflib. A candidate of length L can score at most 2*min(len(word), L)/(len(word) + L)
    (difflib's own ``real_quick_ratio``, which get_close_matches tests first and drops
    the candidate on), so the candidates left out are the ones difflib would skip, and the
    best of the rest (ties: the larger string) is unchanged. Memoised: a pure function of
    its arguments, and the same unknown engine keys recur across the files of one run."""
    lw = len(word)
    cands = [w for n, ws in _by_length(known).items()
             if (2.0 * min(lw, n) / (lw + n) if lw + n else 1.0) >= cutoff for w in ws]
    close = get_close_matches(word, cands, n=1, cutoff=cutoff) if cands else []
    return close[0] if close else None


def stage_key_typo(ctx: Context, k: Any) -> str | None:
    """The known stage key ``k`` misspells (one edit away: difflib ratio >= 0.88), or
    None: ``k`` is known, an ``x-`` key, not close to any known key, or a flag the
    pipeline's plain ``vllm serve`` accepts. OPD103 reports these; OPD111 and OPD107
    skip them so a typo is reported once."""
    if not isinstance(k, str) or k.startswith("x-"):
        return None
    if k in _known_stage_key_set():
        return None
    meant = close_match(k, _known_stage_keys(), 0.88)
    if meant is None:
        return None
    if _launcher(ctx) == "vllm":
        from omni_pd.check.serve_flags import flags_for

        fs = flags_for(ctx.target.label)
        if fs is not None and fs.accepts(k, False):
            return None
    return meant


def _typo_effect(ctx: Context, k: str, stage: dict) -> str:
    """What the runtime does with the misspelt stage key ``k`` of ``stage``."""
    from omni_pd.check.serve_flags import flag_name

    if _launcher(ctx) == "vllm":
        return f"it becomes `{flag_name(k)}` on the engine's `vllm serve` command line, which vLLM rejects"
    version, _, _ = stage_keys()
    ps = ctx.topology.pipeline.stage(stage.get("stage_id")) if ctx.topology is not None else None
    said = ("Unknown diffusion config field" if ps is not None and ps.execution_type.lower() == "diffusion"
            else "no structured config owner")
    if ctx.target.label == version:
        return f"vllm-omni {version} refuses to start (\"{said}\")"
    return f"the setting it was meant for is not applied (vllm-omni {version} refuses to start: \"{said}\")"


@rule("OPD104", "port-type", Severity.WARNING,
      "port fields of the PD pair mix integers and strings",
      fail=("pipeline: qwen3_omni_moe_pd\nasync_chunk: false\nstages:\n"
            "  - {stage_id: 0, devices: \"0\", kv_transfer_config: {kv_connector: P2pNcclConnector, kv_role: kv_producer, kv_connector_extra_config: {http_port: 8100}}}\n"
            "  - {stage_id: 1, devices: \"1\", kv_transfer_config: {kv_connector: P2pNcclConnector, kv_role: kv_consumer, kv_connector_extra_config: {http_port: \"8200\"}}}\n"),
      passing=("pipeline: qwen3_omni_moe_pd\nasync_chunk: false\nstages:\n"
               "  - {stage_id: 0, devices: \"0\", kv_transfer_config: {kv_connector: P2pNcclConnector, kv_role: kv_producer, kv_connector_extra_config: {http_port: 8100}}}\n"
               "  - {stage_id: 1, devices: \"1\", kv_transfer_config: {kv_connector: P2pNcclConnector, kv_role: kv_consumer, kv_connector_extra_config: {http_port: 8200}}}\n"),
      labels=("SCH-TYPES",),
      examples=(
          Example("kv_port 21001 and \"22001\": KVTransferConfig coerces both to int",
                  "pipeline: qwen3_omni_moe_pd\nasync_chunk: false\nstages:\n"
                  "  - {stage_id: 0, devices: \"0\", kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer, kv_port: 21001}}\n"
                  "  - {stage_id: 1, devices: \"1\", kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_consumer, kv_port: \"22001\"}}\n",
                  False),
      ))
def port_type(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """Port fields in ``kv_connector_extra_config`` (``*_port``) should be written one
    way: the extra config is passed through verbatim and connectors compare or
    concatenate it as strings (P2pNccl builds ``ip:port`` from them), so an int on one
    side and a string on the other is a latent mismatch. ``kv_port`` is not one of
    them: ``KVTransferConfig.kv_port: int`` is validated by pydantic in lax mode, so
    ``21001`` and ``"21001"`` are the same int (vLLM 0.30 vllm/config/kv_transfer.py:90;
    checked in the oracle venv). Source: https://github.com/vllm-project/vllm/pull/26628."""
    if ctx.topology is None or not ctx.platform_first:
        return
    seen: list[tuple[str, type, Any, Location]] = []
    for node in ctx.topology.stages:
        kv = node.kv or {}
        items = []
        for k, v in (kv.get("kv_connector_extra_config") or {}).items():
            if isinstance(k, str) and k.endswith("_port"):
                items.append((("kv_connector_extra_config", k), v))
        for keys, v in items:
            path = ctx.stage_path(node, "kv_transfer_config", *keys)
            if path[-len(keys):] == keys:
                v = ctx.raw_at(path, v)  # as written (the model coerced it)
            if isinstance(v, (int, str)) and not isinstance(v, bool):
                seen.append((".".join(keys), type(v), v,
                             ctx.sloc(node, "kv_transfer_config", *keys, value=True)))
    kinds = {t for _, t, _, _ in seen}
    if len(kinds) > 1:
        ints = [s for s in seen if s[1] is int]
        strs = [s for s in seen if s[1] is str]
        minority = strs if len(strs) <= len(ints) else ints
        other = ints if minority is strs else strs
        for name, t, v, loc in minority:
            yield r.diag(f"port fields mix int and str: `{name}` is {'a string' if t is str else 'an integer'} ({v!r}) "
                         f"while other port fields are {'integers' if t is str else 'strings'}", loc,
                         related=[Location(o[3].file, o[3].line, o[3].column, label=f"`{o[0]}` written as {o[2]!r}")
                                  for o in other[:2]],
                         help=f"write every port as an unquoted integer, e.g. {name.split('.')[-1]}: {int(v) if str(v).isdigit() else v}")


@rule("OPD105", "env-name", Severity.ERROR,
      "an environment variable name is a near miss of a known one",
      fail="stages:\n  - stage_id: 0\n    env: {CUDA_VISIBLE_DEVICE: \"0\"}\n",
      passing="stages:\n  - stage_id: 0\n    env: {CUDA_VISIBLE_DEVICES: \"0\"}\n", labels=("SCH-ENV-NAME",))
def env_name(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """Launcher and stage environment names are checked against the visibility
    variables of every platform (CUDA_VISIBLE_DEVICES, ASCEND_RT_VISIBLE_DEVICES,
    HIP_VISIBLE_DEVICES, ZE_AFFINITY_MASK, MUSA_VISIBLE_DEVICES) and the connector
    variables vLLM reads. A name one letter away from one of them is silently ignored
    by the runtime (vllm-omni#2898: ``ASCEND_RT_VISIBLE_DEVICE`` made every stage see
    the wrong NPUs). Source: https://github.com/vllm-project/vllm-omni/issues/2898."""
    if not ctx.platform_first:
        return
    known = sorted(KNOWN_ENV)

    def near(name: str) -> str | None:
        if name in KNOWN_ENV:
            return None
        close = get_close_matches(name, known, n=1, cutoff=0.9)
        return close[0] if close else None

    for name in ctx.env:
        m = near(str(name))
        if m:
            yield r.diag(f"`{name}` is not a known variable; did you mean `{m}`?",
                         Location(file="<launcher environment>", path=(name,)),
                         help=f"export {m}=... instead; the misspelt name is ignored")
    if ctx.topology is None:
        return
    for node in ctx.topology.stages:
        for name in node.env:
            m = near(str(name))
            if m:
                yield r.diag(f"stage {node.stage_id}: `{name}` is not a known variable; did you mean `{m}`?",
                             ctx.sloc(node, "env", name), help=f"rename it to `{m}`")


@rule("OPD106", "cli-scope", Severity.WARNING,
      "a global engine flag would be broadcast to every stage",
      fail="stages:\n  - stage_id: 0\n  - stage_id: 1\n",
      passing="stages:\n  - stage_id: 0\n    tensor_parallel_size: 2\n  - stage_id: 1\n",
      example_context={"cli": {"tensor_parallel_size": 2}}, pass_context={}, labels=("SCH-CLI-SCOPE",))
def cli_scope(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """``vllm serve --omni`` applies global engine flags (``-tp``, ``--max-model-len``,
    ``--dtype``...) to every stage of a multi-stage pipeline: a TP meant for the Thinker
    lands on the Talker and Code2Wav too (vllm-omni#5003, #2898). Set them per stage in
    the deploy YAML. (The passing example shows the same flag set per stage with no
    global flag.) Pipelines launched as one plain ``vllm serve`` per engine (``llm_pd``,
    the thinker-only pipelines) are not checked: there the flag is meant for every
    engine. Source: vllm-omni docs configuration/stage_configs.md;
    https://github.com/vllm-project/vllm-omni/issues/5003."""
    if not ctx.platform_first or ctx.topology is None or len(ctx.topology.stages) < 2:
        return
    if _launcher(ctx) != "vllm-omni":
        return  # one `vllm serve` per engine: a flag for every engine is what the user asked for
    flags = [k for k in ctx.cli if k in STAGE_SCOPED_FLAGS]
    if flags:
        shown = ", ".join("--" + f.replace("_", "-") for f in flags)
        yield r.diag(f"global {shown} would be broadcast to all {len(ctx.topology.stages)} stages",
                     Location(file="<command line>", path=tuple(flags)),
                     help="drop the flag and set " + ", ".join(f"`{f}`" for f in flags) + " per stage in the deploy YAML")


@rule("OPD108", "base-config-missing", Severity.ERROR,
      "`base_config` names a file that cannot be found, or the chain of base files loops",
      fail="base_config: no_such_file.yaml\nstages:\n  - stage_id: 0\n",
      passing="base_config: qwen3_omni_moe.yaml\n")
def base_config_missing(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """``base_config`` is resolved next to the file, then among omni-pd's bundled
    presets (which mirror vllm-omni's ``vllm_omni/deploy/``), at any depth; a chain that
    comes back to one of its own files is reported too (vllm-omni recurses until
    ``RecursionError``). The diagnostic is emitted while loading (omni_pd/check/validate.py), before
    the rules run. Source: vllm-omni 0.30.0 config/stage_config.py
    (``resolve_deploy_yaml``, ``load_deploy_config``)."""
    return []


# --- engine-argument ownership (vllm-omni 0.30) -------------------------------------


@lru_cache(maxsize=1)
def stage_keys() -> tuple[str, frozenset[str], frozenset[str]]:
    """(vllm-omni major.minor, StageDeployConfig fields, owned engine args) from
    ``presets/targets/vllm_omni_stage_keys.yaml`` (generated from vllm-omni 0.30.0;
    tests/test_oracle.py checks it against the live package)."""
    from omni_pd.resources import data_dir, load_data

    d = load_data(data_dir("presets") / "targets" / "vllm_omni_stage_keys.yaml")
    return str(d["vllm_omni"]), frozenset(d["deploy"]), frozenset(d["owned"])


@rule("OPD111", "engine-arg-unowned", Severity.ERROR,
      "a stage key is neither a deploy field nor an engine argument vllm-omni can place",
      fail="pipeline: qwen3_omni_moe\nstages:\n  - stage_id: 0\n    seq_budget: 8\n",
      passing="pipeline: qwen3_omni_moe\nstages:\n  - stage_id: 0\n    max_num_seqs: 8\n",
      examples=(
          Example("unowned key in a platform overlay", "pipeline: qwen3_omni_moe\nstages:\n  - stage_id: 0\n"
                  "platforms:\n  rocm:\n    stages:\n      - {stage_id: 0, seq_budget: 8}\n", True,
                  contains="platforms.rocm"),
          Example("unowned key in a base_config chain child", "base_config: qwen3_omni_moe.yaml\nstages:\n"
                  "  - {stage_id: 1, seq_budget: 8}\n", True, contains="seq_budget"),
          Example("other releases: not checked", "pipeline: qwen3_omni_moe\nstages:\n  - stage_id: 0\n    seq_budget: 8\n",
                  False, {"vllm_version": "0.24"}),
      ))
def engine_arg_unowned(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """vllm-omni 0.30 forwards stage keys that are not ``StageDeployConfig`` fields to
    the engine, then refuses any that no structured config (model, cache, parallel,
    scheduler, KV transfer, ...) owns: ``ValueError: Stage N (llm_ar) has explicit
    engine argument(s) with no structured config owner`` when the server starts.
    Checked for vLLM 0.30 targets (the list omni-pd ships is vllm-omni 0.30.0's), in
    every stage entry, its ``engine_args`` and every ``platforms.<p>.stages`` overlay
    entry (vllm-omni applies the overlay's keys to the stage). A key one edit from a known
    one is reported by OPD103 instead (a typo, with the key meant), not twice.
    Source: vllm-omni 0.30.0 config/omni_config.py
    ``_validate_stage_engine_override_ownership``; config/stage_config.py
    ``StageDeployConfig``."""
    from difflib import get_close_matches

    version, deploy, owned = stage_keys()
    if ctx.legacy or ctx.platform_first is False or ctx.target.label != version:
        return
    # only pipelines whose stages omni-pd knows are LLM stages (the list is theirs);
    # diffusion and other stage types own other keys
    topo = ctx.topology
    if topo is None or topo.pipeline.runtime != "vllm-omni" or topo.pipeline.name.startswith("<"):
        return
    known = deploy | owned | {"engine_args", "runtime"}
    for base, st in stage_entries(ctx):
        where = "" if base[0] == "stages" else f" (`platforms.{base[1]}` overlay)"
        inner = st.get("engine_args") if isinstance(st.get("engine_args"), dict) else {}
        for path, k in [(base + (k,), k) for k in st] + [(base + ("engine_args", k), k) for k in inner]:
            if not isinstance(k, str) or k in known or stage_key_typo(ctx, k):
                continue  # a near-miss typo is OPD103's (one report per key)
            if k in ctx.target.kv_fields():  # a kv_transfer_config key dedented out of its block
                kv_path = base + ("kv_transfer_config",)
                under = (f"move it under the stage's `kv_transfer_config` (line {ctx.loc(kv_path).line})"
                         if ctx.exists(kv_path) else "move it into a `kv_transfer_config:` mapping of this stage")
                yield r.diag(f"vllm-omni {version} has no place for stage key `{k}`{where}: the server would refuse to start",
                             ctx.loc(path), help=f"`{k}` is a kv_transfer_config key: {under}")
                continue
            close = get_close_matches(k, sorted(deploy | owned), n=1, cutoff=0.8)
            yield r.diag(f"vllm-omni {version} has no place for stage key `{k}`{where}: the server would refuse to start",
                         ctx.loc(path),
                         help=(f"did you mean `{close[0]}`? " if close else "") +
                         "remove it, or use a vLLM engine argument (see `vllm serve --help`)")


# --- one parallel size from two sources (vllm-omni 0.30) ----------------------------

_DIT = "stages:\n  - {{stage_id: 0, devices: \"{dev}\"{flat}, parallel_config: {{{nested}}}}}\n"


@rule("OPD112", "parallel-config-conflict", Severity.ERROR,
      "a stage sets a parallel size flat and in its nested parallel_config with different values",
      fail=_DIT.format(dev="0,1,2,3", flat=", tensor_parallel_size: 1, cfg_parallel_size: 2",
                       nested="tensor_parallel_size: 4, cfg_parallel_size: 1"),
      passing=_DIT.format(dev="0,1", flat="", nested="tensor_parallel_size: 1, cfg_parallel_size: 2"),
      labels=("SCH-PARALLEL-CONFLICT",),
      examples=(
          Example("same value in both places", _DIT.format(dev="0,1", flat=", tensor_parallel_size: 2",
                                                            nested="tensor_parallel_size: 2"), False),
          Example("flat key the nested block does not set", _DIT.format(
              dev="0,1", flat=", cfg_parallel_size: 2", nested="tensor_parallel_size: 1"), False),
          Example("engine_args layout", "stages:\n  - stage_id: 0\n    devices: \"0\"\n    engine_args: {tensor_parallel_size: 2,"
                  " parallel_config: {tensor_parallel_size: 1}}\n", True, contains="tensor_parallel_size 2"),
          Example("global flag under an LLM stage's nested block", "pipeline: llm\nstages:\n  - {stage_id: 0, devices: \"0,1\", "
                  "parallel_config: {tensor_parallel_size: 2}}\n", True, {"cli": {"tensor_parallel_size": 1}},
                  contains="overridden by parallel_config.tensor_parallel_size 2"),
          Example("global flag on a diffusion stage wins (vllm-omni moves it into the nested block)",
                  _DIT.format(dev="0,1", flat="", nested="tensor_parallel_size: 1, cfg_parallel_size: 2"), False,
                  {"cli": {"tensor_parallel_size": 1}}),
          Example("a platform overlay's flat size under the base's nested block",
                  "stages:\n  - {stage_id: 0, devices: \"0\", parallel_config: {tensor_parallel_size: 1}}\n"
                  "platforms:\n  npu:\n    stages:\n      - {stage_id: 0, tensor_parallel_size: 2}\n", True,
                  {"platform": "npu"}, contains="parallel_config.tensor_parallel_size 1"),
      ))
def parallel_config_conflict(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """vllm-omni 0.30 builds a stage's parallel config from its flat keys and then
    updates it with the nested ``parallel_config`` block, so where both set a size
    the nested value wins, silently: editing ``tensor_parallel_size: 1,
    cfg_parallel_size: 2`` next to a bundled ``parallel_config: {tensor_parallel_size:
    4, cfg_parallel_size: 1}`` changes nothing (vllm-omni#3911). Checked after the
    platform overlay (an overlay's flat key loses to the base's nested block too). On an
    LLM stage a global ``--tensor-parallel-size`` lands flat as well and loses to the
    nested block; on a diffusion stage vllm-omni moves CLI parallel flags into the nested
    block, so they win. Write each size once. Sources: vllm-omni 0.30.0 config/omni_config.py
    ``_build_parallel_config``; https://github.com/vllm-project/vllm-omni/issues/3911."""
    from omni_pd.check.rules import PARALLEL_SIZE_KEYS

    if ctx.topology is None:
        return
    for n in ctx.topology.stages:
        nested = n.settings.get("parallel_config")
        if not isinstance(nested, dict):
            continue
        clash = []
        for k in PARALLEL_SIZE_KEYS + ("use_hsdp",):
            fv = n.settings.get(k)  # the flat key (after the platform overlay)
            nv = nested.get(k)
            if fv is not None and nv is not None and str(fv) != str(nv):
                clash.append((k, fv, nv))
        if not ctx.is_diffusion(n):  # LLM stages: a global flag lands flat, so the nested block beats it too
            for k in PARALLEL_SIZE_KEYS:
                cv, nv = ctx.cli.get(k), nested.get(k)
                if cv is not None and nv is not None and str(cv) != str(nv):
                    yield r.diag(f"stage {n.stage_id}: the global --{k.replace('_', '-')} {cv} is overridden by "
                                 f"parallel_config.{k} {nv} (vllm-omni merges the nested block over flat keys and "
                                 "command-line flags of an LLM stage)",
                                 ctx.sloc(n, "parallel_config", k, value=True),
                                 help=f"drop the flag, or set parallel_config.{k}: {cv} in the deploy YAML")
        if not clash:
            continue
        fl = " / ".join(f"{k} {fv}" for k, fv, _ in clash)
        ne = " / ".join(f"{'parallel_config.' if i == 0 else ''}{k} {nv}" for i, (k, _, nv) in enumerate(clash))
        k0 = clash[0][0]
        yield r.diag(f"stage {n.stage_id} sets {fl} and {ne}; vllm-omni uses parallel_config",
                     ctx.sloc(n, k0, value=True),
                     related=[ctx.sloc(n, "parallel_config", k, value=True, label=f"wins: {k} {nv}") for k, _, nv in clash],
                     help="write each size once: edit parallel_config (or drop it and keep the flat keys)")


#: Keys a nested ``parallel_config`` may hold in vllm-omni 0.30 (LLM stages: vLLM
#: ParallelConfig fields owned by OmniStageParallelConfig; diffusion stages:
#: OmniStageDiffusionParallelConfig). Source: vllm-omni 0.30.0 config/omni_config.py
#: ``_PARALLEL_CONFIG_FIELDS_BY_EXECUTION_TYPE`` (read in the oracle venv).
PARALLEL_CONFIG_KEYS = frozenset({
    "pipeline_parallel_size", "tensor_parallel_size", "prefill_context_parallel_size", "data_parallel_size",
    "data_parallel_size_local", "data_parallel_rank", "data_parallel_master_ip", "data_parallel_address",
    "data_parallel_rpc_port", "dp_sync_interval", "data_parallel_backend", "data_parallel_external_lb",
    "data_parallel_hybrid_lb", "enable_expert_parallel", "enable_batch_sharded_sampling", "enable_ep_weight_filter",
    "enable_eplb", "eplb_config", "expert_placement_strategy", "all2all_backend", "max_parallel_loading_workers",
    "disable_custom_all_reduce", "enable_elastic_ep", "elastic_ep_max_dp_size", "enable_dbo", "ubatch_size",
    "dbo_decode_token_threshold", "dbo_prefill_token_threshold", "disable_nccl_for_dp_synchronization",
    "ray_workers_use_nsight", "worker_extension_cls", "master_addr", "master_port", "node_rank", "nnodes",
    "numa_bind", "numa_bind_nodes", "numa_bind_cpus", "distributed_timeout_seconds",
    "cpu_distributed_timeout_seconds", "decode_context_parallel_size", "dcp_kv_cache_interleave_size",
    "dcp_comm_backend", "dcp_q_replicate", "cp_kv_cache_interleave_size", "enable_fault_tolerance",
    "fault_tolerance_config",
    # diffusion
    "allgather_degree", "cfg_parallel_size", "hsdp_replicate_size", "hsdp_shard_size", "mask_sp_padding",
    "ring_degree", "sequence_parallel_size", "text_encoder_tp_size", "ulysses_a2a_permute", "ulysses_degree",
    "ulysses_mode", "use_hsdp", "vae_parallel_mode", "vae_patch_parallel_size",
})


# --- flags checked against the real `vllm serve` parser ----------------------------


def _launcher(ctx: Context) -> str:
    """``vllm-omni`` (one ``vllm serve --omni``) or ``vllm`` (one ``vllm serve`` per engine).

    Only a file whose pipeline is named (its ``pipeline: llm_pd`` key, or ``--pipeline llm``)
    is taken to be launched as plain ``vllm serve`` engines; a one-stage file without
    either (checked as ``llm``) may well be a vllm-omni diffusion or TTS deploy."""
    topo = ctx.topology
    if topo is None or ctx.config is None or not (ctx.config.pipeline or ctx.pipeline_given):
        return "vllm-omni"
    return str(getattr(topo.pipeline, "launcher", None) or topo.pipeline.runtime)


_TWO = "stages:\n  - {stage_id: 0, devices: \"0\"}\n  - {stage_id: 1, devices: \"0\", gpu_memory_utilization: 0.4}\n"
_LLM_PD = ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
           "  - {{stage_id: 0, devices: \"0\"{x}, kv_transfer_config: {{kv_connector: NixlConnector, kv_role: kv_producer, engine_id: p}}}}\n"
           "  - {{stage_id: 1, devices: \"1\", kv_transfer_config: {{kv_connector: NixlConnector, kv_role: kv_consumer, engine_id: d}}}}\n")


def _flags_release(ctx: Context, fs: Any) -> str:
    """How an OPD107 message names the release whose `vllm serve` flags it read: the target
    (with the "assumed" note when no --vllm-version was given), or the nearest release omni-pd
    has a flag list for when it differs."""
    return ctx.release_words() if fs.release == ctx.target.label else f"vLLM {fs.release}"


@rule("OPD107", "serve-flag-unknown", Severity.ERROR,
      "a `vllm serve` flag (or a stage key that becomes one) is not a flag the target vllm serve accepts",
      fail=_TWO, passing=_TWO, example_context={"cli": {"stage_0_devices": "0"}, "vllm_version": "0.30"},
      pass_context={"cli": {"max_model_len": 4096}, "vllm_version": "0.30"}, labels=("SCH-CLI-SCOPE",),
      examples=(
          Example("stage-scoped flag on a release without a flag list", _TWO, True,
                  {"cli": {"stage_1_devices": "0"}, "vllm_version": "0.22"}, contains="--stage-1-devices"),
          Example("misspelt flag: nearest flag named", _TWO, True,
                  {"cli": {"max_model_length": 4096}, "vllm_version": "0.30"}, contains="--max-model-length"),
          Example("--omni flag under vllm serve --omni", _TWO, False,
                  {"cli": {"stage_overrides": '{"0": {"devices": "0"}}'}, "vllm_version": "0.30"}),
          Example("--omni-only flag on a plain vllm serve pair", _LLM_PD.format(x=""), True,
                  {"cli": {"stage_overrides": "{}"}, "vllm_version": "0.30"}, contains="--stage-overrides"),
          Example("short flag", _TWO, False, {"cli": {"tp": 1}, "vllm_version": "0.30"}),
          Example("stage key that becomes an unknown flag (plain vllm serve)", _LLM_PD.format(x=", seq_budget: 8"),
                  True, {"vllm_version": "0.30"}, contains="seq_budget"),
          Example("a misspelt stage key is OPD103's (reported once)", _LLM_PD.format(x=", max_num_seq: 8"),
                  False, {"vllm_version": "0.30"}),
          Example("stage key that is a flag (plain vllm serve)", _LLM_PD.format(x=", max_num_seqs: 8"),
                  False, {"vllm_version": "0.30"}),
          Example("no flag list for the release: info", _TWO, True,
                  {"cli": {"max_model_len": 4096}, "vllm_version": "0.22"}, severity=Severity.INFO),
      ))
def serve_flag_unknown(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """Global flags (``validate --serve-arg``, ``launch --engine-arg``) must be flags the
    target ``vllm serve`` accepts (plus the ones ``--omni`` adds for vllm-omni
    pipelines), else the server stops with "unrecognized arguments" before anything
    starts. Checked against vLLM's own serve parser when vLLM of the target release is
    importable, else against ``presets/targets/serve_flags.yaml`` (generated from those
    parsers); the nearest flag is suggested. A per-stage flag such as
    ``--stage-0-devices`` is never a ``vllm serve`` flag on any release: a stage's
    devices go in ``stages[N].devices`` (or ``--stage-overrides`` under ``--omni``). For
    pipelines launched as one ``vllm serve`` per engine, each stage key becomes a flag
    too and is checked the same way (a key one edit from a known stage key is OPD103's,
    reported once). Sources: vLLM vllm/entrypoints/cli/serve.py
    (``ServeSubcommand.subparser_init``), vllm-omni 0.30.0 entrypoints/cli/serve.py
    (``OmniServeCommand``); https://github.com/vllm-project/vllm-omni/issues/4508."""
    from omni_pd.check.serve_flags import DEPLOY_ONLY_KEYS, STAGE_SCOPED, flag_name, flags_for, releases

    if not ctx.platform_first or ctx.legacy:
        return
    omni = _launcher(ctx) == "vllm-omni"
    if not ctx.cli and (omni or ctx.topology is None):
        return  # nothing becomes a flag here (building vLLM's parser imports much of vLLM)
    fs = flags_for(ctx.target.label)
    cmd = "vllm serve --omni" if omni else "vllm serve"
    unchecked = []
    for key in ctx.cli:
        flag = flag_name(str(key))
        loc = Location(file="<command line>", path=(key,))
        m = STAGE_SCOPED.match(str(key))
        if m:
            sid, what = m.group(1), m.group(2)
            val = ctx.cli[key]
            where = f"stages[{sid}].{what} in" if what in _stage_fields() else f"`{what}` in the stage {sid} entry of"
            over = f"; or --stage-overrides '{{\"{sid}\": {{\"{what}\": \"{val}\"}}}}'" if omni else ""
            yield r.diag(f"{flag} is not a `{cmd}` flag (unrecognized arguments): it is per stage", loc,
                         help=f"set {where} the deploy YAML{over}")
            continue
        if fs is None:
            unchecked.append(flag)
            continue
        if not fs.accepts(str(key), omni):
            near = fs.nearest(str(key), omni)
            only_omni = not omni and fs.accepts(str(key), True)
            why = " (a `vllm serve --omni` flag; this pipeline runs plain `vllm serve` engines)" if only_omni else ""
            yield r.diag(f"{flag} is not a `{cmd}` flag in {_flags_release(ctx, fs)}{why}", loc,
                         help=f"did you mean {near}?" if near and not only_omni else
                         "remove it" if only_omni else "see `vllm serve --help` for the flags of this release")
    if unchecked:
        yield r.diag(f"no `vllm serve` flag list for vLLM {ctx.target.label} (omni-pd has {', '.join(releases()) or 'none'}; "
                     f"vLLM is not importable here): {', '.join(unchecked)} not checked",
                     Location(file="<command line>", path=tuple(unchecked)), severity=Severity.INFO,
                     help="regenerate presets/targets/serve_flags.yaml in an environment with that vLLM "
                          "(python -m omni_pd.check.serve_flags -o ...), or validate where it is installed")
    if omni or fs is None or ctx.topology is None:
        return
    for n in ctx.topology.stages:  # plain `vllm serve` engines: every engine key becomes --key
        if n.index is None:
            continue
        st = ctx.raw_at(("stages", n.index)) or {}
        inner = st.get("engine_args") if isinstance(st.get("engine_args"), dict) else {}
        for path, k in [(("stages", n.index, k), k) for k in st] + [(("stages", n.index, "engine_args", k), k) for k in inner]:
            if (not isinstance(k, str) or k in DEPLOY_ONLY_KEYS or k.startswith("x-") or fs.accepts(k, False)
                    or stage_key_typo(ctx, k)):
                continue  # a near-miss typo is OPD103's (one report per key)
            near = fs.nearest(k, False)
            yield r.diag(f"stage {n.stage_id}: `{k}` becomes `{flag_name(k)}` on this engine's `vllm serve` command line, "
                         f"which {_flags_release(ctx, fs)} does not accept", ctx.loc(path),
                         help=(f"did you mean `{near[2:].replace('-', '_')}`?" if near else "remove it"))
