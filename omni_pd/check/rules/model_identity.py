"""OPD313 pd-model-identity: both halves of a PD pair load the same model.

Decode continues from KV that prefill computed, so both engines must run the same
weights, read the prompt with the same tokenizer and store KV in the same numbers. The
handshakes do not check it: NIXL's compatibility hash (vLLM 0.30
``kv_connector/v1/nixl/metadata.py`` ``compute_nixl_compatibility_hash``) covers the
KV geometry (layers, heads, head size, block size, dtype), not the checkpoint's
revision; Mooncake sends raw bytes. Two commits of one repository with the same
geometry pass and answers are silently wrong (vllm-project/vllm#55776).

Compared, on the pair's prefill and decode stage (xPyD: every replica of a stage runs
that stage's settings, so one comparison covers every prefill/decode instance):
``model``, ``revision``, ``tokenizer``, ``tokenizer_revision``, ``code_revision``,
``quantization`` and ``dtype``. ``kv_cache_dtype`` is OPD605's (XS-DTYPE) and not
reported twice. A key set on one side only is compared with what the runtime uses
without it (vLLM 0.30 ``vllm/config/model.py`` ``ModelConfig`` defaults and
``__post_init__``): ``tokenizer`` -> that side's ``model``, ``tokenizer_revision`` ->
that side's ``revision``, ``revision``/``code_revision`` -> the default branch
(``main``), ``quantization`` -> the checkpoint's ``quantization_config``,
``dtype`` -> ``auto`` (the checkpoint's dtype). The effective value of a stage: a
global CLI flag, else the stage's key, else the pipeline-wide top-level key
(``dtype``, ``quantization``).

PASS::

    stages:
      - {stage_id: 0, revision: 3f2b1c0e, kv_transfer_config: {kv_role: kv_producer, ...}}
      - {stage_id: 1, revision: 3f2b1c0e, kv_transfer_config: {kv_role: kv_consumer, ...}}

FAIL::

    stages:
      - {stage_id: 0, revision: 3f2b1c0e, kv_transfer_config: {kv_role: kv_producer, ...}}
      - {stage_id: 1, revision: a1b2c3d4, kv_transfer_config: {kv_role: kv_consumer, ...}}
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Iterable

from omni_pd.diagnostics import Diagnostic, Severity
from omni_pd.check.rules import Context, Example, Rule, rule

if TYPE_CHECKING:
    from omni_pd.compile.topology import StageNode

#: compared keys, in report order, with the words the message uses
KEYS = (("model", "models"), ("revision", "model revisions"), ("tokenizer", "tokenizers"),
        ("tokenizer_revision", "tokenizer revisions"), ("code_revision", "code revisions"),
        ("quantization", "quantization methods"), ("dtype", "weight dtypes"))

#: pipeline-wide top-level keys that are defaults of every stage (vllm-omni 0.30
#: config/stage_config.py ``_PIPELINE_WIDE_ENGINE_FIELDS``)
_PIPELINE_WIDE = ("dtype", "quantization")

#: vLLM 0.30 ``vllm/config/model.py`` ``_STR_DTYPE_TO_TORCH_DTYPE``: spellings of one dtype
_DTYPES = {"half": "float16", "float16": "float16", "bfloat16": "bfloat16", "float": "float32", "float32": "float32"}

_HEX = re.compile(r"[0-9a-f]{12,40}")

_PAIR = ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
         "  - {{stage_id: 0, devices: \"0\"{p}, kv_transfer_config: {{kv_connector: MooncakeConnector, kv_role: kv_producer, engine_id: p0}}}}\n"
         "  - {{stage_id: 1, devices: \"1\"{d}, kv_transfer_config: {{kv_connector: MooncakeConnector, kv_role: kv_consumer, engine_id: d0}}}}\n")


def _pair(p: str = "", d: str = "") -> str:  # pragma: no mutate block (runs at import only)
    return _PAIR.format(p=p, d=d)


def _short(v: Any) -> str:
    """A commit id as its 7-character prefix (``git log --oneline``), anything else as is."""
    s = str(v)
    return s[:7] if _HEX.fullmatch(s) else s


def _explicit(ctx: Context, n: "StageNode", key: str) -> tuple[bool, Any]:
    """(set?, value) of ``key`` for stage ``n``: CLI flag, stage key, top-level key."""
    if key in ctx.cli:
        return True, ctx.cli[key]
    if n.settings.get(key) is not None:
        return True, n.settings[key]
    if key in _PIPELINE_WIDE and ctx.config is not None and getattr(ctx.config, key, None) is not None:
        return True, getattr(ctx.config, key)
    return False, None


def _effective(ctx: Context, n: "StageNode") -> dict[str, tuple[Any, bool]]:
    """key -> (the value the engine uses, known?) for stage ``n``. ``known`` is False when
    the value depends on something validate does not see (the served model, the
    checkpoint's dtype or quantization without ``--model-info``)."""
    raw = {k: _explicit(ctx, n, k) for k, _ in KEYS}
    out: dict[str, tuple[Any, bool]] = {}
    model_set, model = raw["model"]
    out["model"] = (model, True) if model_set else ("the served model", False)
    rev_set, rev = raw["revision"]
    out["revision"] = (str(rev) if rev_set else "main", True)
    tok_set, tok = raw["tokenizer"]
    out["tokenizer"] = (tok, True) if tok_set else out["model"]
    trev_set, trev = raw["tokenizer_revision"]
    out["tokenizer_revision"] = (str(trev), True) if trev_set else out["revision"]
    crev_set, crev = raw["code_revision"]
    out["code_revision"] = (str(crev) if crev_set else "main", True)
    q_set, q = raw["quantization"]
    info = ctx.model
    if q_set and q is not None:
        out["quantization"] = (str(q), True)
    elif info is not None and info.quant_method is not None:
        out["quantization"] = (info.quant_method or "none", True)
    else:
        out["quantization"] = ("the checkpoint's quantization_config", False)
    dt_set, dt = raw["dtype"]
    # vLLM lowercases a dtype string (vllm/config/model.py _get_and_verify_dtype): AUTO is auto
    dts = _DTYPES.get(str(dt).lower(), str(dt).lower()) if dt_set else "auto"
    if dts == "auto":
        tdt = _DTYPES.get(str(info.torch_dtype).lower()) if info is not None and info.torch_dtype else None
        # auto keeps a float16/bfloat16 checkpoint's dtype; float32 is resolved per platform
        out["dtype"] = (tdt, True) if tdt in ("float16", "bfloat16") else ("auto (the checkpoint's dtype)", False)
    else:
        out["dtype"] = (dts, True)
    return out


def _same(key: str, a: Any, b: Any) -> bool:
    if key in ("quantization",):
        return str(a).lower() == str(b).lower()
    return str(a) == str(b)


@rule("OPD313", "pd-model-identity", Severity.ERROR,
      "prefill and decode load different models, revisions, tokenizers, quantization or weight dtypes",
      fail=_pair(', revision: "3f2b1c0e9d8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c"', ', revision: "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678"'),
      passing=_pair(', revision: "3f2b1c0e9d8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c"', ', revision: "3f2b1c0e9d8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c"'),
      labels=("XS-MODEL-IDENTITY",),
      examples=(
          Example("revision pinned on one side, the default branch on the other", _pair(', revision: "3f2b1c0"'),
                  True, contains="main"),
          Example("revision main written on one side only: the default either way", _pair(', revision: main'), False),
          Example("different quantization", _pair(", quantization: fp8", ", quantization: awq"), True,
                  contains="fp8 / awq"),
          Example("dtype half and float16 are one dtype", _pair(", dtype: half", ", dtype: float16"), False),
          Example("dtype on one side, auto on the other, checkpoint dtype unknown", _pair(", dtype: bfloat16"), True,
                  severity=Severity.WARNING, contains="auto"),
          Example("dtype on one side, auto on the other, a bfloat16 checkpoint",
                  _pair(", dtype: bfloat16"), False, {"model": {"torch_dtype": "bfloat16"}}),
          Example("tokenizer on one side equals the other side's model",
                  _pair(", model: /models/a, tokenizer: /models/a", ", model: /models/a"), False),
          Example("model on one side only: the other serves the CLI's model", _pair(", model: /models/a"), True,
                  severity=Severity.WARNING, contains="the served model"),
          Example("model on one side, the same model on the command line", _pair(", model: /models/a"), False,
                  {"cli": {"model": "/models/a"}}),
          Example("pipeline-wide dtype against a stage's own", "dtype: bfloat16\n" + _pair(", dtype: float16"), True,
                  contains="float16 / bfloat16"),
      ))
def model_identity(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """Both halves of a PD pair must load the same model: ``model``, ``revision``,
    ``tokenizer``, ``tokenizer_revision``, ``code_revision``, ``quantization`` and
    ``dtype`` equal on prefill and decode (every xPyD instance runs its stage's
    settings). Error when both values are known and differ; warning when one side's
    value is the runtime's default and that default depends on what validate does not
    see (the served model, the checkpoint's dtype or quantization: pass
    ``--model-info config.json``). ``kv_cache_dtype`` is compared by OPD605. Located at
    the key on decode (prefill's when decode does not set it), with the other side as
    related location. Sources: https://github.com/vllm-project/vllm/pull/55776; vLLM
    0.30 ``vllm/config/model.py`` (``ModelConfig`` defaults, ``__post_init__``:
    tokenizer -> model, tokenizer_revision -> revision), ``kv_connector/v1/nixl/metadata.py``
    ``compute_nixl_compatibility_hash`` (no revision in the hash)."""
    pair = ctx.pd_pair
    if pair is None:
        return
    p, d = pair
    pe, de = _effective(ctx, p), _effective(ctx, d)
    for key, words in KEYS:
        (pv, pk), (dv, dk) = pe[key], de[key]
        p_set, d_set = _explicit(ctx, p, key)[0], _explicit(ctx, d, key)[0]
        if not (p_set or d_set) or (pk == dk and _same(key, pv, dv)):
            # not written on either side (the same default), equal, or both follow the same
            # unresolved default (`dtype: auto` on one side or both: ModelConfig's default)
            continue
        if key in ("tokenizer", "tokenizer_revision") and not (pk and dk):
            continue  # follows an unknown model: the model comparison says it
        # located where the stage itself writes it (decode first), else where it is set
        here, there = (d, p) if key in d.settings or (d_set and key not in p.settings) else (p, d)
        side, other = ("decode", "prefill") if here is d else ("prefill", "decode")
        hv, tv = (dv, pv) if here is d else (pv, dv)
        loc = ctx.sloc(here, key, value=True) if key in here.settings else \
            (ctx.loc((key,), value=True) if ctx.exists((key,)) else ctx.sloc(here, key, value=True))
        rel_node_loc = ctx.sloc(there, key, value=True, label=f"{other} (stage {there.stage_id}) uses {_short(tv)}") \
            if key in there.settings else ctx.sloc(there, label=f"{other} (stage {there.stage_id}) uses {_short(tv)}")
        if pk and dk:
            yield r.diag(f"prefill (stage {p.stage_id}) and decode (stage {d.stage_id}) load different {words} "
                         f"({_short(pv)} / {_short(dv)}): the KV handshake does not compare them, decode would "
                         "continue from KV computed by other weights or token ids", loc, related=[rel_node_loc],
                         label=f"{side} uses {_short(hv)}",
                         help=f"write the same `{key}` on both stages of the PD pair (`{key}: {hv}` on "
                              f"{other} too, or drop it from both)")
        else:
            yield r.diag(f"{side} (stage {here.stage_id}) sets {key} {_short(hv)}, {other} (stage {there.stage_id}) "
                         f"uses {tv}: they load the same {words[:-1] if words.endswith('s') else words} only if "
                         f"that is {_short(hv)}", loc, related=[rel_node_loc], severity=Severity.WARNING,
                         help=f"write `{key}: {hv}` on {other} too"
                              + (" (or pass --model-info config.json so validate can resolve the default)"
                                 if key in ("dtype", "quantization") else ""))
