"""OPD317 pd-engine-arg-mismatch: an engine argument that must agree is set differently on prefill and decode.

Generic over vLLM's whole ``EngineArgs`` (issue 35): presets/targets/engine_args.yaml
classifies every argument of each release read (engine_args_fields.yaml, generated from the
released wheels) as ``must_agree``, ``agree_if`` (a condition), ``may_differ`` (a reason)
or ``per_side``, each group with its upstream source. This rule reads the table of the
target release (``--vllm-version``) and reports each ``must_agree`` argument, and each
``agree_if`` argument whose condition validate can test (a hybrid model from
``--model-info``, the pair's connector), that the two sides set to different values.
Arguments with a dedicated rule (the row's ``rule``: OPD313 model identity, OPD605
kv_cache_dtype, OPD607 block_size, and the speculative and max_model_len rules) are left
to it.

PASS::

    stages:
      - {stage_id: 0, attention_backend: FLASH_ATTN, kv_transfer_config: {kv_role: kv_producer, ...}}
      - {stage_id: 1, attention_backend: FLASH_ATTN, kv_transfer_config: {kv_role: kv_consumer, ...}}

FAIL::

    stages:
      - {stage_id: 0, attention_backend: FLASH_ATTN, kv_transfer_config: {kv_role: kv_producer, ...}}
      - {stage_id: 1, attention_backend: FLASHINFER, kv_transfer_config: {kv_role: kv_consumer, ...}}
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Iterable

from omni_pd.compile.engine_args import NOT_LITERAL, ArgRow, arg_rows, release_source, table_release
from omni_pd.compile.topology import PIPELINE_WIDE_ENGINE_KEYS, pipeline_wide_settings
from omni_pd.diagnostics import Diagnostic, Severity
from omni_pd.check.rules import Context, Example, Rule, rule

if TYPE_CHECKING:
    from omni_pd.compile.topology import StageNode

_PAIR = ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
         "  - {{stage_id: 0, devices: \"0\"{p}, kv_transfer_config: {{kv_connector: {c}, kv_role: kv_producer, engine_id: p0}}}}\n"
         "  - {{stage_id: 1, devices: \"1\"{d}, kv_transfer_config: {{kv_connector: {c}, kv_role: kv_consumer, engine_id: d0}}}}\n")

TABLE = "presets/targets/engine_args.yaml"


def _pair(p: str = "", d: str = "", c: str = "MooncakeConnector") -> str:  # pragma: no mutate block (runs at import only)
    return _PAIR.format(p=p, d=d, c=c)


def _explicit(ctx: Context, n: "StageNode", key: str) -> tuple[bool, Any]:
    """(set?, value) of engine argument ``key`` for stage ``n``: a global CLI flag (the same
    on every stage), the stage's own key (flat or under ``engine_args``), else a pipeline-wide
    top-level key vllm-omni applies to every stage (topology.PIPELINE_WIDE_ENGINE_KEYS)."""
    if key in ctx.cli:
        return True, ctx.cli[key]
    if n.settings.get(key) is not None:
        return True, n.settings[key]
    if key in PIPELINE_WIDE_ENGINE_KEYS and ctx.config is not None:
        wide = pipeline_wide_settings(ctx.config)
        if key in wide:
            return True, wide[key]
    return False, None


def _norm(v: Any) -> Any:
    """A value as vLLM would compare it after parsing: a JSON text as its data (``--hf-overrides
    '{...}'``), strings case-folded (enum names), numbers as floats, mappings and lists
    recursively."""
    if isinstance(v, str):
        s = v.strip()
        if s[:1] in ("{", "["):
            try:
                return _norm(json.loads(s))
            except ValueError:
                pass
        low = s.lower()
        return {"true": True, "false": False, "none": None, "null": None}.get(low, low)
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, dict):
        return {str(k): _norm(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_norm(x) for x in v]
    return str(v)


def _parsed(v: Any) -> Any:
    """A JSON text (``--hf-overrides '{...}'``) as its data, anything else as written."""
    if isinstance(v, str) and v.strip()[:1] in ("{", "["):
        try:
            return json.loads(v)
        except ValueError:
            pass
    return v


def _show(v: Any) -> str:
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True, default=str)
    if isinstance(v, bool):
        return str(v).lower()
    return "null" if v is None else str(v)


def _resolved_at_runtime(default: Any) -> bool:
    """True for a default vLLM resolves when the engine starts (None, ``auto``, a factory),
    so a side that leaves it may end up with the value the other side writes."""
    return default is NOT_LITERAL or default is None or (isinstance(default, str) and default.lower() == "auto")


def _condition_holds(ctx: Context, row: ArgRow, p: "StageNode", d: "StageNode") -> bool:
    """True when an ``agree_if`` row's ``when`` holds for the pair: ``hybrid`` (the
    ``--model-info`` checkpoint is a hybrid model), ``connectors`` (either side
    loads one of them: vLLM's classes by ``capability.connector_row``, not another package's
    class of that name). False when there is no ``when`` or nothing to test it on."""
    if not row.when:
        return False
    if "hybrid" in row.when and not (ctx.model is not None and ctx.model.is_hybrid == bool(row.when["hybrid"])):
        return False
    if "connectors" in row.when:
        from omni_pd.check.rules.capability import connector_row

        names = {connector_row(ctx, n) for n in (p, d)}  # the loaded classes (a row names vLLM's)
        if not names & set(row.when["connectors"]):
            return False
    return True


@rule("OPD317", "pd-engine-arg-mismatch", Severity.ERROR,
      "an engine argument that must agree across the PD pair is set differently on prefill and decode",
      fail=_pair(", attention_backend: FLASH_ATTN", ", attention_backend: FLASHINFER"),
      passing=_pair(", attention_backend: FLASH_ATTN", ", attention_backend: FLASH_ATTN"),
      examples=(
          Example("one side sets a must-agree argument, the other keeps a fixed default",
                  _pair(d=", disable_sliding_window: true"), True, contains="default false"),
          Example("one side sets it, the other's default is resolved at runtime",
                  _pair(d=", attention_backend: FLASH_ATTN"), True, severity=Severity.WARNING,
                  contains="resolved when the engine starts"),
          Example("a JSON text and a mapping of the same overrides are one value",
                  _pair(", hf_overrides: '{\"num_hidden_layers\": 2}'", ", hf_overrides: {num_hidden_layers: 2}"), False),
          Example("different overrides", _pair(", hf_overrides: {num_hidden_layers: 2}", ", hf_overrides: {num_hidden_layers: 4}"),
                  True, contains='{"num_hidden_layers": 2} / {"num_hidden_layers": 4}'),
          Example("enum names compare case-insensitively",
                  _pair(", attention_backend: flash_attn", ", attention_backend: FLASH_ATTN"), False),
          Example("a may_differ argument (batch size) differs", _pair(", max_num_seqs: 4", ", max_num_seqs: 64"), False),
          Example("kv_cache_dtype has its own rule (OPD605) and is not reported twice",
                  _pair(", kv_cache_dtype: fp8", ", kv_cache_dtype: auto"), False),
          Example("hybrid state dtype differs on a hybrid model",
                  _pair(", mamba_ssm_cache_dtype: float32", ", mamba_ssm_cache_dtype: float16"), True,
                  {"model": {"attention": "hybrid"}}, contains="hybrid"),
          Example("hybrid state dtype differs, model not known to be hybrid",
                  _pair(", mamba_ssm_cache_dtype: float32", ", mamba_ssm_cache_dtype: float16"), False),
          Example("block-hash algorithm differs over a shared LMCache store",
                  _pair(", prefix_caching_hash_algo: sha256", ", prefix_caching_hash_algo: xxhash", c="LMCacheConnectorV1"),
                  True, contains="LMCache"),
          Example("block-hash algorithm differs over Mooncake P2P (no shared store)",
                  _pair(", prefix_caching_hash_algo: sha256", ", prefix_caching_hash_algo: xxhash"), False),
          Example("the release the table was read from is named",
                  _pair(", tokenizer_mode: slow", ", tokenizer_mode: mistral"), True, {"vllm_version": "0.33"},
                  contains="vLLM 0.33"),
      ))
def engine_arg_agree(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """Every vLLM engine argument the table (presets/targets/engine_args.yaml, the target
    release's ``EngineArgs`` fields in presets/targets/engine_args_fields.yaml, read from
    the released wheels) classifies ``must_agree`` must have one value on the PD pair's
    prefill and decode stage (xPyD: every replica runs its stage's settings); an
    ``agree_if`` argument too when its condition holds and validate can test it (a hybrid
    model given by ``--model-info``; the pair's connector). The effective value of a side:
    a global CLI flag, the stage's key, a pipeline-wide top-level key. Error when both
    sides set different values, or one side sets a value other than the fixed default the
    other keeps; warning when the other side's default is resolved when the engine starts
    (None, ``auto``, a factory), since both may end up equal. Values compare as vLLM parses
    them (JSON text as data, enum names case-insensitively). Arguments whose row names a
    dedicated rule are left to it. The message names both sides and values, the row's
    reason and source, and the vLLM release whose table was read (``--vllm-version``);
    a target release the table was not read for is not checked. Sources: vLLM 0.30.0-0.34.0
    ``vllm/engine/arg_utils.py`` ``EngineArgs``;
    ``vllm/distributed/kv_transfer/kv_connector/v1/nixl/metadata.py``
    ``compute_nixl_compatibility_hash``; the Mooncake connector's region checks."""
    pair = ctx.pd_pair
    if pair is None:
        return
    rel = table_release(ctx.target.label)
    if rel is None:
        return
    p, d = pair
    for name, row in arg_rows(rel).items():
        if row.rule or row.cls not in ("must_agree", "agree_if"):
            continue
        if row.cls == "agree_if" and not _condition_holds(ctx, row, p, d):
            continue
        (p_set, pv), (d_set, dv) = _explicit(ctx, p, name), _explicit(ctx, d, name)
        if not (p_set or d_set):
            continue
        severity = Severity.ERROR
        if p_set and d_set:
            if _norm(pv) == _norm(dv):
                continue
            values = f"{_show(_parsed(pv))} / {_show(_parsed(dv))}"
            what = f"set {name} differently ({values})"
        else:
            here_v = pv if p_set else dv
            if not _resolved_at_runtime(row.default) and _norm(here_v) == _norm(row.default):
                continue
            setter, keeper = ("prefill", "decode") if p_set else ("decode", "prefill")
            if _resolved_at_runtime(row.default):
                severity = Severity.WARNING
                dflt = "a factory" if row.default is NOT_LITERAL else _show(row.default)
                what = (f"differ on {name}: {setter} sets {_show(here_v)}, {keeper} keeps vLLM's default ({dflt}, "
                        "resolved when the engine starts; equal only if it resolves to the same)")
            else:
                what = f"differ on {name}: {setter} sets {_show(here_v)}, {keeper} keeps vLLM's default {_show(row.default)}"
        cond = f", and {row.why}" if row.cls == "agree_if" else f": {row.why}"
        here, there = (d, p) if d_set else (p, d)
        side, other = ("decode", "prefill") if here is d else ("prefill", "decode")
        hv, tv = (dv, pv) if here is d else (pv, dv)
        t_set = p_set if there is p else d_set
        loc = ctx.sloc(here, name, value=True)
        rel_loc = ctx.sloc(there, name, value=True, label=f"{other} (stage {there.stage_id}) "
                           + (f"sets {_show(tv)}" if t_set else "keeps the default")) if t_set else \
            ctx.sloc(there, label=f"{other} (stage {there.stage_id}) keeps the default")
        yield r.diag(
            f"prefill (stage {p.stage_id}) and decode (stage {d.stage_id}) {what} on vLLM {rel}{cond}",
            loc, related=[rel_loc], severity=severity, label=f"{side} uses {_show(hv)}",
            help=f"write the same `{name}` on both stages of the PD pair (`{name}: {_show(hv)}` on {other} too, "
                 "or drop it from both)",
            notes=[f"{TABLE} group {row.group} ({row.cls}), source: {row.source}",
                   f"assumed vLLM {rel} (its EngineArgs read from {release_source(rel)}); "
                   "give another release with --vllm-version"],
            reads=ctx.reads(p, name) + ctx.reads(d, name))
